"""harness.engine.logprobs: the chunked log-probs equal the plain computation (values, and gradients
for the hidden states and the weight, tied to the input embedding or not, at T = 1 and 0.8, with
padding, for chunk sizes that do and do not divide the rows, under no_grad, in bfloat16), no more
than a chunk of rows of logits ever exists, and the learner keeps the plain path, bit for bit,
below the threshold (the quickstart's tiny model always is)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

from algorithms.presets import resolve
from harness.config.schema import ModelConfig, load_config
from harness.engine import fastlm, logprobs
from harness.engine.learner import Learner, make_batch, token_logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.perf import PerfTracker
from harness.engine.sampling import sample
from support_paths import REPO

B, TN, H, V = 3, 5, 8, 37  # 15 rows


def _problem(tied: bool, dtype=torch.float64):
    """Leaves, and a function of them giving (hidden [B, TN, H], the output weight): the hidden
    states come from an embedding lookup (the output weight itself when ``tied``) through a
    linear layer, so a tied weight gets gradient by both routes."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    a = (torch.randn(H, H, generator=g, dtype=torch.float64) / H ** 0.5).to(dtype).requires_grad_()
    e = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    ids = torch.randint(0, V, (B, TN), generator=g)
    leaves = {"w": w, "a": a} if tied else {"w": w, "a": a, "e": e}

    def forward():
        return torch.tanh(F.embedding(ids, w if tied else e) @ a), w
    return leaves, forward


def _targets_and_loss_weights():
    g = torch.Generator().manual_seed(1)
    targets = torch.randint(0, V, (B, TN), generator=g)
    mask = torch.ones(B, TN, dtype=torch.float64)
    mask[0, 3:] = 0  # padding: these rows get no gradient
    mask[2, 1:] = 0
    return targets, torch.randn(B, TN, generator=g, dtype=torch.float64) * mask


def _exact(hidden, w, targets, temperature):
    """The maths, in the inputs' dtype: log_softmax(h W^T / T)[target]."""
    return torch.log_softmax(hidden @ w.t() / temperature, -1).gather(-1, targets[..., None]).squeeze(-1)


def _run(fn, tied, temperature, dtype=torch.float64):
    """Values [B, TN] and the gradients of every leaf (and of the hidden states) of a masked loss."""
    leaves, forward = _problem(tied, dtype)
    targets, coef = _targets_and_loss_weights()
    hidden, w = forward()
    hidden.retain_grad()
    lp = fn(hidden, w, targets, temperature)
    (lp.double() * coef).sum().backward()
    return lp.detach(), {"hidden": hidden.grad, **{k: v.grad for k, v in leaves.items()}}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("temperature", [1.0, 0.8])
@pytest.mark.parametrize("chunk", [4, 1, 64])  # 4 does not divide 15 rows; 64 is one chunk
def test_chunked_equals_the_maths_in_float64(tied, temperature, chunk):
    want, want_g = _run(_exact, tied, temperature)
    got, got_g = _run(lambda h, w, t, T: logprobs.chunked_logprobs(h, w, t, T, chunk=chunk), tied, temperature)
    assert got.dtype == torch.float64 and got.shape == (B, TN)
    # values at every position, padding included
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    assert want.std() > 1.0  # log-probs of a 37-token vocabulary, spread out: not a degenerate case
    for k in want_g:
        assert want_g[k].abs().max() > 1e-3, k
        assert torch.allclose(got_g[k], want_g[k], rtol=1e-10, atol=1e-13), (k, (got_g[k] - want_g[k]).abs().max())
    # padded rows: no gradient into their hidden states
    assert got_g["hidden"][0, 3:].abs().max() == 0 and got_g["hidden"][2, 1:].abs().max() == 0


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_chunked_equals_plain_in_float32(tied):
    """Float32 weights (the real case): the chunked path against the learner's plain one."""
    want, want_g = _run(logprobs.full_logprobs, tied, 0.8, torch.float32)
    got, got_g = _run(lambda h, w, t, T: logprobs.chunked_logprobs(h, w, t, T, chunk=4), tied, 0.8, torch.float32)
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, rtol=0, atol=2e-6)
    for k in want_g:
        assert got_g[k].dtype == torch.float32
        err = (got_g[k] - want_g[k]).abs().max() / want_g[k].abs().max()
        assert err < 1e-5, (k, err)  # float32 rounding


