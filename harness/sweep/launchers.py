"""Sweep launchers: execute planned runs, one fresh process per run.

Both launchers run the same worker entry point, :func:`run_worker`, which builds the
run's :class:`~harness.config.schema.Config`, calls the train entry point
(``harness.train.loop:train`` unless a test injects another ``module:function``) as
``train(cfg, resume=True, progress=False)``, and records a failure in the run directory
(``summary.json`` status ``failed`` + ``error``, ``error.txt`` traceback) when it raises.

- :class:`LocalLauncher`: a pool of worker processes on this machine. Every run gets a
  fresh interpreter (``python -m harness.sweep.launchers worker <payload file>``, its own
  session, stdout and stderr to ``<run_dir>/worker.log``), so its peak memory is its own and
  nothing leaks between runs. The run's payload (its whole config, env and numerics pins) goes
  through ``<run_dir>/.worker-payload.json`` (mode 0600, removed when the worker ends), never
  the command line: a config of any size fits (one argument is at most 128 KiB on Linux), and
  ``ps`` shows other users only the file's path. ``cpus`` per run sets the torch/OpenMP
  threads; GPUs are handed out as disjoint ``CUDA_VISIBLE_DEVICES`` slots (``gpus`` per run;
  a fraction packs several runs onto one GPU; 0 hides the GPUs). A run with ``procs > 1`` is started under ``torchrun
  --standalone --nproc_per_node=procs`` (multi-GPU learners; ZeRO stage and DeepSpeed
  config reach :mod:`harness.engine.distributed` through ``HARNESS_ZERO_STAGE`` /
  ``HARNESS_DEEPSPEED_CONFIG``).
- :class:`RayLauncher`: the same runs on a Ray cluster (``address``), one task per run
  with ``num_cpus``/``num_gpus`` requests, ``max_calls=1`` (a fresh worker process per
  run) and no retries. The task runs :func:`run_worker`, so results land in the same
  folder layout; the cluster must see the same filesystem path (one node, or a shared
  filesystem), and the driver's working directory is used as the task's.

A worker that dies without recording anything (killed, out of memory, segfault) is
recorded by the launcher, with the signal and the tail of ``worker.log``. On Ctrl-C (or
SIGTERM) the launcher stops its workers and marks their runs ``interrupted``: the next
launch hands them to the trainer, which resumes from the run's checkpoint. A worker sent
SIGTERM on its own is recorded ``interrupted`` too (not failed), and the sweep goes on with
the other runs. Recording is best effort: a run that cannot be recorded or started (disk
full) is reported failed and the launcher goes on (docs/faults.md).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from harness.config.schema import config_from_dict
from harness.engine.distributed import DEEPSPEED_DIR
from harness.foundation import numerics
from harness.rundir.layout import ERROR_TXT, SUMMARY, make_run_dir, read_json
from harness.rundir.summary import mark_interrupted, record_failure, write_summary
from harness.sweep.spec import LaunchOptions, SweepError

__all__ = ["RunSpec", "RunResult", "LocalLauncher", "RayLauncher", "run_worker",
           "callable_path", "resolve_callable", "gpu_count", "gpu_slots", "default_workers", "resource_problem",
           "WORKER_LOG", "WORKER_PAYLOAD", "write_payload", "read_payload",
           "ENV_ZERO_STAGE", "ENV_DEEPSPEED_CONFIG"]

WORKER_LOG = "worker.log"
WORKER_PAYLOAD = ".worker-payload.json"
"""The worker's payload in its run directory (mode 0600): the command line carries only its path."""
ENV_ZERO_STAGE = "HARNESS_ZERO_STAGE"
ENV_DEEPSPEED_CONFIG = "HARNESS_DEEPSPEED_CONFIG"
REPO_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class RunSpec:
    run_id: str
    run_dir: str
    config: dict
    """The loaded config as a plain dict (``to_dict(cfg)``, its algorithm section as given)."""
    label: str = ""


@dataclass
class RunResult:
    run_id: str
    status: str
    """finished | failed | interrupted | skipped"""
    error: Optional[str] = None
    returncode: Optional[int] = None
    seconds: Optional[float] = None


# --------------------------------------------------------------------------- entry points


