"""Reading finished (or unfinished) run directories back: shared by `harness sync` and
`harness report`.

Layout (docs/architecture.md): ``<output_dir>/<name>/<run_id>/`` with ``config.yaml``,
``summary.json``, ``metrics.jsonl``, ``eval/<task>_<step>.jsonl``. Everything here is
read-only, bounded and tolerant: a missing summary, a torn last JSONL line or an unknown key
never raises; the caller sees ``None``/empty values instead. A file that is there but
unusable (not a regular file, too large, binary, too deeply nested, of the wrong type: see
:mod:`harness.rundir.layout`) makes the run ``unreadable``, with the reason in
:attr:`RunData.error`; one bad run never stops a reader of many.

A summary that says ``finished`` is believed only when the run directory bears it out
(:func:`finished_problem`: the budget consumed in summary.json and on the last metrics row
agree and reach the budget, and the final evaluation is the evaluation row logged at the
end); otherwise the run is ``unverified`` (not finished) with the reason.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Optional

from harness.foundation.base import did_you_mean, flatten
from harness.foundation.budget import BUDGET_UNITS, COUNTERS, EPS, counter_key, row_consumed
from harness.rundir.ids import parse_run_id
from harness.rundir.layout import (CONFIG, ERROR_TXT, METRICS, SETUP_DIR, SUMMARY, RunFileError, is_non_run_dir,
                                   load_json, nonregular, read_bytes_bounded, read_json, read_metrics, warn_once)

_K_RE = re.compile(r"^(maj|pass)@(\d+)$")
UNREADABLE = "unreadable"
"""Status of a run whose files cannot be read (the reason is its ``error``)."""
UNVERIFIED = "unverified"
"""Status of a run whose summary says finished but whose files do not bear it out."""


def _d(v: Any) -> dict:
    """``v`` if it is a dict, else ``{}`` (a summary field of the wrong type reads as absent)."""
    return v if isinstance(v, dict) else {}


def _load_yaml(path: Path) -> dict:
    try:
        import yaml
        data = yaml.safe_load(read_bytes_bounded(path).decode("utf-8", errors="replace"))
        return data if isinstance(data, dict) else {}
    except Exception:
        return {}


def is_run_dir(path: Path) -> bool:
    """A run directory holds metrics.jsonl (of any kind: a FIFO is listed as unreadable, never
    opened), or a summary.json that names a run_id or cannot be read at all."""
    path = Path(path)
    if os.path.exists(path / METRICS):
        return True
    try:
        s = load_json(path / SUMMARY)
    except FileNotFoundError:
        return False
    except (RunFileError, OSError):
        return True  # a summary.json that cannot be read: a (broken) run directory
    return "run_id" in s


def unreadable_files(run_dir: Path) -> list[str]:
    """``"<file> is a FIFO, not a regular file"`` for each of the run's metrics.jsonl /
    summary.json that exists but is not a regular file (whoever opens one may block forever);
    without a metrics.jsonl, also why its summary.json cannot be read (nothing to replay)."""
    run_dir = Path(run_dir)
    out = [f"{name} is {kind}, not a regular file" for name in (METRICS, SUMMARY)
           if (kind := nonregular(run_dir / name))]
    if not out and not os.path.exists(run_dir / METRICS):
        try:
            load_json(run_dir / SUMMARY)
        except FileNotFoundError:
            pass
        except (RunFileError, OSError) as e:
            out.append(_problem(e, SUMMARY))
    return out


def find_run_dirs(root: str | os.PathLike, skip_unreadable: bool = True,
                  is_run: Optional[Callable[[Path], bool]] = None) -> list[Path]:
    """Every run directory at or under ``root`` (a results root, a sweep dir or a run dir),
    sorted. Checkpoints, eval records, wandb/mlflow stores, reports and a sweep's setup jobs are not
    descended (:func:`harness.rundir.layout.is_non_run_dir`, the rule every reader shares).
    ``skip_unreadable``: a run whose metrics.jsonl or summary.json is not a regular file (a
    FIFO, a device), or that has only a summary.json that cannot be read, is left out with a
    warning (whoever replays it would open it, or find nothing to replay); `harness report`
    lists such runs instead (:func:`load_run`). ``is_run``: what counts as a run directory
    (default :func:`is_run_dir`; `harness sync` also counts dangling links)."""
    is_run = is_run or is_run_dir
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"no such directory: {root}")
    if is_run(root):
        found = [root]
    else:
        found = []
        for dirpath, dirnames, _ in os.walk(root):
            d = Path(dirpath)
            if d != root and is_run(d):
                found.append(d)
                dirnames[:] = []
                continue
            dirnames[:] = sorted(n for n in dirnames if not is_non_run_dir(d, n))
    if skip_unreadable:
        keep = []
        for d in found:
            bad = unreadable_files(d)
            if bad:
                warn_once(f"skipped {d}: {'; '.join(bad)}; delete it (or restore the run's own file)")
            else:
                keep.append(d)
        found = keep
    return sorted(found)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def setup_records(sweep_dir: str | os.PathLike) -> list[tuple[Path, dict]]:
    """``(folder, its setup_seconds)`` of each setup record under ``<sweep_dir>/setup/``, in folder
    order; [] without any. A setup record is a folder (not a link) whose summary.json has
    ``setup_seconds`` that reached the start evaluation (``initial_eval``), whatever the process did
    after it: a setup job's, or that of a process stopped once its setup was done. The seconds kept
    are the numeric ones (``warmup_build``, ``warmup_wait``, ``initial_eval``), as floats."""
    out = []
    root = Path(sweep_dir) / SETUP_DIR
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if not d.is_dir() or d.is_symlink():
            continue
        s = read_json(d / SUMMARY, {})
        secs = s.get("setup_seconds") if isinstance(s, dict) else None
        if isinstance(secs, dict) and is_number(secs.get("initial_eval")):
            out.append((d, {k: float(v) for k, v in secs.items() if is_number(v)}))
    return out


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
    problems: list[str] = field(default_factory=list)
    """Why files of the run could not be used (``"summary.json: is not UTF-8 text"``); empty when all could."""

    @property
    def results_root(self) -> Path:
        return self.run_dir.resolve().parent.parent

    def counter(self, row: dict) -> Optional[float]:
        """Budget consumed at ``row`` in the run's unit."""
        v = row_consumed(row, self.budget_unit)
        return float(v) if is_number(v) else None

    @property
    def budget_consumed(self) -> Optional[float]:
        consumed = _d(_d(self.summary.get("budget")).get("consumed"))
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

    # computed once per run (a study reads each pass@K of each run: K² work per run otherwise); the
    # summary and rows of a RunData are not changed after it is read, and callers only read these
    @cached_property
    def initial_eval(self) -> dict[str, float]:
        e = eval_metrics(self.summary.get("initial_eval"), self.task)
        if not e:
            ev = self.eval_rows()
            if ev and (self.counter(ev[0]) or 0) == 0:
                e = row_eval_metrics(ev[0])
        return e

    @cached_property
    def final_eval(self) -> dict[str, float]:
        e = eval_metrics(self.summary.get("final_eval"), self.task)
        if not e and self.status == "finished":
            ev = self.eval_rows()
            if ev:
                e = row_eval_metrics(ev[-1])
        return e

    @property
    def peak(self) -> dict[str, Optional[float]]:
        p = _d(self.summary.get("peak"))
        out = {k: (float(p[k]) if is_number(p.get(k)) else None) for k in ("rss_mb", "rss_above_base_mb", "cuda_mb")}
        for k, rk in (("rss_mb", "perf/peak_rss_mb"), ("rss_above_base_mb", "perf/peak_rss_above_base_mb"),
                      ("cuda_mb", "perf/peak_cuda_mb")):
            if out[k] is None:
                vals = [r[rk] for r in self.rows if is_number(r.get(rk))]
                out[k] = float(max(vals)) if vals else None
        return out

    @property
    def wall_seconds(self) -> Optional[float]:
        """The summary's ``wall_seconds``; None when absent, or negative (a clock that stepped
        back under a run written before durations were measured on a monotonic clock)."""
        v = self.summary.get("wall_seconds")
        return float(v) if is_number(v) and v >= 0 else None

    @property
    def resumed(self) -> bool:
        """Whether the run was resumed after an interruption (the summary's ``resumed_from_step``)."""
        return is_number(self.summary.get("resumed_from_step"))

    @property
    def whole_wall_seconds(self) -> Optional[float]:
        """The run's wall-clock from start to end: `wall_seconds`, or None for a resumed run, whose summary holds
        only its last attempt's (tables and plots that compare runs' wall-clock leave it out and say so)."""
        return None if self.resumed else self.wall_seconds

    @property
    def train_seconds(self) -> Optional[float]:
        v = _d(_d(self.summary.get("budget")).get("consumed")).get("seconds")
        if is_number(v):
            return float(v)
        vals = [r["seconds"] for r in self.rows if is_number(r.get("seconds"))]
        return float(vals[-1]) if vals else None


