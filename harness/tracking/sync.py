"""`harness sync` (replay run directories into MLflow / wandb) and `harness ui` (MLflow UI).

``harness sync RESULTS_DIR --to mlflow [--uri URI]`` walks every run directory under
RESULTS_DIR (a results root, one sweep, or one run) and replays its metrics.jsonl,
summary.json, config and artifacts into MLflow, with the run's own start and end times: the
MLflow run is found by its identity (run id, resolved run directory and attempt: the same
run_id from another results folder, or a restarted run, is another MLflow run) or created,
and only the metric points not already there are logged, so running it twice, or after a
live tracker that logged part of a run, adds no duplicates.
Without ``--uri`` each run goes where its own config points (``tracking.mlflow_uri``, then
``$MLFLOW_TRACKING_URI``, then ``sqlite:///<results root>/mlflow.db``).

``harness sync RESULTS_DIR --to wandb`` writes an offline wandb run per run directory
(``<run_dir>/wandb/offline-run-*``; upload with ``wandb sync``). A run already replayed
from the same metrics.jsonl is skipped; an outdated replay is moved to
``<run_dir>/wandb/superseded/``.

When a sweep folder holds its report (``<sweep>/report/report.html``, from `harness sweep` or
`harness report`), the report is attached too: to the sweep's MLflow parent run (artifacts
under ``report/``) or as the sweep's wandb report run
(:func:`harness.tracking.report_upload.attach_to`).

One bad run never stops the others: a run whose summary.json, metrics.jsonl, config.yaml or
error.txt is not a regular file (a FIFO would block the sync forever), links out of the run
directory, or (summary.json) is not a JSON object is not synced, and the command lists it with
the reason; so is a run whose replay fails. Nothing that resolves outside a run directory is
uploaded (a symlinked file or folder is skipped with a warning naming it).

``harness ui [RESULTS_DIR] [--port 5000]`` serves the MLflow UI for
``RESULTS_DIR/mlflow.db`` on 127.0.0.1. The server runs in its own process group
(setsid); Ctrl-C / SIGTERM / exit stops the whole group. ``--host`` other than a loopback
address prints a warning first (:func:`exposure_warning`: the server has no login, and
MLflow's host and CORS checks are no authentication).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

from harness.config.schema import effective_dict
from harness.rundir import provenance
from harness.rundir.layout import CONFIG, ERROR_TXT, METRICS, SUMMARY
from harness.rundir.read import RunData, find_run_dirs, load_run
from harness.tracking.base import run_times, upload_problem
from harness.tracking.report_upload import attach_to
from harness.tracking.mlflow_tracker import (MlflowTracker, attempt_key, default_uri, first_row_time,
                                             forget_parents, row_metrics)
from harness.tracking.wandb_tracker import MARKER, WandbTracker, fingerprint, wandb_id

TERMINAL = ("finished", "failed", "killed", "interrupted")
RUN_FILES = (SUMMARY, METRICS, CONFIG, ERROR_TXT)
"""The files of a run directory that a replay opens itself (artifacts are checked one by one)."""
_JSON_MAX_BYTES = 64 * 1024 * 1024


# ---------------------------------------------------------------------------------------------
# finding runs, and telling a broken one before anything opens its files
# ---------------------------------------------------------------------------------------------
def read_json_object(path: str | os.PathLike) -> tuple[Optional[dict], Optional[str]]:
    """(the JSON object in ``path``, None), or (None, why not): missing, not a regular file (never
    blocks: opened non-blocking and checked on the open file), too large, not UTF-8, not JSON,
    not an object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None, "is missing"
    except OSError as e:
        return None, f"cannot be opened ({e.strerror or e})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "is not a regular file"
        if st.st_size > _JSON_MAX_BYTES:
            return None, f"is {st.st_size} bytes, more than a summary ever holds"
        chunks, left = [], _JSON_MAX_BYTES + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "is not UTF-8 text (binary or corrupt)"
    try:
        obj = json.loads(text)
    except ValueError as e:
        return None, f"is not valid JSON ({e})"
    except RecursionError:
        return None, "is nested too deeply"
    if not isinstance(obj, dict):
        return None, f"holds a JSON {type(obj).__name__}, not an object"
    return obj, None


def run_problem(run_dir: str | os.PathLike) -> Optional[str]:
    """Why the run directory cannot be replayed safely (None when it can): one of its files is
    not a regular file (a FIFO would block the reader forever), resolves outside the run
    directory (a symlink to a secret), or summary.json is not a JSON object."""
    d = Path(run_dir)
    for name in RUN_FILES:
        f = d / name
        if os.path.lexists(f):
            why = upload_problem(f, d)
            if why:
                return f"{name}: {why}"
    if os.path.lexists(d / SUMMARY):
        _, why = read_json_object(d / SUMMARY)
        if why:
            return f"{SUMMARY} {why}"
    return None


