"""A fake trainer whose disk fills up (``enospc_trainer:train``, for the sweep's fault tests).

Runs with ``train.lr == 0.0555`` find every write full: the trainer cannot record its own
failure (summary.json, error.txt, as the real trainer on a full disk) and raises
``OSError(ENOSPC)``; the worker's attempt to record it fails the same way. Every other run is
:func:`sweep_fake_trainer.train`.
"""
from __future__ import annotations

import errno

import sweep_fake_trainer
from harness.foundation import files
from harness.rundir import layout, summary

FULL_LR = 0.0555


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def train(cfg, *, resume=True, progress=True):
    if cfg.train.lr != FULL_LR:
        return sweep_fake_trainer.train(cfg, resume=resume, progress=progress)
    for mod in (files, layout, summary):                # the whole disk, from now on, in this worker
        for name in ("write_json_atomic", "write_text_atomic", "rewrite_atomic"):
            if hasattr(mod, name):
                setattr(mod, name, _full)
    summary.write_summary = _full
    raise OSError(errno.ENOSPC, "No space left on device", str(sweep_fake_trainer.run_dir_of(cfg) / "metrics.jsonl"))
