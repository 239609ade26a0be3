"""fastlm's layer recomputation modes (issue 29.2a): selective recomputation (keep each layer's matmul and
attention outputs, recompute the cheap ops) gives the same values and every parameter's gradient bit for bit
as whole-layer recomputation and as no recomputation, and its backward does no matmul FLOPs beyond
no recomputation's. Under a memory budget (``RECOMPUTE_BUDGET_BYTES``) the first layers are recomputed fully,
the rest selectively: the same bits again, backward FLOPs between the two."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from harness.engine import fastlm, heap, logprobs
from harness.engine.models import build_char_tokenizer


def _model(tok, kv_heads):
    conf = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                       num_attention_heads=6, num_key_value_heads=kv_heads, max_position_embeddings=64,
                       tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(5)
    return LlamaForCausalLM(conf)


def _batch(tok, G=3):
    """Left-padded prompts of different lengths, each G times; completions ending at different places."""
    enc = tok(["Q:1+2\nA:", "Q:33*4-25\nA:", "Q:7\nA:"], padding=True, return_tensors="pt")
    p_ids, p_mask = enc["input_ids"].repeat_interleave(G, 0), enc["attention_mask"].repeat_interleave(G, 0)
    B, T = p_ids.shape[0], 10
    c_ids = torch.randint(4, len(tok), (B, T), generator=torch.Generator().manual_seed(0))
    c_mask = torch.ones(B, T, dtype=torch.long)
    for r, e in enumerate([0, 3, 9, None, 5, 1, 2, None, 6]):
        if e is not None:
            c_ids[r, e], c_ids[r, e + 1:], c_mask[r, e + 1:] = tok.eos_token_id, tok.pad_token_id, 0
    return p_ids, p_mask, c_ids, c_mask


def _run(model, batch, mode, monkeypatch, prompt_only=False, budget=float("inf")):
    """Values, every parameter's gradient, forward and backward FLOPs of a log-prob loss under ``mode``
    (and ``budget``: ``RECOMPUTE_BUDGET_BYTES``)."""
    p_ids, p_mask, c_ids, c_mask = batch
    if prompt_only:  # no completion input positions: each layer runs the prompt part only
        c_ids, c_mask = c_ids[:, :1], c_mask[:, :1]
    monkeypatch.setattr(fastlm, "RECOMPUTE_BUDGET_BYTES", budget)
    if mode is None:
        monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", 2**62)
    else:
        monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", -1)
        monkeypatch.setattr(fastlm, "RECOMPUTE", mode)
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as fc:
        h = fastlm.completion_hidden(model, p_ids, p_mask, c_ids, c_mask)
        lp = logprobs.token_logprobs_from_hidden(h, model.lm_head.weight, c_ids)
        fwd = fc.get_total_flops()
        w = torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)
        (lp * w * c_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return lp.detach(), grads, fwd, fc.get_total_flops() - fwd


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("kv_heads", [6, 2])
@pytest.mark.parametrize("prompt_only", [False, True])
def test_selective_full_and_no_recomputation_give_the_same_bits(fuse, kv_heads, prompt_only, monkeypatch):
    if not fuse:  # separate q/k/v and gate/up projections (larger models)
        monkeypatch.setattr(fastlm, "FUSE_MAX_PARAMS", 0)
    tok = build_char_tokenizer()
    model, batch = _model(tok, kv_heads), _batch(tok)
    assert fastlm.supported(model)
    lp0, g0, f0, b0 = _run(model, batch, None, monkeypatch, prompt_only)
    lp1, g1, f1, b1 = _run(model, batch, "full", monkeypatch, prompt_only)
    lp2, g2, f2, b2 = _run(model, batch, "selective", monkeypatch, prompt_only)
    assert torch.equal(lp0, lp1) and torch.equal(lp0, lp2)
    assert g0.keys() == g1.keys() == g2.keys() and len(g0) == len(list(model.parameters()))
    for n in g0:
        assert g0[n] is not None and g0[n].abs().sum() > 0, n
        assert torch.equal(g0[n], g1[n]), n
        assert torch.equal(g0[n], g2[n]), n
    assert f0 == f1 == f2
    # full recomputation repeats the layers' matmuls (all but the last down projection) in backward;
    # selective repeats none
    assert b2 == b0 < b1, (b0, b1, b2)


def _spy_plans(monkeypatch):
    """Every (tokens, plan) that completion_hidden's recompute_plan returns, in a list."""
    seen, real = [], fastlm.recompute_plan

    def spy(dec, tokens):
        plan = real(dec, tokens)
        seen.append((tokens, plan))
        return plan
    monkeypatch.setattr(fastlm, "recompute_plan", spy)
    return seen


