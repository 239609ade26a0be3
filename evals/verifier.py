"""The verifier pool: persistent worker processes that check two answers for mathematical equality under a time limit.

:func:`evals.grading.is_equiv` asks the pool only when its fast paths (equal normalised strings,
two plain numbers) do not decide. Each worker runs :mod:`evals._verify_worker` (``math_verify``,
or a whitelisted sympy grammar that never evaluates the answer's text) and answers one JSON line
per request; a reply later than the time limit kills the worker (the next request starts a fresh
one) and counts as not equal. Workers are started from one long-lived thread (they ask the kernel
to kill them when it ends), and a forked child starts its own pool on first use.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Iterable, Optional, Sequence

__all__ = ["DEFAULT_TIMEOUT", "VerifierPool", "get_pool"]

DEFAULT_TIMEOUT = float(os.environ.get("GRPO_HARNESS_VERIFY_TIMEOUT", "5"))
"""Seconds allowed to one equivalence check in the worker (env GRPO_HARNESS_VERIFY_TIMEOUT)."""

_POOL_LOCK = threading.Lock()
_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_verify_worker.py")


class _Spawner:
    """Starts worker processes from one long-lived thread: the workers ask the kernel to kill
    them when the thread that started them ends (PR_SET_PDEATHSIG), which must therefore not
    be a short-lived pool thread."""

    def __init__(self):
        import queue
        self.q: "queue.Queue" = queue.Queue()
        threading.Thread(target=self._run, daemon=True, name="grader-spawner").start()

    def _run(self):
        while True:
            fn, box, ev = self.q.get()
            try:
                box.append((True, fn()))
            except BaseException as e:  # noqa: BLE001
                box.append((False, e))
            ev.set()

    def call(self, fn):
        box: list = []
        ev = threading.Event()
        self.q.put((fn, box, ev))
        ev.wait()
        ok, val = box[0]
        if not ok:
            raise val
        return val


_SPAWNER: Optional[_Spawner] = None


def _spawn(fn):
    global _SPAWNER
    with _POOL_LOCK:
        if _SPAWNER is None:
            _SPAWNER = _Spawner()
    return _SPAWNER.call(fn)


class _Worker:
    """One persistent verifier subprocess speaking JSON lines."""

    def __init__(self, cmd: Sequence[str], startup_timeout: float):
        self.cmd = list(cmd)
        self.startup_timeout = startup_timeout
        self.proc: Optional[subprocess.Popen] = None
        self.buf = b""
        self.lock = threading.Lock()

    def _start(self):
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = _spawn(lambda: subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                    stderr=subprocess.DEVNULL, env=env, close_fds=True))
        self.buf = b""
        line = self._readline(self.startup_timeout)
        if line is None:
            self.kill()
            raise RuntimeError(f"grader worker did not start: {' '.join(self.cmd)}")

    def _readline(self, timeout: float) -> Optional[bytes]:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def kill(self):
        p, self.proc = self.proc, None
        if p is not None:
            try:
                p.kill()
                p.wait(timeout=5)
            except Exception:
                pass
            for f in (p.stdin, p.stdout):
                try:
                    f.close()
                except Exception:
                    pass

    def ask(self, pred: str, gold: str, timeout: float) -> tuple[bool, str]:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            try:
                self.proc.stdin.write((json.dumps({"pred": pred, "gold": gold}) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self.kill()
                return False, "worker died"
            line = self._readline(timeout)
            if line is None:
                self.kill()  # late or dead: the next request starts a fresh worker
                return False, "timeout"
            try:
                r = json.loads(line)
                return bool(r.get("ok")), str(r.get("how", ""))
            except Exception:
                self.kill()
                return False, "bad reply"


class VerifierPool:
    """A few persistent verifier processes; thread-safe. ``verify`` never raises and never
    waits longer than ``timeout`` for one answer (plus the worker's start-up on first use)."""

    def __init__(self, workers: int = 1, cmd: Optional[Sequence[str]] = None, startup_timeout: float = 120.0):
        self.cmd = list(cmd) if cmd else [sys.executable, _WORKER_SCRIPT]
        self._workers = [_Worker(self.cmd, startup_timeout) for _ in range(max(1, workers))]
        self._next = 0
        self._lock = threading.Lock()
        self.stats = {"calls": 0, "timeouts": 0, "errors": 0}

    def verify(self, pred: str, gold: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
        return self.verify_ex(pred, gold, timeout)[0]

    def verify_ex(self, pred: str, gold: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[bool, str]:
        with self._lock:
            free = [w for w in self._workers if not w.lock.locked()]
            w = free[0] if free else self._workers[self._next % len(self._workers)]
            self._next += 1
            self.stats["calls"] += 1
        try:
            ok, how = w.ask(pred, gold, timeout)
        except Exception as e:  # could not start a worker at all
            ok, how = False, f"error: {e}"
        if how == "timeout":
            self.stats["timeouts"] += 1
        elif how.startswith("error") or how in ("worker died", "bad reply"):
            self.stats["errors"] += 1
        return ok, how

    def verify_many(self, pairs: Iterable[tuple[str, str]], timeout: float = DEFAULT_TIMEOUT) -> list[bool]:
        pairs = list(pairs)
        if len(self._workers) == 1 or len(pairs) < 2:
            return [self.verify(p, g, timeout) for p, g in pairs]
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(len(self._workers)) as ex:
            return list(ex.map(lambda pg: self.verify(pg[0], pg[1], timeout), pairs))

    def close(self):
        for w in self._workers:
            with w.lock:
                w.kill()


_POOL: Optional[VerifierPool] = None


def get_pool() -> VerifierPool:
    """The process-wide verifier pool (one worker; env GRPO_HARNESS_VERIFY_WORKERS for more)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool(workers=int(os.environ.get("GRPO_HARNESS_VERIFY_WORKERS", "1") or 1))
            atexit.register(_POOL.close)
        return _POOL


def _reset_after_fork():
    """A forked child must not talk to its parent's workers (nor wait on a spawner thread
    that did not survive the fork): it starts its own on first use."""
    global _POOL, _SPAWNER, _POOL_LOCK
    _POOL, _SPAWNER, _POOL_LOCK = None, None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
