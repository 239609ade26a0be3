"""harness.engine.fastlm against the transformers forward it replaces: values and gradients at every
position that predicts a real token, decoding with an in-place cache (and dropped rows),
and which models may take the path."""
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from harness.engine import fastlm
from harness.config.schema import ModelConfig
from harness.engine.learner import ValueModel, make_batch, token_logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.sampling import sample


def _gqa_llama(tok):
    conf = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                       rope_theta=500.0, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(3)
    return LlamaForCausalLM(conf)


def _rollout_like(tok, G=3):
    """Left-padded prompts of different lengths, each repeated G times, and completions that
    end (EOS) at different places: after 1 token, mid-way, never; one holds a sampled <pad>
    before its end (a real token: nn.Embedding's padding_idx gives its row no gradient)."""
    prompts = ["Q:1+2\nA:", "Q:33*4-25\nA:", "Q:7\nA:"]
    enc = tok(prompts, padding=True, return_tensors="pt")
    p_ids, p_mask = enc["input_ids"].repeat_interleave(G, 0), enc["attention_mask"].repeat_interleave(G, 0)
    B, T = p_ids.shape[0], 9
    g = torch.Generator().manual_seed(0)
    c_ids = torch.randint(4, len(tok), (B, T), generator=g)
    ends = [0, 3, 8, None, 5, 1, 2, None, 6][:B]
    c_mask = torch.ones(B, T, dtype=torch.long)
    for r, e in enumerate(ends):
        if e is not None:
            c_ids[r, e] = tok.eos_token_id
            c_ids[r, e + 1:] = tok.pad_token_id
            c_mask[r, e + 1:] = 0
    c_ids[3, 2] = tok.pad_token_id
    return p_ids, p_mask, c_ids, c_mask


def _hf_logprobs(model, p_ids, p_mask, c_ids, c_mask):
    ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, p_ids.shape[1] - 1:-1]
    return logits.log_softmax(-1).gather(-1, c_ids[..., None])[..., 0]


@pytest.mark.parametrize("which,fuse", [("tiny", True), ("gqa", True), ("gqa", False)])
def test_completion_logprobs_and_gradients_match_transformers(which, fuse, monkeypatch):
    if not fuse:  # the separate-projection path larger models take
        monkeypatch.setattr(fastlm, "FUSE_MAX_PARAMS", 0)
    tok = build_char_tokenizer()
    model = (build_tiny_model(ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128), tok)
             if which == "tiny" else _gqa_llama(tok))
    assert fastlm.supported(model)
    p_ids, p_mask, c_ids, c_mask = _rollout_like(tok)
    w = torch.randn(c_ids.shape, generator=torch.Generator().manual_seed(1))
    real = c_mask.bool()

    ref = _hf_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    (ref * w * c_mask).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    fast = fastlm.completion_logits(model, p_ids, p_mask, c_ids, c_mask).log_softmax(-1)
    fast = fast.gather(-1, c_ids[..., None])[..., 0]
    (fast * w * c_mask).sum().backward()

    assert torch.allclose(fast[real], ref[real], atol=2e-5), (fast - ref)[real].abs().max()
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, ref_grads[n], atol=2e-5, rtol=1e-4), n
    # the learner's entry point: same values, zeros past each completion, trimmed columns
    b = make_batch(type("R", (), dict(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=c_ids,
                                      completion_mask=c_mask))(), "cpu")
    with torch.no_grad():
        lp = token_logprobs(model, b)
        with fastlm.disabled():
            lp_hf = token_logprobs(model, b)
    assert lp.shape == lp_hf.shape == c_ids.shape
    assert torch.allclose(lp[real], lp_hf[real], atol=2e-5)
    short = b.rows(slice(0, 2))  # completions of 1 and 4 tokens: 4 columns computed, the rest zero
    lp_short = token_logprobs(model, short)
    assert lp_short.shape == (2, 9) and (lp_short[:, 4:] == 0).all()
    assert torch.allclose(lp_short[short.mask.bool()], lp_hf[:2][short.mask.bool()], atol=2e-5)


