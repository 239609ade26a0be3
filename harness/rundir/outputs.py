"""Output folders a command may write: what each command leaves in its folder, whose results a folder holds, and replacing a folder whole (staged, then moved into place).

Every command with an output folder asks :func:`output_problem` before any work: a folder that
holds another command's results (a run, a model such as a run's ``final_model``, a reward model,
a report, an evaluation, a warm-up cache entry) or files no command of the harness wrote is
refused in one line; one that holds the same command's earlier result is replaced, and
:func:`staged` writes the new result beside it and moves it into place only once it is complete
(the old one stays, under a hidden name next to it, until then). :func:`root_problem` is the check
of a results root (``--output-dir`` of ``train`` and ``warmup``: runs and caches go *under* it), which
may hold anything but must not be one command's result itself.
"""
from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Optional

from harness.foundation.base import ConfigError
from harness.rundir.layout import METRICS, SUMMARY, SWEEP_JSON

KINDS = (  # (what, the names that tell it), most specific first: a reward model is a model folder too
    ("run folder", (SUMMARY, METRICS)),
    ("reward model (harness rm train)", ("reward_model.json",)),
    ("warm-up cache entry", ("warmup.json",)),
    ("model folder", ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "*.gguf")),
    ("study report (harness report --study)", ("claims.csv", "table5.csv")),
    ("report (harness report)", ("report.md", "report.html", "table.csv")),
    ("evaluation (harness eval)", ("*_metrics.json",)),
    ("sweep folder or export", (SWEEP_JSON,)),
)
"""Whose results a folder holds, by the files each command leaves (:func:`holder`)."""
OWN = {
    "rm train": "reward model (harness rm train)",
    "report": "report (harness report)",
    "report --study": "study report (harness report --study)",
    "eval": "evaluation (harness eval)",
}
"""The kind of result each command writes into its output folder (`harness export`'s DEST, which holds
run folders, has its own rule: :func:`harness.rundir.export.dest_problem`)."""
LEFTOVERS = {"report": ("plots",), "report --study": ("plots",), "eval": ("*.jsonl", "*.jsonl.tmp")}
"""What an earlier, interrupted run of a command may have left alone in its folder (before reports were
staged, a kill left ``plots/`` without ``report.md``; an evaluation stopped before its metrics leaves its
records): replaced like its own result."""
_HIDDEN_OK = (".write-probe-*", ".*.tmp", ".*.tmp-*", ".*.old-*")
"""Names a folder may hold whatever it is: the harness's own probes and staging leftovers."""


def _entries(folder: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(folder) if not any(fnmatch.fnmatch(n, p) for p in _HIDDEN_OK))
    except OSError:
        return []


def holder(folder: str | os.PathLike) -> Optional[tuple[str, str]]:
    """``(kind, the file that tells it)`` of the command results ``folder`` holds (:data:`KINDS`), or None."""
    names = _entries(Path(folder).expanduser())
    for kind, tells in KINDS:
        for pattern in tells:
            hit = next((n for n in names if fnmatch.fnmatch(n, pattern)), None)
            if hit is not None:
                return kind, hit
    return None


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def output_problem(folder: str | os.PathLike, command: str, field: str) -> Optional[str]:
    """Why ``folder`` may not be the output folder of ``harness <command>`` (a key of :data:`OWN`),
    as one line naming ``field`` (None when it may: it is missing, empty, not a folder (other checks
    say why) or holds this command's earlier result, which :func:`staged` replaces whole)."""
    p = Path(folder).expanduser()
    if not p.is_dir():
        return None
    names = _entries(p)
    if not names:
        return None
    found = holder(p)
    left = LEFTOVERS.get(command, ())
    ours = found[0] == OWN[command] if found is not None else \
        all(any(fnmatch.fnmatch(n, pat) for pat in left) for n in names)
    if ours:
        return None
    head = f"{field}={str(folder)!r} is invalid: "
    fix = f"harness {command} writes only into a new or empty folder (or its own earlier result): choose another"
    if found is not None:
        return f"{head}it holds a {found[0]}'s files ({found[1]}), which harness {command} would replace; {fix}"
    return f"{head}it holds files harness {command} did not write ({_shown(names)}); {fix}"


def check_output(folder: str | os.PathLike, command: str, field: str) -> None:
    """Raise :func:`output_problem` as a one-line ConfigError (exit 2)."""
    why = output_problem(folder, command, field)
    if why:
        raise ConfigError(why)


def root_problem(folder: str | os.PathLike, field: str) -> Optional[str]:
    """Why ``folder`` may not be a results root (runs and caches go under it: ``--output-dir`` of
    ``train``, ``warmup``, ``rm train``): it is itself one command's result (a run folder, a model such as
    a run's ``final_model``, a reward model, a report, an evaluation, a warm-up entry); None when it may."""
    found = holder(folder)
    if found is None or found[0] == "sweep folder or export":
        return None
    return (f"{field}={str(folder)!r} is invalid: it is a {found[0]} ({found[1]} is there), not a results root; "
            f"runs and caches would be written inside it: give the folder that holds your results (e.g. results)")


def check_root(folder: str | os.PathLike, field: str) -> None:
    """Raise :func:`root_problem` as a one-line ConfigError (exit 2)."""
    why = root_problem(folder, field)
    if why:
        raise ConfigError(why)


def publish(stage: Path, dest: Path) -> None:
    """Move the complete folder ``stage`` to ``dest``: an earlier ``dest`` is first renamed to a
    hidden ``.<name>.old-*`` beside it (a kill between the two renames leaves it there, whole), then
    ``stage`` renamed into place, then the old one removed."""
    old = None
    if os.path.lexists(dest):
        old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old-"))
        os.replace(dest, old / dest.name)
    os.replace(stage, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def recover(dest: Path) -> Optional[Path]:
    """Put back the old result a kill between :func:`publish`'s two renames left hidden beside
    ``dest`` (``.<name>.old-*/<name>``), when ``dest`` itself is missing: the earlier result is the
    whole one, so it is ``dest`` again before anything new is written. Returns the folder put back,
    or None."""
    if os.path.lexists(dest):
        return None
    for old in sorted(dest.parent.glob(f".{dest.name}.old-*")):
        if (old / dest.name).is_dir():
            os.replace(old / dest.name, dest)
            shutil.rmtree(old, ignore_errors=True)
            return dest
    return None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def staged(dest: str | os.PathLike) -> Iterator[Path]:
    """A new empty folder beside ``dest`` (``.<name>.tmp-*``) to write the whole result into;
    on success it is :func:`publish`\\ ed as ``dest``, on any failure (or a signal) removed,
    ``dest`` as it was. A SIGKILL leaves the hidden stage behind and ``dest`` intact; one between
    the two renames of :func:`publish` leaves the old result hidden, which the next write to
    ``dest`` puts back first (:func:`recover`)."""
    dest = Path(dest).expanduser()
    dest.parent.mkdir(parents=True, exist_ok=True)
    recover(dest)
    stage = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
    try:
        os.chmod(stage, 0o777 & ~_umask())  # a folder as mkdir makes it (mkdtemp's is private, 0700)
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    publish(stage, dest)
