"""Where a GRPO step's time goes: our step under torch.profiler, seconds per op class and phase beside each class's compute floor (issue 29).

Method
------
1. The step is ``bench/grpo_step.py``'s "ours" worker: the default-config Llama (or the 27.3M one) at
   random init (seed 0), saved with ``save_policy`` and loaded with ``load_policy``, the models from
   ``harness.train.stage.build_models``, a ``Learner``, and ``harness.train.stage.run_stage`` with
   the forced length (``NoStopTokenizer``: every row decodes exactly ``--max-new-tokens`` tokens), in
   the bench's numerics mode (portable unless ``GRPO_HARNESS_NUMERICS=native``). Settings are
   ``grpo_step.py``'s (G 8 x 16 prompts, beta 0.04, eps 0.2, micro-batch 64, AdamW, clip 1.0).
2. Each shape runs in a fresh worker process pinned to its thread count (``_common.thread_env``):
   ``--warmup`` untimed steps, ``--plain-steps`` steps timed without the profiler (the reference
   wall time: the profiler adds a cost per op), ``--steps`` steps each under its own
   ``torch.profiler.profile`` (CPU activities), and one step under ``FlopCounterMode``.
3. Phases are the trainer's own (``PerfTracker.phase``: generate, score, reference, policy_forward,
   backward, optimizer, ...): the tracker used here also opens a ``record_function("phase::NAME")``
   around each, so every op event is charged to the phase around it ("between phases": the
   learner's work outside its named phases, e.g. the batch, advantages, metrics).
4. Op classes (:func:`classify`): matmul (mm/addmm/linear/matmul and their backward), attention
   (SDPA and everything inside it, the decode step's bmm + softmax), norms/activations/elementwise
   (rms_norm, silu, mul, add, rotary, reductions), softmax/log-prob (log_softmax, logsumexp, gather
   and their backward), optimizer (AdamW's and the clip's ``_foreach`` ops, everything inside
   ``Optimizer.step``), copies/alloc/views (copy_, cat, to, empty, index_select, views), other ops.
   An op is classed by its own name, except inside an op that owns its parts (SDPA, logsumexp,
   log_softmax, rms_norm, ``Optimizer.*``: everything inside is theirs), and a generic op (a copy,
   a view, an unknown op) takes the class of the nearest classed op or backward node around it
   (``aten::t`` in ``aten::linear`` is matmul). Seconds are self times (no double counting), so
   the classes plus "Python/framework overhead" (= wall - the summed self time of every op: the
   interpreter, autograd's engine, the profiler's own per-op cost) add up to the step's wall time.
5. FLOPs: ``torch.utils.flop_counter`` (matmul and attention only, CPU SDPA included), per phase
   and class; the floor of a class is its FLOPs at the sgemm roof (``_common.sgemm_roof``, the best
   of start and end of the worker), and "x floor" = its seconds / its floor. Classes without
   counted FLOPs have no floor: their time is all above it.
6. Noise: the figures are those of the median profiled step (by wall time), so that its classes
   add up; brackets give each figure's min-max over the profiled steps. The load average is printed
   at the start, after every step and at the end, with a warning when it exceeds the CPU count
   (``--quiet-check`` refuses to run then).

Run:  python bench/profile_step.py                     # both shapes (0.87M at 1 thread, 27.3M at 2)
      python bench/profile_step.py --shape small --steps 5 --json out.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _common import (NUMERICS, NoStopTokenizer, fmt, fmt_spread, loadavg, median, numerics_line,  # first: numerics
                     print_table, register_cpu_sdpa_flops, run_worker, sgemm_roof)
import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils import flop_counter

import grpo_step  # the "ours" worker's settings (bench/ is sys.path[0])
from algorithms.presets import resolve
from evals.catalog import get_task
from harness.config.schema import load_config
from harness.engine.learner import Learner
from harness.engine.models import build_char_tokenizer, build_tiny_model, load_policy, num_params, save_policy
from harness.engine.perf import PerfTracker
from harness.train.loop import score
from harness.train.stage import build_models, run_stage, stage_problems

SHAPES = {  # grpo_step.py's two headline shapes (bench/README.md), and a toy one for the tests
    "small": {"model": [], "max_new_tokens": 24, "threads": 1},
    "27m": {"model": ["hidden_size=512", "num_layers=8", "num_heads=8", "intermediate_size=1536", "max_length=256"],
            "max_new_tokens": 128, "threads": 2},
    "toy": {"model": ["hidden_size=32", "num_layers=2", "num_heads=2", "intermediate_size=64"],
            "max_new_tokens": 6, "threads": 1, "prompts": 4, "group": 2, "micro_batch": 4},
}
CLASSES = ("matmul", "attention", "norms/activations/elementwise", "softmax/log-prob", "optimizer",
           "copies/alloc/views", "other ops")
OVERHEAD = "python/framework overhead"
BETWEEN = "(between phases)"

# op names (without "aten::" and leading underscores; backward nodes as snake_case without "Backward")
_OPS = {
    "matmul": {"mm", "addmm", "matmul", "linear", "addmv", "mv", "dot"},
    "attention": {"scaled_dot_product_attention", "scaled_dot_product_flash_attention_for_cpu",
                  "scaled_dot_product_flash_attention_for_cpu_backward", "scaled_dot_product_attention_math",
                  "bmm", "baddbmm", "softmax", "softmax_backward_data"},
    "softmax/log-prob": {"log_softmax", "log_softmax_backward_data", "logsumexp", "gather", "scatter_add",
                         "scatter_add_", "cross_entropy", "cross_entropy_loss", "nll_loss", "nll_loss_forward",
                         "nll_loss_backward", "nll_loss_nd"},
    "norms/activations/elementwise": {
        "rms_norm", "fused_rms_norm", "fused_rms_norm_backward", "silu", "silu_", "silu_backward", "mul", "mul_",
        "add", "add_", "sub", "sub_", "rsub", "div", "div_", "neg", "neg_", "rsqrt", "pow", "mean", "sum", "exp",
        "exp_", "log", "log_", "cos", "sin", "where", "masked_fill", "masked_fill_", "clamp", "clamp_", "clamp_min",
        "clamp_max", "maximum", "minimum", "abs", "sigmoid", "tanh", "sqrt", "reciprocal", "addcmul", "addcmul_",
        "addcdiv", "addcdiv_", "lerp", "lerp_", "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or",
        "bitwise_and", "bitwise_or", "bitwise_not", "minimum", "amax", "max", "min", "norm", "linalg_vector_norm",
        "cumsum", "tril", "triu", "rotate", "isfinite", "mse_loss", "smooth_l1_loss"},
    "optimizer": set(),  # _foreach_* / fused AdamW, by prefix
    "copies/alloc/views": {
        "copy_", "clone", "contiguous", "to", "to_copy", "cat", "stack", "empty", "empty_like", "empty_strided",
        "zeros", "zeros_like", "new_zeros", "new_empty", "new_empty_strided", "full", "full_like", "ones",
        "ones_like", "fill_", "zero_", "index_copy", "index_copy_", "index_select", "index", "index_put_",
        "repeat_interleave", "repeat", "pad", "constant_pad_nd", "arange", "detach", "detach_", "resize_",
        "embedding", "embedding_dense_backward", "embedding_backward", "view", "reshape", "reshape_alias",
        "unsafe_view", "transpose", "t", "unflatten", "flatten", "squeeze", "unsqueeze", "expand", "expand_as",
        "slice", "select", "as_strided", "permute", "split", "split_with_sizes", "chunk", "narrow", "alias",
        "unbind", "view_as", "lift_fresh", "resolve_conj", "resolve_neg", "conj", "real", "item",
        "local_scalar_dense", "set_", "select_backward", "slice_backward", "unsafe_split", "t_", "numpy_t",
        "masked_select", "nonzero", "scatter", "scatter_", "index_add", "index_add_", "where_", "result_type"},
}
_OWN = {name: cls for cls, names in _OPS.items() for name in names}
_OWNERS = {"scaled_dot_product_attention", "scaled_dot_product_flash_attention_for_cpu",
           "scaled_dot_product_flash_attention_for_cpu_backward", "logsumexp", "log_softmax",
           "log_softmax_backward_data", "rms_norm", "fused_rms_norm", "fused_rms_norm_backward", "silu_backward",
           "softmax", "softmax_backward_data"}  # everything inside these is theirs
_GENERIC = ("copies/alloc/views", "other ops")
_NODE = re.compile(r"^(?:autograd::engine::evaluate_function: )?(?:torch::autograd::)?([A-Za-z0-9_]+?)Backward\d*$")


def _snake(camel: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", camel).lower()


def _base(name: str) -> tuple[str, str]:
    """(kind, base name): kind 'op' (an ATen op), 'node' (an autograd node), 'phase', 'opt' (inside
    ``Optimizer.*``) or 'mark' (any other annotation: its self time is overhead)."""
    if name.startswith("phase::"):
        return "phase", name[7:]
    if name.startswith("Optimizer."):
        return "opt", name
    m = _NODE.match(name)
    if m:
        return "node", _snake(m.group(1)).lstrip("_")
    if name.startswith(("autograd::", "torch::autograd::", "step::", "ProfilerStep", "## ", "<")):
        return "mark", name
    op = name.split("::", 1)[1] if "::" in name else name
    return "op", op.lstrip("_")


def _own_class(base: str) -> str:
    if base.startswith("foreach_") or base.startswith("fused_adam"):
        return "optimizer"
    return _OWN.get(base, "other ops")


def classify(event) -> str:
    """The op class of a profiler event (see the module docstring, step 4)."""
    kind, base = _base(event.name)
    own = _own_class(base) if kind == "op" else "other ops"
    p, inherited = event.cpu_parent, None
    while p is not None:
        pk, pb = _base(p.name)
        if pk == "opt" or (pk in ("op", "node") and pb in _OWNERS):  # an owner: its parts are its class
            return "optimizer" if pk == "opt" else _own_class(pb)
        if inherited is None and pk in ("op", "node") and _own_class(pb) not in _GENERIC:
            inherited = _own_class(pb)
        p = p.cpu_parent
    return own if own not in _GENERIC or inherited is None else inherited


def _phase_of(event) -> str:
    p = event.cpu_parent
    while p is not None:
        if p.name.startswith("phase::"):
            return p.name[7:]
        p = p.cpu_parent
    return BETWEEN


def breakdown(events, wall: float) -> dict:
    """Seconds per phase and class of one profiled step (``wall`` its wall time): {"wall", "phases":
    {phase: {"wall", "classes": {class: s}}}, "classes": {class: s}, "ops": {name: [class, s, calls]}}.
    Every phase's classes (its ops' self times and its overhead) add up to its wall time, and the
    phases to the step's."""
    phases: dict = defaultdict(lambda: {"wall": 0.0, "classes": defaultdict(float)})
    ops: dict = {}
    for e in events:
        kind, _ = _base(e.name)
        if kind == "phase":
            if _phase_of(e) == BETWEEN:  # phases do not nest; a nested one is part of its parent
                phases[e.name[7:]]["wall"] += e.cpu_time_total / 1e6
            continue
        if kind != "op":
            continue
        cls, s = classify(e), e.self_cpu_time_total / 1e6
        phases[_phase_of(e)]["classes"][cls] += s
        o = ops.setdefault(e.name, [cls, 0.0, 0])
        o[1] += s
        o[2] += 1
    phases[BETWEEN]["wall"] = wall - sum(v["wall"] for k, v in phases.items() if k != BETWEEN)
    total: dict = defaultdict(float)
    for v in phases.values():
        v["classes"][OVERHEAD] = v["wall"] - sum(v["classes"].values())
        for c, s in v["classes"].items():
            total[c] += s
    return {"wall": wall, "phases": {k: {"wall": v["wall"], "classes": dict(v["classes"])} for k, v in phases.items()},
            "classes": dict(total), "ops": ops}