@pytest.mark.parametrize("fuse", [True, False])
def test_layer_recomputation_gives_the_same_bits_and_keeps_less(fuse, monkeypatch):
    """Recomputing each layer in backward (what a large batch gets) changes no value and no gradient,
    bit for bit; it is chosen by the estimated saved bytes (tokens x layers x (10 hidden + 4 MLP)
    floats), and without autograd never."""
    if not fuse:
        monkeypatch.setattr(fastlm, "FUSE_MAX_PARAMS", 0)
    # whole-layer recomputation: what it keeps passes through saved-tensor hooks (the selective mode's
    # matmul outputs are kept by its dispatch mode instead: test_fastlm_recompute.py)
    monkeypatch.setattr(fastlm, "RECOMPUTE", "full")
    tok = build_char_tokenizer()
    model = _gqa_llama(tok)
    p_ids, p_mask, c_ids, c_mask = _rollout_like(tok)
    w = torch.randn(c_ids.shape[0], c_ids.shape[1] - 1, 48, generator=torch.Generator().manual_seed(2))

    def run(min_bytes):
        monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", min_bytes)
        model.zero_grad(set_to_none=True)
        saved = []  # bytes of every tensor autograd keeps for backward (weights included)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                      lambda t: t):
            h = fastlm.completion_hidden(model, p_ids, p_mask, c_ids, c_mask)
        (h[:, 1:] * w).sum().backward()
        return h.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, sum(saved)

    h_keep, g_keep, saved_keep = run(2**62)
    h_re, g_re, saved_re = run(0)
    assert saved_re < saved_keep / 5, (saved_re, saved_keep)
    assert torch.equal(h_keep, h_re)
    assert g_keep.keys() == g_re.keys() and len(g_keep) == len(list(model.model.parameters()))
    assert all(torch.equal(g_keep[n], g_re[n]) for n in g_keep)
    # the rule: 2 layers x (10 x 48 + 4 x 96) floats x 4 bytes = 6,912 bytes per token
    monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", 6912 * 100)
    assert not fastlm.checkpoint_layers(model.model, 100) and fastlm.checkpoint_layers(model.model, 101)


def _bits(t):
    return t.detach().contiguous().view(torch.int32)


def test_rotary_gives_transformers_rotate_half_bits():
    """fastlm's rotary (one roll times a sin whose first half is negated) against transformers' own
    ``x * cos + rotate_half(x) * sin`` with its own tables: the same bits, values and the input's gradient,
    on a strided input (a slice of a fused projection, as the model gives it)."""
    from transformers.models.llama.modeling_llama import rotate_half
    tok = build_char_tokenizer()
    dec = _gqa_llama(tok).model  # head_dim 8, rope_theta 500
    pos = torch.tensor([[0, 1, 2, 5, 9, 17, 30, 63]])
    g = torch.Generator().manual_seed(4)
    cos, sin = dec.rotary_emb(torch.zeros(1, 8, 48), pos)  # [1, 8, 8]
    cos_f, sin_signed = fastlm._rope_tables(dec, pos, torch.float32)
    assert torch.equal(_bits(cos_f), _bits(cos))
    assert torch.equal(_bits(sin_signed[..., 4:]), _bits(sin[..., 4:]))
    assert torch.equal(_bits(sin_signed[..., :4]), _bits(-sin[..., :4]))
    proj = torch.randn(8, 80, generator=g) * 3
    grad = torch.randn(8, 8, 8, generator=g)
    out = []
    for f in (lambda x: x * cos[0, :, None] + rotate_half(x) * sin[0, :, None],
              lambda x: fastlm._rotate(x, cos_f[0, :, None], sin_signed[0, :, None])):
        p = proj.clone().requires_grad_()
        y = f(p[:, :64].unflatten(-1, (8, 8)))  # 6 query + 2 key heads of a fused q|k|v projection
        y.backward(grad)
        out.append((y, p.grad))
    assert torch.equal(_bits(out[0][0]), _bits(out[1][0]))
    assert torch.equal(_bits(out[0][1]), _bits(out[1][1]))


@pytest.mark.parametrize("fuse", [True, False])
def test_batch_without_padding_skips_the_packing_with_the_same_bits(fuse, monkeypatch):
    """When every completion position is real, completion_hidden uses the packed positions as the padded layout
    (no scatter, no gather): the same hidden states and gradients, bit for bit, as the same batch put through the
    packing (an index of every position); and a batch with padding takes the packing."""
    if not fuse:
        monkeypatch.setattr(fastlm, "FUSE_MAX_PARAMS", 0)
    tok = build_char_tokenizer()
    model = _gqa_llama(tok)
    p_ids, p_mask, c_ids, c_padded = _rollout_like(tok)
    c_mask = torch.ones_like(c_ids)
    w = torch.randn(*c_ids.shape, 48, generator=torch.Generator().manual_seed(5))
    packing = fastlm._packing
    assert packing(c_mask[:, 1:].bool()) is None
    assert torch.equal(packing(c_padded[:, 1:].bool()), c_padded[:, 1:].reshape(-1).nonzero().squeeze(1))

    def run(force_packing):
        if force_packing:
            monkeypatch.setattr(fastlm, "_packing", lambda need: need.reshape(-1).nonzero().squeeze(1))
        model.zero_grad(set_to_none=True)
        h = fastlm.completion_hidden(model, p_ids, p_mask, c_ids, c_mask)
        (h * w).sum().backward()
        monkeypatch.setattr(fastlm, "_packing", packing)
        return h.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    (h1, g1), (h2, g2) = run(False), run(True)
    assert h1.shape == (*c_ids.shape, 48)
    assert torch.equal(_bits(h1), _bits(h2))
    assert g1.keys() == g2.keys() and len(g1) == len(list(model.model.parameters()))
    assert all(torch.equal(_bits(g1[n]), _bits(g2[n])) for n in g1)


