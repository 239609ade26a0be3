"""`harness sync` (replay run directories into MLflow / wandb) and `harness ui` (the MLflow UI)."""
from __future__ import annotations

import argparse
import errno
import json
import signal
import socket
import sys
import urllib.request
from pathlib import Path

from harness.cli.checks import check_runs_folder
from harness.cli.polish import lazy, not_installed
from harness.rundir.read import find_run_dirs

# loaded when a command runs (trackers, replay, server control; the link's view), so `--help`
# and refused arguments answer at once
tracking_sync = lazy("harness.tracking.sync")
mlflow_view = lazy("harness.tracking.mlflow_view")

_INSTALL = "is not installed (pip install 'grpo-harness[track]')"

SYNC_HELP = """Replay every run directory under RESULTS_DIR (a results root, one sweep, or one run) into
MLflow or wandb, with the run's own times; running it again adds nothing (runs are matched by
run id, run directory and attempt). A sweep folder's report (<sweep>/report, from `harness
sweep` or `harness report`) is attached too: to the sweep's MLflow parent run, or as its wandb
report run.

--to mlflow: each run goes where its own config points (tracking.mlflow_uri, then
$MLFLOW_TRACKING_URI, then sqlite:///<results root>/mlflow.db) unless --uri says otherwise.
--to wandb: one offline run per run directory (<run_dir>/wandb/offline-run-*; upload with
`wandb sync`).

A run that cannot be read safely (a FIFO or a link out of the run directory, a summary.json
that is not a JSON object) is not synced; the command names it with the reason and the
others go on."""


def cmd_sync(args) -> int:
    check_runs_folder(args.results_dir, "results_dir")  # refuses: missing, or not a directory
    if args.uri and args.to != "mlflow":
        print("harness sync: --uri applies to --to mlflow only", file=sys.stderr)
        return 2
    if args.to in ("mlflow", "wandb") and not_installed(args.to):
        print(f"harness sync: {args.to} {_INSTALL}", file=sys.stderr)
        return 2
    skipped: list[dict] = []
    results = tracking_sync.sync(args.results_dir, args.to, uri=args.uri, project=args.project, mode=args.mode,
                                 skipped=skipped)
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


def experiment_links(url: str) -> list[tuple[str, str]]:
    """(experiment name, link) for each sweep's experiment: its runs in MLflow's model-training
    chart view, grouped by algorithm, accuracy charts first (the view saved by
    :func:`harness.tracking.mlflow_view.publish_view`; without one, the plain chart view)."""
    req = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search", method="POST",
                                 data=json.dumps({"max_results": 1000}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        exps = json.loads(r.read()).get("experiments", [])
    out = []
    for e in exps:
        if e.get("name") == "Default":
            continue
        try:
            key = mlflow_view.publish_view(url, e["experiment_id"])
        except Exception as err:  # the link still opens the experiment, without the saved view
            print(f"harness ui: the view of {e['name']} could not be saved ({type(err).__name__}: {err})",
                  file=sys.stderr, flush=True)
            key = None
        out.append((e["name"], mlflow_view.view_link(url, e["experiment_id"], key)))
    return out


def _print_experiment_links(url: str) -> None:
    """Where to click: one link per sweep, opening on its accuracy charts."""
    try:
        links = experiment_links(url)
    except Exception:
        return
    for name, link in links:
        print(f"  sweep {name}: {link}", flush=True)
    if links:
        print("  (each link opens the sweep's runs grouped by algorithm, accuracy charts first, in percent; "
              "a chart's Step is the budget consumed; an attached report is in the parent run's artifacts)",
              flush=True)


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
    if not_installed("mlflow"):
        print(f"harness ui: mlflow {_INSTALL}", file=sys.stderr)
        return 2
    root = tracking_sync.ui_store(args.results_dir)
    if not (root / "mlflow.db").exists():
        _say_nothing_to_show(args.results_dir, root)
        return 1
    url = f"http://{args.host}:{args.port}"
    warning = tracking_sync.exposure_warning(args.host, args.port, root)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    log = None if args.verbose else open(root / "mlflow-server.log", "ab")  # banners, one INFO line per request
    try:
        proc = tracking_sync.start_ui(root, args.port, args.host, log=log)
    finally:
        if log is not None:
            log.close()  # the server holds its own descriptor
    print(f"MLflow UI for {root / 'mlflow.db'}: {url}  (server pid {proc.pid}, process group {proc.pid}; Ctrl-C stops it)",
          flush=True)

    def _term(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, _term)
    try:
        if tracking_sync.wait_healthy(url, proc):
            print(f"ready: {url}", flush=True)
            _print_experiment_links(url)
        elif proc.poll() is not None:
            if not args.verbose and _said_port_in_use(root / "mlflow-server.log"):  # taken since the check
                print(f"harness ui: port {args.port} on {args.host} cannot be used (in use): pick another with "
                      f"--port", file=sys.stderr)
                return 2
            where = "" if args.verbose else f"; its output is in {root / 'mlflow-server.log'}"
            print(f"harness ui: mlflow server exited with code {proc.returncode}{where}", file=sys.stderr)
            return proc.returncode or 1
        proc.wait()
        return proc.returncode or 0
    except KeyboardInterrupt:
        print("stopping MLflow UI", flush=True)
        return 0
    finally:
        tracking_sync.stop_group(proc)
        signal.signal(signal.SIGTERM, old)


def _said_port_in_use(log: Path) -> bool:
    """Whether the server's log (its last lines) says its port was taken."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            tail = f.read().decode("utf-8", "replace").lower()
    except OSError:
        return False
    return "address already in use" in tail or "errno 98" in tail


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sync", help="replay run directories into MLflow or wandb (idempotent)",
        description=SYNC_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
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
                    "with `harness sync --to mlflow` appear under one experiment per sweep; the link printed "
                    "for each opens its runs grouped by algorithm with the accuracy charts first (docs/dashboards.md).")
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