class MarkedPerf(PerfTracker):
    """The trainer's PerfTracker, whose phases also open a ``record_function("phase::NAME")`` (for the
    profiler) and call ``hooks`` on entry and exit (for the FLOP counter)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.hooks: list = []

    @contextlib.contextmanager
    def phase(self, name: str):
        with record_function(f"phase::{name}"), super().phase(name):
            for h in self.hooks:
                h(name, True)
            try:
                yield
            finally:
                for h in self.hooks:
                    h(name, False)


class PhaseFlops:
    """Matmul / attention FLOPs per phase and class of what runs while it is on (``FlopCounterMode``)."""

    def __init__(self, perf: MarkedPerf):
        self.perf, self.mode, self.at = perf, None, {}
        self.by_phase: dict = defaultdict(lambda: defaultdict(int))

    def _counts(self) -> dict:
        return {str(op).split(".")[-1]: n for op, n in self.mode.get_flop_counts().get("Global", {}).items()}

    def _hook(self, name: str, enter: bool) -> None:
        now = self._counts()
        if enter:
            self.at[name] = now
            return
        for op, n in now.items():
            self.by_phase[name][_own_class(op.lstrip("_"))] += n - self.at[name].get(op, 0)

    def __enter__(self):
        register_cpu_sdpa_flops()
        self.mode = flop_counter.FlopCounterMode(display=False)
        self.mode.__enter__()
        self.perf.hooks.append(self._hook)
        return self

    def __exit__(self, *exc):
        self.perf.hooks.remove(self._hook)
        total = defaultdict(int)
        for op, n in self._counts().items():
            total[_own_class(op.lstrip("_"))] += n
        self.mode.__exit__(*exc)
        inside = defaultdict(int)
        for v in self.by_phase.values():
            for c, n in v.items():
                inside[c] += n
        for c, n in total.items():
            if n - inside[c]:
                self.by_phase[BETWEEN][c] += n - inside[c]
        self.total = dict(total)
        return False


# ----------------------------------------------------------------------------------------------
# the profiled worker
# ----------------------------------------------------------------------------------------------
def setup(a, mdir: str):
    """(learner, cfg, task, tok, sampler tok, perf, params): grpo_step.py's "ours" worker's set-up."""
    perf = MarkedPerf(torch.device("cpu"))
    cfg = load_config(None, grpo_step._overrides(a))
    algo, task = resolve(cfg.algorithm), get_task(cfg.task)
    torch.manual_seed(cfg.seed)
    policy, tok = load_policy(mdir)
    models = build_models(policy, algo, torch.device("cpu"))
    learner = Learner(policy, algo, cfg, torch.device("cpu"), perf, reference=models.reference, critic=models.critic)
    return learner, cfg, task, tok, NoStopTokenizer(tok), perf, num_params(policy)


def cpu_roof(threads: int, n: int = 1024, reps: int = 7) -> float:
    """:func:`_common.sgemm_roof` timed in process CPU seconds per thread instead of wall seconds (GFLOP/s):
    a diagnostic beside the wall-time figures (at 2 threads OpenMP's spinning counts as CPU time)."""
    return sgemm_roof(threads, n, reps, cpu_time=True)


def profile_shape(a, keep_stage: bool = False) -> dict:
    """Warm-up, plain, profiled and FLOP-counted steps of one shape in this process (see the module
    docstring); the figures as a dict (``stage``: the counted step's Stage when ``keep_stage``)."""
    torch.set_num_threads(a.threads)
    la = [loadavg()]
    roof0, cpu_roof0 = sgemm_roof(a.threads), cpu_roof(a.threads)
    mcfg = load_config(None, [f"model.{kv}" for kv in a.model]).model
    tok0 = build_char_tokenizer()
    with tempfile.TemporaryDirectory(prefix="profile-step-model-") as mdir:
        save_policy(build_tiny_model(mcfg, tok0, seed=a.seed), tok0, mdir)
        learner, cfg, task, tok, stok, perf, n_params = setup(a, mdir)
    k, cpus = 0, []

    def one_step():
        nonlocal k
        problems = stage_problems(task, a.seed, k, a.prompts)
        c0, t0 = time.process_time(), time.perf_counter()
        st = run_stage(learner, cfg, task, tok, k, problems, score, perf=perf, sampler_tok=stok)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        k += 1
        cpus.append(cpu)
        return st, dt, perf.pop_seconds()

    for _ in range(a.warmup):
        one_step()
        la.append(loadavg())
    plain = []
    for _ in range(a.plain_steps):
        _, dt, ph = one_step()
        plain.append({"seconds": dt, "cpu_seconds": cpus[-1], "phases": ph})
        la.append(loadavg())
    profiled, top = [], []
    for _ in range(a.steps):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            st, dt, ph = one_step()
        ev = prof.events()
        threads = {e.thread for e in ev}
        b = breakdown([e for e in ev if e.thread == min(threads)] if len(threads) > 1 else ev, dt)
        b["tracker_phases"], b["event_threads"], b["tokens"] = ph, len(threads), st.rollouts.num_tokens
        b["cpu_seconds"] = cpus[-1]
        profiled.append(b)
        del prof, ev
        la.append(loadavg())
    with PhaseFlops(perf) as fl:
        st, _, _ = one_step()
    la.append(loadavg())
    roof1, cpu_roof1 = sgemm_roof(a.threads), cpu_roof(a.threads)
    walls = [p["wall"] for p in profiled]
    mid = sorted(range(len(walls)), key=lambda i: walls[i])[(len(walls) - 1) // 2] if walls else None
    if mid is not None:
        ops = profiled[mid]["ops"]
        top = sorted(([n, c, s, calls] for n, (c, s, calls) in ops.items()), key=lambda r: -r[2])[:a.top]
    for p in profiled:
        p["n_ops"] = sum(v[2] for v in p.pop("ops").values())
    out = {"shape": a.shape, "threads": a.threads, "params": n_params, "model": a.model, "prompts": a.prompts,
           "group": a.group, "max_new_tokens": a.max_new_tokens, "micro_batch": a.micro_batch,
           "numerics": NUMERICS, "roof_gflops": [roof0, roof1], "roof_used_gflops": max(roof0, roof1),
           "cpu_roof_gflops": max(cpu_roof0, cpu_roof1),
           "plain_steps": plain, "profiled_steps": profiled, "median_step": mid, "top_ops": top,
           "flops_by_phase": {p: dict(v) for p, v in fl.by_phase.items()}, "flops": fl.total,
           "tokens": st.rollouts.num_tokens, "loadavg": la, "cpus": os.cpu_count(), "torch": torch.__version__}
    if keep_stage:
        out["stage"] = st
    return out


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------
def _floor_cells(s: float, flops: float, roof: float, sp: str = ".3f") -> list[str]:
    if not flops:
        return ["-", "-", "-"]
    floor = flops / 1e9 / roof
    return [fmt(flops / 1e9, ".3f"), fmt(floor, sp), fmt(s / floor, ".1f")]


def class_rows(res: dict) -> list[dict]:
    """Per class (then overhead, then the total): seconds of the median step, [min-max] over the
    profiled steps, share, GFLOP, floor seconds, x floor."""
    steps, mid, roof = res["profiled_steps"], res["median_step"], res["roof_used_gflops"]
    m = steps[mid]
    rows = []
    for c in (*CLASSES, OVERHEAD, "total"):
        xs = [p["wall"] if c == "total" else p["classes"].get(c, 0.0) for p in steps]
        s = m["wall"] if c == "total" else m["classes"].get(c, 0.0)
        f = sum(res["flops"].values()) if c == "total" else res["flops"].get(c, 0)
        row = {"class": c, "seconds": s, "all": xs, "share": s / m["wall"], "gflop": f / 1e9,
               "floor_s": f / 1e9 / roof if f else None, "x_floor": s / (f / 1e9 / roof) if f else None}
        if m.get("cpu_seconds") and res.get("cpu_roof_gflops"):  # the share of the step's CPU time per thread
            row["cpu_est_s"] = row["share"] * m["cpu_seconds"] / res["threads"]
            row["cpu_x_floor"] = row["cpu_est_s"] / (f / 1e9 / res["cpu_roof_gflops"]) if f else None
        rows.append(row)
    return rows


def report(res: dict) -> None:
    steps, mid, roof = res["profiled_steps"], res["median_step"], res["roof_used_gflops"]
    m = steps[mid]
    plain = [p["seconds"] for p in res["plain_steps"]]
    print(f"\n## {res['shape']}: {res['params'] / 1e6:.2f}M params, {res['prompts']} prompts x G {res['group']} = "
          f"{res['prompts'] * res['group']} rows x {res['max_new_tokens']} tokens (forced), micro-batch "
          f"{res['micro_batch']}, {res['threads']} thread(s), sgemm roof {roof:.1f} GFLOP/s "
          f"(start {res['roof_gflops'][0]:.1f}, end {res['roof_gflops'][1]:.1f})")
    print(f"step wall: profiled {fmt_spread([p['wall'] for p in steps])} s over {len(steps)} steps (median step: "
          f"{m['wall']:.3f} s, {m['n_ops']} ops), unprofiled {fmt_spread(plain)} s over {len(plain)} steps"
          + (f": the profiler adds {m['wall'] / median(plain) - 1:+.0%}, inside the overhead row mostly"
             if plain else ""))
    print(f"loadavg: {res['loadavg']} on {res['cpus']} CPUs; tokens per step {res['tokens']}")
    cpu_s = median([p.get("cpu_seconds") for p in res["plain_steps"]])
    if cpu_s == cpu_s:
        gflop, croof = sum(res["flops"].values()) / 1e9, res["cpu_roof_gflops"]
        print(f"CPU-time view (a diagnostic for a loaded machine): unprofiled step {cpu_s:.3f} process CPU s "
              f"({cpu_s / res['threads']:.3f} per thread) against a CPU-time sgemm roof of {croof:.1f} GFLOP/s: "
              f"{cpu_s / res['threads'] / (gflop / croof):.1f} x floor")
    sp = ".3f" if m["wall"] < 10 else ".2f"
    fb = res["flops_by_phase"]
    fwd, bwd = fb.get("policy_forward", {}).get("matmul", 0), fb.get("backward", {}).get("matmul", 0)
    if fwd:
        print(f"backward's matmul FLOPs = {bwd / fwd:.2f} x the policy forward's (2.00: no recomputation; above: "
              f"layers recomputed in backward, fastlm.checkpoint_layers, {(bwd - 2 * fwd) / 1e9:.1f} GFLOP counted "
              f"in the floor though the maths does not need them)")
    cr = class_rows(res)
    cpu = "cpu_est_s" in cr[0]
    rows = [[r["class"], fmt(r["seconds"], sp), f"[{fmt(min(r['all']), sp)}-{fmt(max(r['all']), sp)}]",
             f"{r['share']:.1%}", *_floor_cells(r["seconds"], r["gflop"] * 1e9, roof, sp),
             *([fmt(r["cpu_est_s"], sp), fmt(r["cpu_x_floor"], ".1f")] if cpu else [])] for r in cr]
    print_table(["class", "s (median step)", "[min-max over steps]", "share", "GFLOP", "floor s", "x floor",
                 *(["CPU-time est. s", "x floor (CPU)"] if cpu else [])], rows)
    if cpu:
        print("(CPU-time est.: the class's share of the median profiled step times that step's process CPU seconds "
              "per thread; x floor (CPU): against the CPU-time sgemm roof. On a loaded machine, a rough picture of a "
              "quiet one: shares from wall-clock self times, waits for the core included)")
    phases = [p for p in (*grpo_step.PHASES_OURS, *sorted(m["phases"])) if p in m["phases"]]
    phases = list(dict.fromkeys(phases))
    print("\nseconds per phase and class (median step); floor and x floor from the phase's counted FLOPs")
    hdr = ["phase", "wall", *[c.split("/")[0] for c in CLASSES], "overhead", "GFLOP", "floor s", "x floor",
           "unprofiled"]
    rows = []
    for p in phases:
        v = m["phases"][p]
        f = sum(res["flops_by_phase"].get(p, {}).values())
        unp = median([q["phases"].get(p) for q in res["plain_steps"]]) if p != BETWEEN else None
        rows.append([p, fmt(v["wall"], sp), *[fmt(v["classes"].get(c, 0.0), sp) for c in (*CLASSES, OVERHEAD)],
                     *_floor_cells(v["wall"], f, roof, sp), fmt(unp, sp)])
    print_table(hdr, rows)
    print(f"\ntop {len(res['top_ops'])} ops by self time (median step)")
    print_table(["op", "class", "s", "calls"], [[n, c, fmt(s, sp), str(k)] for n, c, s, k in res["top_ops"]])


def warn_load(cpus: int) -> bool:
    la = loadavg()
    if la[0] > cpus:
        print(f"# WARNING: load average {la} above the {cpus} CPUs: the machine is shared, seconds are inflated "
              f"and uneven between op classes; read the shares, not the seconds", flush=True)
        return True
    return False


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="small,27m", help=f"comma list of {', '.join(SHAPES)} (default small,27m)")
    ap.add_argument("--threads", type=int, help="torch threads (default: the shape's: small 1, 27m 2)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--plain-steps", type=int, default=2, help="steps timed without the profiler")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (the median one is reported)")
    ap.add_argument("--prompts", type=int, help="prompts per step (default 16)")
    ap.add_argument("--group", type=int, help="G (default 8)")
    ap.add_argument("--max-new-tokens", type=int, help="default: the shape's (24 / 128)")
    ap.add_argument("--micro-batch", type=int, help="default 64")
    ap.add_argument("--model", action="append", default=None, metavar="KEY=VALUE", help="ModelConfig override")
    ap.add_argument("--top", type=int, default=15, help="ops listed by self time")
    ap.add_argument("--in-process", action="store_true", help="profile in this process (no worker)")
    ap.add_argument("--quiet-check", action="store_true", help="refuse to run when the load average exceeds the CPUs")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per worker")
    ap.add_argument("--json", metavar="OUT", help="also write the figures to this JSON file")
    ap.add_argument("--report", metavar="JSON", help="print the tables of a --json file written earlier, run nothing")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def shape_args(a, shape: str) -> argparse.Namespace:
    """The settings of ``shape`` with the command line's overrides, as grpo_step.py's worker names them."""
    d = {"prompts": 16, "group": 8, "micro_batch": 64, **SHAPES[shape]}
    for k in ("threads", "prompts", "group", "max_new_tokens", "micro_batch", "model"):
        if getattr(a, k) is not None:
            d[k] = getattr(a, k)
    return argparse.Namespace(**{**vars(a), **d, "shape": shape, "beta": 0.04, "eps": 0.2, "lr": 1e-4,
                                 "temperature": 1.0, "seed": 0})


def worker_argv(s: argparse.Namespace) -> list[str]:
    out = ["--shape", s.shape, "--threads", str(s.threads), "--warmup", str(s.warmup), "--plain-steps",
           str(s.plain_steps), "--steps", str(s.steps), "--prompts", str(s.prompts), "--group", str(s.group),
           "--max-new-tokens", str(s.max_new_tokens), "--micro-batch", str(s.micro_batch), "--top", str(s.top)]
    return out + [x for kv in s.model for x in ("--model", kv)]


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        res = profile_shape(shape_args(a, a.shape))
        Path(a.worker_out).write_text(json.dumps(res))
        return 0
    if a.report:
        saved = json.loads(Path(a.report).read_text())
        print(f"# from {a.report}: loadavg at start {saved['loadavg_start']}, at end {saved.get('loadavg_end')}")
        for res in saved["shapes"].values():
            report(res)
        return 0
    shapes = [s.strip() for s in a.shape.split(",") if s.strip()]
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        raise SystemExit(f"--shape: unknown {bad}; choose from {', '.join(SHAPES)}")
    cpus = os.cpu_count() or 1
    print(f"# GRPO step profile (ours: harness.train.stage.run_stage, forced length) | torch {torch.__version__} | "
          f"loadavg at start {loadavg()} on {cpus} CPUs", flush=True)
    print(f"# {numerics_line()}", flush=True)
    print(f"# {a.warmup} warm-up + {a.plain_steps} unprofiled + {a.steps} profiled + 1 FLOP-counted step per shape, "
          f"a fresh process per shape{' (in-process)' if a.in_process else ''}", flush=True)
    if warn_load(cpus) and a.quiet_check:
        print("--quiet-check: not running on a loaded machine")
        return 2
    out, errors = {"loadavg_start": loadavg(), "shapes": {}}, []
    for shape in shapes:
        s = shape_args(a, shape)
        if a.in_process:
            res = profile_shape(s)
        else:
            res = run_worker(__file__, ["--worker", shape, *worker_argv(s)], s.threads, a.timeout, shape)
        if "error" in res:
            errors.append(res["error"])
            print(f"\n## {shape}: FAILED\n{res['error']}")
            continue
        report(res)
        out["shapes"][shape] = res
        warn_load(cpus)
    out["loadavg_end"] = loadavg()
    print(f"\nloadavg at end {out['loadavg_end']}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {a.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
