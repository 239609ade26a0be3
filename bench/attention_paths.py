"""Attention at the small bench shape: the kernels the harness uses against the other ways to write it.

What the 0.87M step spends in attention (``profile_step.py``: about 0.09 s of 0.85) is two things: the CPU flash
kernel of ``scaled_dot_product_attention`` in the learner's forwards and backward (heads of 32, 23 completion
queries over prompt + completion keys, a boolean mask), and the decode step's two batched matmuls of one query
each (``fastlm.DecodeState.step``). This script times each against the alternatives that keep to stock ATen
ops (so their summation order is pinned in portable numerics too, but is another order than the kernel's: the
bits move), in one process, the contenders' order shuffled every round, and prints per call:

- milliseconds (median over rounds of the mean over ``--reps`` calls; min-max over rounds),
- whether the output (and, with backward, every input's gradient) is the same bits as the harness's path,
  and the largest absolute difference,
- the step's saving if the harness switched: the per-call difference times the calls per step of the
  0.87M bench step (16 prompts x G 8 x 24 tokens, micro-batch 64, 4 layers: ``CALLS`` below).

    python bench/attention_paths.py                     # the 0.87M bench shape, 1 thread
    python bench/attention_paths.py --rounds 5 --reps 100 --json /tmp/attn.json
"""
from __future__ import annotations

import argparse
import random
import time
from types import SimpleNamespace

from _common import NUMERICS, finish, loadavg, numerics_line, print_table  # noqa: F401  (pins numerics first)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from harness.engine import fastlm  # noqa: E402

# calls per 0.87M bench step (4 layers; two 64-row micro-batches for the reference and for the policy; prefill of
# the 16 prompts; 23 decode steps), as profile_step.py counts them
CALLS = {
    "completion attention, forward only (reference)": 8,
    "completion attention, forward + backward (policy)": 8,
    "prompt attention, forward only (reference, prefill)": 12,
    "prompt attention, forward + backward (policy)": 8,
    "decode attention (one query, 23 steps x 4 layers)": 92,
}


def learner_inputs(rows, heads, head_dim, prompt, completion, seed=0):
    """q [rows, h, T, d], k/v [rows, h, P+T, d] and the learner's boolean mask [rows, 1, T, P+T]
    (``fastlm.completion_hidden``'s: left-padded prompts, causal packed completions, some rows ending early)."""
    g = torch.Generator().manual_seed(seed)
    T, K = completion, prompt + completion
    q = torch.randn(rows, heads, T, head_dim, generator=g)
    k, v = (torch.randn(rows, heads, K, head_dim, generator=g) for _ in range(2))
    pad = torch.randint(0, 4, (rows,), generator=g)
    pmask = torch.arange(prompt)[None] >= pad[:, None]
    length = torch.randint(T // 2, T + 1, (rows,), generator=g)
    need = torch.arange(T)[None] < length[:, None]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    m = torch.cat([pmask[:, None, :].expand(rows, T, prompt),
                   (causal[None] & need[:, None, :]) | torch.eye(T, dtype=torch.bool)[None]], 2)[:, None]
    return q, k, v, m


def prompt_inputs(rows, heads, head_dim, prompt, seed=1):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(rows, heads, prompt, head_dim, generator=g) for _ in range(3))
    pad = torch.randint(0, 4, (rows,), generator=g)
    pm = torch.arange(prompt)[None] >= pad[:, None]
    causal = torch.tril(torch.ones(prompt, prompt, dtype=torch.bool))
    m = ((causal[None] & pm[:, None, :]) | torch.eye(prompt, dtype=torch.bool)[None])[:, None]
    return q, k, v, m


def flash(q, k, v, m, fm):
    """The harness's path (fastlm._attend): SDPA with the boolean mask (the CPU flash kernel)."""
    return fastlm._attend(q, k, v, m, SimpleNamespace(heads=q.shape[1], kv_heads=k.shape[1]))


def math(q, k, v, m, fm):
    """softmax(q k^T * scale + additive mask) v with matmul and softmax."""
    s = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + fm
    return torch.matmul(torch.softmax(s, -1), v)