@pytest.mark.parametrize("kv_heads", [6, 2])
@pytest.mark.parametrize("prompt_only", [False, True])
def test_budget_mixes_full_and_selective_layers_with_the_same_bits(kv_heads, prompt_only, monkeypatch):
    """A budget between all-selective and all-full: the first layer is recomputed fully, the other two
    selectively; values and every gradient equal to no recomputation's, backward FLOPs between."""
    tok = build_char_tokenizer()
    model, batch = _model(tok, kv_heads), _batch(tok)
    seen = _spy_plans(monkeypatch)
    lp0, g0, f0, b0 = _run(model, batch, None, monkeypatch, prompt_only)
    tokens = seen[-1][0]
    assert seen[-1][1] == ("keep",) * 3
    sel = fastlm._saved_bytes(model.model, tokens, "selective")
    full = fastlm._saved_bytes(model.model, tokens, "full")
    assert 0 < full < sel
    _, _, _, b_full = _run(model, batch, "full", monkeypatch, prompt_only)
    lp1, g1, f1, b1 = _run(model, batch, "selective", monkeypatch, prompt_only, budget=full + 2 * sel)
    assert seen[-1] == (tokens, ("full", "selective", "selective"))
    assert torch.equal(lp0, lp1)
    assert g0.keys() == g1.keys() and len(g0) == len(list(model.parameters()))
    for n in g0:
        assert g0[n].abs().sum() > 0, n
        assert torch.equal(g0[n], g1[n]), n
    assert f0 == f1
    assert b0 < b1 < b_full, (b0, b1, b_full)


def test_budget_plan_recomputes_as_few_layers_fully_as_fit(monkeypatch):
    """recompute_plan: the least number of leading full layers whose estimate fits the budget; all
    selective without a budget, all full where nothing fits; the budget never applies to RECOMPUTE='full'
    nor below CHECKPOINT_MIN_BYTES."""
    tok = build_char_tokenizer()
    dec = _model(tok, 2).model
    T = 100
    sel = fastlm._saved_bytes(dec, T, "selective")
    full = fastlm._saved_bytes(dec, T, "full")
    # floats per token: input, q, attention output, output projection (4 x 48), k and v (2 x 2 heads x 8),
    # gate and up (2 x 96); fully recomputed: the input
    assert sel == T * (4 * 48 + 2 * 16 + 2 * 96) * 4 and full == T * 48 * 4
    monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", -1)
    monkeypatch.setattr(fastlm, "RECOMPUTE", "selective")
    S, F = "selective", "full"
    for budget, plan in [(float("inf"), (S, S, S)), (3 * sel, (S, S, S)), (3 * sel - 1, (F, S, S)),
                         (full + 2 * sel, (F, S, S)), (full + 2 * sel - 1, (F, F, S)), (2 * full + sel, (F, F, S)),
                         (3 * full, (F, F, F)), (0, (F, F, F))]:
        monkeypatch.setattr(fastlm, "RECOMPUTE_BUDGET_BYTES", budget)
        assert fastlm.recompute_plan(dec, T) == plan, budget
    monkeypatch.setattr(fastlm, "RECOMPUTE", "full")
    assert fastlm.recompute_plan(dec, T) == ("full",) * 3
    monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", 2**62)
    assert fastlm.recompute_plan(dec, T) == ("keep",) * 3


def test_default_budget_at_the_27m_bench_shape():
    """The defaults at the 27.3M bench's 64-row micro-batch (8 prompts of 13 tokens + 64 x 127 completion
    positions, as bench/recompute.py builds it): recomputed, 2 of 8 layers fully under the 1,200 MiB budget, with the
    freed heap handed back (bench/README.md, 29.2e)."""
    from types import SimpleNamespace
    conf = LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                       num_key_value_heads=8)
    dec = SimpleNamespace(config=conf, embed_tokens=SimpleNamespace(weight=torch.empty(0)))
    assert fastlm.CHECKPOINT_MIN_BYTES == 512 * 2**20 and fastlm.RECOMPUTE_BUDGET_BYTES == 1200 * 2**20
    assert fastlm.RECOMPUTE == "selective" and heap.RELEASE_FREED_HEAP is True
    assert fastlm.recompute_plan(dec, 8 * 13 + 64 * 127) == ("full",) * 2 + ("selective",) * 6


def test_unknown_recompute_mode_is_refused(monkeypatch):
    tok = build_char_tokenizer()
    model, batch = _model(tok, 2), _batch(tok)
    monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", -1)
    monkeypatch.setattr(fastlm, "RECOMPUTE", "some")
    with pytest.raises(ValueError, match="RECOMPUTE"):
        fastlm.completion_hidden(model, *batch)