def _is_run_dir(d: Path) -> bool:
    """metrics.jsonl is there (of any kind), or a summary.json that names a run or is broken."""
    if os.path.lexists(d / METRICS):
        return True
    if not os.path.lexists(d / SUMMARY):
        return False
    obj, why = read_json_object(d / SUMMARY)
    return why is not None or "run_id" in obj


def run_dirs(root: str | os.PathLike) -> list[Path]:
    """Every run directory at or under ``root``, broken ones included (sync lists them), found
    without opening anything but regular files."""
    return find_run_dirs(root, skip_unreadable=False, is_run=_is_run_dir)


# ---------------------------------------------------------------------------------------------
# sync
# ---------------------------------------------------------------------------------------------
def _tracker_cfg(run: RunData) -> dict:
    """The run's config as the mirrors take it: as written, with the name, seed, budget unit and
    algorithm the run directory records where it lacks them, and its algorithm section resolved
    (:func:`harness.config.schema.effective_dict`)."""
    cfg = dict(run.config or {})
    cfg.setdefault("name", run.sweep)
    cfg.setdefault("seed", run.seed)
    budget = dict(cfg.get("budget") or {})
    budget.setdefault("unit", run.budget_unit)
    cfg["budget"] = budget
    algo = cfg.get("algorithm")
    if not algo:
        cfg["algorithm"] = {"name": run.algorithm}
    return effective_dict(cfg)