def test_gradcheck():
    g = torch.Generator().manual_seed(2)
    h = torch.randn(7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 11, (7,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: logprobs.ChunkedLogprobs.apply(h, w, t, 0.8, 3), (h, w))


def test_bfloat16_weights_accumulate_in_float32():
    ref, ref_g = _run(_exact, True, 0.8)  # float64
    got, got_g = _run(lambda h, w, t, T: logprobs.chunked_logprobs(h, w, t, T, chunk=4), True, 0.8,
                      dtype=torch.bfloat16)
    assert got.dtype == torch.float32 and all(v.dtype == torch.bfloat16 for v in got_g.values())
    assert (got.double() - ref).abs().max() < 0.1  # bfloat16 inputs: ~3 significant digits
    for k in ref_g:
        err = (got_g[k].double() - ref_g[k]).abs().max() / ref_g[k].abs().max()
        assert err < 0.03, (k, err)


def test_no_grad_callers_just_chunk(monkeypatch):
    leaves, forward = _problem(True)
    targets, _ = _targets_and_loss_weights()
    hidden, w = forward()
    with_grad = logprobs.chunked_logprobs(hidden, w, targets, 0.8, chunk=4)
    applied = []
    real_apply = logprobs.ChunkedLogprobs.apply
    monkeypatch.setattr(logprobs.ChunkedLogprobs, "apply", lambda *a: applied.append(1) or real_apply(*a))
    with torch.no_grad():
        got = logprobs.chunked_logprobs(hidden, w, targets, 0.8, chunk=4)
        want = _exact(hidden, w, targets, 0.8)
    assert not applied and not got.requires_grad
    assert torch.equal(got, with_grad.detach())  # the same forward, autograd or not
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_never_more_than_a_chunk_of_logits(monkeypatch):
    """Every logits tensor the chunked path forms has at most ``chunk`` rows (a spy on the one
    function that forms them), and no op allocates anything near the full [rows, vocab] logits
    (torch's profiler, per op), while the plain path does (so the probe can see it)."""
    n, h_dim, vocab, chunk = 64, 8, 4096, 6  # full logits 1 MiB; weight and its gradient 128 KiB
    g = torch.Generator().manual_seed(3)
    h = torch.randn(n, h_dim, generator=g, requires_grad=True)
    w = torch.randn(vocab, h_dim, generator=g, requires_grad=True)
    t = torch.randint(0, vocab, (n,), generator=g)
    coef = torch.randn(n, generator=g)
    coef[:10] = 0  # rows with no gradient are skipped in backward
    seen = []
    real = logprobs._chunk_logits
    monkeypatch.setattr(logprobs, "_chunk_logits", lambda hc, wc, T: seen.append(hc.shape[0]) or real(hc, wc, T))

    def biggest_allocation(fn):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            (fn() * coef).sum().backward()
        return max(e.cpu_memory_usage for e in prof.events())

    full_bytes = n * vocab * 4
    assert biggest_allocation(lambda: logprobs.full_logprobs(h, w, t, 0.8)) >= full_bytes
    assert not seen
    assert biggest_allocation(lambda: logprobs.chunked_logprobs(h, w, t, 0.8, chunk=chunk)) < full_bytes // 4
    # forward: ceil(64 / 6) = 11 chunks; backward: the 54 rows with gradient, ceil(54 / 6) = 9
    assert seen == [6] * 10 + [4] + [6] * 9


def test_threshold_picks_the_path(monkeypatch):
    leaves, forward = _problem(False, torch.float32)
    targets, _ = _targets_and_loss_weights()
    hidden, w = forward()
    calls = []
    real = logprobs.chunked_logprobs
    monkeypatch.setattr(logprobs, "chunked_logprobs", lambda *a: calls.append(1) or real(*a))
    full = B * TN * V * 4
    monkeypatch.setattr(logprobs, "FULL_LOGITS_MAX_BYTES", full)  # exactly fits: the plain path
    plain = logprobs.token_logprobs_from_hidden(hidden, w, targets, 0.8)
    # op for op what the learner always computed
    logits = F.linear(hidden, w).float() / 0.8
    assert torch.equal(plain, logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, -1))
    assert not calls
    monkeypatch.setattr(logprobs, "FULL_LOGITS_MAX_BYTES", full - 1)
    chunked = logprobs.token_logprobs_from_hidden(hidden, w, targets, 0.8)
    assert calls and torch.allclose(chunked, plain, rtol=0, atol=1e-5)


def test_shipped_configs_fall_on_the_intended_sides():
    # the quickstart's largest micro-batch (every row at max_new_tokens) over the character vocabulary
    qs = load_config(REPO / "harness" / "configs" / "quickstart.yaml", [])
    assert not logprobs.uses_chunks(qs.train.micro_batch_size * qs.sampling.max_new_tokens, len(build_char_tokenizer()))
    # the SmolLM2 recipe (vocabulary 49,152): a full micro-batch of 128-token completions is chunked,
    # 170 rows (32 MiB of float32 logits) at a time
    sm = load_config(REPO / "harness" / "configs" / "gsm8k_smollm2.yaml", [])
    assert logprobs.uses_chunks(sm.train.micro_batch_size * sm.sampling.max_new_tokens, 49152)
    assert logprobs.chunk_rows(49152) == 170


def _llama(tied: bool):
    tok = build_char_tokenizer()
    conf = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(4)
    return LlamaForCausalLM(conf).double(), tok