def callable_path(fn: str | Callable) -> str:
    """``module:qualname`` of a top-level function (strings pass through)."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(f"train entry point must be 'module:function', got {fn!r}")
        return fn
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not mod or mod == "__main__" or "<" in qual:
        raise ValueError(f"train entry point {fn!r} must be a top-level function in an importable module "
                         f"(worker processes import it by name)")
    return f"{mod}:{qual}"


def resolve_callable(path: str) -> Callable:
    mod, _, name = path.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _module_root(path: str) -> Optional[str]:
    """Directory to put on sys.path so the module of ``module:function`` imports."""
    mod = path.partition(":")[0]
    top = mod.split(".")[0]
    if top in ("harness", "algorithms", "evals"):
        return None
    try:
        spec = importlib.util.find_spec(mod)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.exists(spec.origin):
        return None
    p = Path(spec.origin).resolve()
    depth = len(mod.split(".")) if p.name != "__init__.py" else len(mod.split(".")) + 1
    for _ in range(depth):
        p = p.parent
    return str(p)


def _sys_path_for(train: str) -> list[str]:
    paths = [REPO_ROOT]
    root = _module_root(train)
    if root and root not in paths:
        paths.append(root)
    return paths


# --------------------------------------------------------------------------- resources


def gpu_count() -> int:
    """GPUs visible to this process, without initialising CUDA here."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([d for d in vis.split(",") if d.strip() and d.strip() != "-1"])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _visible_ids() -> list[str]:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [d.strip() for d in vis.split(",") if d.strip() and d.strip() != "-1"]
    return [str(i) for i in range(gpu_count())]


def resolve_gpus(gpus: Any, n_gpus: int) -> float:
    if gpus == "auto" or gpus is None:
        return 1.0 if n_gpus > 0 else 0.0
    return float(gpus)


def resource_problem(opts: LaunchOptions) -> str:
    """Why the runs of ``opts`` could not start on this machine ('' when they could): with the local
    launcher, ``gpus`` per run that the visible GPUs cannot give even one run (``gpus: 2`` where one,
    or none, is visible). A Ray cluster's resources are checked when the launcher connects to it."""
    if opts.type != "local" or opts.gpus in ("auto", None) or not opts.gpus > 0:  # auto: 0 without a GPU
        return ""
    ids = _visible_ids()
    g = resolve_gpus(opts.gpus, len(ids))
    if g > 0 and not gpu_slots(ids, g):
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f"CUDA_VISIBLE_DEVICES={vis!r}" if vis is not None else "by nvidia-smi -L"
        return (f"launcher.gpus={opts.gpus!r}: each run needs {g:g} GPU(s) but {len(ids)} {'is' if len(ids) == 1 else 'are'} "
                f"visible here ({where}); run it on a machine with the GPUs, set launcher.gpus: 0 (or auto) to train "
                f"on the CPU, or use launcher.type: ray")
    return ""


