"""`harness export RUNS_DIR DEST [--runs GLOB]`: copy a sweep's finished run folders, trimmed to what the report and a resume need, small enough to commit."""
from __future__ import annotations

import sys

from harness.foundation.files import check_output_dir
from harness.cli.polish import lazy

# loaded when the command runs, so `--help` answers at once
export = lazy("harness.rundir.export")

DESCRIPTION = ("Copy the finished run folders of a sweep's results folder (RUNS_DIR, e.g. results/deepseekmath_small) "
               "into DEST/<run id>/, trimmed so they can be committed to git and still serve `harness report` "
               "(--study too) and resuming the sweep: config.yaml, summary.json and metrics.jsonl as they are; of "
               "eval/, the start (step 0) and final evaluation records and the validation records, with every "
               "completion and question text removed (ids, answer keys, correct/valid, num_correct, pass@k / "
               "maj@k kept). The intermediate evaluations' records are left out: the report reads only the start "
               "and the end (its curves come from metrics.jsonl). No weights, checkpoints, optimizer state, "
               "caches or logs. RUNS_DIR's sweep.json is copied too. Unfinished runs are skipped, one line each. "
               "Exporting again writes the same bytes. Copied back into a results folder, the runs count as "
               "finished: `harness sweep` does not run them again.")


def cmd_export(args) -> int:
    choice = export.plan_export(args.runs_dir, args.dest, args.runs)  # every check before anything is copied
    check_output_dir(args.dest, "DEST")
    bad = export.sweep_json_problem(args.runs_dir)
    if bad:
        print(f"harness export: warning: {bad}: not exported (the report reads the runs without it)", file=sys.stderr)
    res = export.export_runs(args.runs_dir, args.dest, args.runs, choice=choice)
    for name, why in res.skipped:
        print(f"skipped {name}: {why}")
    print(f"exported {len(res.exported)} run(s) to {args.dest}, skipped {len(res.skipped)}, "
          f"{res.bytes:,} bytes in all ({res.written} file(s) written, the rest already up to date)")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="copy finished runs, trimmed (no completions, weights or checkpoints), to commit them",
        description=DESCRIPTION)
    p.add_argument("runs_dir", metavar="RUNS_DIR", help="a sweep's results folder: RESULTS_DIR/<name>")
    p.add_argument("dest", metavar="DEST", help="where the run folders go (DEST/<run id>/); not inside RUNS_DIR")
    p.add_argument("--runs", default=None, metavar="GLOB",
                   help="export only run folders whose name matches this glob, e.g. --runs 'grpo-*'")
    p.set_defaults(func=cmd_export)
