"""The admission gate: a config, the command's flags and the launcher's settings become a checked run, before any work.

Every command that starts work calls :func:`admit` once: ``harness train``, ``quickstart``, ``warmup``, ``sweep``
(every run of the plan, before it is printed), ``eval`` and ``rm train``; so does the library entry point
(:func:`harness.train.loop.train` given a `Config`, which is what a sweep worker calls). It decides, in this order,
and each in this module only:

1. the **numerics mode**: the run's ``numerics``; work without a run config (``harness eval --model DIR``) takes the
   process's (``GRPO_HARNESS_NUMERICS``, else portable: :func:`harness.foundation.numerics.run_mode`). The pins are
   set in the environment at once, so numpy and torch, imported after the gate, load pinned;
2. the **thread count**: the command's flag (``eval --threads``) or ``train.threads``; 0 takes what the launcher
   gave the run (a sweep worker's ``OMP_NUM_THREADS``: the launcher's cpus per run), else, in portable numerics,
   :data:`~harness.foundation.numerics.DEFAULT_THREADS` (never the machine's core count), in native torch's own.
   A thread count in the environment (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``) is held to ``train.threads``' rule
   in every mode: OpenMP reads it whatever the harness sets (99,999 threads end in a segfault, ``abc`` is ignored);
3. the **device**: spelled as the config's ``device`` rule says, and present on this machine;
4. the **budget**: the config's fields hold their own rules (:mod:`harness.config.rules`), checked when it loaded;
   what the machine must hold for it is checked here: the samples held at once (a stage, a reward model's round,
   ``rm train --samples``) against this machine's memory (:mod:`harness.admission.memory`);
5. the **input paths** the run reads (:func:`harness.config.paths.check_input_paths`);
6. the **output folders**: a results root (runs and caches go under it) is not itself one command's result
   (:func:`harness.rundir.outputs.check_root`: not a run's folder, a ``final_model``, a report ...), a command's own
   result folder holds nothing another command made (:func:`harness.rundir.outputs.check_output`); each is made
   writable (created if missing, probed with a file), the warm-up cache too when the run builds or reads it.

A refusal is one line (a `ConfigError`: exit 2), before any folder of the run is made. What the gate decided is an
:class:`Admitted`; :meth:`Admitted.enter` is the one place a process takes a run's numerics (the pins, OpenBLAS's
kernels for the matrix products, the thread count), and what it returns is the run's numerics provenance.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from harness.admission.memory import check_stage_memory, samples_memory_problem
from harness.config.fields import Config
from harness.config.paths import check_input_paths, uses_warmup_cache, warmup_cache_root
from harness.config.rules import DEVICE, MAX_THREADS, THREADS_OR_DEFAULT
from harness.foundation import numerics
from harness.foundation.base import ConfigError
from harness.foundation.files import check_output_dir
from harness.rundir.outputs import check_output, check_root

PATH_RESERVE = 256
"""Characters a run writes below a results root at most: <name>/<run id>/checkpoint/state.tmp, a warm-up cache's
<key>/initial_eval/<key>.tmp<pid>/..., an evaluation's records (the longest are about 180)."""
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Thread counts the OpenMP and MKL runtimes read from the environment, whatever the harness sets."""


@dataclass(frozen=True)
class Admitted:
    """A run the gate let in: what it decided (see the module doc). ``cfg`` is None for work without a run config."""
    cfg: Optional[Config]
    numerics: str
    threads: int
    """torch threads to run with; 0: torch's default (native numerics only)."""
    device: str
    """As spelled and checked: auto, cpu, cuda or cuda:N."""
    outputs: tuple[Path, ...] = field(default=())

    def torch_device(self):
        """The torch device the run uses (``auto``: CUDA where there is one)."""
        return resolve_device(self.device)

    def enter(self) -> dict:
        """Take the decided numerics and thread count in this process; returns what is in force
        (:func:`harness.foundation.numerics.enter`; a `NumericsError` when portable numerics cannot hold here)."""
        return numerics.enter(self.numerics, self.threads, device=str(self.torch_device()))


def resolve_device(name: str):
    """``name`` as a torch device: ``auto`` is CUDA where torch sees one, else the CPU."""
    import torch  # the gate itself runs without torch; a run entering its numerics has it

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_problem(device, field: str = "device") -> Optional[str]:
    """Why ``device`` is not a device the harness takes (the config's ``device`` rule: auto, cpu, cuda, cuda:N), as
    one line; None when it is one."""
    return DEVICE.problem(field, device)


def check_device(device: str, field: str = "device") -> None:
    """``device`` spelled as :func:`device_problem` says; ``cuda`` / ``cuda:N`` only where CUDA is available (and
    device N exists). torch is imported only for a CUDA device."""
    bad = device_problem(device, field)
    if bad:
        raise ConfigError(bad)
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"{field}={device!r} is invalid: CUDA is not available on this machine; use cpu or auto")
    if ":" in device:
        idx, n = int(device.split(":", 1)[1]), torch.cuda.device_count()
        if idx >= n:
            raise ConfigError(f"{field}={device!r} is invalid: this machine has {n} CUDA device(s) "
                              f"(cuda:0..cuda:{n - 1})")


