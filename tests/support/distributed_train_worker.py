"""Run under ``torchrun --nproc_per_node=2`` by tests/test_distributed_train.py (CPU, gloo,
``DS_ACCELERATOR=cpu``): the real trainer (:func:`harness.train.loop.train`) for each case
given on the command line, one after another in the same process group.

``argv[1]``: JSON list of cases ``{"name", "mode": "zero2"|"zero3"|"ddp", "overrides": [...],
"crash_at_step": int (optional)}``; ``argv[2]``: folder for ``rank<r>.json``. A case with
``crash_at_step = k`` first raises on every rank as stage k starts learning, then trains
again with ``resume=True``: the run picks up from its last checkpoint. A case with
``"kind": "learner"`` runs one learner step on fixed rollouts instead (see
:func:`run_learner_case`). ``DT_DUMP=<seconds>`` in the environment dumps every rank's
stack and exits after that long (to locate a collective that one rank never joins).
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import copy  # noqa: E402
import dataclasses  # noqa: E402

import torch  # noqa: E402

import harness.train.loop as trainer  # noqa: E402
from algorithms.presets import resolve  # noqa: E402
from harness.config.schema import ModelConfig, load_config  # noqa: E402
from harness.engine.learner import Learner  # noqa: E402
from harness.engine.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from harness.engine.perf import PerfTracker  # noqa: E402
from harness.rundir.layout import read_jsonl  # noqa: E402
from harness.engine.sampling import sample  # noqa: E402

ZERO = {"zero2": "2", "zero3": "3", "ddp": ""}


class Crash(RuntimeError):
    pass


def fresh_state() -> None:
    """A new Accelerator per run in this process (the launcher starts one process per run)."""
    from accelerate.state import AcceleratorState
    from transformers.integrations import unset_hf_deepspeed_config
    AcceleratorState._reset_state(True)
    unset_hf_deepspeed_config()


def rows_of(ro, rows: list[int]):
    """The rollouts of ``rows`` (lists sliced, tensors indexed on their first dimension)."""
    idx = torch.tensor(rows)
    return dataclasses.replace(ro, **{
        f.name: ([getattr(ro, f.name)[i] for i in rows] if isinstance(getattr(ro, f.name), list) and getattr(ro, f.name)
                 else getattr(ro, f.name)[idx] if torch.is_tensor(getattr(ro, f.name)) else getattr(ro, f.name))
        for f in dataclasses.fields(ro)})


SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PROMPTS = ["Q:1+2\nA:", "Q:3*4-1\nA:", "Q:5+5\nA:", "Q:2*3\nA:"]
LEARNER_REWARDS = {
    # GRPO: mixed groups on both ranks (rank r takes groups r, r+2)
    "grpo": [1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1],
    # RFT: groups 1 and 3 (rank 1's) all wrong -> rank 1 keeps nothing, pads its micro-batches
    "rft": [1, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0],
}


def run_learner_case(case: dict) -> dict:
    """One learner step on fixed rollouts: each rank its groups through ``dist``, against
    a single-process step on all of them (computed on every rank, no ``dist``)."""
    fresh_state()
    os.environ["HARNESS_ZERO_STAGE"] = ZERO[case["mode"]]
    tok = build_char_tokenizer()
    res: dict = {"name": case["name"], "rank": int(os.environ["RANK"])}
    base = ["device=cpu", "train.micro_batch_size=3", "train.lr=1e-3"]
    dist = trainer.make_distributed(load_config(None, base))
    for algo_name, rewards in LEARNER_REWARDS.items():
        cfg = load_config(None, base + [f"algorithm={algo_name}"])
        algo = resolve(cfg.algorithm)
        ro = sample(build_tiny_model(SMALL, tok, seed=1), tok, PROMPTS, n=4, max_new_tokens=10, seed=3)
        r = torch.tensor(rewards, dtype=torch.float32)
        out = {}
        for how in ("single", "dist"):
            policy = build_tiny_model(SMALL, tok, seed=1)
            ref = copy.deepcopy(policy).requires_grad_(False) if algo.uses_reference else None
            if how == "single":
                out[how] = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref).step(ro, r, [], 0)
            else:
                rows = [i for g in range(len(PROMPTS)) if g % dist.world_size == dist.rank for i in range(4 * g, 4 * g + 4)]
                learner = Learner(policy, algo, cfg, dist.device, PerfTracker(), reference=ref, dist=dist)
                out[how] = learner.step(rows_of(ro, rows), r[rows], [], 0, valid=torch.ones(len(rows), dtype=torch.bool))
        res[algo_name] = out
    return res


def run_case(case: dict) -> dict:
    if case.get("kind") == "learner":
        return run_learner_case(case)
    fresh_state()
    os.environ["HARNESS_ZERO_STAGE"] = ZERO[case["mode"]]
    os.environ.pop("HARNESS_DEEPSPEED_CONFIG", None)
    cfg = load_config(None, case["overrides"])
    t0 = time.time()
    res: dict = {"name": case["name"], "rank": int(os.environ["RANK"])}
    crash = case.get("crash_at_step")
    if crash is not None:  # first attempt: every rank raises at the start of stage `crash`
        real = trainer.Learner.step

        def flaky(self, rollouts, rewards, step_rewards, step, **kw):
            if step == crash:
                raise Crash(f"injected at step {step}")
            return real(self, rollouts, rewards, step_rewards, step, **kw)
        trainer.Learner.step = flaky
        try:
            trainer.train(cfg, progress=False)
            res["crashed"] = None
        except Crash as e:
            res["crashed"] = str(e)
        finally:
            trainer.Learner.step = real
        res["status_after_crash"] = (json.loads((trainer.run_dir(cfg) / "summary.json").read_text())["status"]
                                     if res["rank"] == 0 else None)
        fresh_state()
    summary = trainer.train(cfg, progress=False)
    res["seconds"] = time.time() - t0
    res["summary"] = summary
    run_dir = trainer.run_dir(cfg)
    res["run_dir"] = str(run_dir)
    res["metrics"] = read_jsonl(run_dir / "metrics.jsonl")
    return res


def main() -> None:
    if os.environ.get("DT_DUMP"):
        import faulthandler
        faulthandler.dump_traceback_later(int(os.environ["DT_DUMP"]), exit=True)
    cases = json.loads(sys.argv[1])
    out_dir = Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    results = {}
    for case in cases:
        try:
            results[case["name"]] = run_case(case)
        except Exception:
            results[case["name"]] = {"error": traceback.format_exc()}
            (out_dir / f"rank{rank}.json").write_text(json.dumps(results, indent=1, default=str))
            raise
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