def baddbmm(q, k, v, m, fm):
    """The same with the scale and mask folded into one baddbmm."""
    B, H, T, D = q.shape
    K = k.shape[2]
    s = torch.baddbmm(fm.expand(B, H, T, K).reshape(B * H, T, K), q.reshape(B * H, T, D),
                      k.reshape(B * H, K, D).transpose(1, 2), alpha=D ** -0.5)
    return torch.bmm(torch.softmax(s, -1), v.reshape(B * H, K, D)).view(B, H, T, D)


LEARNER = {"flash (harness)": flash, "math": math, "baddbmm": baddbmm}


def decode_bmm(q, K, V, bias, t):
    """The harness's decode step (fastlm.DecodeState.step, one group): bmm, scale + key mask, softmax, bmm."""
    s = torch.bmm(q, K[:, :t].transpose(1, 2))
    p = torch.softmax(s * q.shape[-1] ** -0.5 + bias[:, None, :t], -1)
    return torch.bmm(p, V[:, :t])


def decode_mulsum(q, K, V, bias, t):
    """The same as elementwise products and sums over the head dimension and the keys."""
    s = (q * K[:, :t]).sum(-1)[:, None]
    p = torch.softmax(s * q.shape[-1] ** -0.5 + bias[:, None, :t], -1)
    return (p.transpose(1, 2) * V[:, :t]).sum(1, keepdim=True)


DECODE = {"bmm (harness)": decode_bmm, "mul + sum": decode_mulsum}


def _bits_equal(a, b) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def compare(fns, args, backward: bool):
    """{name: (same bits as the first, max |diff|)} of output (and gradients with ``backward``)."""
    out = {}
    ref = None
    for name, fn in fns.items():
        xs = [a.detach().clone().requires_grad_(backward) if a.is_floating_point() and a.dim() == 4 and i < 3 else a
              for i, a in enumerate(args)]
        o = fn(*xs)
        got = [o.detach()]
        if backward:
            o.backward(torch.ones_like(o).mul_(0.5) + torch.linspace(0, 1, o.numel()).view_as(o))
            got += [x.grad for x in xs[:3]]
        if ref is None:
            ref = got
        out[name] = (all(_bits_equal(a, b) for a, b in zip(got, ref)),
                     max(float((a - b).abs().max()) for a, b in zip(got, ref)))
    return out


def time_learner(fn, args, backward: bool, reps: int) -> float:
    if backward:
        xs = [a.detach().clone().requires_grad_(True) for a in args[:3]] + list(args[3:])
        o = fn(*xs)
        g = torch.randn_like(o)
        fn(*xs).backward(g)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(*xs).backward(g)
    else:
        with torch.no_grad():
            fn(*args)
            t0 = time.perf_counter()
            for _ in range(reps):
                fn(*args)
    return (time.perf_counter() - t0) / reps