def gpu_slots(device_ids: list[str], gpus_per_run: float) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` values of the concurrent run slots."""
    if gpus_per_run <= 0:
        return []
    if gpus_per_run < 1:
        per = max(1, int(1 // gpus_per_run))
        return [d for d in device_ids for _ in range(per)]
    g = int(gpus_per_run)
    return [",".join(device_ids[i:i + g]) for i in range(0, len(device_ids) - g + 1, g)]


def default_workers(n_runs: int, cpus_per_run: int, n_slots: Optional[int] = None) -> int:
    """min(#runs, CPU cores // cores per run, GPU slots when runs use GPUs); at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    n = min(n_runs, max(1, cores // max(1, cpus_per_run)))
    if n_slots is not None:
        n = min(n, n_slots)
    return max(1, n)


# --------------------------------------------------------------------------- run-dir records


# ``record_failure`` and ``mark_interrupted`` live in harness.rundir.summary (the one summary.json writer).


def _prepare_run_dir(run_dir: Path) -> None:
    make_run_dir(run_dir)  # a dangling link or a file there: one line (exit 2), not a traceback
    err = run_dir / ERROR_TXT
    if err.exists():  # keep the previous attempt's traceback, out of the way of this one
        os.replace(err, run_dir / "error.previous.txt")


def _tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def describe_returncode(rc: Optional[int]) -> str:
    if rc is None:
        return "the worker was lost"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        why = {"SIGKILL": " (killed: out of memory, or by hand)", "SIGSEGV": " (segmentation fault)",
               "SIGABRT": " (aborted)", "SIGBUS": " (bus error)"}.get(name, "")
        return f"the worker process died from {name}{why}"
    return f"the worker process exited with code {rc}"


def conclude(spec: RunSpec, rc: Optional[int], seconds: float, crash: Optional[str] = None) -> RunResult:
    """Turn a finished worker into a RunResult, recording a failure it did not record."""
    run_dir = Path(spec.run_dir)
    s = read_json(run_dir / SUMMARY) or {}
    status = s.get("status")
    if rc == 0 and status == "finished":
        return RunResult(spec.run_id, "finished", returncode=rc, seconds=seconds)
    if status == "failed" and s.get("error") and (run_dir / ERROR_TXT).exists():
        return RunResult(spec.run_id, "failed", error=s.get("error"), returncode=rc, seconds=seconds)
    if rc in (130, -signal.SIGTERM):  # the worker was terminated (SIGTERM) or interrupted: resumable
        status = mark_interrupted(run_dir, spec.run_id, spec.config)
        return RunResult(spec.run_id, status, returncode=rc, seconds=seconds)
    if rc == 0:
        error = f"the worker exited normally but summary.json says status={status!r}"
    else:
        error = crash or describe_returncode(rc)
    details = f"--- last lines of {WORKER_LOG} ---\n{_tail(run_dir / WORKER_LOG)}"
    record_failure(run_dir, spec.run_id, spec.config, error, details)
    return RunResult(spec.run_id, "failed", error=error, returncode=rc, seconds=seconds)


# --------------------------------------------------------------------------- the worker


def _payload(spec: RunSpec, opts: LaunchOptions) -> dict:
    threads = max(1, opts.cpus // max(1, opts.procs))
    mode = numerics.run_mode(spec.config.get("numerics"))  # the one place a launcher decides a run's mode
    # the run's numerics pins travel with it (local processes, Ray tasks, torchrun ranks): set in
    # the worker's environment before torch runs a kernel there (`run_worker`)
    pins = {k: v for k, v in numerics.env_for(mode, threads).items() if k in numerics.PINS or k.startswith(
        ("GRPO_HARNESS_", "OMP_", "MKL_NUM", "OPENBLAS_NUM"))}
    return {"run_id": spec.run_id, "run_dir": spec.run_dir, "config": spec.config, "train": opts.train,
            "threads": threads, "procs": opts.procs, "cwd": os.getcwd(),
            "sys_path": _sys_path_for(opts.train), "env": {**_run_env(opts), **pins},
            "numerics": mode}


def _run_env(opts: LaunchOptions) -> dict:
    env = dict(opts.env)
    if opts.zero_stage:
        env[ENV_ZERO_STAGE] = str(opts.zero_stage)
        env.setdefault(ENV_DEEPSPEED_CONFIG, str(DEEPSPEED_DIR / f"zero{opts.zero_stage}.json"))
    if opts.deepspeed_config:
        env[ENV_DEEPSPEED_CONFIG] = opts.deepspeed_config
    return env


def write_payload(payload: dict) -> Path:
    """Write ``payload`` to ``<run_dir>/.worker-payload.json``, readable by this user only
    (created 0600 under a temporary name, then renamed over any previous one); returns its path."""
    run_dir = Path(payload["run_dir"])
    fd, tmp = tempfile.mkstemp(prefix=WORKER_PAYLOAD + ".", suffix=".tmp", dir=run_dir)  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f)
        os.replace(tmp, run_dir / WORKER_PAYLOAD)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return run_dir / WORKER_PAYLOAD


def read_payload(path: str | os.PathLike) -> dict:
    """The payload a launcher wrote with :func:`write_payload` (ValueError when it is not one)."""
    with open(path, encoding="utf-8") as f:
        payload = json.load(f)
    if not isinstance(payload, dict) or "run_dir" not in payload:
        raise ValueError(f"{path} is not a worker payload")
    return payload


def _remove_payload(run_dir: str | os.PathLike) -> None:
    with contextlib.suppress(OSError):
        os.unlink(Path(run_dir) / WORKER_PAYLOAD)


def _torchrun(payload: dict) -> int:
    try:
        return _torchrun_with(payload, write_payload(payload))
    finally:
        _remove_payload(payload["run_dir"])


def _torchrun_with(payload: dict, payload_file: Path) -> int:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={payload['procs']}", "-m", "harness.sweep.launchers", "worker", str(payload_file)]
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(payload.get("sys_path", []) + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = str(payload["threads"])
    rc = subprocess.call(cmd, env=env)
    run_dir = Path(payload["run_dir"])
    if rc != 0:
        s = read_json(run_dir / SUMMARY) or {}
        if not (s.get("status") == "failed" and (run_dir / ERROR_TXT).exists()):
            record_failure(run_dir, payload["run_id"], payload["config"],
                           f"torchrun with {payload['procs']} processes failed: {describe_returncode(rc)}",
                           f"--- last lines of {WORKER_LOG} ---\n{_tail(run_dir / WORKER_LOG)}")
    return rc


def run_worker(payload: dict, sigterm: bool = False) -> int:
    """Worker entry point (a fresh process, or one rank of a torchrun group): run one
    training run and record a failure in its folder. Returns the process exit code (130
    when interrupted). ``sigterm`` (the worker process's own ``main``): SIGTERM interrupts
    the run like Ctrl-C, so it is recorded ``interrupted`` and resumes on the next launch."""
    run_dir = Path(payload["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    cwd = payload.get("cwd")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    for p in reversed(payload.get("sys_path") or []):
        if p not in sys.path:
            sys.path.insert(0, p)
    for k, v in (payload.get("env") or {}).items():
        os.environ[k] = str(v)
    numerics.pin_process(payload["numerics"])  # the process's start, before torch: the mode `_payload` decided
    threads = int(payload.get("threads") or 1)
    if int(payload.get("procs") or 1) > 1 and "LOCAL_RANK" not in os.environ:
        return _torchrun(payload)
    # torch reads these when it is first imported (by the trainer): threads per run = cpus
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    rank = int(os.environ.get("RANK", "0"))
    if sigterm:
        signal.signal(signal.SIGTERM, _SigtermAsInterrupt._handler)
    try:
        fn = resolve_callable(payload["train"])
        cfg = config_from_dict(payload["config"])
        summary = fn(cfg, resume=True, progress=False)
    except BaseException as e:  # noqa: BLE001 — everything a run raises is recorded
        if isinstance(e, SystemExit) and e.code in (0, None):
            summary = None
        else:
            tb = traceback.format_exc()
            try:
                sys.stderr.write(tb)
                sys.stderr.flush()
            except OSError:  # worker.log on a full disk: recording below is best effort too
                pass
            if rank == 0 and isinstance(e, KeyboardInterrupt):
                mark_interrupted(run_dir, payload["run_id"], payload["config"])
            elif rank == 0:
                record_failure(run_dir, payload["run_id"], payload["config"], f"{type(e).__name__}: {e}", tb)
            return 130 if isinstance(e, KeyboardInterrupt) else 1
    if rank == 0 and not (run_dir / SUMMARY).exists() and isinstance(summary, dict):
        write_summary(run_dir, dict(summary, status=summary.get("status", "finished")))
    return 0


# --------------------------------------------------------------------------- local


def _pdeathsig():  # child: die with the launcher (Linux), so a killed sweep leaves no orphans
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class _SigtermAsInterrupt:
    """Inside: SIGTERM raises KeyboardInterrupt (main thread only), so a terminated
    launcher cleans up like Ctrl-C."""

    def __enter__(self):
        self._old = None
        try:
            self._old = signal.signal(signal.SIGTERM, self._handler)
        except ValueError:  # not the main thread
            pass
        return self

    @staticmethod
    def _handler(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False


class _NullMonitor:
    def update(self, run_id, state): ...
    def tick(self): ...


class LocalLauncher:
    """Runs on this machine, each in a fresh process, at most ``workers`` at a time."""

    def __init__(self, workers: Optional[int] = None, options: Optional[LaunchOptions] = None,
                 poll_interval: float = 0.25, kill_grace: float = 5.0):
        self.workers = workers
        self.options = options or LaunchOptions()
        self.poll_interval = poll_interval
        self.kill_grace = kill_grace
        self.results: dict[str, RunResult] = {}

    def plan_resources(self, n_runs: int) -> tuple[int, Optional[list[str]]]:
        ids = _visible_ids()
        g = resolve_gpus(self.options.gpus, len(ids))
        slots = None
        if g > 0:
            slots = gpu_slots(ids, g)
            if not slots:
                raise SweepError(f"this sweep cannot run on this machine: {resource_problem(self.options)}")
        workers = self.workers or default_workers(n_runs, self.options.cpus, len(slots) if slots else None)
        if slots is not None:
            workers = min(workers, len(slots))
        return workers, slots

    def _env(self, payload: dict, slot: Optional[str]) -> dict:
        mode = payload["numerics"]  # decided once, in `_payload`
        env = numerics.env_for(mode, payload["threads"])
        env.update(payload["env"])
        env["PYTHONPATH"] = os.pathsep.join(payload["sys_path"] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.update(numerics.thread_env(mode, payload["threads"]), PYTHONUNBUFFERED="1")
        if slot is not None:
            env["CUDA_VISIBLE_DEVICES"] = slot
        elif _visible_ids():
            env["CUDA_VISIBLE_DEVICES"] = ""  # gpus: 0 -> this run must not grab one
        return env

    def run(self, specs: list[RunSpec], monitor=None) -> dict[str, RunResult]:
        monitor = monitor or _NullMonitor()
        workers, slots = self.plan_resources(len(specs))
        free = list(slots) if slots is not None else None
        queue = list(specs)
        running: dict[str, tuple] = {}
        self.results = {}
        with _SigtermAsInterrupt():
            try:
                while queue or running:
                    while queue and len(running) < workers:
                        spec = queue.pop(0)
                        slot = free.pop(0) if free is not None else None
                        started = self._try_start(spec, slot)
                        if started is None:  # recorded failed; its slot is free again
                            if free is not None:
                                free.append(slot)
                            monitor.update(spec.run_id, "failed")
                            continue
                        running[spec.run_id] = started + (slot,)
                        monitor.update(spec.run_id, "running")
                    for rid in list(running):
                        proc, spec, t0, logf, slot = running[rid]
                        rc = proc.poll()
                        if rc is None:
                            continue
                        logf.close()
                        _remove_payload(spec.run_dir)
                        del running[rid]
                        if free is not None:
                            free.append(slot)
                        res = conclude(spec, rc, time.time() - t0)
                        self.results[rid] = res
                        monitor.update(rid, res.status)
                    monitor.tick()
                    if running:
                        time.sleep(self.poll_interval)
            except KeyboardInterrupt:
                self._stop(running, monitor)
                raise
        return self.results

    def _try_start(self, spec: RunSpec, slot: Optional[str]):
        """:meth:`_start`, or None when the run cannot start (its folder or worker.log cannot be
        written: disk full; no process): the run is recorded failed (best effort) and the
        sweep goes on with the others."""
        try:
            return self._start(spec, slot)
        except OSError as e:
            error = f"could not start the worker: {type(e).__name__}: {e}"
            record_failure(spec.run_dir, spec.run_id, spec.config, error)
            self.results[spec.run_id] = RunResult(spec.run_id, "failed", error=error)
            return None

    def _start(self, spec: RunSpec, slot: Optional[str]):
        run_dir = Path(spec.run_dir)
        _prepare_run_dir(run_dir)
        payload = _payload(spec, self.options)
        logf = open(run_dir / WORKER_LOG, "a")
        try:
            logf.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} launch {spec.run_id} "
                       f"(CUDA_VISIBLE_DEVICES={slot if slot is not None else '-'}, threads={payload['threads']})\n")
            logf.flush()
            cmd = [sys.executable, "-m", "harness.sweep.launchers", "worker", str(write_payload(payload))]
            proc = subprocess.Popen(cmd, env=self._env(payload, slot), stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_pdeathsig)
        except BaseException:
            try:
                logf.close()
            except OSError:
                pass
            _remove_payload(run_dir)
            raise
        return proc, spec, time.time(), logf

    def _stop(self, running: dict, monitor) -> None:
        for proc, *_ in running.values():
            _killpg(proc.pid, signal.SIGTERM)
        deadline = time.time() + self.kill_grace
        for proc, *_ in running.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        for proc, spec, t0, logf, slot in running.values():
            if proc.poll() is None:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            else:
                _killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (torchrun ranks)
            logf.close()
            _remove_payload(spec.run_dir)
            status = mark_interrupted(spec.run_dir, spec.run_id, spec.config)
            self.results[spec.run_id] = RunResult(spec.run_id, status, returncode=proc.returncode,
                                                  seconds=time.time() - t0)
            monitor.update(spec.run_id, status)
        running.clear()


def _killpg(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- ray


def _ray_task(payload: dict) -> int:
    """Body of one Ray task: the worker entry point with its output in worker.log."""
    run_dir = Path(payload["run_dir"])
    _prepare_run_dir(run_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(run_dir / WORKER_LOG, "a") as logf:
        logf.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} ray task {payload['run_id']} on "
                   f"{os.uname().nodename} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '-')})\n")
        logf.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(logf.fileno(), 1)
        os.dup2(logf.fileno(), 2)
        try:
            return run_worker(payload)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)


class RayLauncher:
    """Runs as Ray tasks on an existing cluster (``address``; None = Ray's default:
    RAY_ADDRESS / a running local cluster / a new local instance)."""

    def __init__(self, address: Optional[str] = None, workers: Optional[int] = None,
                 options: Optional[LaunchOptions] = None, poll_interval: float = 0.5):
        self.address = address
        self.workers = workers
        self.options = options or LaunchOptions()
        self.poll_interval = poll_interval
        self.results: dict[str, RunResult] = {}

    def run(self, specs: list[RunSpec], monitor=None) -> dict[str, RunResult]:
        import ray

        monitor = monitor or _NullMonitor()
        paths = _sys_path_for(self.options.train)
        job_config = ray.job_config.JobConfig(code_search_path=paths)
        ray.init(address=self.address, job_config=job_config, log_to_driver=False, ignore_reinit_error=True,
                 logging_level="ERROR")
        try:
            have = ray.cluster_resources()
            n_gpus = int(have.get("GPU", 0))
            g = resolve_gpus(self.options.gpus, n_gpus)
            short = [f"{what} {need:g} {unit} per run but the cluster has {have.get(key, 0):g}"
                     for what, need, unit, key in (("launcher.gpus", g, "GPU(s)", "GPU"),
                                                   ("launcher.cpus", self.options.cpus, "CPU(s)", "CPU"))
                     if need > 0 and need > have.get(key, 0)]
            if short:  # its tasks would wait for resources that never come
                raise SweepError(f"this sweep cannot run on the Ray cluster{' at ' + self.address if self.address else ''}: "
                                 f"{'; '.join(short)}")
            remote = ray.remote(max_calls=1, max_retries=0)(_ray_task)
            self.results = {}
            pending = list(specs)
            inflight: dict = {}
            with _SigtermAsInterrupt():
                try:
                    while pending or inflight:
                        while pending and (self.workers is None or len(inflight) < self.workers):
                            spec = pending.pop(0)
                            payload = _payload(spec, self.options)
                            ref = remote.options(num_cpus=self.options.cpus, num_gpus=g,
                                                 name=f"sweep:{spec.run_id}").remote(payload)
                            inflight[ref] = (spec, time.time(), False)
                            monitor.update(spec.run_id, "queued")
                        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=self.poll_interval)
                        for ref in ready:
                            spec, t0, _started = inflight.pop(ref)
                            crash = None
                            try:
                                rc = ray.get(ref)
                            except Exception as e:  # worker died, task error
                                rc, crash = None, f"the Ray task failed: {type(e).__name__}: {str(e)[:2000]}"
                            res = conclude(spec, rc, time.time() - t0, crash=crash)
                            self.results[spec.run_id] = res
                            monitor.update(spec.run_id, res.status)
                        for ref, (spec, t0, started) in list(inflight.items()):
                            if not started and _started_since(spec, t0):
                                inflight[ref] = (spec, t0, True)
                                monitor.update(spec.run_id, "running")
                        monitor.tick()
                except KeyboardInterrupt:
                    for ref in inflight:
                        try:
                            ray.cancel(ref, force=True)
                        except Exception:
                            pass
                    for ref, (spec, t0, started) in inflight.items():
                        if started or _started_since(spec, t0):
                            status = mark_interrupted(spec.run_dir, spec.run_id, spec.config)
                            self.results[spec.run_id] = RunResult(spec.run_id, status, seconds=time.time() - t0)
                            monitor.update(spec.run_id, status)
                    raise
        finally:
            ray.shutdown()
        return self.results


def _started_since(spec: RunSpec, t0: float) -> bool:
    try:
        return (Path(spec.run_dir) / WORKER_LOG).stat().st_mtime >= t0 - 1
    except OSError:
        return False


# --------------------------------------------------------------------------- CLI of the worker


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "worker":
        print("usage: python -m harness.sweep.launchers worker PAYLOAD_FILE  (started by `harness sweep`)",
              file=sys.stderr)
        return 2
    try:
        payload = read_payload(argv[1])
    except (OSError, ValueError) as e:
        print(f"harness.sweep.launchers: cannot read the worker payload {argv[1]}: {e}", file=sys.stderr)
        return 2
    return run_worker(payload, sigterm=True)


if __name__ == "__main__":
    sys.exit(main())
