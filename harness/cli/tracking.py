"""`harness sync` (replay run directories into MLflow / wandb) and `harness ui` (the MLflow UI)."""
from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import json
import signal
import socket
import sys
import urllib.request
from pathlib import Path

from harness.tracking import sync as tracking_sync
from harness.cli.checks import check_runs_folder
from harness.tracking.sync import exposure_warning, start_ui, stop_group, sync, ui_store, wait_healthy
from harness.rundir.read import find_run_dirs

_INSTALL = "is not installed (pip install 'grpo-harness[track]')"


def _missing(package: str) -> bool:
    """True if the optional tracker package is not installed (found without importing it: MLflow
    takes seconds to import, and a wrong folder or flag should be answered at once)."""
    try:
        return importlib.util.find_spec(package) is None
    except (ImportError, ValueError):
        return True


def cmd_sync(args) -> int:
    check_runs_folder(args.results_dir, "results_dir")  # refuses: missing, or not a directory
    if args.uri and args.to != "mlflow":
        print("harness sync: --uri applies to --to mlflow only", file=sys.stderr)
        return 2
    if args.to in ("mlflow", "wandb") and _missing(args.to):
        print(f"harness sync: {args.to} {_INSTALL}", file=sys.stderr)
        return 2
    skipped: list[dict] = []
    results = sync(args.results_dir, args.to, uri=args.uri, project=args.project, mode=args.mode, skipped=skipped)
    failed = skipped + [r for r in results if "error" in r]
    total = len(results) + len(skipped)
    print(f"synced {total - len(failed)}/{total} runs to {args.to}")
    if failed:  # the good runs are synced; each bad one is named with its reason
        print(f"harness sync: {len(failed)} run(s) not synced:", file=sys.stderr)
        for r in sorted(failed, key=lambda r: r["run_dir"]):
            print(f"  {r['run_dir']}: {r['error']}", file=sys.stderr)
    return 1 if failed else 0


def _say_nothing_to_show(results_dir: str, root: Path) -> None:
    """No MLflow store yet: say so in one line, where runs are expected and what to run (no
    server is started: it would create an empty database there)."""
    folder = Path(results_dir).expanduser()
    runs = find_run_dirs(folder)
    hint = (f"{len(runs)} run directories are there: `harness sync {folder} --to mlflow` copies them in"
            if runs else "runs appear there after training with --set tracking.mlflow=true, "
                         f"or after `harness sync {folder} --to mlflow`")
    print(f"harness ui: nothing to show yet: no MLflow store at {root / 'mlflow.db'}, where runs "
          f"under {folder} are expected; {hint}", file=sys.stderr, flush=True)


ML_VIEW = "workflowType=machine_learning"
"""MLflow 3's UI opens in its GenAI view unless the URL (or the browser's last choice) asks for this."""


