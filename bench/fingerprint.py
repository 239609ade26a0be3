"""The product's numerics fingerprint: a hash of what each kernel the harness calls returns, in the harness's own
call pattern, and of short real runs, in portable numerics. Two machines that print the same values compute the
same bits; an entry that differs names the kernel (or the stage of a run) that is not portable yet.

    python bench/fingerprint.py                                   # print the fingerprint (JSON) of this machine
    python bench/fingerprint.py --check bench/fingerprint.json    # compare with the committed one: exit 1 on a difference
    python bench/fingerprint.py --write bench/fingerprint.json    # record this machine's as the committed one

Entries (each at 1 and 2 threads, as runs use both):
- ``kernel/...``: the built-in tiny model at the quickstart's shape (seed 0, no training) through the harness's own
  paths: the sampler (``harness.engine.sampling.sample``, seeded), the training forward and backward of
  ``harness.engine.learner.token_logprobs`` (fastlm) and the same through the transformers forward
  (``fastlm.disabled``), gradient clipping and AdamW as the learner configures them, greedy decoding as the
  evaluator runs it;
- ``run/...``: short real runs of the quickstart config through ``harness.train.loop.train`` (an 80-step warm-up,
  its evaluation, 2 RL steps of 4 prompts x 4 samples, the final evaluation): the warm-up checkpoint's and the
  final weights' sha256 and every metric row but wall-clock ones, for GRPO, PPO (its critic) and online RFT;
- ``stats/...``: the reports' numpy / scipy statistics on fixed data (hierarchical bootstrap, maj@k, a compute-
  curve fit).

The committed values (``bench/fingerprint.json``) name the machine that made them; `tests/bench/test_fingerprint.py`
compares this machine's with them. Runs in about a minute on 2 cores.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from _common import NUMERICS, ROOT, numerics  # pins the numerics (portable by default) before torch or numpy load

import numpy as np  # noqa: E402
import torch  # noqa: E402

from evals.metrics import maj_at_k_curve  # noqa: E402
from harness.config.schema import load_config  # noqa: E402
from harness.engine import fastlm  # noqa: E402
from harness.engine.learner import make_batch, token_logprobs  # noqa: E402
from harness.engine.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from harness.engine.sampling import sample  # noqa: E402
from harness.report.curvefit import fit_curve  # noqa: E402
from harness.report.stats import hierarchical_bootstrap  # noqa: E402
from harness.train.loop import train  # noqa: E402

EXPECTED = Path(__file__).with_name("fingerprint.json")
CONFIG = ROOT / "harness" / "configs" / "quickstart.yaml"
NOT_BITS = ("perf/", "time", "seconds")  # wall-clock figures: the only metric values allowed to differ
RUN_SETS = ["warmup.steps=80", "warmup.examples_per_step=32", "train.prompts_per_step=4",
            "sampling.samples_per_prompt=4", "budget.amount=32", "budget.eval_points=1", "task.eval_size=20",
            "eval.n=2", "device=cpu", f"numerics={NUMERICS}"]


def _digest(*items) -> str:
    m = hashlib.sha256()
    for x in items:
        if isinstance(x, torch.Tensor):
            m.update(x.detach().contiguous().cpu().numpy().tobytes())
        elif isinstance(x, np.ndarray):
            m.update(np.ascontiguousarray(x).tobytes())
        else:
            m.update(json.dumps(x, sort_keys=True, default=str).encode())
    return m.hexdigest()[:16]


def kernels(threads: int) -> dict:
    numerics.enter(NUMERICS, threads)
    cfg = load_config(str(CONFIG), ["device=cpu"])
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model, tok, seed=0)
    prompts = [f"{a}+{b}*{c}=" for a, b, c in ((1, 2, 3), (4, 5, 6), (7, 8, 9), (2, 9, 4), (6, 1, 8), (3, 3, 7))]
    p = f"kernel/t{threads}/"
    out = {}
    with torch.no_grad():
        r = sample(model, tok, prompts, n=8, max_new_tokens=cfg.sampling.max_new_tokens, temperature=1.0, seed=7)
    out[p + "sampler (prefill, KV-cached decode, multinomial)"] = _digest(r.completion_ids, r.logprobs)
    b = make_batch(r, "cpu")
    for name, ctx in (("fastlm", None), ("transformers", fastlm.disabled())):
        model.zero_grad(set_to_none=True)
        if ctx is None:
            lp = token_logprobs(model, b)
        else:
            with ctx:
                lp = token_logprobs(model, b)
        (lp * b.mask).sum().backward()
        out[p + f"train forward+backward ({name})"] = _digest(lp, *[q.grad for q in model.parameters()])
    opt = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=cfg.train.weight_decay, betas=(0.9, 0.99))
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    out[p + "clip_grad_norm + AdamW step"] = _digest(gn, *model.parameters())
    with torch.no_grad():
        g = sample(model, tok, prompts, n=1, max_new_tokens=cfg.sampling.max_new_tokens, greedy=True)
    out[p + "greedy decode (evaluator)"] = _digest(g.completion_ids, g.logprobs)
    return out


def runs(tmp: Path) -> dict:
    out = {}
    cases = [("grpo", 1, True), ("ppo", 1, True), ("rft", 1, True), ("grpo", 2, True), ("grpo", 1, False)]
    for algo, threads, fast in cases:
        name = f"run/{algo} t{threads}" + ("" if fast else " (transformers forward)")
        d = tmp / name.replace("/", "_").replace(" ", "_").replace("(", "").replace(")", "")
        cfg = load_config(str(CONFIG), RUN_SETS + [f"algorithm={algo}", f"train.threads={threads}",
                                                   f"warmup.threads={threads}", f"output_dir={d}", "name=fp",
                                                   f"warmup.cache_dir={tmp / 'warmup'}"])
        torch.manual_seed(0)
        if fast:
            s = train(cfg, progress=False)
        else:
            with fastlm.disabled():
                s = train(cfg, progress=False)
        assert any(r.get("train/grad_norm", 0) > 0 for r in [json.loads(x) for x in
                   (next(d.glob("fp/*/metrics.jsonl"))).read_text().splitlines()]), f"{name}: no learning signal"
        run = next(d.glob("fp/*/summary.json")).parent
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rows = [{k: v for k, v in r.items() if not any(k.startswith(t) or k.endswith(t) for t in NOT_BITS)}
                for r in rows]
        warm = Path(s["start"]["source"]) / "model.safetensors"
        out[name + ": warm-up checkpoint"] = hashlib.sha256(warm.read_bytes()).hexdigest()[:16]
        out[name + ": final weights"] = hashlib.sha256((run / "final_model" / "model.safetensors")
                                                       .read_bytes()).hexdigest()[:16]
        out[name + ": metric rows"] = _digest(rows)
        out[name + ": accuracy start, end"] = f"{s['initial_eval']['eval/arith/acc']}, {s['final_eval']['eval/arith/acc']}"
    return out


def stats() -> dict:
    rng = np.random.default_rng(11)
    per_seed = [rng.integers(0, 2, size=200).astype(float) - rng.integers(0, 2, size=200) for _ in range(6)]
    draws = hierarchical_bootstrap(per_seed, n_boot=2000, rng=np.random.default_rng(3))
    out = {"stats/hierarchical bootstrap": _digest(np.asarray(draws, dtype=float))}
    keys = [int(v) for v in rng.integers(0, 5, size=64)]
    out["stats/maj@k curve (n=64)"] = _digest(np.asarray(maj_at_k_curve(keys, [k == 2 for k in keys]), dtype=float))
    c = np.array([256, 512, 1024, 2048, 4096, 8192, 16384, 32768], dtype=float)
    y = 0.55 + 0.2 / (1 + (3000 / c) ** 1.3) + rng.normal(0, 0.004, size=c.size)
    c, y = np.concatenate([[0.0], c]), np.concatenate([[0.55], y])  # R0 from the C = 0 point, as the study
    f = fit_curve(c, y)
    out["stats/compute-curve fit"] = _digest([float(v) for v in (f.r0, f.a, f.b, f.c_mid, f.sse)])
    return out


PARTS = ("kernel", "run", "stats")


def fingerprint(parts=PARTS) -> dict:
    out = {}
    if "kernel" in parts:
        for t in (1, 2):
            out.update(kernels(t))
    if "run" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            out.update(runs(Path(tmp)))
    if "stats" in parts:
        out.update(stats())
    st = numerics.state(NUMERICS)
    cpu = numerics.cpu_info()
    out["_machine"] = {"cpu": cpu["model"], "vendor": cpu["vendor"], "isa": cpu["isa"], "numerics": NUMERICS,
                       "portable": st["portable"], "why": st["why"], "matmul": st["matmul"],
                       "aten": st["aten_capability"], "numpy": st["numpy_simd"]}
    out["_versions"] = {"torch": torch.__version__, "numpy": np.__version__}
    return out


def compare(mine: dict, expected: dict, parts=PARTS) -> list[str]:
    """The entries of ``parts`` whose values differ (or are missing on one side)."""
    keys = sorted(k for k in set(mine) | set(expected) if not k.startswith("_") and k.split("/")[0] in parts)
    return [k for k in keys if mine.get(k) != expected.get(k)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--check", metavar="FILE", help="compare with FILE (exit 1 and name each entry that differs)")
    g.add_argument("--write", metavar="FILE", help="write this machine's fingerprint to FILE")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts to compute (default: all of "
                    f"{', '.join(PARTS)})")
    a = ap.parse_args()
    parts = tuple(p for p in a.only.split(",") if p)
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        ap.error(f"--only takes parts among {', '.join(PARTS)} (got {a.only!r})")
    mine = fingerprint(parts)
    if a.write:
        Path(a.write).write_text(json.dumps(mine, indent=1, sort_keys=True) + "\n")
    if not a.check:
        print(json.dumps(mine, indent=1, sort_keys=True))
        return 0
    expected = json.loads(Path(a.check).read_text())
    diff = compare(mine, expected, parts)
    print(f"this machine: {mine['_machine']['cpu']} ({mine['_machine']['vendor']})")
    print(f"{a.check}: {expected.get('_machine', {}).get('cpu', '?')} ({expected.get('_machine', {}).get('vendor', '?')})")
    print(f"numerics: {NUMERICS}; {len(compare(mine, {}, parts)) - len(diff)} entries equal, {len(diff)} differ")
    for k in diff:
        print(f"  differs: {k}: {mine.get(k)} here, {expected.get(k)} there")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
