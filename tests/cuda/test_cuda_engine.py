"""The engine on CUDA against the CPU: log-probs and gradients (harness.engine.fastlm's forward for
Llama models, the transformers forward for Qwen2, the bench's model family), KV-cached decoding,
greedy sampling, the sampler's log-prob contract, bfloat16 against float32, and the chunked
log-probs' memory (issue 27.6).

Tolerances (float32 with TF32 off, conftest's ``device`` fixture): log-probs within ``LP_ATOL`` of the
CPU's; gradients within ``GRAD_RTOL`` of the largest entry of each parameter's CPU gradient; bfloat16
log-probs within ``BF16_MAX`` (mean ``BF16_MEAN``) of float32 CPU ones (measured on a CPU in bfloat16:
max 0.0025, mean 0.0006 on the tiny model; a shifted position moves them by ~0.3). Written on a
machine without a GPU: every test has run there only with GRPO_HARNESS_CUDA_TESTS_DEVICE=cpu (CPU
against CPU), none yet on CUDA.
"""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from harness.config.schema import ModelConfig
from harness.engine import fastlm, logprobs
from harness.engine.learner import make_batch, token_logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.sampling import sample

pytestmark = pytest.mark.cuda

LP_ATOL = 1e-4
GRAD_RTOL = 1e-3
BF16_MAX, BF16_MEAN = 0.05, 0.01
MARGIN = 1e-3  # greedy rows compared where every step's top-2 logit gap on the CPU is at least this
PROMPTS = ["Q:1+2\nA:", "Q:33*4-25\nA:", "Q:7\nA:", "Q:9-8*2\nA:"]


def _tiny(tok):
    return build_tiny_model(ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128), tok, seed=1)


def _gqa(tok):
    conf = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64, rope_theta=500.0,
                       tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return LlamaForCausalLM(conf)


def _qwen2(tok):
    """A tiny Qwen2 (q/k/v biases: the transformers forward, as bench/gpu.py's 0.5B shape), biases made non-zero."""
    conf = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rope_theta=1e4,
                       tie_word_embeddings=True, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        model = Qwen2ForCausalLM(conf)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.normal_(0.0, 0.02)
    return model


MODELS = {"tiny": _tiny, "gqa": _gqa, "qwen2": _qwen2}


def _rollout_like(tok, G=3):
    """Left-padded prompts of different lengths, G rows each; completions ending at EOS at different
    places (after 1 token, mid-way, never)."""
    enc = tok(PROMPTS[:3], padding=True, return_tensors="pt")
    p_ids, p_mask = enc["input_ids"].repeat_interleave(G, 0), enc["attention_mask"].repeat_interleave(G, 0)
    B, T = p_ids.shape[0], 9
    c_ids = torch.randint(4, len(tok), (B, T), generator=torch.Generator().manual_seed(0))
    c_mask = torch.ones(B, T, dtype=torch.long)
    for r, e in enumerate([0, 3, 8, None, 5, 1, 2, None, 6][:B]):
        if e is not None:
            c_ids[r, e], c_ids[r, e + 1:], c_mask[r, e + 1:] = tok.eos_token_id, tok.pad_token_id, 0
    return SimpleNamespace(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=c_ids, completion_mask=c_mask)


def _logprobs_and_grads(model, ro, weights, device):
    """The learner's log-probs of ``ro`` (:func:`token_logprobs`) and the gradients of a weighted sum."""
    b = make_batch(ro, device)
    lp = token_logprobs(model, b)
    (lp * weights.to(device) * b.mask).sum().backward()
    return lp.detach().cpu(), {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()}


def _assert_grads_close(got: dict, want: dict, rtol=GRAD_RTOL):
    assert got.keys() == want.keys()
    for n, g in want.items():
        scale = g.abs().max().item()
        err = (got[n] - g).abs().max().item()
        assert err <= rtol * scale + 1e-7, f"{n}: max |diff| {err:.3g} vs max |grad| {scale:.3g}"