def _rollouts(tok, G=3, T=8):
    """Two left-padded prompts, each G times, with completions that end (EOS, then padding)
    after 1 token, mid-way, or not at all."""
    enc = tok(["Q:1+2\nA:", "Q:33*4-25\nA:"], padding=True, return_tensors="pt")
    p_ids, p_mask = enc["input_ids"].repeat_interleave(G, 0), enc["attention_mask"].repeat_interleave(G, 0)
    c_ids = torch.randint(4, len(tok), (2 * G, T), generator=torch.Generator().manual_seed(5))
    c_mask = torch.ones(2 * G, T, dtype=torch.long)
    for r, end in enumerate([0, 4, None, 2, None, 6]):
        if end is not None:
            c_ids[r, end], c_ids[r, end + 1:], c_mask[r, end + 1:] = tok.eos_token_id, tok.pad_token_id, 0
    return type("Rollouts", (), dict(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=c_ids,
                                     completion_mask=c_mask))()


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_learner_token_logprobs_chunked_equals_the_maths(tied, monkeypatch):
    """The learner's entry point on a float64 Llama (fastlm path), forced through the chunked path
    (3 rows a chunk), against log_softmax of the full float64 logits of the same hidden states:
    the same log-probs and the same gradient for every parameter (the tied weight's included)."""
    model, tok = _llama(tied)
    assert fastlm.supported(model) and (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    b = make_batch(_rollouts(tok), "cpu")
    assert b.mask.min() == 0 and b.mask[:, -1].max() == 1  # padding, and rows that run to the end
    coef = torch.randn(b.targets.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    runs = []
    for chunked in (False, True):
        model.zero_grad()
        if chunked:
            monkeypatch.setattr(logprobs, "FULL_LOGITS_MAX_BYTES", 0)
            monkeypatch.setattr(logprobs, "LOGITS_CHUNK_BYTES", 3 * 4 * len(tok))
            seen = []
            real = logprobs._chunk_logits
            monkeypatch.setattr(logprobs, "_chunk_logits", lambda h, w, T: seen.append(h.shape[0]) or real(h, w, T))
            lp = token_logprobs(model, b, 0.8)
            assert max(seen) == 3 and lp.dtype == torch.float64
        else:
            h = fastlm.rows_hidden(model, b.input_ids, b.attention_mask, b.T)
            lp = _exact(h, model.lm_head.weight, b.targets[:, :h.shape[1]], 0.8)
        (lp * coef * b.mask).sum().backward()
        runs.append((lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp0, g0), (lp1, g1) = runs
    assert torch.allclose(lp1, lp0, rtol=0, atol=1e-12)
    for n in g0:
        assert torch.allclose(g1[n], g0[n], rtol=1e-9, atol=1e-13), n
    assert g0["model.embed_tokens.weight" if tied else "lm_head.weight"].abs().max() > 1e-3  # tied: one parameter


def test_tiny_model_keeps_the_plain_path_bit_for_bit(monkeypatch):
    """The quickstart's model: token_logprobs is exactly linear -> float -> / T -> logsumexp and
    gather, and the chunked function is never entered."""
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok,
                             seed=1)
    ro = sample(model, tok, ["Q:1+2\nA:", "Q:3*4-1\nA:"], n=4, max_new_tokens=10, seed=3)
    b = make_batch(ro, "cpu")
    monkeypatch.setattr(logprobs, "chunked_logprobs", lambda *a: pytest.fail("chunked path taken"))
    got = token_logprobs(model, b, 0.7)
    h = fastlm.rows_hidden(model, b.input_ids, b.attention_mask, b.T)
    logits = F.linear(h, model.lm_head.weight).float() / 0.7
    want = logits.gather(-1, b.targets[:, :h.shape[1], None]).squeeze(-1) - torch.logsumexp(logits, -1)
    assert torch.equal(got[:, :h.shape[1]], want)


def test_learner_step_same_update_chunked_or_plain(monkeypatch):
    """A whole GRPO step (reference scoring under no_grad, policy forward and backward) on the tiny
    model, once as shipped and once forced through chunks of 5 rows: the same gradient."""
    grads = []
    for chunked in (False, True):
        if chunked:
            monkeypatch.setattr(logprobs, "FULL_LOGITS_MAX_BYTES", 0)
            monkeypatch.setattr(logprobs, "LOGITS_CHUNK_BYTES", 5 * 4 * 100)
        torch.manual_seed(0)
        tok = build_char_tokenizer()
        policy = build_tiny_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok,
                                  seed=1)
        cfg = load_config(None, ["train.micro_batch_size=4", "train.max_grad_norm=0", "sampling.temperature=0.8"])
        algo = resolve(cfg.algorithm)
        ref = copy.deepcopy(policy).requires_grad_(False)
        with torch.no_grad():  # move the reference off the policy, so that the KL term has a gradient
            for p in ref.parameters():
                p.add_(0.01 * torch.randn_like(p))
        ro = sample(policy, tok, ["Q:1+2\nA:", "Q:3*4-1\nA:"], n=4, max_new_tokens=10, seed=3, temperature=0.8)
        learner = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref)
        step = learner.opt.step
        learner.opt.step = lambda: (grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()])), step())
        learner.step(ro, torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]), [], 0)
    assert grads[0].abs().max() > 1e-4
    assert torch.allclose(grads[1], grads[0], rtol=1e-4, atol=1e-6)