def _close(a: Any, b: Any) -> bool:
    return is_number(a) and is_number(b) and math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)


def _fmt(v: Any) -> str:
    return f"{v:g}" if is_number(v) else repr(v)


def finished_problem(run_dir: str | os.PathLike, summary: Any, budget: Any = None,
                     rows: Optional[list[dict]] = None, task: str = "task") -> Optional[str]:
    """Why a run whose summary says ``finished`` cannot be believed (None when it can): a forged
    or hand-edited ``{"status": "finished"}`` on a run stopped part-way would otherwise be
    skipped by the trainer and the sweep and counted by the report.

    Believed when (``budget``: the run's, a ``BudgetConfig`` or ``{"unit", "amount"}``; default
    the summary's): the summary records that budget, consumed up to its amount in its unit;
    it has a final evaluation; metrics.jsonl's last row carries the same budget counters as the
    summary's ``budget.consumed``; and a metrics row at that point holds the final evaluation's
    values. ``rows``: the run's metrics rows when already read (:func:`read_metrics`)."""
    run_dir = Path(run_dir)
    s = _d(summary)
    if s.get("status") != "finished":
        return f"its status is {s.get('status')!r}"
    sb = _d(s.get("budget"))
    if budget is None:
        unit, amount = sb.get("unit"), sb.get("amount")
    elif isinstance(budget, dict):
        unit, amount = budget.get("unit"), budget.get("amount")
    else:
        unit, amount = getattr(budget, "unit", None), getattr(budget, "amount", None)
    if unit not in BUDGET_UNITS or not is_number(amount) or amount <= 0:
        return "it records no budget (budget.unit, budget.amount)"
    if budget is not None and (sb.get("unit") != unit or not _close(sb.get("amount"), amount)):
        return (f"its budget ({_fmt(sb.get('amount'))} {sb.get('unit')}) is not the run's "
                f"({_fmt(amount)} {unit})")
    consumed = _d(sb.get("consumed"))
    used = consumed.get(unit)
    if not is_number(used):
        return f"it records no budget consumed in {unit}"
    if used < amount - EPS:
        return f"it consumed {_fmt(used)} of its {_fmt(amount)} {unit}"
    final = eval_metrics(s.get("final_eval"), task)
    if not final:
        return "it has no final evaluation"
    if rows is None:
        try:
            rows = read_metrics(run_dir / METRICS, warn=False, strict=True)
        except (RunFileError, OSError) as e:
            return f"metrics.jsonl cannot be read ({getattr(e, 'problem', None) or e})"
    counted = [r for r in rows if any(c in r for c in COUNTERS)]
    if not counted:
        return "metrics.jsonl has no rows"
    last = counted[-1]
    for u in BUDGET_UNITS:
        k = counter_key(u)
        if k in last and u in consumed and not _close(last[k], consumed[u]):
            return (f"metrics.jsonl ends at {k}={_fmt(last[k])} but summary.json's budget.consumed.{u} is "
                    f"{_fmt(consumed[u])}")
    key = counter_key(unit)
    if not _close(row_consumed(last, unit), used):
        return f"metrics.jsonl's last row has no {key} counter of {_fmt(used)}"
    at_end = [row_eval_metrics(r) for r in counted if _close(row_consumed(r, unit), used)]
    at_end = [e for e in at_end if e]
    if not at_end:
        return f"metrics.jsonl has no evaluation row at the end of the budget ({key}={_fmt(used)})"
    if not any(all(k in e and (_close(e[k], v) or not math.isfinite(v)) for k, v in final.items()) for e in at_end):
        return f"its final_eval is not the evaluation logged at the end of the budget ({key}={_fmt(used)})"
    return None


