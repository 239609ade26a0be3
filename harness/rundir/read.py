"""Reading finished (or unfinished) run directories back: shared by `harness sync` and
`harness report`.

Layout (docs/architecture.md): ``<output_dir>/<name>/<run_id>/`` with ``config.yaml``,
``summary.json``, ``metrics.jsonl``, ``eval/<task>_<step>.jsonl``. Everything here is
read-only and tolerant: a missing summary, a torn last JSONL line or an unknown key never
raises; the caller sees ``None``/empty values instead.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from harness.rundir.budget import COUNTERS, row_consumed
from harness.rundir.ids import parse_run_id
from harness.rundir.layout import CONFIG, METRICS, SUMMARY, read_json, read_jsonl

_SKIP_DIRS = {"checkpoint", "eval", "wandb", "mlartifacts", "mlruns", "report", "plots", "_cache",
              "__pycache__", "superseded"}
_K_RE = re.compile(r"^(maj|pass)@(\d+)$")


def _load_yaml(path: Path) -> dict:
    try:
        import yaml
        data = yaml.safe_load(path.read_text())
        return data if isinstance(data, dict) else {}
    except Exception:
        return {}


def is_run_dir(path: Path) -> bool:
    """A run directory holds metrics.jsonl, or a summary.json that names a run_id."""
    path = Path(path)
    if (path / METRICS).is_file():
        return True
    s = read_json(path / SUMMARY)
    return isinstance(s, dict) and "run_id" in s


def find_run_dirs(root: str | os.PathLike) -> list[Path]:
    """Every run directory at or under ``root`` (a results root, a sweep dir or a run dir),
    sorted. Checkpoints, eval records, wandb/mlflow stores and reports are not descended."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"no such directory: {root}")
    if is_run_dir(root):
        return [root]
    found = []
    for dirpath, dirnames, _ in os.walk(root):
        d = Path(dirpath)
        if d != root and is_run_dir(d):
            found.append(d)
            dirnames[:] = []
            continue
        dirnames[:] = sorted(n for n in dirnames if n not in _SKIP_DIRS and not n.startswith("."))
    return sorted(found)


