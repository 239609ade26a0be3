"""Live progress table of a sweep: one row per run with its state (and, before its first metrics row, what it waits on), budget consumed / amount, last reward and accuracy, and ETAs.

Read from each run's ``metrics.jsonl`` (tailed incrementally), ``summary.json`` and lock
files. What a running run waits on before its first metrics row: ``building warm-up`` (it
holds the warm-up lock and the checkpoint is not written yet), ``waiting for warm-up lock``
(another process builds it), ``initial evaluation`` (summary ``phase``, written by the
trainer) or ``loading``; later ``evaluation`` and ``final evaluation`` (the bar is full while
the last one runs). ETA of a run: its remaining budget at the rate between its first
and last metrics rows of this launch; ETA of the sweep: the remaining work of running and
pending runs (at the finished or projected run duration) over the parallel runs seen.

On a terminal the table is redrawn in place (with ``rich`` when installed, else ANSI
clear-and-reprint); otherwise (logs, CI) it is re-printed as plain text when a run changes
state (at most every few seconds) and every ``interval`` seconds.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

from harness.config.schema import load_config
from harness.foundation.budget import UNIT_COUNTER
from harness.report.format import number, percent, table
from harness.rundir.layout import CONFIG, METRICS, SUMMARY, read_json
from harness.rundir.lock import RUN_LOCK, read_holder
from harness.train.warmup import warmup_dir

__all__ = ["Progress", "RunProgress", "reward_of", "accuracy_of"]

_REWARD_KEYS = ("rollout/reward_mean", "rollout/reward", "train/reward_mean", "train/reward")


def reward_of(row: dict) -> Optional[float]:
    """The mean rollout reward of a metrics row, if it has one."""
    for k in _REWARD_KEYS:
        if isinstance(row.get(k), (int, float)):
            return row[k]
    for k, v in row.items():
        if (k.startswith("rollout/") or k.startswith("train/")) and "reward" in k and isinstance(v, (int, float)) \
                and not any(s in k for s in ("std", "min", "max")):
            return v
    return None


def accuracy_of(row: dict) -> Optional[float]:
    """Held-out accuracy of a metrics/eval row (``eval/<task>/acc``, else pass@1)."""
    for suffix in ("/acc", "/pass@1"):
        for k, v in row.items():
            if k.startswith("eval/") and k.endswith(suffix) and isinstance(v, (int, float)):
                return v
    return None


class RunProgress:
    def __init__(self, run_id: str, run_dir: str | Path, state: str, unit: str = "steps"):
        self.unit = unit
        self.run_id = run_id
        self.run_dir = Path(run_dir)
        self.state = state
        self.offset = 0
        self.consumed: dict = {}
        self.reward: Optional[float] = None
        self.acc: Optional[float] = None
        self.started: Optional[float] = None
        self.ended: Optional[float] = None
        self._buf = ""
        self.first: Optional[tuple[float, float]] = None  # (time, consumed) of the first row this launch
        self.last: Optional[tuple[float, float]] = None
        self.rows_seen = 0
        self.phase = ""  # what a running run waits on before its first metrics row
        self._warmup: Optional[Path] = None
        self._warmup_known = False

    def poll(self) -> None:
        """Read metrics rows appended since the last poll."""
        path = self.run_dir / METRICS
        try:
            size = path.stat().st_size
        except OSError:
            return
        if size < self.offset:  # truncated on resume
            self.offset, self._buf = 0, ""
        if size == self.offset:
            return
        with open(path) as f:
            f.seek(self.offset)
            chunk = f.read()
            self.offset = f.tell()
        data = self._buf + chunk
        lines = data.split("\n")
        self._buf = lines.pop()  # an incomplete last line waits for the next poll
        for line in lines:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):  # a non-object line (``123``) is skipped like a torn one
                self._take(row)

    def _take(self, row: dict) -> None:
        self.rows_seen += 1
        for u, key in UNIT_COUNTER.items():
            if isinstance(row.get(key), (int, float)):
                self.consumed[u] = row[key]
        t, c = row.get("time"), self.consumed.get(self.unit)
        if isinstance(t, (int, float)) and isinstance(c, (int, float)) and t >= (self.started or 0) - 5:
            self.last = (float(t), float(c))  # rows of this launch only (a resumed run's old rows are not its rate)
            if self.first is None or c < self.first[1]:  # a restart begins again at 0
                self.first = self.last
        r = reward_of(row)
        if r is not None:
            self.reward = r
        a = accuracy_of(row)
        if a is not None:
            self.acc = a

    def load_summary(self) -> None:
        s = read_json(self.run_dir / SUMMARY)
        if not isinstance(s, dict):
            return
        cons = (s.get("budget") or {}).get("consumed") or {}
        for unit in UNIT_COUNTER:
            if isinstance(cons.get(unit), (int, float)):
                self.consumed[unit] = cons[unit]
        if self.acc is None:
            a = accuracy_of({f"{k}": v for k, v in (s.get("final_eval") or {}).items()})
            if a is not None:
                self.acc = a


    def waiting_on(self) -> str:
        """What a running run is busy with besides training steps: its summary's ``phase`` (an
        evaluation, the final one included), else, before its first metrics row, the warm-up
        or loading ('' while it trains)."""
        if self.state != "running":
            return ""
        s = read_json(self.run_dir / SUMMARY)
        if isinstance(s, dict) and s.get("status") == "running" and s.get("phase"):
            return str(s["phase"])
        if self.rows_seen:
            return ""
        wdir = self._warmup_dir()
        if wdir is not None and not (wdir / "warmup.json").exists():
            holder = read_holder(wdir.with_name(wdir.name + ".lock"))
            mine = read_holder(self.run_dir / RUN_LOCK)
            return "building warm-up" if holder and holder == mine else "waiting for warm-up lock"
        return "loading"

    def _warmup_dir(self) -> Optional[Path]:
        """The warm-up checkpoint this run starts from (None: it uses none), read once."""
        if not self._warmup_known:
            try:
                cfg = load_config(self.run_dir / CONFIG)
                if cfg.model.name_or_path == "tiny" and cfg.warmup.enabled:
                    self._warmup = warmup_dir(cfg)
                self._warmup_known = True
            except Exception:  # config.yaml not written yet: ask again next time
                return None
        return self._warmup

    def eta(self, amount: float, now: float) -> Optional[float]:
        """Seconds until the budget is reached, at the rate since the first row of this launch."""
        if self.state != "running" or self.first is None or self.last is None or not amount:
            return None
        (t0, c0), (t1, c1) = self.first, self.last
        if c1 <= c0 or t1 <= t0:
            return None
        rate = (c1 - c0) / (t1 - t0)
        return max(0.0, (amount - c1) / rate - (now - t1))


def _num(v: Any) -> str:
    return number(v, ".3g", large_spec=",.0f", int_spec=",", missing="-")


def _dur(s: Optional[float]) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """``with Progress(...) as p: p.update(run_id, state); p.tick()`` — the launchers call
    ``update`` on state changes and ``tick`` every poll."""

    HEADERS = ("run id", "state", "budget", "done", "reward", "accuracy", "time", "eta")

    def __init__(self, runs: list[tuple[str, str | Path]], *, unit: str, amount: float,
                 initial: Optional[dict] = None, mode: bool | str = True, stream=None,
                 interval: Optional[float] = None):
        self.stream = stream or sys.stdout
        self.unit, self.amount = unit, amount
        initial = initial or {}
        self.runs = {rid: RunProgress(rid, d, initial.get(rid, "pending"), unit) for rid, d in runs}
        self.parallel = 1  # the most runs seen running at once (the sweep ETA's workers)
        for rp in self.runs.values():
            if rp.state == "finished":
                rp.load_summary()
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        if mode is False:
            self.mode = "off"
        elif mode in ("plain", "rich", "ansi"):
            self.mode = mode
        else:
            self.mode = "plain"
            if tty:
                try:
                    import rich  # noqa: F401
                    self.mode = "rich"
                except ImportError:
                    self.mode = "ansi"
        self.interval = interval if interval is not None else (1.0 if self.mode in ("rich", "ansi") else 30.0)
        self._last = 0.0
        self._dirty = False
        self._live = None
        self._lines_drawn = 0

    # -- lifecycle ------------------------------------------------------------
    def __enter__(self):
        if self.mode == "rich":
            from rich.console import Console
            from rich.live import Live
            self._live = Live(self.rich_table(), console=Console(file=self.stream), auto_refresh=False,
                              transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        self.tick(force=True)
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None
        return False

    # -- events -----------------------------------------------------------------
    def update(self, run_id: str, state: str) -> None:
        rp = self.runs.get(run_id)
        if rp is None or rp.state == state:
            return
        now = time.time()
        if state == "running" and rp.started is None:
            rp.started = now
        if state in ("finished", "failed", "interrupted"):
            rp.ended = now
            rp.poll()
            rp.load_summary()
        rp.state = state
        self._dirty = True
        if self.mode == "off":
            done = sum(r.state in ("finished", "failed") for r in self.runs.values())
            print(f"[{done}/{len(self.runs)}] {run_id}: {state}", file=self.stream, flush=True)

    def tick(self, force: bool = False) -> None:
        if self.mode == "off":
            return
        now = time.time()
        due = now - self._last >= self.interval
        if self.mode == "plain" and self._dirty and now - self._last >= min(5.0, self.interval):
            due = True
        if not (force or due):
            return
        for rp in self.runs.values():
            if rp.state in ("running", "queued"):
                rp.poll()
        self._last = now
        self._dirty = False
        if self.mode == "rich" and self._live is not None:
            self._live.update(self.rich_table(), refresh=True)
        elif self.mode == "ansi":
            text = self.text()
            if self._lines_drawn:
                self.stream.write(f"\x1b[{self._lines_drawn}F\x1b[J")
            self.stream.write(text + "\n")
            self.stream.flush()
            self._lines_drawn = text.count("\n") + 1
        else:
            self.stream.write(f"--- {time.strftime('%H:%M:%S')} ---\n{self.text()}\n")
            self.stream.flush()

    # -- rendering ----------------------------------------------------------------
    def rows(self) -> list[list[str]]:
        out = []
        now = time.time()
        for rp in self.runs.values():
            c = rp.consumed.get(self.unit)
            pct = percent(c / self.amount, 0) if isinstance(c, (int, float)) and self.amount else "-"
            el = None
            if rp.started is not None:
                el = (rp.ended or now) - rp.started
            waiting = rp.waiting_on()
            state = f"{rp.state}: {waiting}" if waiting else rp.state
            out.append([rp.run_id, state, f"{_num(c)}/{_num(self.amount)} {self.unit}", pct, _num(rp.reward),
                        percent(rp.acc), _dur(el), _dur(rp.eta(self.amount, now))])
        return out

    def sweep_eta(self, now: Optional[float] = None) -> Optional[float]:
        """Seconds until every run has ended (None while there is nothing to estimate from)."""
        now = time.time() if now is None else now
        runs = list(self.runs.values())
        running = [r for r in runs if r.state == "running"]
        pending = sum(r.state in ("pending", "queued") for r in runs)
        if not running and not pending:
            return 0.0
        self.parallel = max(self.parallel, len(running))
        done = [r.ended - r.started for r in runs if r.state == "finished" and r.started and r.ended]
        left = []
        for r in running:
            eta = r.eta(self.amount, now)
            if eta is not None:
                left.append(eta)
                if not done and r.started is not None:
                    done.append(now - r.started + eta)  # projected duration
        if len(left) < len(running) or (pending and not done):
            return None
        work = sum(left) + pending * (sum(done) / len(done) if done else 0.0)
        return max(max(left, default=0.0), work / self.parallel)

    def counts(self) -> str:
        from collections import Counter
        c = Counter(rp.state for rp in self.runs.values())
        text = ", ".join(f"{n} {s}" for s, n in sorted(c.items()))
        eta = self.sweep_eta()
        return text + (f"; sweep ETA {_dur(eta)}" if eta else "")

    def text(self) -> str:
        return table(self.HEADERS, self.rows()) + "\n" + self.counts()

    def rich_table(self):
        from rich.table import Table
        t = Table(title=f"sweep: {self.counts()}", title_justify="left")
        for h in self.HEADERS:
            t.add_column(h, justify="right" if h in ("done", "reward", "accuracy", "time", "budget", "eta") else "left")
        style = {"finished": "green", "failed": "red", "interrupted": "yellow", "running": "cyan"}
        for r in self.rows():
            st = style.get(r[1].split(":")[0])
            t.add_row(*[f"[{st}]{c}[/{st}]" if st and i == 1 else c for i, c in enumerate(r)])
        return t