@pytest.mark.parametrize("which", sorted(MODELS))
def test_logprobs_and_gradients_on_device_match_cpu(which, device):
    tok = build_char_tokenizer()
    model = MODELS[which](tok)
    assert fastlm.supported(model) == (which != "qwen2")  # the two forward paths are both covered
    on_dev = copy.deepcopy(model).to(device)
    ro = _rollout_like(tok)
    w = torch.randn(ro.completion_ids.shape, generator=torch.Generator().manual_seed(1))
    lp_cpu, g_cpu = _logprobs_and_grads(model, ro, w, "cpu")
    lp_dev, g_dev = _logprobs_and_grads(on_dev, ro, w, device)
    assert (lp_dev - lp_cpu).abs().max().item() <= LP_ATOL
    _assert_grads_close(g_dev, g_cpu)
    assert max(g.abs().max().item() for g in g_cpu.values()) > 1e-4  # not a comparison of zeros


def _hf_logprobs(model, p_ids, p_mask, c_ids):
    ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, torch.ones_like(c_ids)], 1)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, p_ids.shape[1] - 1:-1]
    return logits.float().log_softmax(-1).gather(-1, c_ids[..., None])[..., 0]


def test_decode_state_on_device_matches_cpu_full_forward(device):
    """fastlm's in-place KV cache on the device, rows dropped mid-way, against the CPU's full forward."""
    tok = build_char_tokenizer()
    model = _gqa(tok)
    enc = tok(PROMPTS[:2], padding=True, return_tensors="pt")
    G, T = 3, 6
    seq = torch.randint(4, len(tok), (2 * G, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = _hf_logprobs(model, enc["input_ids"].repeat_interleave(G, 0),
                            enc["attention_mask"].repeat_interleave(G, 0), seq)
        on_dev = copy.deepcopy(model).to(device)
        st = fastlm.DecodeState(on_dev, enc["input_ids"].shape[1] + T)
        logits = st.prefill(enc["input_ids"].to(device), enc["attention_mask"].to(device), G).repeat_interleave(G, 0)
        rows, got = torch.arange(2 * G), torch.zeros_like(full)
        for t in range(T):
            got[rows, t] = logits.float().log_softmax(-1).cpu().gather(-1, seq[rows, t:t + 1])[:, 0]
            if t == 2:  # drop rows 1 and 4: the others go on with a smaller cache
                keep = torch.tensor([0, 2, 3, 5])
                st.keep_rows(keep.to(device))
                rows = rows[keep]
            if t < T - 1:
                logits = st.step(seq[rows, t].to(device))
    assert (got[:, :3] - full[:, :3]).abs().max().item() <= LP_ATOL
    kept = torch.tensor([0, 2, 3, 5])
    assert (got[kept] - full[kept]).abs().max().item() <= LP_ATOL


def _greedy_margins(model, ro) -> torch.Tensor:
    """Per row, the smallest gap between the top two logits (CPU, full forward) over the steps that
    chose its completion tokens: where it is tiny, float rounding may pick the other token."""
    with torch.no_grad():
        ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
        mask = torch.cat([ro.prompt_mask, ro.completion_mask], 1)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, ro.prompt_ids.shape[1] - 1:-1]
        top2 = logits.float().topk(2, -1).values
        gap = (top2[..., 0] - top2[..., 1]).masked_fill(ro.completion_mask == 0, float("inf"))
    return gap.min(1).values


@pytest.mark.parametrize("which", ["tiny", "qwen2"])
def test_greedy_decode_on_device_equals_cpu(which, device):
    tok = build_char_tokenizer()
    model = MODELS[which](tok).eval()
    cpu = sample(model, tok, PROMPTS, n=1, max_new_tokens=24, greedy=True, offsets=False)
    dev = sample(copy.deepcopy(model).to(device), tok, PROMPTS, n=1, max_new_tokens=24, greedy=True, offsets=False)
    assert dev.completion_ids.device.type == device.type
    clear = (_greedy_margins(model, cpu) >= MARGIN).tolist()
    assert sum(clear) >= len(PROMPTS) // 2, "too many near-ties to compare"
    for r, ok in enumerate(clear):
        if ok:
            assert dev.completions[r] == cpu.completions[r]
            assert dev.completion_ids[r].cpu().tolist() == cpu.completion_ids[r].tolist()
            assert dev.completion_mask[r].cpu().tolist() == cpu.completion_mask[r].tolist()


@pytest.mark.parametrize("which", ["tiny", "qwen2"])
def test_sampler_logprobs_on_device_equal_the_learners_recomputation(which, device):
    """The contract the learner relies on (the sampler's log-probs stand in for the old policy's),
    on the device, at a temperature other than 1; and the same seed gives the same samples."""
    tok = build_char_tokenizer()
    model = MODELS[which](tok).to(device)
    ro = sample(model, tok, PROMPTS[:2], n=4, max_new_tokens=16, temperature=0.8, seed=3, offsets=False)
    with torch.no_grad():
        lp = token_logprobs(model, make_batch(ro, device), temperature=0.8) * ro.completion_mask
    assert (lp - ro.logprobs).abs().max().item() <= LP_ATOL
    again = sample(model, tok, PROMPTS[:2], n=4, max_new_tokens=16, temperature=0.8, seed=3, offsets=False)
    assert again.completions == ro.completions and ro.num_tokens > 0


@pytest.mark.parametrize("which", ["tiny", "qwen2"])
def test_bf16_logprobs_on_device_are_close_to_float32_cpu(which, device):
    tok = build_char_tokenizer()
    model = MODELS[which](tok)
    ro = _rollout_like(tok)
    with torch.no_grad():
        ref = token_logprobs(model, make_batch(ro, "cpu"))
        got = token_logprobs(copy.deepcopy(model).to(device, torch.bfloat16), make_batch(ro, device)).float().cpu()
    d = (got - ref)[ro.completion_mask.bool()].abs()
    assert d.max().item() <= BF16_MAX and d.mean().item() <= BF16_MEAN, (d.max().item(), d.mean().item())


def test_chunked_logprobs_on_cuda_match_full_and_use_a_fraction_of_the_logits_memory(cuda_only):
    """4,096 rows x SmolLM2's 49,152-token vocabulary: the full float32 logits are 768 MiB. The
    chunked path (32 MiB of logits at a time, forward and backward) must peak under a quarter of
    that above its inputs, and agree with the full path in values and gradients."""
    dev = cuda_only
    R, d, V = 4096, 64, 49152
    full_bytes = R * V * 4
    g = torch.Generator().manual_seed(0)
    h = torch.randn(R, d, generator=g).to(dev).requires_grad_()
    w = (torch.randn(V, d, generator=g) * 0.05).to(dev).requires_grad_()
    t = torch.randint(0, V, (R,), generator=g).to(dev)
    gout = torch.randn(R, generator=g).to(dev)

    def run(fn):
        h.grad = w.grad = None
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        lp = fn(h, w, t)
        (lp * gout).sum().backward()
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) - base, lp.detach(), h.grad.clone(), w.grad.clone()

    peak_c, lp_c, gh_c, gw_c = run(logprobs.chunked_logprobs)
    peak_f, lp_f, gh_f, gw_f = run(logprobs.full_logprobs)
    assert peak_f >= full_bytes  # the measure sees the full path's logits
    assert peak_c < full_bytes / 4, f"chunked peak {peak_c / 2**20:.0f} MiB above its inputs"
    assert (lp_c - lp_f).abs().max().item() <= LP_ATOL
    _assert_grads_close({"h": gh_c.cpu(), "w": gw_c.cpu()}, {"h": gh_f.cpu(), "w": gw_f.cpu()})