def experiment_links(url: str) -> list[tuple[str, str]]:
    """(experiment name, URL of its runs list in the model-training view) for each experiment."""
    req = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search", method="POST",
                                 data=json.dumps({"max_results": 1000}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        exps = json.loads(r.read()).get("experiments", [])
    return [(e["name"], f"{url}/#/experiments/{e['experiment_id']}/runs?{ML_VIEW}")
            for e in exps if e.get("name") != "Default"]


def _print_experiment_links(url: str) -> None:
    """Where to click: one link per sweep (its runs list, the sweep's parent run on top)."""
    try:
        links = experiment_links(url)
    except Exception:
        return
    for name, link in links:
        print(f"  sweep {name}: {link}", flush=True)
    if links:
        print("  (runs of a sweep are grouped under a parent run named after it: expand it, tick runs, "
              "then Chart view; metric steps are the budget consumed)", flush=True)


def port_problem(host: str, port: int):
    """Why ``host:port`` cannot serve (out of range, in use, not an address of this machine), or None."""
    if not 1 <= port <= 65535:
        return f"--port {port} is invalid: a port is 1-65535"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        return f"--host {host!r} is not an address of this machine ({e})"
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            why = "in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
            return f"port {port} on {host} cannot be used ({why}): pick another with --port"
    return None


def cmd_ui(args) -> int:
    if not Path(args.results_dir).expanduser().is_dir():
        check_runs_folder(args.results_dir, "results_dir")  # refuses: missing, or not a directory
    problem = port_problem(args.host, args.port)
    if problem:
        print(f"harness ui: {problem}", file=sys.stderr)
        return 2
    if _missing("mlflow"):
        print(f"harness ui: mlflow {_INSTALL}", file=sys.stderr)
        return 2
    root = ui_store(args.results_dir)
    if not (root / "mlflow.db").exists():
        _say_nothing_to_show(args.results_dir, root)
        return 1
    url = f"http://{args.host}:{args.port}"
    warning = exposure_warning(args.host, args.port, root)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    log = None if args.verbose else open(root / "mlflow-server.log", "ab")  # banners, one INFO line per request
    try:
        proc = start_ui(root, args.port, args.host, log=log)
    finally:
        if log is not None:
            log.close()  # the server holds its own descriptor
    print(f"MLflow UI for {root / 'mlflow.db'}: {url}  (server pid {proc.pid}, process group {proc.pid}; Ctrl-C stops it)",
          flush=True)

    def _term(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, _term)
    try:
        if wait_healthy(url, proc):
            print(f"ready: {url}", flush=True)
            _print_experiment_links(url)
        elif proc.poll() is not None:
            where = "" if args.verbose else f"; its output is in {root / 'mlflow-server.log'}"
            print(f"harness ui: mlflow server exited with code {proc.returncode}{where}", file=sys.stderr)
            return proc.returncode or 1
        proc.wait()
        return proc.returncode or 0
    except KeyboardInterrupt:
        print("stopping MLflow UI", flush=True)
        return 0
    finally:
        stop_group(proc)
        signal.signal(signal.SIGTERM, old)


def register(subparsers) -> None:
    doc = tracking_sync.__doc__.split("\n\n")
    p = subparsers.add_parser(
        "sync", help="replay run directories into MLflow or wandb (idempotent)",
        description="\n\n".join(doc[1:4]), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results_dir", help="results root, a sweep directory or a run directory")
    p.add_argument("--to", choices=["mlflow", "wandb"], required=True, help="tracker to fill in")
    p.add_argument("--uri", default=None,
                   help="MLflow tracking URI (default: each run's tracking.mlflow_uri, else "
                        "$MLFLOW_TRACKING_URI, else sqlite:///<results root>/mlflow.db)")
    p.add_argument("--project", default=None, help="wandb project (default: the run's tracking.wandb_project)")
    p.add_argument("--mode", default=None, choices=["offline", "online"],
                   help="wandb mode (default: the run's tracking.wandb_mode, else $WANDB_MODE, else offline)")
    p.set_defaults(func=cmd_sync)

    u = subparsers.add_parser(
        "ui", help="serve the MLflow UI for a results directory on 127.0.0.1",
        description="Start `mlflow server` on the SQLite store RESULTS_DIR/mlflow.db (its own process "
                    "group; Ctrl-C stops all of it). Runs logged with tracking.mlflow=true or replayed "
                    "with `harness sync --to mlflow` appear under one experiment per sweep.")
    u.add_argument("results_dir", nargs="?", default="results", help="results root (default: results)")
    u.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    u.add_argument("--host", default="127.0.0.1",
                   help="interface (default 127.0.0.1). Anything else (0.0.0.0: every interface) lets anyone who "
                        "reaches the port read and change the runs: the MLflow server has no login, and its "
                        "Host/CORS checks are no authentication; a warning says so. Prefer an SSH tunnel")
    u.add_argument("--verbose", action="store_true",
                   help="show the MLflow server's own output (banners, a line per request); without it that "
                        "output goes to RESULTS_DIR/mlflow-server.log")
    u.set_defaults(func=cmd_ui)
