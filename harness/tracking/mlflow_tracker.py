"""MLflow mirror of a run (metrics.jsonl stays the source of truth).

- Store: ``cfg.tracking.mlflow_uri`` if set, else ``$MLFLOW_TRACKING_URI`` if set, else a
  SQLite database in the results root: ``sqlite:///<output_dir>/mlflow.db`` (artifacts next
  to it in ``<output_dir>/mlartifacts/<sweep>/``). A remote ``http(s)://`` server works the same.
- One experiment per sweep (experiment name = ``cfg.name``, tag ``mlflow.experimentKind =
  custom_model_development`` so MLflow 3 opens it in its model-training view), one parent run
  per sweep directory (run name = the sweep, tag ``harness.sweep_parent``) and under it one
  child MLflow run per harness run attempt (``mlflow.parentRunId``; run name = run_id).
- A child's identity is (``harness.run_id``, ``harness.run_dir`` = the resolved run
  directory, ``harness.attempt`` = the ``time`` of the first row of its metrics.jsonl, which
  a resume keeps and a ``--restart`` replaces). Opening the same identity again (trainer
  resume, ``harness sync``) reuses that MLflow run; the same run_id from another results
  folder, or a restarted run, gets its own.
- Params: the resolved config flattened (``train.lr``, ``algorithm.kl_coef`` ...).
- Metrics: every numeric entry of a metrics.jsonl row, with MLflow ``step`` = budget
  consumed in the budget unit (milliseconds for a ``seconds`` budget, since MLflow steps are
  integers) and timestamp = the row's ``time``. The counters are logged as
  ``budget/steps|samples|tokens|seconds`` so any of them can be the x-axis of a chart.
  MLflow metric names may not contain ``@``: ``pass@8`` is logged as ``pass_at_8``. Each
  ``eval/<task>/acc`` is also logged in percent as ``accuracy_pct/<task>`` (for charts).
- The run description (``mlflow.note.content``) says what a chart's "Step" axis is (the budget unit).
- Times (:func:`harness.tracking.base.run_times`, the same live and replayed): a run starts at
  its first metrics row and, finished in one attempt, ends ``wall_seconds`` later, so MLflow's
  duration is summary.json's ``wall_seconds``. The sweep's parent run spans its runs: it starts
  with the earliest and ends with the latest (each run that ends moves its end).
- At finish: run-level metrics for the runs table, each logged once at the final step (``final/<task>/acc``,
  ``final/<task>/maj_at_K``, ``final/<task>/pass_at_K``, ``initial/...``, ``peak/rss_mb``,
  ``peak/rss_above_base_mb``, ``peak/cuda_mb``, ``wall_seconds``, ``budget/consumed``),
  artifacts (config.yaml, summary.json, eval/*.jsonl, plots/*, error.txt, worker.log) and the status.

Failures never stop a run: TrackerSet drops a mirror that raises. HTTP retries and
timeouts are kept short (env defaults below, overridable) so a dead server costs seconds.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Optional

# Must be set before mlflow is imported: nothing leaves the machine, and a dead tracking
# server fails in seconds (mlflow's defaults retry for minutes).
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ.setdefault("DO_NOT_TRACK", "true")
for _k, _v in {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}.items():
    os.environ.setdefault(_k, _v)

from harness.foundation.base import flatten  # noqa: E402
from harness.foundation.budget import row_consumed, unit_of  # noqa: E402
from harness.rundir.ids import parse_run_id  # noqa: E402
from harness.rundir.layout import MAX_ROW_BYTES, METRICS, RunFileError, open_regular  # noqa: E402
from harness.rundir.lock import file_lock  # noqa: E402
from harness.rundir.read import is_number  # noqa: E402
from harness.rundir.read import summary_metrics as results_summary_metrics  # noqa: E402
from harness.tracking.base import (Tracker, artifact_dir, artifact_files, cfg_get, config_dict,  # noqa: E402
                                   dir_run_times, percent_metrics, run_times)

RUN_ID_TAG = "harness.run_id"
RUN_DIR_TAG = "harness.run_dir"
ATTEMPT_TAG = "harness.attempt"
PARENT_TAG = "harness.sweep_parent"
SWEEP_DIR_TAG = "harness.sweep_dir"
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
"""MLflow 3 opens an experiment in its GenAI view unless this tag says it holds model training."""
STATUS = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED", "interrupted": "KILLED",
          "running": "RUNNING"}
"""harness status -> MLflow run status (anything else: FAILED)."""
_BAD = re.compile(r"[^/\w.\- :]")


def metric_key(name: str) -> str:
    """A metrics.jsonl key as a valid MLflow metric name (``@`` -> ``_at_``)."""
    key = name.replace("@", "_at_")
    key = _BAD.sub("_", key)
    key = re.sub(r"/+", "/", key).strip("/")
    return key or "_"


def budget_step(value: Any, unit: str) -> int:
    """MLflow step for a budget amount (integer; a seconds budget is logged in ms)."""
    if not is_number(value):
        return 0
    return int(round(float(value) * (1000 if unit == "seconds" else 1)))


def default_uri(results_root: str | os.PathLike) -> str:
    return f"sqlite:///{Path(results_root).resolve() / 'mlflow.db'}"


def resolve_uri(cfg: Any, results_root: str | os.PathLike, uri: Optional[str] = None) -> str:
    return uri or cfg_get(cfg, "tracking.mlflow_uri") or os.environ.get("MLFLOW_TRACKING_URI") \
        or default_uri(results_root)


def _is_local_store(uri: str) -> bool:
    scheme = uri.split(":", 1)[0] if "://" in uri else ""
    return scheme in ("", "file", "sqlite")


@lru_cache(maxsize=None)
def git_commit() -> Optional[str]:
    """Commit of the harness checkout (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=3)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except Exception:
        return None