def environment_threads_problem(field: str = "train.threads",
                                env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Why a thread count in the environment (:data:`THREAD_VARIABLES`) breaks ``train.threads``' rule (a whole
    number from 1 to `MAX_THREADS`), as one line naming ``field`` as the way out; None when every one set is fine."""
    env = os.environ if env is None else env
    for var in THREAD_VARIABLES:
        raw = env.get(var)
        if raw is None or raw.strip() == "":
            continue
        try:
            n = int(raw.strip())
        except ValueError:
            n = None
        if n is None or not 1 <= n <= MAX_THREADS:
            return (f"{var}={raw.strip() if raw.strip().isprintable() else repr(raw)} is invalid: the OpenMP and MKL "
                    f"runtimes read it as a thread count, a whole number from 1, at most {MAX_THREADS:,}: set it so, "
                    f"or unset it and give {field}")
    return None


def decide_threads(threads: int, mode: str, field: str = "train.threads") -> int:
    """The torch thread count of a run given ``threads`` (``field``: a flag or ``train.threads``) in ``mode``: see
    the module doc. A ConfigError when ``threads`` or the environment's count breaks the rule."""
    bad = THREADS_OR_DEFAULT.problem(field, threads) or environment_threads_problem(field)
    if bad:
        raise ConfigError(bad)
    if threads:
        return int(threads)
    launcher = os.environ.get("OMP_NUM_THREADS", "").strip()
    if mode == "portable":
        return int(launcher) if launcher else numerics.DEFAULT_THREADS
    return 0


def admit(cfg: Optional[Config], *, threads: Optional[int] = None, threads_field: str = "train.threads",
          device: Optional[str] = None, device_field: str = "device", inputs: bool = True,
          outputs: Optional[Mapping[str, object]] = None, result: Optional[tuple[str, str, object]] = None,
          samples: Optional[tuple[int, str]] = None, memory: bool = True, warmup_cache: bool = True,
          warmup_threads: bool = False, here: bool = True) -> Admitted:
    """Decide and check a run (the module doc) and return what was decided; a one-line ConfigError otherwise.

    ``cfg``: the run's config (None: work without one, e.g. ``harness eval --model DIR``). ``threads`` /
    ``device``: a command's flag, which wins over the config's field (``threads_field`` / ``device_field`` name it in
    a refusal). ``inputs``: check the paths ``cfg`` reads. ``outputs``: results roots, ``{name in a refusal:
    folder}``; ``result``: ``(command, name, folder)`` of a command's own result folder (``rm train --out``);
    ``warmup_cache``: the warm-up cache too where the run uses it. ``samples``: ``(count, setting)`` of the samples
    the work holds at once, else (``memory``) the run's stage and reward-model round. ``warmup_threads``: the work
    is the supervised warm-up, which sets its own count (``warmup.threads``): the run's is left to it. ``here``: the
    work runs in this process, whose environment takes the run's numerics pins at once; False for a plan's runs
    that workers will run (each worker's launcher sets its own)."""
    mode = numerics.run_mode(cfg.numerics if cfg is not None else None)
    if here:
        numerics.pin_process(mode)  # before torch or numpy load (the gate needs neither): they read the pins once
    given = threads if threads is not None else (cfg.train.threads if cfg is not None else 0)
    n = decide_threads(given, mode, threads_field if threads is not None else "train.threads")
    dev = device if device is not None else (cfg.device if cfg is not None else "cpu")
    check_device(dev, device_field if device is not None else "device")
    if cfg is not None and inputs:
        check_input_paths(cfg)
    if cfg is not None and (samples or memory):
        too_big = samples_memory_problem(samples[0], cfg, samples[1]) if samples else check_stage_memory(cfg)
        if too_big:
            raise ConfigError(too_big)
    return Admitted(cfg, mode, 0 if warmup_threads else n, dev, _output_folders(cfg, outputs, result, warmup_cache))


def _output_folders(cfg, outputs, result, warmup_cache: bool) -> tuple[Path, ...]:
    """Every output folder (`admit`'s ``outputs``, ``result`` and the warm-up cache) checked, and only then each made
    writable: a refusal creates no folder."""
    roots = dict(outputs or {})
    if cfg is not None and warmup_cache and uses_warmup_cache(cfg):
        roots["warmup.cache_dir"] = warmup_cache_root(cfg)
    for name, folder in roots.items():
        check_path_length(folder, name)
        check_root(folder, name)  # runs and caches go under it: it is not a run's folder, a final_model, ...
    if result is not None:
        check_output(result[2], result[0], result[1])  # never a run's final_model, a user's folder, ...
    made = [(name, folder) for name, folder in roots.items()] + ([result[1:]] if result is not None else [])
    return tuple(check_output_dir(folder, name) for name, folder in made)


def check_path_length(folder, name: str) -> None:
    """A results root leaves room for the paths a run writes under it (:data:`PATH_RESERVE`) within the system's
    longest path: a 4,080-character one ended in a 30-line ``File name too long`` part-way through a run."""
    full = os.path.abspath(os.path.expanduser(str(folder)))
    try:
        limit = os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError):
        limit = 4096
    if len(full) + PATH_RESERVE > limit:
        raise ConfigError(f"{name}={str(folder)[:80]!r}... is invalid: its path is {len(full):,} characters long and a "
                          f"run writes paths up to about {PATH_RESERVE} characters below it, past this system's "
                          f"limit of {limit:,}: choose a shorter folder")


def admitted(run) -> Admitted:
    """``run`` as an `Admitted`: itself, or a `Config` taken through :func:`admit` with the config's own settings
    (the library entry point and a sweep worker: the launcher's thread count comes in ``OMP_NUM_THREADS``)."""
    if isinstance(run, Admitted):
        return run
    if not isinstance(run, Config):
        raise TypeError(f"expected a Config or an Admitted run, got {type(run).__name__}")
    return admit(run, outputs={"output_dir": run.output_dir})