def _num(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def run_span(summary: Optional[dict], rows: list[dict]) -> tuple[Optional[float], Optional[float]]:
    """(start, end) unix times of a run as its files record them, for replays: the same as a
    live mirror records (:func:`harness.tracking.base.run_times`: from the first metrics row,
    ``wall_seconds`` long for a run finished in one attempt; end None while running)."""
    times = [t for t in (_num(r.get("time")) for r in rows if isinstance(r, dict)) if t is not None]
    return run_times(summary, times[0] if times else None, times[-1] if times else None)


def replay_mlflow(run: RunData, uri: Optional[str] = None) -> dict:
    """Replay one run directory into MLflow; returns what was done."""
    tr = MlflowTracker(_tracker_cfg(run), run.run_dir, run.run_id, run.sweep, uri=uri)
    tr.unit = run.budget_unit
    tr.attempt = attempt_key(first_row_time(run.run_dir))  # run identity: run dir + attempt
    start, end = run_span(run.summary, run.rows)  # the run's own times, not the sync's
    tr.start_ms, tr.end_ms = (None if t is None else int(round(t * 1000)) for t in (start, end))
    tr.start(params={}, tags=provenance.tags((run.summary or {}).get("provenance") or {}))
    points = [p for row in run.rows for p in row_metrics(row, None, tr.unit)]
    summary_points = tr.summary_points(run.summary) if run.summary else []
    if tr.resumed:
        have = tr.existing_points({p[0] for p in points} | {p[0] for p in summary_points})
        have_step = {(k, st) for k, st, _ in have}
        points = [p for p in points if (p[0], p[3], p[1]) not in have]
        summary_points = [p for p in summary_points if (p[0], p[3]) not in have_step]
    # the same (key, step, value) twice in one replay (e.g. counters repeated on an eval row)
    seen, unique = set(), []
    for p in points:
        if (p[0], p[3], p[1]) not in seen:
            seen.add((p[0], p[3], p[1]))
            unique.append(p)
    tr.log_points(unique)
    if run.status in TERMINAL:
        tr.finish_with(run.summary, run.status, summary_points)
    else:  # still running (or killed without a summary): metrics and artifacts, run stays open
        tr.log_points(summary_points)
        for f in tr.standard_artifacts():
            tr.log_artifact(f)
    return {"run_id": run.run_id, "mlflow_run_id": tr.mlflow_run_id, "uri": tr.uri,
            "created": not tr.resumed, "points": len(unique) + len(summary_points), "status": run.status,
            "tracker": tr}


def replay_wandb(run: RunData, project: Optional[str] = None, mode: Optional[str] = None) -> dict:
    """Replay one run directory into an offline (default) wandb run; skipped if up to date."""
    wdir = run.run_dir / "wandb"
    fp = fingerprint(run.run_dir, run.status)
    marker = read_json_object(wdir / MARKER)[0] or {}
    wid = wandb_id(run.sweep, run.run_id)
    if marker.get("fingerprint") == fp and marker.get("wandb_id") == wid and \
            (not marker.get("run_path") or Path(marker["run_path"]).exists()):
        return {"run_id": run.run_id, "skipped": True, "points": 0, "run_path": marker.get("run_path"),
                "status": run.status}
    old = sorted(wdir.glob(f"offline-run-*-{wid}")) if wdir.exists() else []
    if old:
        (wdir / "superseded").mkdir(parents=True, exist_ok=True)
        for d in old:
            shutil.move(str(d), str(wdir / "superseded" / d.name))
    tr = WandbTracker(_tracker_cfg(run), run.run_dir, run.run_id, run.sweep, mode=mode, project=project)
    tr.unit = run.budget_unit
    tr.span = run_span(run.summary, run.rows)  # the run's own start and end, for the summary
    tr.start(params={}, tags=provenance.tags((run.summary or {}).get("provenance") or {}))
    for row in run.rows:
        tr.log(row, None)
    run_path = tr.offline_dir
    tr.finish(run.summary, run.status)
    return {"run_id": run.run_id, "skipped": False, "points": len(run.rows),
            "run_path": str(run_path) if run_path else None, "status": run.status}


def sync(results_dir: str | os.PathLike, to: str = "mlflow", uri: Optional[str] = None,
         project: Optional[str] = None, mode: Optional[str] = None,
         echo: Callable[[str], None] = print, skipped: Optional[list] = None) -> list[dict]:
    """Replay every run under ``results_dir``; one result dict per run replayed, with
    ``run_dir``, and ``error`` (the reason) when its replay failed. A run whose files cannot be
    read safely (:func:`run_problem`, or what the reader could not use) is not replayed: it is
    echoed with the reason and appended to ``skipped`` (``{"run_id", "run_dir", "error"}``).
    One bad run never stops the others."""
    if to not in ("mlflow", "wandb"):
        raise ValueError(f"--to must be mlflow or wandb, got {to!r}")
    dirs = run_dirs(results_dir)
    if not dirs:
        echo(f"no run directories under {results_dir}")
    forget_parents()
    out = []
    sweeps: dict[Path, tuple] = {}  # sweep folder -> (a run of it that synced, its MLflow tracker or None)
    for d in dirs:
        try:
            why = run_problem(d)
            run = None if why else load_run(d)
            if run is not None and getattr(run, "problems", None):  # what the reader could not use
                why = "; ".join(run.problems)
            if why:
                echo(f"  {d.parent.name}/{d.name}: NOT SYNCED: {why}")
                if skipped is not None:
                    skipped.append({"run_id": d.name, "run_dir": str(d), "error": why})
                continue
            res = replay_mlflow(run, uri) if to == "mlflow" else replay_wandb(run, project, mode)
            res["run_dir"] = str(d)
        except Exception as e:  # one bad run does not stop the others
            res = {"run_id": d.name, "run_dir": str(d), "error": f"{type(e).__name__}: {e}"}
        if "error" in res:
            echo(f"  {d.parent.name}/{d.name}: NOT SYNCED: {res['error']}")
        else:
            if res.get("skipped"):
                what = "up to date"
            elif to == "mlflow":
                what = f"{'created' if res['created'] else 'updated'}, {res['points']} new points -> {res['uri']}"
            else:
                what = f"replayed {res['points']} rows -> {res['run_path']}"
            echo(f"  {run.sweep}/{run.run_id} [{run.status}]: {what}")
            sweeps.setdefault(Path(run.run_dir).resolve().parent, (run, res.pop("tracker", None)))
        res.pop("tracker", None)
        out.append(res)
    for sweep_dir, (run, tracker) in sweeps.items():
        if tracker is not None:
            try:  # the parent run ends with the sweep's latest run, as the files say
                tracker.settle_parent()
            except Exception as e:
                echo(f"  {sweep_dir.name}: the parent run's end was not set: {type(e).__name__}: {e}")
        sync_report(sweep_dir, run, to, uri=uri, project=project, mode=mode, echo=echo)
    return out


def sync_report(sweep_dir: Path, run: RunData, to: str, uri: Optional[str] = None, project: Optional[str] = None,
                mode: Optional[str] = None, echo: Callable[[str], None] = print) -> Optional[bool]:
    """Attach ``<sweep_dir>/report`` to the tracker ``to`` (None when the sweep has no report)."""
    report = Path(sweep_dir) / "report"
    if upload_problem(report / "report.html", report) is not None:
        return None
    target = SimpleNamespace(config=_tracker_cfg(run), run_dir=run.run_dir, run_id=run.run_id)
    ok = attach_to(to, target, run.sweep, report, uri=uri, project=project, mode=mode)
    where = f"artifacts of the parent run '{run.sweep}'" if to == "mlflow" else f"run '{run.sweep}-report'"
    echo(f"  report {report}: {'attached: ' + where if ok else 'NOT attached (see the warning above)'}")
    return ok


# ---------------------------------------------------------------------------------------------
# ui
# ---------------------------------------------------------------------------------------------
def _child_setup() -> None:  # runs in the child between fork and exec (after setsid)
    try:  # Linux: the server dies with its parent even if the parent is SIGKILLed
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    h = (host or "").strip()
    if h.lower() in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(h.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, port: int, store: str | os.PathLike, env: Optional[dict] = None) -> Optional[str]:
    """What ``harness ui --host HOST`` exposes when HOST is not a loopback address (None when it
    is): the lines to print on stderr before the server starts.

    Facts from MLflow's server (3.x: ``mlflow/server/security_utils.py``, ``mlflow server --help``):
    its security middleware checks the Host header against ``--allowed-hosts`` /
    ``$MLFLOW_SERVER_ALLOWED_HOSTS`` (default: localhost, 127.0.0.1, [::1], 0.0.0.0 and the
    private ranges 10.*, 172.16-31.*, 192.168.*, fc00:*, fd00:*), which stops DNS rebinding,
    and blocks state-changing cross-origin requests unless ``--cors-allowed-origins`` allows
    the origin (default: localhost origins), which stops other web pages from writing through
    a browser. Neither is authentication: the server has no login, and any client that reaches
    the port can send an allowed Host header (e.g. the machine's private address)."""
    if is_loopback(host):
        return None
    env = os.environ if env is None else env
    where = ("every network interface of this machine" if (host or "").strip() in ("", "0.0.0.0", "::", "[::]")
             else f"{host}, reachable from other machines")
    lines = [
        f"harness ui: WARNING: --host {host or repr(host)} serves the MLflow UI on {where}: anyone who can reach "
        f"port {port} can read every run, parameter, metric and artifact of {store} and change or delete them "
        f"(the MLflow server has no login).",
        "  MLflow's host check (Host header must be localhost, 127.0.0.1, [::1], 0.0.0.0 or a private address "
        "10.*, 172.16-31.*, 192.168.*, fc00:*, fd00:*; --allowed-hosts / $MLFLOW_SERVER_ALLOWED_HOSTS sets the "
        "list) only stops DNS rebinding, and its CORS check (--cors-allowed-origins) only stops other web pages "
        "from writing through your browser; neither authenticates anyone: a client on your network sends an "
        "allowed Host header (e.g. this machine's private address) and gets in.",
    ]
    if str(env.get("MLFLOW_SERVER_DISABLE_SECURITY_MIDDLEWARE", "")).strip().lower() in ("1", "true", "yes"):
        lines.append("  $MLFLOW_SERVER_DISABLE_SECURITY_MIDDLEWARE is set: even those checks are off.")
    elif str(env.get("MLFLOW_SERVER_ALLOWED_HOSTS", "")).strip() == "*":
        lines.append("  $MLFLOW_SERVER_ALLOWED_HOSTS=* is set: every Host header is accepted (no DNS-rebinding check).")
    lines.append(f"  Safer: keep the default --host 127.0.0.1 and reach it through an SSH tunnel "
                 f"(ssh -L {port}:127.0.0.1:{port} <this machine>), or put an authenticating proxy in front.")
    return "\n".join(lines)


def ui_store(results_dir: str | os.PathLike) -> Path:
    """The results root whose mlflow.db the UI serves (a sweep dir falls back to its parent)."""
    root = Path(results_dir).resolve()
    if not (root / "mlflow.db").exists() and (root.parent / "mlflow.db").exists():
        root = root.parent
    return root


def start_ui(results_dir: str | os.PathLike = "results", port: int = 5000, host: str = "127.0.0.1",
             backend_uri: Optional[str] = None, log=None) -> subprocess.Popen:
    """Start ``mlflow server`` in a new session (its own process group); return the Popen."""
    root = ui_store(results_dir)
    root.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri or default_uri(root),
           "--host", host, "--port", str(port), "--workers", "1",
           "--artifacts-destination", str(root / "mlartifacts")]
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    return subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_child_setup,
                            stdout=log, stderr=subprocess.STDOUT if log is not None else None)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_group(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group led by ``proc``; SIGKILL whatever is left after ``timeout``."""
    pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.time() + (timeout if sig == signal.SIGTERM else 5.0)
        while time.time() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                return
            time.sleep(0.1)
    proc.poll()


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except Exception:
            pass
        time.sleep(0.3)
    return False