@contextlib.contextmanager
def _store_lock(uri: str):
    """Serialise first-time SQLite schema creation / experiment creation across processes
    (parallel runs of a sweep open the same database)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri[len("sqlite:///"):])
    with file_lock(str(db) + ".lock"):  # blocking; a no-op where fcntl is missing
        yield


def row_metrics(row: dict, step: Any, unit: str) -> list[tuple[str, float, int, int]]:
    """(key, value, timestamp_ms, step) for every numeric entry of a metrics.jsonl row."""
    ts = int(round(float(row["time"]) * 1000)) if is_number(row.get("time")) else int(time.time() * 1000)
    if step is None:
        step = row_consumed(row, unit)
    st = budget_step(step, unit)
    out = []
    for k, v in row.items():
        if k == "time" or not is_number(v):
            continue
        key = f"budget/{unit_of(k)}" if unit_of(k) else metric_key(k)
        out.append((key, float(v), ts, st))
    out += [(metric_key(k), v, ts, st) for k, v in percent_metrics(row).items()]
    return out


def summary_metrics(summary: dict, unit: str, default_task: str = "task") -> dict[str, float]:
    """Run-level metrics from summary.json (columns of the MLflow runs table)."""
    return results_summary_metrics(summary, unit, default_task, key=metric_key)


_PARENTS: dict[tuple, str] = {}  # (uri, experiment id, sweep dir) -> parent run id, per process


def forget_parents() -> None:
    """Look the sweeps' parent runs up again (`harness sync`: one may have been deleted since)."""
    _PARENTS.clear()


def first_row_time(run_dir: str | os.PathLike) -> Optional[float]:
    """``time`` of the first row of a run's metrics.jsonl (None without one). Streamed: at most
    :data:`~harness.rundir.layout.MAX_ROW_BYTES` of a line is ever read (a first line longer than that,
    e.g. a sparse file of NUL bytes, has no time), and only a regular file is opened (never a FIFO)."""
    try:
        with open_regular(Path(run_dir) / METRICS, "rb") as f:
            while True:
                line = f.readline(MAX_ROW_BYTES + 1)
                if not line or len(line) > MAX_ROW_BYTES:
                    return None
                if line.strip():
                    break
    except (OSError, RunFileError):
        return None
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return float(row["time"]) if isinstance(row, dict) and is_number(row.get("time")) else None


def attempt_key(first_time: Optional[float]) -> str:
    """A run attempt's identity: the exact ``time`` of its first metrics row (a resume keeps
    the rows before its checkpoint, a restart writes a new first row); '' before any row."""
    return "" if first_time is None else repr(float(first_time))