def flatten(d: Any, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """``{"train": {"lr": 1e-4}}`` -> ``{"train.lr": 1e-4}``."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}{sep}{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(flatten(v, key, sep))
            else:
                out[key] = v
    elif prefix:
        out[prefix] = d
    return out


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def eval_metrics(d: Any, default_task: str = "task") -> dict[str, float]:
    """Normalise an eval dict (summary ``initial_eval`` / ``final_eval``, or a metrics row) to
    ``{"<task>/<metric>": value}``: nested dicts are joined with '/', a leading ``eval/`` is
    dropped, a bare metric name (no task) gets ``default_task``, non-numeric values are
    skipped. Rows' non-eval keys are ignored."""
    if not isinstance(d, dict):
        return {}
    out = {}
    for k, v in flatten(d, sep="/").items():
        if k.startswith("eval/"):
            k = k[len("eval/"):]
        elif "/" in k and k.split("/", 1)[0] in ("train", "rollout", "perf"):
            continue
        elif k in COUNTERS or k == "time":
            continue
        if not is_number(v):
            continue
        if "/" not in k:
            k = f"{default_task}/{k}"
        out[k] = float(v)
    return out


def row_eval_metrics(row: dict) -> dict[str, float]:
    """The ``eval/<task>/<metric>`` entries of a metrics.jsonl row, as ``{"<task>/<metric>": v}``."""
    return {k[len("eval/"):]: float(v) for k, v in row.items()
            if k.startswith("eval/") and k.count("/") >= 2 and is_number(v)}


def split_metric(key: str) -> tuple[str, str]:
    """``"arith/pass@8"`` -> ``("arith", "pass@8")``."""
    task, _, metric = key.rpartition("/")
    return task, metric


def k_of(metric: str) -> Optional[tuple[str, int]]:
    """``"maj@8"`` -> ``("maj", 8)``; anything else -> None."""
    m = _K_RE.match(metric)
    return (m.group(1), int(m.group(2))) if m else None


@dataclass
class RunData:
    run_dir: Path
    run_id: str
    sweep: str
    algorithm: str
    seed: Optional[int]
    status: str
    error: Optional[str]
    summary: dict
    config: dict
    rows: list[dict] = field(default_factory=list)
    budget_unit: str = "steps"

    @property
    def results_root(self) -> Path:
        return self.run_dir.resolve().parent.parent

    def counter(self, row: dict) -> Optional[float]:
        """Budget consumed at ``row`` in the run's unit."""
        v = row_consumed(row, self.budget_unit)
        return float(v) if is_number(v) else None

    @property
    def budget_consumed(self) -> Optional[float]:
        consumed = (self.summary.get("budget") or {}).get("consumed") or {}
        v = consumed.get(self.budget_unit)
        if is_number(v):
            return float(v)
        for r in reversed(self.rows):
            c = self.counter(r)
            if c is not None:
                return c
        return None

    @property
    def task(self) -> str:
        t = self.config.get("task")
        t = t.get("name") if isinstance(t, dict) else t
        return str(t or "task")

    def eval_rows(self) -> list[dict]:
        return [r for r in self.rows if any(k.startswith("eval/") for k in r)]

    @property
    def initial_eval(self) -> dict[str, float]:
        e = eval_metrics(self.summary.get("initial_eval"), self.task)
        if not e:
            ev = self.eval_rows()
            if ev and (self.counter(ev[0]) or 0) == 0:
                e = row_eval_metrics(ev[0])
        return e

    @property
    def final_eval(self) -> dict[str, float]:
        e = eval_metrics(self.summary.get("final_eval"), self.task)
        if not e and self.status == "finished":
            ev = self.eval_rows()
            if ev:
                e = row_eval_metrics(ev[-1])
        return e

    @property
    def peak(self) -> dict[str, Optional[float]]:
        p = self.summary.get("peak") or {}
        out = {k: (float(p[k]) if is_number(p.get(k)) else None) for k in ("rss_mb", "rss_above_base_mb", "cuda_mb")}
        for k, rk in (("rss_mb", "perf/peak_rss_mb"), ("rss_above_base_mb", "perf/peak_rss_above_base_mb"),
                      ("cuda_mb", "perf/peak_cuda_mb")):
            if out[k] is None:
                vals = [r[rk] for r in self.rows if is_number(r.get(rk))]
                out[k] = float(max(vals)) if vals else None
        return out

    @property
    def wall_seconds(self) -> Optional[float]:
        v = self.summary.get("wall_seconds")
        return float(v) if is_number(v) else None

    @property
    def train_seconds(self) -> Optional[float]:
        v = ((self.summary.get("budget") or {}).get("consumed") or {}).get("seconds")
        if is_number(v):
            return float(v)
        vals = [r["seconds"] for r in self.rows if is_number(r.get("seconds"))]
        return float(vals[-1]) if vals else None


def load_run(run_dir: str | os.PathLike) -> RunData:
    """Read one run directory (nothing is required but the directory itself)."""
    run_dir = Path(run_dir)
    summary = read_json(run_dir / SUMMARY, {}) or {}
    config = summary.get("config") if isinstance(summary.get("config"), dict) else None
    if not config:
        config = _load_yaml(run_dir / CONFIG)
    rows = read_jsonl(run_dir / METRICS)
    algo = summary.get("algorithm") or config.get("algorithm")
    if isinstance(algo, dict):
        algo = algo.get("name")
    run_id = summary.get("run_id") or run_dir.name
    if not algo:
        algo = parse_run_id(run_id).algorithm
    seed = summary.get("seed", config.get("seed"))
    unit = (summary.get("budget") or {}).get("unit") or (config.get("budget") or {}).get("unit") or "steps"
    status = summary.get("status")
    error = summary.get("error")
    if (run_dir / "error.txt").exists():
        status = status if status and status != "running" else "failed"
        if not error:
            lines = (run_dir / "error.txt").read_text(errors="replace").strip().splitlines()
            error = lines[-1] if lines else "error.txt present"
    if not status:
        status = "running"
    return RunData(run_dir=run_dir, run_id=str(run_id),
                   sweep=str(summary.get("name") or config.get("name") or run_dir.parent.name),
                   algorithm=str(algo), seed=seed if isinstance(seed, int) else None,
                   status=str(status), error=error, summary=summary, config=config or {},
                   rows=rows, budget_unit=str(unit))


def load_runs(root: str | os.PathLike) -> list[RunData]:
    return [load_run(d) for d in find_run_dirs(root)]


def summary_metrics(summary: dict, unit: str, default_task: str = "task", key=lambda k: k) -> dict[str, float]:
    """Run-level metrics from a summary.json: ``final/<task>/<metric>``, ``initial/...``,
    ``peak/<rss_mb|rss_above_base_mb|cuda_mb>``, ``wall_seconds``, ``budget/consumed`` (in
    ``unit``), ``n_params/<policy|reference|critic>``. ``key`` maps each name (trackers use
    it to make names valid for their backend)."""
    summary = summary or {}
    out: dict[str, float] = {}
    for prefix, src in (("final", "final_eval"), ("initial", "initial_eval")):
        for k, v in eval_metrics(summary.get(src), default_task).items():
            out[key(f"{prefix}/{k}")] = v
    for k, v in (summary.get("peak") or {}).items():
        if is_number(v):
            out[key(f"peak/{k}")] = float(v)
    if is_number(summary.get("wall_seconds")):
        out[key("wall_seconds")] = float(summary["wall_seconds"])
    consumed = (summary.get("budget") or {}).get("consumed") or {}
    if is_number(consumed.get(unit)):
        out[key("budget/consumed")] = float(consumed[unit])
    for k, v in (summary.get("params") or {}).items():
        if is_number(v):
            out[key(f"n_params/{k}")] = float(v)
    return out