def time_decode(fn, args, lengths, reps: int) -> float:
    with torch.no_grad():
        for t in lengths[:3]:
            fn(*args, t)
        n = 0
        t0 = time.perf_counter()
        for _ in range(max(1, reps // len(lengths))):
            for t in lengths:
                fn(*args, t)
                n += 1
    return (time.perf_counter() - t0) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the contenders' order shuffled in each")
    ap.add_argument("--reps", type=int, default=50, help="calls timed per contender and round")
    ap.add_argument("--rows", type=int, default=64, help="learner micro-batch rows")
    ap.add_argument("--prompts", type=int, default=8, help="distinct prompts per learner micro-batch (prompt attention)")
    ap.add_argument("--decode-rows", type=int, default=128, help="decoded rows (prompts x G)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=13, help="prompt tokens")
    ap.add_argument("--completion", type=int, default=23, help="completion positions that are inputs")
    ap.add_argument("--step-seconds", type=float, default=0.814,
                    help="the 0.87M step's seconds, for the saving's share (bench/README.md's step report)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="OUT")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    rng = random.Random(a.seed)
    print(f"# attention paths at the small bench shape | torch {torch.__version__} | {a.threads} thread(s) | "
          f"loadavg {loadavg()}")
    print("# " + numerics_line())

    def fmask(m):
        return torch.zeros(m.shape).masked_fill(~m, float("-inf"))

    comp = learner_inputs(a.rows, a.heads, a.head_dim, a.prompt, a.completion, a.seed)
    comp = (*comp, fmask(comp[3]))
    prom = prompt_inputs(a.prompts, a.heads, a.head_dim, a.prompt, a.seed + 1)
    prom = (*prom, fmask(prom[3]))
    g = torch.Generator().manual_seed(a.seed + 2)
    BH, maxlen = a.decode_rows * a.heads, a.prompt + a.completion + 1
    dec = (torch.randn(BH, 1, a.head_dim, generator=g), torch.randn(BH, maxlen, a.head_dim, generator=g),
           torch.randn(BH, maxlen, a.head_dim, generator=g),
           torch.zeros(BH, maxlen).masked_fill_(torch.rand(BH, maxlen, generator=g) < 0.05, float("-inf")))
    lengths = list(range(a.prompt + 1, maxlen + 1))

    cases = {  # name -> (contenders, timer, bits check)
        "completion attention, forward only (reference)": (LEARNER, lambda f: time_learner(f, comp, False, a.reps),
                                                           lambda: compare(LEARNER, comp, False)),
        "completion attention, forward + backward (policy)": (LEARNER, lambda f: time_learner(f, comp, True, a.reps),
                                                              lambda: compare(LEARNER, comp, True)),
        "prompt attention, forward only (reference, prefill)": (LEARNER, lambda f: time_learner(f, prom, False, a.reps),
                                                                lambda: compare(LEARNER, prom, False)),
        "prompt attention, forward + backward (policy)": (LEARNER, lambda f: time_learner(f, prom, True, a.reps),
                                                          lambda: compare(LEARNER, prom, True)),
        "decode attention (one query, 23 steps x 4 layers)": (
            DECODE, lambda f: time_decode(f, dec, lengths, a.reps),
            lambda: {n: (_bits_equal(f(*dec, maxlen), decode_bmm(*dec, maxlen)),
                         float((f(*dec, maxlen) - decode_bmm(*dec, maxlen)).abs().max())) for n, f in DECODE.items()}),
    }
    out = {"numerics": NUMERICS, "threads": a.threads, "torch": torch.__version__, "cases": {}}
    total_saving, alt, alt_same = 0.0, 0, 0
    for case, (fns, timer, check) in cases.items():
        times = {n: [] for n in fns}
        for _ in range(a.rounds):
            order = list(fns)
            rng.shuffle(order)
            for n in order:
                times[n].append(timer(fns[n]))
        bits = check()
        base = sorted(times[next(iter(fns))])[len(times[next(iter(fns))]) // 2]
        rows, rec = [], {}
        for n, ts in times.items():
            med = sorted(ts)[len(ts) // 2]
            saving = (base - med) * CALLS[case]
            rows.append([n, f"{1e3 * med:.3f}", f"{1e3 * min(ts):.3f}-{1e3 * max(ts):.3f}", str(bits[n][0]),
                         f"{bits[n][1]:.1e}", f"{1e3 * saving:+.1f}"])
            rec[n] = {"seconds": ts, "median_s": med, "same_bits": bits[n][0], "max_abs_diff": bits[n][1],
                      "step_saving_s": saving}
        alt += len(rec) - 1
        alt_same += sum(r["same_bits"] for r in list(rec.values())[1:])
        best = max(rec.values(), key=lambda r: r["step_saving_s"])["step_saving_s"]
        total_saving += max(best, 0.0)
        print(f"\n## {case}: {CALLS[case]} calls per step")
        print_table(["path", "ms/call", "[min-max]", "same bits", "max |diff|", "step saving ms"], rows)
        out["cases"][case] = {"calls_per_step": CALLS[case], "paths": rec}
    out["best_total_saving_s"] = total_saving
    out["other_paths_same_bits"] = [alt_same, alt]
    print(f"\nbest path in every case, together: {1e3 * total_saving:.1f} ms per step "
          f"({100 * total_saving / a.step_seconds:.1f}% of a {a.step_seconds:.3f} s step); {alt_same} of the "
          f"{alt} other paths gave the harness's bits")
    return finish(out, [], [loadavg()], a.json)


if __name__ == "__main__":
    raise SystemExit(main())
