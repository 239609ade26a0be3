"""MLflow mirror of a run (metrics.jsonl stays the source of truth).

- Store: ``cfg.tracking.mlflow_uri`` if set, else ``$MLFLOW_TRACKING_URI`` if set, else a
  SQLite database in the results root: ``sqlite:///<output_dir>/mlflow.db`` (artifacts next
  to it in ``<output_dir>/mlartifacts/<sweep>/``). A remote ``http(s)://`` server works the same.
- One experiment per sweep (experiment name = ``cfg.name``), one MLflow run per harness
  ``run_id`` (run name = run_id, tag ``harness.run_id``). Opening the same run_id again
  (trainer resume, ``harness sync``) reuses that MLflow run.
- Params: the resolved config flattened (``train.lr``, ``algorithm.kl_coef`` ...).
- Metrics: every numeric entry of a metrics.jsonl row, with MLflow ``step`` = budget
  consumed in the budget unit (milliseconds for a ``seconds`` budget, since MLflow steps are
  integers) and timestamp = the row's ``time``. The counters are logged as
  ``budget/steps|samples|tokens|seconds`` so any of them can be the x-axis of a chart.
  MLflow metric names may not contain ``@``: ``pass@8`` is logged as ``pass_at_8``.
- At finish: run-level metrics for the runs table (``final/<task>/acc``,
  ``final/<task>/maj_at_K``, ``final/<task>/pass_at_K``, ``initial/...``, ``peak/rss_mb``,
  ``peak/rss_above_base_mb``, ``peak/cuda_mb``, ``wall_seconds``, ``budget/consumed``),
  artifacts (config.yaml, summary.json, eval/*.jsonl, plots/*, error.txt, worker.log) and the status.

Failures never stop a run: TrackerSet drops a mirror that raises. HTTP retries and
timeouts are kept short (env defaults below, overridable) so a dead server costs seconds.
"""
from __future__ import annotations

import contextlib
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

from harness.rundir.budget import row_consumed, unit_of  # noqa: E402
from harness.rundir.ids import parse_run_id  # noqa: E402
from harness.rundir.lock import file_lock  # noqa: E402
from harness.rundir.read import flatten, is_number  # noqa: E402
from harness.rundir.read import summary_metrics as results_summary_metrics  # noqa: E402
from harness.tracking.base import Tracker, cfg_get, config_dict  # noqa: E402

RUN_ID_TAG = "harness.run_id"
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
    return out