def _problem(e: BaseException, name: str) -> str:
    if isinstance(e, RunFileError):
        return f"{name}: {e.problem}"
    if isinstance(e, OSError):
        return f"{name}: {e.strerror or e}"
    return f"{name}: {type(e).__name__}: {e}"


def load_run(run_dir: str | os.PathLike) -> RunData:
    """Read one run directory (nothing is required but the directory itself). Never raises: a
    run whose files cannot be read comes back ``unreadable`` with the reason as its error."""
    run_dir = Path(run_dir)
    try:
        return _load_run(run_dir)
    except Exception as e:  # one bad run never takes a reader of many down
        why = f"{type(e).__name__}: {e}"
        return RunData(run_dir=run_dir, run_id=run_dir.name, sweep=run_dir.parent.name,
                       algorithm=str(parse_run_id(run_dir.name).algorithm), seed=None, status=UNREADABLE,
                       error=why, summary={}, config={}, problems=[why])


def _load_run(run_dir: Path) -> RunData:
    problems: list[str] = []
    try:
        summary = load_json(run_dir / SUMMARY)
    except FileNotFoundError:
        summary = {}
    except (RunFileError, OSError) as e:
        problems.append(_problem(e, SUMMARY))
        summary = {}
    config = summary.get("config") if isinstance(summary.get("config"), dict) else None
    if not config:
        config = _load_yaml(run_dir / CONFIG)
    try:
        rows = read_metrics(run_dir / METRICS, strict=True)
    except (RunFileError, OSError) as e:
        problems.append(_problem(e, METRICS))
        rows = []
    algo = summary.get("algorithm") or _d(config.get("algorithm")).get("name")  # config.yaml: a mapping
    run_id = summary.get("run_id") or run_dir.name
    if not isinstance(algo, str) or not algo:
        algo = parse_run_id(str(run_id)).algorithm
    seed = summary.get("seed", config.get("seed"))
    unit = _d(summary.get("budget")).get("unit") or _d(config.get("budget")).get("unit") or "steps"
    unit = unit if unit in BUDGET_UNITS else "steps"
    status = summary.get("status") if isinstance(summary.get("status"), str) else None
    error = summary.get("error") if isinstance(summary.get("error"), str) else None
    if os.path.lexists(run_dir / ERROR_TXT):
        status = status if status and status != "running" else "failed"
        if not error:
            try:
                lines = read_bytes_bounded(run_dir / ERROR_TXT, 64 * 1024, tail=True).decode(
                    "utf-8", errors="replace").strip().splitlines()
                error = lines[-1] if lines else "error.txt present"
            except (RunFileError, OSError) as e:
                error = _problem(e, ERROR_TXT)
    if not status:
        status = "running"
    task = (config.get("task") or {}).get("name") if isinstance(config.get("task"), dict) else config.get("task")
    if status == "finished" and not problems:
        why = finished_problem(run_dir, summary, rows=rows, task=str(task or "task"))
        if why:
            status, error = UNVERIFIED, f"summary.json says finished, but {why}"
    if problems:
        status, error = UNREADABLE, "; ".join(problems)
    return RunData(run_dir=run_dir, run_id=str(run_id),
                   sweep=str(summary.get("name") or config.get("name") or run_dir.parent.name),
                   algorithm=str(algo), seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
                   status=str(status), error=error, summary=summary, config=config or {},
                   rows=rows, budget_unit=str(unit), problems=problems)


