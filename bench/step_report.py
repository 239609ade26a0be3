"""One run, one table: ours vs TRL at both issue-29 shapes (s/step, x floor, peak memory above base) and the quickstart's wall time.

Method
------
1. Each shape is ``bench/grpo_step.py``'s forced-length setting, run by its own functions
   (``grpo_step.run_setting``): alternating rounds of fresh worker processes, ours then TRL, the
   order flipped every round, medians over the timed steps, the sgemm roof measured at the shape's
   thread count. Shapes (``profile_step.SHAPES``): ``small`` = the default 0.87M model, 16 prompts x
   G 8 x 24 tokens, 1 thread; ``27m`` = hidden 512, 8 layers, 8 heads, MLP 1536, 128 tokens, 2
   threads; ``toy`` (tests). TRL's extra settings (static cache, paged) are not run here.
2. The quickstart: ``harness quickstart --output-dir TMP --set warmup.cache_dir=TMP/cache
   --no-progress`` in a fresh process from an empty cache (warm-up, GRPO / PPO / RFT, report),
   timed wall to wall; its last lines (the accuracy table) are printed. ``--no-quickstart`` skips
   it (about 6 minutes on a quiet 2-core machine); ``--quickstart-set KEY=VALUE`` passes overrides.
   Beside its wall time, its **compute floor**: the warm-up's model FLOPs (replayed,
   ``harness.train.warmup.warmup_flops``) plus every run's training FLOPs at all CPUs' 1-thread
   sgemm roof, the runs' counted ``perf/flops`` (model FLOPs, every row's prompt counted) scaled to
   the work the code executes (each group's prompt once: `executed_run_flops`); a lower bound
   (evaluation and rewards are not counted, and no schedule keeps every core at the roof). The
   model FLOPs' time is printed beside it. ``--floor-of DIR``
   prints only that for an existing quickstart output folder.
3. The summary table at the end: per shape ours and TRL s/step [round min-max], x floor, ours/TRL
   (and the FLOP ratio), peak RSS above each worker's post-import RSS, tokens equal; then the
   quickstart's wall time; with the date, the CPU, the numerics mode and the load average at the
   start, the end and after every worker (a warning when it exceeds the CPU count).

Run:  python bench/step_report.py                                   # both shapes + the quickstart
      python bench/step_report.py --no-quickstart --rounds 2 --json results/bench/step_report.json
      python bench/step_report.py --shapes toy --rounds 1 --warmup 0 --steps 1 --no-quickstart   # seconds
      python bench/step_report.py --floor-of results                  # the floor of a finished quickstart
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

from _common import ROOT, finish, fmt, fmt_spread, loadavg, numerics_line, print_table, sgemm_roof  # first: numerics
from evals.catalog import get_task
from harness.config.schema import load_config
from harness.engine.models import build_char_tokenizer, build_tiny_model, num_params, save_policy
from harness.foundation import numerics
from harness.report.study_data import STAGE_FLOPS
from harness.rundir.read import load_run
from harness.train.stage import stage_problems
from harness.train.warmup import warmup_flops

import grpo_step  # its workers and tables (bench/ is sys.path[0])
import profile_step  # the shapes


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="small,27m", help=f"comma list of {', '.join(profile_step.SHAPES)}")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per shape")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per worker")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per worker")
    ap.add_argument("--no-quickstart", action="store_true", help="skip the quickstart's timing")
    ap.add_argument("--quickstart-set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for the timed quickstart (passed as --set)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per worker and for the quickstart")
    ap.add_argument("--json", metavar="OUT", help="also write the figures to this JSON file")
    ap.add_argument("--floor-of", metavar="DIR",
                    help="only print the compute floor of the finished quickstart under DIR (its --output-dir)")
    return ap.parse_args(argv)


def shape_argv(a, shape: str) -> list[str]:
    """grpo_step.py's command line for ``shape``: forced length, ours and TRL only."""
    s = {"prompts": 16, "group": 8, "micro_batch": 64, **profile_step.SHAPES[shape]}
    return ["--rounds", str(a.rounds), "--warmup", str(a.warmup), "--steps", str(a.steps), "--threads",
            str(s["threads"]), "--length", "forced", "--trl-settings", "", "--prompts", str(s["prompts"]),
            "--group", str(s["group"]), "--max-new-tokens", str(s["max_new_tokens"]), "--micro-batch",
            str(s["micro_batch"]), "--timeout", str(a.timeout), *[x for kv in s["model"] for x in ("--model", kv)]]


def run_shape(a, shape: str, errors: list, loads: list) -> dict:
    """grpo_step.py's forced setting of ``shape`` (its rounds, table and ratio lines); its figures."""
    g = grpo_step.parse_args(shape_argv(a, shape))
    threads = int(g.threads)
    mcfg = load_config(None, [f"model.{kv}" for kv in g.model]).model
    tok = build_char_tokenizer()
    model = build_tiny_model(mcfg, tok, seed=g.seed)
    n_params = num_params(model)
    roof = sgemm_roof(threads)
    print(f"\n# shape {shape}: {n_params / 1e6:.2f}M params, {g.prompts} prompts x G {g.group} x {g.max_new_tokens} "
          f"tokens, {threads} thread(s)", flush=True)
    with tempfile.TemporaryDirectory(prefix="step-report-model-") as mdir:
        save_policy(model, tok, mdir)
        res = grpo_step.run_setting(g, mdir, threads, "forced", roof, errors, loads)
    res["params"], res["threads"], res["roof"] = n_params, threads, roof
    return res