def summary_metrics(summary: dict, unit: str, default_task: str = "task") -> dict[str, float]:
    """Run-level metrics from summary.json (columns of the MLflow runs table)."""
    return results_summary_metrics(summary, unit, default_task, key=metric_key)


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

    # ---- connection -------------------------------------------------------------------------
    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(self.sweep)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            return exp.experiment_id
        kwargs = {}
        if _is_local_store(self.uri):
            kwargs["artifact_location"] = (self.results_root / "mlartifacts" / self.sweep).resolve().as_uri()
        try:
            return self.client.create_experiment(self.sweep, tags={"harness.sweep": self.sweep}, **kwargs)
        except MlflowException:  # created concurrently by another run of the sweep
            exp = self.client.get_experiment_by_name(self.sweep)
            if exp is None:
                raise
            return exp.experiment_id

    def find_run(self):
        """The MLflow run already holding this run_id (oldest if several), or None."""
        from mlflow.entities import ViewType

        safe = self.run_id.replace("'", "")
        runs = self.client.search_runs([self.experiment_id], f"tags.`{RUN_ID_TAG}` = '{safe}'",
                                       run_view_type=ViewType.ACTIVE_ONLY, max_results=50,
                                       order_by=["attributes.start_time ASC"])
        return runs[0] if runs else None

    def connect(self):
        """Open the store, the experiment and the (new or existing) MLflow run."""
        from mlflow.tracking import MlflowClient

        with _store_lock(self.uri):
            self.client = MlflowClient(tracking_uri=self.uri)
            self.experiment_id = self._experiment()
            run = self.find_run()
            if run is None:
                run = self.client.create_run(self.experiment_id, run_name=self.run_id,
                                             tags={RUN_ID_TAG: self.run_id})
                self.resumed = False
            else:
                self.resumed = True
                if run.info.status != "RUNNING":
                    self.client.update_run(run.info.run_id, status="RUNNING")
        self.mlflow_run_id = run.info.run_id
        return run

    # ---- Tracker interface -------------------------------------------------------------------
    def start(self, params: dict, tags: dict) -> None:
        from mlflow.entities import Param, RunTag

        run = self.connect()
        flat = {k: v for k, v in flatten(config_dict(self.cfg)).items()}
        flat.update(flatten(params or {}))
        existing = dict(run.data.params) if self.resumed else {}
        new_params = []
        for k, v in flat.items():
            k = metric_key(k)
            if k in existing:  # params are immutable in MLflow; only tracking.* / name can differ
                continue
            sv = "None" if v is None else str(v)
            new_params.append(Param(k, sv[:6000]))
        all_tags = {RUN_ID_TAG: self.run_id, "algorithm": self.algorithm, "sweep": self.sweep,
                    "run_id": self.run_id, "seed": "" if self.seed is None else str(self.seed),
                    "task": self.task, "budget_unit": self.unit,
                    "harness.step_unit": "milliseconds" if self.unit == "seconds" else self.unit,
                    "harness.run_dir": str(self.run_dir.resolve())}
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
        if time.time() - self._last_flush >= self.flush_seconds or len(self._buffer) >= 1000 \
                or any(k.startswith("eval/") for k in row):
            self.flush()

    def flush(self) -> None:
        buf, self._buffer = self._buffer, []
        self._last_flush = time.time()
        self.log_points(buf)

    def log_artifact(self, path: str | os.PathLike) -> None:
        self.flush()
        p = Path(path)
        if p.is_file():  # the trainer logs config/summary/eval files, finish() logs them too: upload once
            st = p.stat()
            sig = (st.st_mtime_ns, st.st_size)
            if self._logged.get(str(p.resolve())) == sig:
                return
            self._logged[str(p.resolve())] = sig
        artifact_path = None
        try:
            rel = p.resolve().relative_to(self.run_dir.resolve())
            artifact_path = rel.parent.as_posix() if rel.parent != Path(".") else None
            if p.is_dir():
                artifact_path = rel.as_posix()
        except ValueError:
            pass
        if p.is_dir():
            self.client.log_artifacts(self.mlflow_run_id, str(p), artifact_path)
        elif p.is_file():
            self.client.log_artifact(self.mlflow_run_id, str(p), artifact_path)

    def standard_artifacts(self) -> list[Path]:
        d = self.run_dir
        files = [d / "config.yaml", d / "error.txt", d / "worker.log"]
        files += sorted((d / "eval").glob("*.jsonl")) + sorted((d / "plots").glob("*"))
        return [f for f in files if f.is_file()]

    def summary_points(self, summary: dict) -> list[tuple[str, float, int, int]]:
        consumed = ((summary or {}).get("budget") or {}).get("consumed") or {}
        st = budget_step(consumed.get(self.unit), self.unit) if is_number(consumed.get(self.unit)) else self._last_step
        ts = int(time.time() * 1000)
        return [(k, v, ts, st) for k, v in summary_metrics(summary or {}, self.unit, self.task).items()]

    def finish(self, summary: dict, status: str) -> None:
        self.flush()
        self.finish_with(summary, status, self.summary_points(summary or {}))

    def finish_with(self, summary: dict, status: str, points: list) -> None:
        """finish() with the run-level metric points given (sync passes only missing ones)."""
        from mlflow.entities import RunTag

        summary = summary or {}
        self.flush()
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
            self.client.set_terminated(self.mlflow_run_id, status=mstatus)

    def existing_points(self, keys: Iterable[str]) -> set[tuple[str, int, float]]:
        """(key, step, value) of every point already logged for ``keys`` (for idempotent replay)."""
        present = set(self.client.get_run(self.mlflow_run_id).data.metrics)
        out = set()
        for k in sorted(set(keys) & present):
            for m in self.client.get_metric_history(self.mlflow_run_id, k):
                out.add((m.key, int(m.step), float(m.value)))
        return out