def test_value_model_fast_path_matches_backbone_forward():
    tok = build_char_tokenizer()
    policy = build_tiny_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok)
    critic = ValueModel(policy)
    torch.nn.init.normal_(critic.head.weight)
    p_ids, p_mask, c_ids, c_mask = _rollout_like(tok)
    ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        v = critic(ids, mask, pos, c_ids.shape[1])
        with fastlm.disabled():
            v_hf = critic(ids, mask, pos, c_ids.shape[1])
    real = c_mask.bool()
    assert v.shape == v_hf.shape and torch.allclose(v[real], v_hf[real], atol=1e-5)


@pytest.mark.parametrize("fuse", [True, False])
def test_decode_with_in_place_cache_and_dropped_rows_matches_full_forward(fuse, monkeypatch):
    if not fuse:
        monkeypatch.setattr(fastlm, "FUSE_MAX_PARAMS", 0)
    tok = build_char_tokenizer()
    model = _gqa_llama(tok)
    prompts = ["Q:1+2\nA:", "Q:33*4-25\nA:"]
    enc = tok(prompts, padding=True, return_tensors="pt")
    G, T = 3, 6
    seq = torch.randint(4, len(tok), (len(prompts) * G, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = _hf_logprobs(model, enc["input_ids"].repeat_interleave(G, 0),
                            enc["attention_mask"].repeat_interleave(G, 0), seq, torch.ones_like(seq))
        st = fastlm.DecodeState(model, enc["input_ids"].shape[1] + T)
        logits = st.prefill(enc["input_ids"], enc["attention_mask"], G).repeat_interleave(G, 0)
        rows = torch.arange(seq.shape[0])
        got = torch.zeros_like(full)
        for t in range(T):
            got[rows, t] = logits.log_softmax(-1).gather(-1, seq[rows, t:t + 1])[:, 0]
            if t == 2:  # drop rows 1 and 4: the others go on with a smaller cache
                keep = torch.tensor([0, 2, 3, 5])
                st.keep_rows(keep)
                rows = rows[keep]
            if t < T - 1:
                logits = st.step(seq[rows, t])
    dropped = torch.tensor([1, 4])
    assert torch.allclose(got[:, :3], full[:, :3], atol=2e-5)
    kept = torch.tensor([0, 2, 3, 5])
    assert torch.allclose(got[kept], full[kept], atol=2e-5)
    assert (got[dropped, 3:] == 0).all()


def _ends_early(tok):
    """A tiny model taught (a few Adam steps) to stop after 1-10 random characters, so that
    sampled completions end at many different lengths."""
    torch.manual_seed(0)
    model = build_tiny_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        texts = ["Q:1\nA:" + "".join(chr(33 + int(c)) for c in torch.randint(0, 90, (int(k),), generator=g))
                 for k in torch.randint(1, 11, (16,), generator=g)]
        enc = tok(texts, padding=True, return_tensors="pt")
        ids = torch.cat([enc["input_ids"], torch.full((16, 1), tok.pad_token_id)], 1)
        mask = torch.cat([enc["attention_mask"], torch.zeros(16, 1, dtype=torch.long)], 1)
        ids[:, -1] = tok.eos_token_id
        mask[:, -1] = 1
        labels = ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0),
                     labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_sampler_fast_and_transformers_paths_agree_on_logprobs():
    tok = build_char_tokenizer()
    model = _ends_early(tok)
    prompts = ["Q:3+4\nA:", "Q:33*4-2\nA:"]
    ro = sample(model, tok, prompts, n=4, max_new_tokens=16, seed=3)
    with fastlm.disabled():
        ro_hf = sample(model, tok, prompts, n=4, max_new_tokens=16, seed=3)
        lp_hf = token_logprobs(model, make_batch(ro, "cpu")) * ro.completion_mask
    # the fast sampler's log-probs are those of the transformers forward on its own samples,
    # and, rows dropped from its cache or not, it draws the same samples from the same seed
    assert torch.allclose(ro.logprobs, lp_hf, atol=2e-5)
    assert ro.completions == ro_hf.completions and len(set(map(len, ro.completions))) > 3
    # greedy decoding takes the same path either way (ties aside)
    g1 = sample(model, tok, prompts, n=1, max_new_tokens=16, greedy=True)
    with fastlm.disabled():
        g2 = sample(model, tok, prompts, n=1, max_new_tokens=16, greedy=True)
    assert g1.completions == g2.completions
    assert ro_hf.num_sequences == ro.num_sequences == 8


def test_which_models_take_the_fast_path():
    tok = build_char_tokenizer()
    small = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, max_position_embeddings=32)
    assert fastlm.supported(LlamaForCausalLM(LlamaConfig(**small)))
    assert fastlm.supported(LlamaForCausalLM(LlamaConfig(**small)).model)  # the critic's backbone
    assert not fastlm.supported(LlamaForCausalLM(LlamaConfig(**small, attention_bias=True)))
    assert not fastlm.supported(LlamaForCausalLM(LlamaConfig(**small, hidden_act="gelu")))
    dyn = LlamaConfig(**small, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    assert not fastlm.supported(LlamaForCausalLM(dyn))
    assert not fastlm.supported(GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2)))
    m = LlamaForCausalLM(LlamaConfig(**small))
    with fastlm.disabled():
        assert not fastlm.supported(m)
    assert fastlm.supported(m)