def summary_metrics(summary: dict, unit: str, default_task: str = "task", key=lambda k: k) -> dict[str, float]:
    """Run-level metrics from a summary.json: ``final/<task>/<metric>``, ``initial/...``,
    ``peak/<rss_mb|rss_above_base_mb|cuda_mb>``, ``wall_seconds``, ``budget/consumed`` (in
    ``unit``), ``n_params/<policy|reference|critic>``. ``key`` maps each name (trackers use
    it to make names valid for their backend)."""
    summary = _d(summary)
    out: dict[str, float] = {}
    for prefix, src in (("final", "final_eval"), ("initial", "initial_eval")):
        for k, v in eval_metrics(summary.get(src), default_task).items():
            out[key(f"{prefix}/{k}")] = v
    for k, v in _d(summary.get("peak")).items():
        if is_number(v):
            out[key(f"peak/{k}")] = float(v)
    if is_number(summary.get("wall_seconds")) and summary["wall_seconds"] >= 0:
        out[key("wall_seconds")] = float(summary["wall_seconds"])
    consumed = _d(_d(summary.get("budget")).get("consumed"))
    if is_number(consumed.get(unit)):
        out[key("budget/consumed")] = float(consumed[unit])
    for k, v in _d(summary.get("params")).items():
        if is_number(v):
            out[key(f"n_params/{k}")] = float(v)
    return out


def summary_value(summary: Any, path: str) -> Any:
    """Look up a dotted path in a summary, where keys may themselves contain '/' or '.'
    (``final_eval.eval/arith/acc``, ``peak.rss_mb``); None when it is not there."""
    cur: Any = summary
    rest = path
    while rest:
        if not isinstance(cur, dict):
            return None
        if rest in cur:
            return cur[rest]
        parts = rest.split(".")
        for i in range(len(parts) - 1, 0, -1):
            k = ".".join(parts[:i])
            if k in cur:
                cur, rest = cur[k], ".".join(parts[i:])
                break
        else:
            return None
    return cur


def columns_in_no_run(summaries: list, columns: list[str]) -> list[str]:
    """One warning line per column of ``columns`` (dotted paths into summary.json: a sweep file's
    ``report.columns``) that none of the finished runs' ``summaries`` holds, with the closest path they do
    hold; [] when every column is found somewhere, or when no run has finished (an unfinished run's summary
    lacks its final figures, so an interrupted sweep would warn of columns that are only not filled yet)."""
    summaries = [s for s in summaries if isinstance(s, dict) and s and s.get("status") == "finished"]
    if not summaries:
        return []
    out = []
    known: Optional[list[str]] = None
    for c in columns:
        if any(summary_value(s, c) is not None for s in summaries):
            continue
        if known is None:
            known = sorted({k for s in summaries for k in flatten(s, keep_empty=True)})
        out.append(f"report.columns: {c!r} is in no run's summary.json, so its column is empty"
                   f"{did_you_mean(c, known)} (a column is a dotted path into summary.json, e.g. peak.rss_mb, "
                   f"wall_seconds, final_eval.eval/<task>/acc)")
    return out
