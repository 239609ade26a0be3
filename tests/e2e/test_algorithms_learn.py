"""Every algorithm, on the same backbone, must raise held-out accuracy on an easy arith setting.

One un-annealed supervised warm-up (shared by every algorithm through the warm-up cache)
on imperfect demonstrations (60% of worked solutions ignore precedence) gives a small model
that is right on 18% of the held-out problems; each algorithm then trains from it for the
same 5,120 samples and its final greedy accuracy must beat the start by 5 points. Fixed seeds
on CPU make each run deterministic.

Each algorithm runs at a learning rate that is stable for it (as in sweeps/quickstart.yaml):
1e-3, except grpo_ps and rft at 4e-4. Measured over seeds 0-3 at 1e-3, grpo_ps moved
-4.0 to +5.3 points (its token advantage sums the normalised rewards of every later step, so
its scale grows with the number of steps) and rft -2.0 to +5.3 (it learns from the ~10
correct samples of a step: a noisier gradient); at 4e-4, seeds 0-2: grpo_ps +10.0 to +12.7,
rft +6.7 to +14.7. GRPO at 1e-3: +12.7 to +14.7.

Marked slow and out of the default run since 2026-11-23: on the current 2-core CI machine kind
the same warm-up lands at 30.0% held-out accuracy (not 18%), and from there no algorithm gains
5 points in 5,120 samples - with the code before the 2026-11-23 layout change too (GRPO
0.300 -> 0.273) - nor with lr 1e-4 / 3e-4 / 1e-3, the warm-up's optimizer state, 10,240 samples,
32 prompts per step, 200 warm-up steps, demo_error_rate 0.3, temperature 0.7 or the transformers
forward instead of fastlm (GRPO finals 0.200-0.307). The quickstart (0.87M model, 32 prompts x 8)
does learn on this machine. Re-calibrating this test is open work (issue: algorithm fidelity).
Run it with `python -m pytest -m slow tests/e2e/test_algorithms_learn.py`.
"""
import pytest

from algorithms.presets import ALGORITHMS
from harness.config.schema import load_config
from harness.train.loop import train

EASY = [
    "model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=192",
    "task.min_ops=2", "task.max_ops=3", "task.operators=+*", "task.max_operand=4", "task.eval_size=150",
    "task.demo_error_rate=0.6",
    "warmup.steps=400", "warmup.examples_per_step=32", "warmup.lr=3e-3", "warmup.final_lr_fraction=1.0",
    "sampling.samples_per_prompt=8", "sampling.max_new_tokens=24",
    "train.prompts_per_step=16", "train.lr=1e-3", "train.lr_schedule=cosine", "train.threads=1",
    "budget.unit=samples", "budget.amount=5120", "budget.eval_points=1",
    "train.save_final_model=false",
]
ACC = "eval/arith/acc"


@pytest.fixture(scope="module")
def results(tmp_path_factory, warm_cache):
    return tmp_path_factory.mktemp("learn")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_algorithm_raises_heldout_accuracy(algorithm, results, warm_cache):
    extra = {"ppo": ["algorithm.critic_lr=1e-3"], "grpo_ps": ["train.lr=4e-4"], "rft": ["train.lr=4e-4"]}.get(algorithm, [])
    cfg = load_config(None, EASY + extra + [f"algorithm={algorithm}", f"output_dir={results}",
                                            f"warmup.cache_dir={warm_cache}", "name=learn"])
    s = train(cfg, progress=False)
    a0, a1 = s["initial_eval"][ACC], s["final_eval"][ACC]
    print(f"{algorithm}: {a0:.3f} -> {a1:.3f}")
    assert s["status"] == "finished"
    assert s["budget"]["consumed"]["samples"] == 5120  # matched budget, exactly
    assert 0.1 < a0 < 0.8, f"warm-up start {a0} outside the range this test is designed for"
    assert a1 >= a0 + 0.05, f"{algorithm}: held-out accuracy {a0:.3f} -> {a1:.3f}"
    # memory honesty: what each algorithm holds
    p = s["params"]
    assert p["reference"] == (p["policy"] if ALGORITHMS[algorithm]["kl_placement"] != "none" else 0)
    assert p["critic"] == (p["policy"] + 64 + 1 if algorithm == "ppo" else 0)  # backbone copy + scalar head
