"""fastlm's layer recomputation modes (issue 29.2a): selective recomputation (keep each layer's matmul and
attention outputs, recompute the cheap ops) gives the same values and every parameter's gradient bit for bit
as whole-layer recomputation and as no recomputation, and its backward does no matmul FLOPs beyond
no recomputation's."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from harness.engine import fastlm, logprobs
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


def _run(model, batch, mode, monkeypatch, prompt_only=False):
    """Values, every parameter's gradient, forward and backward FLOPs of a log-prob loss under ``mode``."""
    p_ids, p_mask, c_ids, c_mask = batch
    if prompt_only:  # no completion input positions: each layer runs the prompt part only
        c_ids, c_mask = c_ids[:, :1], c_mask[:, :1]
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


def test_unknown_recompute_mode_is_refused(monkeypatch):
    tok = build_char_tokenizer()
    model, batch = _model(tok, 2), _batch(tok)
    monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", -1)
    monkeypatch.setattr(fastlm, "RECOMPUTE", "some")
    with pytest.raises(ValueError, match="RECOMPUTE"):
        fastlm.completion_hidden(model, *batch)

