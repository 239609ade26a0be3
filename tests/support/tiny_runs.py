"""Tiny training runs for tests of the run lifecycle (resume, corrupt files, identity): a 1-layer, 16-wide model,
2 prompts x 2 samples, 4-token completions, 4 steps with evaluations at 2 and 4 (a checkpoint at step 2)."""
from __future__ import annotations

import pytest

TINY_RUN = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=4", "warmup.steps=0",
    "sampling.samples_per_prompt=2", "sampling.max_new_tokens=4", "train.prompts_per_step=2",
    "train.threads=1", "budget.unit=steps", "budget.amount=4", "budget.eval_points=2",
    "train.save_final_model=false", "eval.greedy=true", "eval.n=0", "train.checkpoint_minutes=0",
]


def stop_before_stage(cfg, k: int = 2) -> None:
    """Train ``cfg`` and stop it (a KeyboardInterrupt, as Ctrl-C) when stage ``k`` would start: the run is left
    ``interrupted`` with its last resume point (step 2 for ``TINY_RUN``)."""
    from harness.train import loop

    real = loop._stage

    def stage(run, i):
        if i == k:
            raise KeyboardInterrupt("injected stop")
        return real(run, i)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "_stage", stage)
        with pytest.raises(KeyboardInterrupt):
            loop.train(cfg, progress=False)


def run_result(cfg) -> tuple[list, str]:
    """(the metrics rows of ``cfg``'s finished run without timings, sha256 of its final model's weights): what a
    resumed run must reproduce."""
    import hashlib
    import json

    from harness.train import loop

    def timing(key: str) -> bool:
        return key.startswith("perf/") or key in ("time", "seconds") or key.endswith("/seconds")

    out = loop.run_dir(cfg)
    rows = [{k: v for k, v in json.loads(line).items() if not timing(k)} for line in open(out / "metrics.jsonl")]
    return rows, hashlib.sha256((out / "final_model" / "model.safetensors").read_bytes()).hexdigest()