def _chunks(seq: list, n: int) -> Iterable[list]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


class MlflowTracker(Tracker):
    """Mirror of one run into MLflow. ``cfg`` is a Config or the resolved config as a dict;
    ``uri`` overrides the tracking URI (used by ``harness sync --uri``)."""

    name = "mlflow"

    def __init__(self, cfg: Any, run_dir: str | os.PathLike, run_id: str, sweep: str,
                 uri: Optional[str] = None):
        import mlflow  # noqa: F401  (fail here, in open_trackers, when the package is missing)

        for lg in ("alembic", "mlflow.store.db.utils", "mlflow.store.sqlalchemy_store"):
            logging.getLogger(lg).setLevel(logging.WARNING)
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.results_root = self.run_dir.resolve().parent.parent
        self.run_id = str(run_id)
        self.sweep = str(sweep)
        self.uri = resolve_uri(cfg, self.results_root, uri)
        self.unit = str(cfg_get(cfg, "budget.unit", "steps"))
        self.algorithm = str(cfg_get(cfg, "algorithm.name", "") or parse_run_id(self.run_id).algorithm)
        self.seed = cfg_get(cfg, "seed")
        self.task = str(cfg_get(cfg, "task.name", "task"))
        self.client = None
        self.mlflow_run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self.resumed = False
        self._last_step = 0
        self.flush_seconds = 2.0  # live logging: batch rows, flush at least this often
        self._buffer: list = []
        self._last_flush = 0.0
        self._logged: dict[str, tuple] = {}  # artifact path -> (mtime, size) already uploaded
        self.attempt: Optional[str] = None  # None: read from metrics.jsonl when the run opens
        self.start_ms: Optional[int] = None  # replay: the run's real start/end (None: now)
        self.end_ms: Optional[int] = None
        self._pending: tuple = ({}, {})
        self._last_row_time: Optional[float] = None
        self._run_start_ms: Optional[int] = None

    # ---- connection -------------------------------------------------------------------------
    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(self.sweep)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            if exp.tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:
                self.client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
            return exp.experiment_id
        kwargs = {}
        if _is_local_store(self.uri):
            kwargs["artifact_location"] = (self.results_root / "mlartifacts" / self.sweep).resolve().as_uri()
        try:
            return self.client.create_experiment(self.sweep, tags={"harness.sweep": self.sweep,
                                                                   EXPERIMENT_KIND[0]: EXPERIMENT_KIND[1]},
                                                 **kwargs)
        except MlflowException:  # created concurrently by another run of the sweep
            exp = self.client.get_experiment_by_name(self.sweep)
            if exp is None:
                raise
            return exp.experiment_id

    def _search(self, tag: str, value: str) -> list:
        """Active runs of the experiment whose ``tag`` equals ``value``, oldest first."""
        from mlflow.entities import ViewType

        safe = value.replace("'", "")
        return self.client.search_runs([self.experiment_id], f"tags.`{tag}` = '{safe}'",
                                       run_view_type=ViewType.ACTIVE_ONLY, max_results=1000,
                                       order_by=["attributes.start_time ASC"])

    def find_run(self):
        """The MLflow run already holding this run attempt (same run_id, resolved run
        directory and attempt; the oldest if several), or None."""
        want = {RUN_DIR_TAG: str(self.run_dir.resolve()), ATTEMPT_TAG: self.attempt}
        for run in self._search(RUN_ID_TAG, self.run_id):
            if all(run.data.tags.get(k) == v for k, v in want.items()):
                return run
        return None

    def parent_run_id(self) -> str:
        """The sweep's parent run (one per experiment and sweep directory), created once."""
        sweep_dir = str(self.run_dir.resolve().parent)
        key = (self.uri, self.experiment_id, sweep_dir)
        if key in _PARENTS:
            return _PARENTS[key]
        found = [r for r in self._search(PARENT_TAG, self.sweep) if r.data.tags.get(SWEEP_DIR_TAG) == sweep_dir]
        if found:
            rid = found[0].info.run_id
        else:
            note = (f"Sweep {self.sweep} ({sweep_dir}): one child run per harness run. Metrics are stepped "
                    f"by {self.step_label()}: the \"Step\" axis of every chart is the budget consumed. "
                    f"Its start and end are those of its earliest and latest runs.")
            start_ms, end_ms = self.sweep_span_ms()
            run = self.client.create_run(self.experiment_id, run_name=self.sweep, start_time=start_ms,
                                         tags={PARENT_TAG: self.sweep, SWEEP_DIR_TAG: sweep_dir, "sweep": self.sweep,
                                               "mlflow.note.content": note})
            rid = run.info.run_id
            self.client.set_terminated(rid, status="FINISHED", end_time=max(end_ms or 0, run.info.start_time))
        _PARENTS[key] = rid
        return rid

    def sweep_span_ms(self) -> tuple[Optional[int], Optional[int]]:
        """(earliest start, latest end) in ms of the runs of this run's sweep directory, from their
        files (:func:`harness.tracking.base.dir_run_times`), this run's own start included."""
        sweep_dir = self.run_dir.resolve().parent
        starts, ends = [], []
        for d in sorted(p.parent for p in sweep_dir.glob("*/metrics.jsonl")) or [self.run_dir]:
            s, e = dir_run_times(d)
            starts += [s] if s is not None else []
            ends += [e] if e is not None else []
        ms = [int(round(t * 1000)) for t in starts] + ([self.start_ms] if self.start_ms is not None else [])
        return (min(ms) if ms else None), (int(round(max(ends) * 1000)) if ends else None)

    def settle_parent(self) -> None:
        """Set the sweep's parent run to end with the latest run of its folder, as the files
        say (`harness sync`: a replay knows every run; the end may move earlier)."""
        _, end_ms = self.sweep_span_ms()
        if end_ms is None:
            return
        with _store_lock(self.uri):
            parent = self.parent_run_id()
            info = self.client.get_run(parent).info
            if info.end_time != end_ms:
                self.client.set_terminated(parent, status="FINISHED", end_time=max(end_ms, info.start_time))

    def extend_parent(self, end_ms: Optional[int]) -> None:
        """The sweep's parent run ends with its latest run: move its end to ``end_ms`` if later."""
        if end_ms is None:
            return
        with _store_lock(self.uri):
            parent = self.parent_run_id()
            info = self.client.get_run(parent).info
            if info.end_time is None or info.end_time < end_ms:
                self.client.set_terminated(parent, status="FINISHED", end_time=end_ms)

    def step_label(self) -> str:
        """What a metric's step counts: ``samples consumed`` (ms for a seconds budget)."""
        return "milliseconds of training (seconds budget)" if self.unit == "seconds" else f"{self.unit} consumed"

    def open_store(self) -> None:
        """The client and the experiment (tagged for MLflow's model-training view)."""
        from mlflow.tracking import MlflowClient

        with _store_lock(self.uri):
            self.client = MlflowClient(tracking_uri=self.uri)
            self.experiment_id = self._experiment()

    def connect(self):
        """Open the store, the experiment, the sweep's parent run and the (new or existing)
        MLflow run of this attempt (``self.attempt``: see :func:`attempt_key`)."""
        if self.client is None:
            self.open_store()
        first = first_row_time(self.run_dir)
        if self.attempt is None:
            self.attempt = attempt_key(first)
        if self.start_ms is None and first is not None:  # the run's history begins at its first row
            self.start_ms = int(round(first * 1000))
        with _store_lock(self.uri):
            parent = self.parent_run_id()
            run = self.find_run()
            if run is None:
                tags = {RUN_ID_TAG: self.run_id, RUN_DIR_TAG: str(self.run_dir.resolve()),
                        ATTEMPT_TAG: self.attempt, "mlflow.parentRunId": parent}
                run = self.client.create_run(self.experiment_id, run_name=self.run_id, start_time=self.start_ms,
                                             tags=tags)
                self.resumed = False
            else:
                self.resumed = True
                if run.info.status != "RUNNING":
                    self.client.update_run(run.info.run_id, status="RUNNING")
                if run.data.tags.get("mlflow.parentRunId") != parent:  # its parent was deleted and made anew
                    self.client.set_tag(run.info.run_id, "mlflow.parentRunId", parent)
        self.mlflow_run_id = run.info.run_id
        self._run_start_ms = run.info.start_time
        return run

    def _ensure_run(self) -> None:
        """Open this attempt's MLflow run on first use: the live trainer calls start() before
        it has truncated (restart) or kept (resume) metrics.jsonl, so the attempt is read
        from the file once the first row of this session is written."""
        if self.mlflow_run_id is not None:
            return
        run = self.connect()
        self._log_params_and_tags(run, *self._pending)

    # ---- Tracker interface -------------------------------------------------------------------
    def start(self, params: dict, tags: dict) -> None:
        """Open the store now (a bad URI fails here); the run itself opens at the first row,
        or now when the attempt is known (``harness sync`` sets it)."""
        self.open_store()
        self._pending = (params, tags)
        if self.attempt is not None:
            self._ensure_run()

    def _log_params_and_tags(self, run, params: dict, tags: dict) -> None:
        from mlflow.entities import Param, RunTag

        flat = {k: v for k, v in flatten(config_dict(self.cfg), keep_empty=True).items()}
        flat.update(flatten(params or {}, keep_empty=True))
        existing = dict(run.data.params) if self.resumed else {}
        new_params = []
        for k, v in flat.items():
            k = metric_key(k)
            if k in existing:  # params are immutable in MLflow; only tracking.* / name can differ
                continue
            sv = "None" if v is None else str(v)
            new_params.append(Param(k, sv[:6000]))
        note = (f"Harness run {self.run_id} of sweep {self.sweep} ({self.algorithm}, seed {self.seed}). "
                f"Metrics are stepped by {self.step_label()}: the \"Step\" axis of every chart is the budget "
                f"consumed, not optimizer steps (budget/steps, budget/samples, budget/tokens and "
                f"budget/seconds are logged too). final/* and initial/* are run-level values (logged once, "
                f"at the final step). Source: {self.run_dir.resolve()}")
        all_tags = {RUN_ID_TAG: self.run_id, "algorithm": self.algorithm, "sweep": self.sweep,
                    "run_id": self.run_id, "seed": "" if self.seed is None else str(self.seed),
                    "task": self.task, "budget_unit": self.unit,
                    "harness.step_unit": "milliseconds" if self.unit == "seconds" else self.unit,
                    RUN_DIR_TAG: str(self.run_dir.resolve()), "mlflow.note.content": note}
        commit = git_commit()
        if commit:
            all_tags["mlflow.source.git.commit"] = commit
            all_tags["git_commit"] = commit
        all_tags.update({str(k): str(v) for k, v in (tags or {}).items() if v is not None})
        tag_list = [RunTag(k, v[:8000]) for k, v in all_tags.items()]
        for chunk in _chunks(new_params, 100):
            self.client.log_batch(self.mlflow_run_id, params=chunk)
        for chunk in _chunks(tag_list, 100):
            self.client.log_batch(self.mlflow_run_id, tags=chunk)

    def log_points(self, points: list[tuple[str, float, int, int]]) -> None:
        from mlflow.entities import Metric

        if not points:
            return
        self._ensure_run()
        metrics = [Metric(k, v, ts, st) for k, v, ts, st in points]
        for chunk in _chunks(metrics, 1000):
            self._retry_locked(lambda: self.client.log_batch(self.mlflow_run_id, metrics=chunk))
        if points:
            self._last_step = max(self._last_step, max(p[3] for p in points))

    def _retry_locked(self, fn, attempts: int = 4):
        """Parallel runs of a sweep share one SQLite file: retry briefly on 'database is locked'."""
        for i in range(attempts):
            try:
                return fn()
            except Exception as e:
                if i == attempts - 1 or "locked" not in str(e).lower() or not self.uri.startswith("sqlite"):
                    raise
                time.sleep(0.2 * (i + 1))

    def log(self, row: dict, step: float) -> None:
        """Buffered: a batch goes out every ``flush_seconds``, at every evaluation row (the
        trainer checkpoints right after one, so nothing before a resume point is lost), and
        at finish. A kill loses at most the unflushed tail, which `harness sync` fills in."""
        self._buffer.extend(row_metrics(row, step, self.unit))
        if is_number(row.get("time")):
            self._last_row_time = float(row["time"])
        if time.time() - self._last_flush >= self.flush_seconds or len(self._buffer) >= 1000 \
                or any(k.startswith("eval/") for k in row):
            self.flush()

    def flush(self) -> None:
        buf, self._buffer = self._buffer, []
        self._last_flush = time.time()
        self.log_points(buf)

    def log_artifact(self, path: str | os.PathLike) -> None:
        """Upload a file, or a folder's files, at their place in the run directory. Only regular
        files inside the run directory (:func:`~harness.tracking.base.artifact_files`): a symlink
        out of it is skipped with a warning, never followed."""
        self.flush()
        self._ensure_run()
        root = self.run_dir.resolve()
        for f in artifact_files(path, root):
            rel = artifact_dir(f, root)
            dest = (rel / f.name).as_posix()
            st = f.resolve().stat()  # the trainer logs config/summary/eval files, finish() logs them too: upload once
            sig = (st.st_mtime_ns, st.st_size)
            if self._logged.get(dest) == sig:
                continue
            self._logged[dest] = sig
            self.client.log_artifact(self.mlflow_run_id, str(f), rel.as_posix() if rel != Path(".") else None)

    def standard_artifacts(self) -> list[Path]:
        d = self.run_dir
        files = [d / "config.yaml", d / "error.txt", d / "worker.log"]
        files += sorted((d / "eval").glob("*.jsonl")) + sorted((d / "plots").glob("*"))
        return [f for f in files if f.is_symlink() or f.is_file() or (f.exists() and not f.is_dir())]

    def settle_end(self, summary: dict) -> Optional[int]:
        """``end_ms`` of a run that ended, from its summary (:func:`~harness.tracking.base.run_times`,
        start = this MLflow run's start); a replay sets it beforehand."""
        if self.end_ms is None:
            start_ms = self.start_ms if self.start_ms is not None else self._run_start_ms
            first = None if start_ms is None else start_ms / 1000.0
            _, end = run_times(summary or {}, first, self._last_row_time)
            self.end_ms = None if end is None else int(round(end * 1000))
        return self.end_ms

    def summary_points(self, summary: dict) -> list[tuple[str, float, int, int]]:
        consumed = ((summary or {}).get("budget") or {}).get("consumed") or {}
        st = budget_step(consumed.get(self.unit), self.unit) if is_number(consumed.get(self.unit)) else self._last_step
        ts = self.end_ms or int(time.time() * 1000)
        return [(k, v, ts, st) for k, v in summary_metrics(summary or {}, self.unit, self.task).items()]

    def finish(self, summary: dict, status: str) -> None:
        self.flush()
        self._ensure_run()
        if STATUS.get(str(status), "FAILED") != "RUNNING":
            self.settle_end({**(summary or {}), "status": str(status)})
        self.finish_with(summary, status, self.summary_points(summary or {}))

    def finish_with(self, summary: dict, status: str, points: list) -> None:
        """finish() with the run-level metric points given (sync passes only missing ones)."""
        from mlflow.entities import RunTag

        summary = summary or {}
        self.flush()
        self._ensure_run()
        self.log_points(points)
        if summary:
            self.client.log_dict(self.mlflow_run_id, summary, "summary.json")
        for f in self.standard_artifacts():
            self.log_artifact(f)
        tags = [RunTag("harness.status", str(status))]
        if summary.get("error"):
            tags.append(RunTag("harness.error", str(summary["error"])[:8000]))
        self.client.log_batch(self.mlflow_run_id, tags=tags)
        mstatus = STATUS.get(str(status), "FAILED")
        if mstatus != "RUNNING":
            self.client.set_terminated(self.mlflow_run_id, status=mstatus, end_time=self.end_ms)
            self.extend_parent(self.end_ms or self.client.get_run(self.mlflow_run_id).info.end_time)

    def existing_points(self, keys: Iterable[str]) -> set[tuple[str, int, float]]:
        """(key, step, value) of every point already logged for ``keys`` (for idempotent replay)."""
        present = set(self.client.get_run(self.mlflow_run_id).data.metrics)
        out = set()
        for k in sorted(set(keys) & present):
            for m in self.client.get_metric_history(self.mlflow_run_id, k):
                out.add((m.key, int(m.step), float(m.value)))
        return out
