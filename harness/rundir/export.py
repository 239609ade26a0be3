"""Exporting finished run folders, trimmed to what the report and a resume need, small enough to commit (`harness export`).

A sweep's results folder (``results/<sweep>/``) holds run folders (``<algorithm>-s<seed>-<hash8>/``)
beside ``sweep.json``, ``report/``, ``study/`` and the like. :func:`export_runs` copies each
*finished* run folder (summary.json says ``finished`` and its files bear it out:
:func:`harness.rundir.read.finished_problem`) into ``DEST/<run_id>/`` with:

- ``config.yaml``, ``summary.json``, ``metrics.jsonl``: byte for byte;
- of ``eval/``: the start (step 0) and final evaluation records, ``<task>_<step>.jsonl`` and
  ``<task>_<step>_samples.jsonl`` (every task: in-domain, ``_ood``), and the validation records
  ``<task>_validation.jsonl`` (the end) and ``<task>_validation_start.jsonl`` (the start); the intermediate
  evaluations' records are left out (the report reads only the start and the end: :mod:`harness.report.problems`;
  the curves come from metrics.jsonl). A record with samples becomes a compact record (`evals.records.compact_record`:
  the n samples as their correct and valid counts, answer-key histograms in first-appearance order
  and the pass@k / maj@k curves, plain and valid-step, at k = 1, 2, 4, ..., n: every curve at every k
  comes back exactly from it, and a 256-sample record shrinks from ~20 kB to ~1 kB); its greedy item
  keeps :data:`GREEDY_KEYS`. A record without samples keeps only :data:`RECORD_KEYS` (``question``,
  every completion and extracted answer text dropped), its greedy item :data:`GREEDY_KEYS`; values
  and key order are the original's. Written as compact JSON lines;
- nothing else: no weights (``final_model/``), ``checkpoint/``, optimizer state, caches, logs.

The sweep folder's ``sweep.json`` is copied too (unless it is unusable: :func:`sweep_json_problem`), and so are its setup jobs' ``config.yaml`` and
``summary.json`` (those whose setup finished) (``setup/<job>/``: each seed's warm-up and start evaluation, built before the runs by
`harness.sweep.run`; the study report counts their time). Unfinished runs are skipped (one line each).
Exporting again writes the same bytes (files whose bytes are already right are left alone).
Only regular files inside a run are read (the rule of `harness sync`:
:func:`harness.foundation.files.regular_inside_problem`; a run with a file linked out is skipped, with
the reason), and nothing is written through a symbolic link in DEST; DEST holds only what an export
writes (run folders, ``sweep.json``, ``setup/``): a folder with other files is refused (:func:`dest_problem`).
Bad inputs (RUNS_DIR missing, DEST inside it, no finished run) raise :class:`ExportError`
before anything is copied.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from evals.records import compact_record
from harness.foundation.base import ConfigError
from harness.foundation.files import link_on_the_way, outside_problem, regular_inside_problem, rewrite_atomic
from harness.rundir.layout import (CONFIG, METRICS, SETUP_DIR, SUMMARY, SWEEP_JSON, RunFileError, is_non_run_dir,
                                   json_type, load_json)
from harness.rundir.read import finished_problem, is_run_dir, setup_records

__all__ = ["ExportError", "ExportResult", "RunChoice", "RECORD_KEYS", "GREEDY_KEYS", "SAMPLE_KEYS", "COPIED",
           "SWEEP_JSON", "trim_record", "trim_records", "kept_eval_files", "choose_runs", "plan_export",
           "export_runs", "none_finished", "sweep_json_problem"]

COPIED = (CONFIG, SUMMARY, METRICS)
"""The run files copied as they are."""
EVAL_DIR = "eval"
RECORD_KEYS = ("id", "gold", "greedy", "samples", "num_correct", "num_valid", "pass@k", "maj@k",
               "valid_pass@k", "valid_maj@k", "n")
"""What a trimmed record keeps (in the record's own order): everything but the question text."""
GREEDY_KEYS = ("key", "correct", "valid", "finished")
"""What a trimmed greedy item keeps: no completion, no extracted answer text, no token count."""
SAMPLE_KEYS = ("key", "correct", "valid")
"""What a trimmed sample item keeps: the voting key and the grades (pass@k / maj@k rebuild from them)."""
_STEP_FILE = re.compile(r"^(?P<task>.+)_(?P<step>\d+)(?P<samples>_samples)?\.jsonl$")
_VALIDATION_FILE = re.compile(r"^.+_validation(_start)?\.jsonl$")


class ExportError(ConfigError):
    """Export inputs that cannot work (named before anything is copied)."""


@dataclass
class RunChoice:
    """The run folders of RUNS_DIR: finished ones to export, the others with why they are skipped."""
    finished: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    """``(folder name, why)`` per run folder that is not exported."""


@dataclass
class ExportResult:
    exported: list = field(default_factory=list)
    """Run ids exported."""
    skipped: list = field(default_factory=list)
    """``(folder name, why)``."""
    bytes: int = 0
    """Total bytes of every file the export holds (written now or already right)."""
    written: int = 0
    """Files whose bytes changed (0 when exporting again over the same export)."""


# --------------------------------------------------------------------------- trimming records


def _pick(d: dict, keys) -> dict:
    """The entries of ``d`` whose key is in ``keys``, in ``d``'s order."""
    return {k: v for k, v in d.items() if k in keys}


def trim_record(rec: Any) -> Any:
    """One evaluation record without texts: :data:`RECORD_KEYS`, the greedy item's
    :data:`GREEDY_KEYS`, each sample's :data:`SAMPLE_KEYS` (a non-mapping is returned as it is)."""
    if not isinstance(rec, dict):
        return rec
    samples = rec.get("samples")
    if isinstance(samples, list) and samples and all(isinstance(x, dict) and "key" in x and "correct" in x
                                                     for x in samples):
        out = compact_record(rec)  # the n samples as counts, answer histograms and curves at k = 1, 2, 4, ..., n
        if isinstance(out.get("greedy"), dict):
            out["greedy"] = _pick(out["greedy"], GREEDY_KEYS)
        return out
    out = _pick(rec, RECORD_KEYS)
    if isinstance(out.get("greedy"), dict):
        out["greedy"] = _pick(out["greedy"], GREEDY_KEYS)
    elif out.get("greedy") is not None:  # not an item (a bare completion text): dropped
        del out["greedy"]
    if isinstance(out.get("samples"), list):
        out["samples"] = [_pick(s, SAMPLE_KEYS) if isinstance(s, dict) else s for s in out["samples"]]
    return out


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def trim_records(path: str | os.PathLike) -> bytes:
    """The bytes of a trimmed copy of the JSONL records file ``path`` (one compact line per record)."""
    lines = []
    with open(path, "r", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise RunFileError(f"{path}: line {i} is not JSON ({e.msg}); the run's records are damaged") from None
            lines.append(_dump(trim_record(rec)) + "\n")
    return "".join(lines).encode("utf-8")


def kept_eval_files(eval_dir: str | os.PathLike) -> list[Path]:
    """The evaluation records an export keeps, sorted: the start's (step 0) and the final
    evaluation's (the largest step), plain and ``_samples``, of every task, and the validation
    records; intermediate steps are left out."""
    d = Path(eval_dir)
    if not d.is_dir():
        return []
    steps: dict[Path, int] = {}
    validation = []
    for p in d.iterdir():
        if not p.is_file():
            continue
        m = _STEP_FILE.match(p.name)
        if m:
            steps[p] = int(m.group("step"))
        elif _VALIDATION_FILE.match(p.name):
            validation.append(p)
    final = max(steps.values(), default=0)
    return sorted([p for p, s in steps.items() if s in (0, final)] + validation)


# --------------------------------------------------------------------------- choosing and checking


def _is_within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def _task_name(summary: dict) -> str:
    cfg = summary.get("config")
    task = cfg.get("task") if isinstance(cfg, dict) else None
    name = task.get("name") if isinstance(task, dict) else None
    return name if isinstance(name, str) else "task"


def choose_runs(runs_dir: str | os.PathLike, pattern: Optional[str] = None) -> RunChoice:
    """The run folders directly in ``runs_dir`` (each holding summary.json or metrics.jsonl;
    ``_cache``, ``report``, ``study``, ``setup`` and hidden folders are not runs: the rule of every
    reader, :func:`harness.rundir.layout.is_non_run_dir`), matching the glob
    ``pattern`` when given: finished ones, and the rest with why they are skipped."""
    root = Path(runs_dir)
    choice = RunChoice()
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.is_symlink() or is_non_run_dir(root, d.name):
            continue
        if not ((d / SUMMARY).exists() or (d / METRICS).exists()):
            continue
        if pattern is not None and not fnmatch.fnmatch(d.name, pattern):
            continue
        try:
            s = load_json(d / SUMMARY)
        except FileNotFoundError:
            choice.skipped.append((d.name, "no summary.json (never finished)"))
            continue
        except (RunFileError, OSError) as e:
            choice.skipped.append((d.name, f"summary.json cannot be read ({getattr(e, 'problem', None) or e})"))
            continue
        st = s.get("status")
        if st != "finished":
            choice.skipped.append((d.name, f"status {st!r}, not finished"))
            continue
        why = finished_problem(d, s, task=_task_name(s))
        if why:
            choice.skipped.append((d.name, f"summary.json says finished, but {why}"))
            continue
        why = link_problem(d)
        if why:
            choice.skipped.append((d.name, why))
            continue
        choice.finished.append(d)
    return choice


def link_problem(run_dir: Path) -> Optional[str]:
    """Why a run folder is not exported for what it links to (None when nothing): a file the export
    copies (``config.yaml``, ``summary.json``, ``metrics.jsonl``, a kept evaluation record) or its
    ``eval/`` folder that is not a regular file (folder) inside the run once every link is resolved;
    the rule of `harness sync` (:func:`harness.foundation.files.regular_inside_problem`): a link to a
    secret is never copied into an export."""
    root = run_dir.resolve()
    for name in COPIED:
        if os.path.lexists(run_dir / name):
            why = regular_inside_problem(run_dir / name, root)
            if why:
                return f"{name}: {why}"
    if os.path.lexists(run_dir / EVAL_DIR):
        why = outside_problem(run_dir / EVAL_DIR, root)
        if why:
            return f"{EVAL_DIR}/: {why}"
    for p in kept_eval_files(run_dir / EVAL_DIR):
        why = regular_inside_problem(p, root)
        if why:
            return f"{EVAL_DIR}/{p.name}: {why}"
    return None


def dest_problem(dest: Path) -> Optional[str]:
    """Why ``dest`` may not take an export (None when it may): it holds something an export does
    not write (an export holds run folders, ``sweep.json`` and ``setup/``), or a link where the
    export writes (a symlinked run folder would send the export into another folder)."""
    if not dest.is_dir():
        return None
    foreign, links = [], []
    for e in sorted(dest.iterdir()):
        if e.name.startswith("."):
            continue
        if e.is_symlink():
            links.append(e.name)
        elif e.name == SWEEP_JSON and e.is_file():
            continue
        elif e.is_dir() and (e.name == SETUP_DIR or any(os.path.lexists(e / n) for n in COPIED)):
            continue
        else:
            foreign.append(e.name)
    if links:
        return (f"DEST={str(dest)!r} is invalid: {links[0]} in it is a symbolic link (to {os.readlink(dest / links[0])})"
                f"; an export never writes through a link: remove it or choose another folder")
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        return (f"DEST={str(dest)!r} is invalid: it holds files harness export did not write ({shown}); an export "
                f"holds run folders, sweep.json and setup/ only: choose a new or empty folder")
    return None


def plan_export(runs_dir: str | os.PathLike, dest: str | os.PathLike, pattern: Optional[str] = None) -> RunChoice:
    """Check the inputs and choose the runs; raises :class:`ExportError` (one line naming the
    problem) when RUNS_DIR is missing or not a folder, DEST is RUNS_DIR, inside it or a file,
    or no run is finished. Copies nothing."""
    src = Path(runs_dir).expanduser()
    if not src.exists():
        raise ExportError(f"RUNS_DIR={str(runs_dir)!r} is invalid: no such directory")
    if not src.is_dir():
        raise ExportError(f"RUNS_DIR={str(runs_dir)!r} is invalid: not a directory")
    out = Path(dest).expanduser()
    src_r, out_r = src.resolve(), out.resolve()
    if _is_within(out_r, src_r):
        raise ExportError(f"DEST={str(dest)!r} is invalid: it is inside RUNS_DIR {str(runs_dir)!r} (the export "
                          f"would be exported again next time); choose a folder outside it")
    if out.exists() and not out.is_dir():
        raise ExportError(f"DEST={str(dest)!r} is invalid: it is a file, not a directory")
    why = dest_problem(out)
    if why:
        raise ExportError(why)
    choice = choose_runs(src, pattern)
    if not choice.finished:
        raise ExportError(none_finished(choice, f"RUNS_DIR={str(runs_dir)!r}", src, "export", pattern))
    return choice


def none_finished(choice: RunChoice, name: str, folder: Path, verb: str, pattern: Optional[str] = None) -> str:
    """The one line for a folder with no finished run to ``verb`` (export, report): how many run
    folders it holds and why the first is not finished; or that it holds none, and, when ``folder`` is
    itself a run folder, that its parent is the folder to give."""
    what = f" matching --runs {pattern!r}" if pattern is not None else ""
    if choice.skipped:
        first = f": {choice.skipped[0][0]}: {choice.skipped[0][1]}" + (", ..." if len(choice.skipped) > 1 else "")
        return f"{name} has no finished runs to {verb} ({len(choice.skipped)} run folder(s){what}, none finished{first})"
    if is_run_dir(folder):
        return (f"{name} has no finished runs to {verb}: it is a run folder itself, not a sweep's results folder; "
                f"give its parent, {str(Path(folder).parent)!r}" + (f" (with --runs {folder.name!r} for this run alone)"
                                                                     if verb == "export" else ""))
    return f"{name} has no finished runs to {verb} (no run folders{what}: a run folder holds summary.json)"


def sweep_json_problem(runs_dir: str | os.PathLike) -> Optional[str]:
    """Why ``<runs_dir>/sweep.json`` cannot be used (None when it can, or when there is none): not a
    regular file, not UTF-8 JSON, not an object, or an object whose ``runs`` / ``report_columns`` /
    ``report`` are of the wrong type (not what `harness sweep` writes)."""
    p = Path(runs_dir).expanduser() / SWEEP_JSON
    if not os.path.lexists(p):
        return None
    try:
        doc = load_json(p)
    except FileNotFoundError:
        return f"{p} is a symbolic link to {os.readlink(p)}, which does not exist"
    except RunFileError as e:
        return f"{p}: {e.problem}"
    except OSError as e:
        return f"{p}: {e.strerror or e}"
    for key, typ in (("runs", list), ("report_columns", list), ("report", dict)):
        if key in doc and doc[key] is not None and not isinstance(doc[key], typ):
            want = "an array" if typ is list else "an object"
            return f"{p}: its {key!r} is {json_type(doc[key])}, not {want} (not a sweep.json `harness sweep` wrote)"
    return None


# --------------------------------------------------------------------------- writing


def _link_refusal(dest: Path, link: Path) -> ExportError:
    return ExportError(f"DEST={str(dest)!r} is invalid: {link} is a symbolic link (to {os.readlink(link)}); an export "
                       f"never writes through a link: remove it")


def _put(path: Path, data: bytes, dest: Path) -> bool:
    """Write ``data`` to ``path`` (under ``dest``) atomically (:func:`harness.foundation.files.rewrite_atomic`),
    readable by all (0644, as a committed file is), unless it already holds exactly these bytes; True if
    written. A symbolic link on the way (``path`` itself included) is refused: nothing is written through one."""
    link = link_on_the_way(path, dest)
    if link is not None:
        raise _link_refusal(dest, link)
    try:
        if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    except OSError:
        pass
    rewrite_atomic(path, lambda f: f.write(data), binary=True)
    os.chmod(path, 0o644)
    return True


def _run_files(run_dir: Path) -> list[tuple[str, bytes]]:
    """``(relative path, bytes)`` of one run's export."""
    files = [(name, (run_dir / name).read_bytes()) for name in COPIED if (run_dir / name).is_file()]
    for p in kept_eval_files(run_dir / EVAL_DIR):
        files.append((f"{EVAL_DIR}/{p.name}", trim_records(p)))
    return files


def export_runs(runs_dir: str | os.PathLike, dest: str | os.PathLike, pattern: Optional[str] = None,
                choice: Optional[RunChoice] = None) -> ExportResult:
    """Export the finished runs of ``runs_dir`` (matching ``pattern``) into ``dest`` (see the
    module doc); ``choice``: :func:`plan_export`'s answer when already checked. Files already in
    ``dest`` that are not part of the export are left alone."""
    choice = choice if choice is not None else plan_export(runs_dir, dest, pattern)
    out = Path(dest).expanduser()
    res = ExportResult(skipped=list(choice.skipped))
    files = [(run_dir.name, _run_files(run_dir)) for run_dir in choice.finished]
    for name, run in files:  # every write checked before the first: none goes through a link
        for rel, _ in run:
            link = link_on_the_way(out / name / rel, out)
            if link is not None:
                raise _link_refusal(out, link)
    for name, run in files:
        for rel, data in run:
            res.written += _put(out / name / rel, data, out)
            res.bytes += len(data)
        res.exported.append(name)
    src = Path(runs_dir).expanduser()
    sj = src / SWEEP_JSON
    if regular_inside_problem(sj, src) is None and sweep_json_problem(runs_dir) is None:  # an unusable one is
        data = sj.read_bytes()  # not copied (the CLI warns), a link out of the folder never
        res.written += _put(out / SWEEP_JSON, data, out)
        res.bytes += len(data)
    for job, _ in setup_records(src):
        for name in (CONFIG, SUMMARY):
            if regular_inside_problem(job / name, src) is None:
                data = (job / name).read_bytes()
                res.written += _put(out / SETUP_DIR / job.name / name, data, out)
                res.bytes += len(data)
    return res