def executed_run_flops(run, cfg, task, tok) -> float:
    """A run's counted FLOPs with each group's prompt counted once instead of once per sample: the model
    FLOPs (``harness.train.flops``) count every row's prompt, while the sampler prefills each distinct
    prompt once and the fast forward computes it once per group (``harness.engine.fastlm``), so this is
    the work the code executes. Per stage, the counted FLOPs are scaled by (P + C) / (G P + C), P the
    stage's prompt tokens (its problems replayed: ``stage_problems`` at the row's step - 1, formatted and
    tokenized), C its completion tokens (the row's ``tokens``), G the samples per prompt; the small
    attention term is scaled alike. For RFT's update on its kept samples only, the same ratio is an
    approximation (its groups keep fewer than G rows)."""
    G = cfg.sampling.samples_per_prompt
    total = 0.0
    for r in run.rows:
        f = float(r.get(STAGE_FLOPS) or 0.0)
        if not f:
            continue
        problems = stage_problems(task, cfg.seed, int(r["step"]) - 1, max(1, int(r["samples"]) // G))
        p = float(sum(len(tok(task.format_prompt(q)).input_ids) for q in problems))
        c = float(r["tokens"])
        total += f * (p + c) / (G * p + c)
    return total


def quickstart_floor(out_dir: str, roof_1thread: float, cores: int) -> dict:
    """The compute floor of the finished quickstart under ``out_dir`` (its ``--output-dir``), in seconds at
    ``cores`` x the 1-thread sgemm roof (GFLOP/s), two ways: the model FLOPs (the warm-up's, replayed from
    its config, plus the sum of ``perf/flops`` over each run's metrics.jsonl), and the work the code
    executes (the runs' FLOPs with each group's prompt once, `executed_run_flops`; the warm-up's rows are
    distinct, so its count is the same). The second is the lower bound: evaluation and rewards are not
    counted, and the warm-up and the runs' schedule cannot keep every core at the roof."""
    runs = sorted(glob.glob(os.path.join(out_dir, "quickstart", "*", "metrics.jsonl")))
    if not runs:
        raise SystemExit(f"--floor-of: no quickstart run (quickstart/*/metrics.jsonl) under {out_dir}")
    per_run, executed, cfgs = {}, {}, []
    tok = build_char_tokenizer()
    for m in runs:
        run = load_run(os.path.dirname(m))
        cfgs.append(load_config(os.path.join(os.path.dirname(m), "config.yaml")))
        per_run[run.run_dir.name] = sum(float(r.get(STAGE_FLOPS, 0.0)) for r in run.rows)
        executed[run.run_dir.name] = executed_run_flops(run, cfgs[-1], get_task(cfgs[-1].task), tok)
    warm = warmup_flops(cfgs[0], get_task(cfgs[0].task))
    total, total_exec = warm + sum(per_run.values()), warm + sum(executed.values())
    rate = cores * roof_1thread * 1e9
    return {"warmup_flops": warm, "run_flops": per_run, "total_flops": total, "roof_1thread_gflops": roof_1thread,
            "cores": cores, "model_floor_seconds": total / rate, "executed_run_flops": executed,
            "executed_flops": total_exec, "floor_seconds": total_exec / rate}


def print_floor_line(fl: dict, wall: float | None = None) -> None:
    runs = ", ".join(f"{k.split('-')[0]} {v / 1e12:.2f}" for k, v in fl["run_flops"].items())
    ex = ", ".join(f"{k.split('-')[0]} {v / 1e12:.2f}" for k, v in fl["executed_run_flops"].items())
    at = f"at {fl['cores']} x {fl['roof_1thread_gflops']:.1f} GFLOP/s (1-thread sgemm roof)"
    line = (f"quickstart compute floor: model FLOPs warm-up {fl['warmup_flops'] / 1e12:.2f} + runs ({runs}) = "
            f"{fl['total_flops'] / 1e12:.2f} TFLOP {at} = {fl['model_floor_seconds']:.0f} s; the work executed (each "
            f"group's prompt once): warm-up {fl['warmup_flops'] / 1e12:.2f} + runs ({ex}) = "
            f"{fl['executed_flops'] / 1e12:.2f} TFLOP = {fl['floor_seconds']:.0f} s ({fl['floor_seconds'] / 60:.1f} min; "
            f"the floor, a lower bound: evaluation not counted)")
    if wall:
        line += (f"; wall time {wall / fl['floor_seconds']:.1f} x the floor "
                 f"({wall / fl['model_floor_seconds']:.1f} x the model FLOPs' time)")
    print(line, flush=True)


def time_quickstart(a) -> dict:
    """Wall seconds of ``harness quickstart`` from an empty cache in a fresh process; its last lines."""
    with tempfile.TemporaryDirectory(prefix="step-report-qs-") as td:
        cmd = [sys.executable, "-m", "harness.cli.main", "quickstart", "--output-dir", td, "--no-progress",
               "--set", f"warmup.cache_dir={td}/cache", *[x for kv in a.quickstart_set for x in ("--set", kv)]]
        la0, t0 = loadavg(), time.perf_counter()
        proc = subprocess.run(cmd, cwd=str(ROOT), capture_output=True,
                              text=True, timeout=a.timeout)
        wall = time.perf_counter() - t0
        floor = (quickstart_floor(td, sgemm_roof(1), os.cpu_count() or 1)
                 if proc.returncode == 0 else None)
    tail = proc.stdout.strip().splitlines()[-14:]
    return {"seconds": wall, "returncode": proc.returncode, "tail": tail, "loadavg": [la0, loadavg()],
            "command": " ".join(cmd[1:]), "floor": floor, "stderr_tail": proc.stderr[-2000:] if proc.returncode else ""}


def _side(summ: dict, c: str) -> list[str]:
    s = summ.get(c)
    if not s:
        return ["-", "-", "-"]
    return [fmt_spread(s["round_median_step_seconds"]), fmt_spread(s["round_x_floor"], ".1f"),
            fmt(s["median_peak_above_base_mb"], ".0f")]


def summary_table(shapes: dict) -> None:
    rows = []
    for shape, r in shapes.items():
        summ, cmp = r["summary"], r["compare"].get("trl", {})
        rows.append([shape, f"{r['params'] / 1e6:.2f}M", str(r["threads"]), *_side(summ, "ours"), *_side(summ, "trl"),
                     fmt(cmp.get("ratio")), fmt(cmp.get("flop_ratio")),
                     "yes" if cmp.get("tokens_equal") else "no" if cmp else "-"])
    print_table(["shape", "params", "threads", "ours s/step", "ours x floor", "ours peak above base MiB",
                 "TRL s/step", "TRL x floor", "TRL peak above base MiB", "ours/TRL", "FLOP ratio", "equal tokens"],
                rows)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.floor_of:
        print(f"# {numerics_line()}", flush=True)
        fl = quickstart_floor(a.floor_of, sgemm_roof(1), os.cpu_count() or 1)
        print_floor_line(fl)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(fl, f, indent=2)
        return 0
    shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
    bad = [s for s in shapes if s not in profile_step.SHAPES]
    if bad:
        raise SystemExit(f"--shapes: unknown {bad}; choose from {', '.join(profile_step.SHAPES)}")
    la0, cpus = loadavg(), os.cpu_count() or 1
    when = datetime.datetime.now().astimezone().isoformat(timespec="minutes")
    print(f"# step report (issue 29): ours vs TRL at {', '.join(shapes)}; quickstart "
          f"{'skipped' if a.no_quickstart else 'timed from an empty cache'} | {when} | {numerics.cpu_info()['model']} "
          f"({cpus} CPUs) | loadavg at start {la0}", flush=True)
    print(f"# {numerics_line()}", flush=True)
    profile_step.warn_load(cpus)
    errors: list[str] = []
    loads = [la0]
    out = {"date": when, "cpu": numerics.cpu_info()["model"], "cpus": cpus, "numerics": numerics_line(),
           "settings": vars(a), "loadavg_start": la0, "shapes": {}, "errors": errors}
    for shape in shapes:
        out["shapes"][shape] = run_shape(a, shape, errors, loads)
    if not a.no_quickstart:
        print("\n# quickstart from an empty cache ...", flush=True)
        qs = out["quickstart"] = time_quickstart(a)
        loads.extend(qs["loadavg"])
        print("\n".join(qs["tail"]))
        if qs["returncode"]:
            errors.append(f"quickstart exited with {qs['returncode']}: {qs['stderr_tail']}")
    print(f"\n# summary ({when}, {out['cpu']}, {cpus} CPUs, {numerics_line().split(';')[0]}; loadavg start {la0}, "
          f"end {loadavg()})")
    summary_table(out["shapes"])
    print("(s/step: median over timed steps [min-max of the per-round medians]; x floor: s/step over the counted "
          "FLOPs' time at the sgemm roof of that thread count; peak: RSS above the worker's post-import RSS)")
    if "quickstart" in out:
        qs = out["quickstart"]
        print(f"quickstart wall time from an empty cache: {qs['seconds']:.0f} s ({qs['seconds'] / 60:.1f} min; "
              f"target <= 3 min), exit {qs['returncode']}, loadavg {qs['loadavg'][0]} -> {qs['loadavg'][1]}")
        if qs.get("floor"):
            print_floor_line(qs["floor"], qs["seconds"])
    profile_step.warn_load(cpus)
    return finish(out, errors, loads, a.json)


if __name__ == "__main__":
    sys.exit(main())
