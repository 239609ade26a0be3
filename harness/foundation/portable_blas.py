"""Matrix products whose summation order no property of the CPU chooses: OpenBLAS's Haswell kernels.

Why. Portable numerics used to run every float32 product in MKL's sgemm at its ``COMPATIBLE,STRICT``
branch, the one MKL documents as giving the same bits on Intel and AMD. It did not: the quickstart's
warm-up trained other weights on an Intel Xeon than on an AMD EPYC with every pin read back in force
(issue 43; ``MKL_VERBOSE`` shows sgemm as the only MKL function a run calls, and nothing else in a
portable run chooses code by the CPU). MKL is closed, so which of its choices depends on the machine
(blocking from the cache sizes, the vendor, ...) cannot be read off; it is taken out of the path instead.

What. `install` registers, for torch's CPU dispatch key, implementations of every aten operator that
reaches a BLAS (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``addbmm``, ``mv``, ``addmv``, ``dot``,
``vdot``, ``_addmm_activation``; functional, in-place and ``out=`` forms), so the forward, autograd's
backward and the sampler all land here. float32 and float64 go to the OpenBLAS build that numpy ships,
with its kernels pinned to Haswell (``OPENBLAS_CORETYPE``, set by `harness.foundation.numerics`); other
dtypes are computed by elementwise products and a sum (or in float32 for half types). It also turns
off SDPA's fused CPU kernel (it calls MKL's sgemm directly, below the dispatcher): attention then runs
torch's math path, whose products land here too.

Why this order cannot depend on the CPU, read from OpenBLAS's source (0.3.28 and the 0.3.31 build
numpy 2.4 ships, checked by disassembly where the source was not at hand):

- the blocking: with the core type pinned, ``sgemm_p/q/r`` come from the Haswell table's compile-time
  constants (``kernel/setparam-ref.c``: ``SGEMM_DEFAULT_Q`` etc.); the cache size it reads
  (``get_l2_size``) only sizes older cores' tables;
- the threads: level-3 threading splits the output's rows and columns, never the sum over k, so every
  element is one kernel's chain over k in the same blocks, whatever the thread count;
- the shortcuts: the "small matrix" kernels are off for Haswell (``sgemm_small_matrix_permit_HASWELL``
  returns 0), and the AVX-512 "direct" sgemm, which OpenBLAS takes on any AVX-512 CPU whatever the core
  type, only for row-major calls, is never reached: every call here is column-major.
- batched products go through numpy's matmul, which makes the same cblas calls once per matrix from C
  (``sgemm``; ``sgemv`` where one side is a vector, ``ssyrk`` for x @ x^T: Haswell kernels again).

So an element's bits follow from the Haswell kernels' instructions (AVX2 with FMA, IEEE-exact on every
CPU that has them) and the shapes. The tests hold it on the machine they run on (thread counts, every
layout, no MKL call in a training step); across vendors, `bench/fingerprint.py` holds it with values
committed from one machine and compared on another.
"""
from __future__ import annotations

import ctypes
import glob
import os
from typing import Optional

import torch

from harness.foundation.errors import NumericsError

_COL, _N, _T = 102, 111, 112  # CBLAS_ORDER ColMajor, CBLAS_TRANSPOSE NoTrans / Trans
_installed = False
_libs: list = []  # the torch.library registrations (kept alive: dropping them unregisters)
_api: Optional[dict] = None


class PortableBlasError(NumericsError):
    """The OpenBLAS that portable numerics needs cannot be loaded."""


def openblas_path() -> Optional[str]:
    """numpy's OpenBLAS (the wheel's ``numpy.libs``), or None where numpy ships none."""
    import numpy as np

    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    found = sorted(glob.glob(os.path.join(libs, "*openblas*.so*")))
    return found[0] if found else None


def _symbol(lib, *names):
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


def _load() -> dict:
    """The cblas entry points of numpy's OpenBLAS (ILP64 names first: numpy's build is 64-bit-int)."""
    global _api
    if _api is not None:
        return _api
    path = openblas_path()
    if path is None:
        raise PortableBlasError("portable numerics need the OpenBLAS that numpy's wheel ships (numpy.libs), "
                                "and this numpy has none; set numerics: native")
    lib = ctypes.CDLL(path)
    ilp64 = getattr(lib, "scipy_cblas_sgemm64_", None) is not None
    I = ctypes.c_int64 if ilp64 else ctypes.c_int  # noqa: E741 (BLAS's integer)
    E, P = ctypes.c_int, ctypes.c_void_p
    api = {"path": path}
    for prec, F in (("s", ctypes.c_float), ("d", ctypes.c_double)):
        fn = _symbol(lib, f"scipy_cblas_{prec}gemm64_", f"cblas_{prec}gemm")
        if fn is None:
            raise PortableBlasError(f"{os.path.basename(path)} has no cblas_{prec}gemm")
        fn.restype, fn.argtypes = None, [E, E, E, I, I, I, F, P, I, P, I, F, P, I]
        api[prec + "gemm"] = fn
    for key, names, restype, argtypes in (
            ("set_threads", ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads"), None, [ctypes.c_int]),
            ("corename", ("scipy_openblas_get_corename64_", "openblas_get_corename"), ctypes.c_char_p, []),
            ("config", ("scipy_openblas_get_config64_", "openblas_get_config"), ctypes.c_char_p, [])):
        fn = _symbol(lib, *names)
        if fn is not None:
            fn.restype, fn.argtypes = restype, argtypes
            api[key] = fn
    _api = api
    return api


def _single_threaded() -> None:
    fn = _load().get("set_threads")
    if fn is not None:
        fn(1)


def describe() -> dict:
    """What runs the products: the library, its version line and core type; ``installed``: routed or not."""
    try:
        api = _load()
    except (PortableBlasError, OSError) as e:
        return {"installed": _installed, "error": str(e)}
    core = api["corename"]().decode(errors="replace") if "corename" in api else ""
    config = api["config"]().decode(errors="replace") if "config" in api else ""
    return {"installed": _installed, "library": os.path.basename(api["path"]), "config": config, "core": core}


# ---------------------------------------------------------------------------------------------------------------
# the products


def _order(r, c, s0, s1):
    """How BLAS reads an r x c matrix with strides (s0, s1) as the column-major x^T: (trans, ld), or None
    when neither layout fits (a copy is needed). Row-major is x^T column-major (``N``); column-major is
    read transposed (``T``). A dimension of size 1 has no meaningful stride."""
    if r <= 1:
        s0 = max(c, 1)
    if c <= 1:
        s1 = 1
    if s1 == 1 and s0 >= max(c, 1):
        return _N, s0
    if (s0 == 1 or r <= 1) and s1 >= max(r, 1):
        return _T, s1
    return None


def _layout(x):
    """(x', trans, ld) for the 2-D ``x``: x itself where BLAS can read it in place, else a contiguous copy."""
    lay = _order(x.shape[0], x.shape[1], *x.stride())
    if lay is None:
        x = x.contiguous()
        lay = (_N, max(x.shape[1], 1))
    return (x,) + lay


def _plain(x):
    return x.resolve_neg().resolve_conj() if (x.is_neg() or x.is_conj()) else x


def _check_mm(a, b, name="mm"):
    if a.dim() != 2 or b.dim() != 2:
        raise RuntimeError(f"{name}: expected 2-D tensors, got {a.dim()}-D and {b.dim()}-D")
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
                           f"{b.shape[0]}x{b.shape[1]})")
    if a.dtype != b.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {a.dtype} != {b.dtype}")


# A large product is cut into blocks of rows (or, when it has few rows, of columns) of a size fixed by its shape
# alone, run on `torch.get_num_threads()` threads, each block one single-threaded OpenBLAS call: OpenBLAS's own
# threading partitions the output by the thread count, and its edge kernels sum in another order than its main
# ones, so its bits would follow the thread count. These bits follow the shape only.
BLOCK = 64  # rows (or columns) per block
PARALLEL_MACS = 1 << 21  # below this many multiply-adds one call on the calling thread is faster
BATCH_MACS = 1 << 20  # a batched product runs in groups of matrices of about this many multiply-adds
_pool = None


def _blocks(m, n, k):
    """The (row range, column range) blocks of an m x n output: a function of the shape only."""
    if m * n * k < PARALLEL_MACS:
        return [((0, m), (0, n))]
    if m >= 2 * BLOCK:
        return [((i, min(i + BLOCK, m)), (0, n)) for i in range(0, m, BLOCK)]
    if n >= 2 * BLOCK:
        return [((0, m), (j, min(j + BLOCK, n))) for j in range(0, n, BLOCK)]
    return [((0, m), (0, n))]


def _run(calls):
    """Run the thunks in order, on up to `torch.get_num_threads()` threads, each thread a contiguous share of
    them (one hand-off per thread, the calling thread taking the first share). What each thunk computes does
    not depend on which thread runs it, so the results do not depend on the count."""
    global _pool
    threads = min(torch.get_num_threads(), len(calls))
    if threads <= 1:
        for c in calls:
            c()
        return
    if _pool is None or _pool._max_workers < threads - 1:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max(threads - 1, 1), thread_name_prefix="portable-blas")
    cut = [len(calls) * i // threads for i in range(threads + 1)]
    shares = [calls[cut[i]:cut[i + 1]] for i in range(threads)]

    def run_share(share):
        for c in share:
            c()

    futures = [_pool.submit(run_share, sh) for sh in shares[1:]]
    run_share(shares[0])
    for f in futures:
        f.result()


def _gemm_into(c, a, b, alpha, beta):
    """c = alpha * a @ b + beta * c for 2-D float32/float64 ``a`` [m, k], ``b`` [k, n] and a row-major ``c``
    [m, n] (unit column stride), as the column-major product c^T = b^T a^T."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.mul_(beta) if beta != 0 else c.zero_()
    fn = _load()["sgemm" if c.dtype == torch.float32 else "dgemm"]
    a, ta, lda = _layout(_plain(a))
    b, tb, ldb = _layout(_plain(b))
    ldc = c.stride(0) if m > 1 else max(n, 1)
    pa, pb, pc, size = a.data_ptr(), b.data_ptr(), c.data_ptr(), c.element_size()
    # element (i, p) of a sits at i * (1 if T else lda) + p * (lda if T else 1); of b, (p, j) likewise
    ra = 1 if ta == _T else lda
    cb = ldb if tb == _T else 1

    def call(rows, cols):
        (i0, i1), (j0, j1) = rows, cols
        fn(_COL, tb, ta, j1 - j0, i1 - i0, k, alpha, pb + j0 * cb * size, ldb, pa + i0 * ra * size, lda, beta,
           pc + (i0 * ldc + j0) * size, ldc)

    _run([(lambda r=r, q=q: call(r, q)) for r, q in _blocks(m, n, k)])
    return c


def _batch_layout(x):
    """The 3-D ``x`` itself where BLAS can read each of its matrices in place, else a contiguous copy."""
    return x if _order(x.shape[1], x.shape[2], x.stride(1), x.stride(2)) is not None else x.contiguous()


def _bgemm_into(c, a, b):
    """c[i] = a[i] @ b[i] for 3-D float32/float64 operands and a contiguous ``c``: numpy's matmul, which calls
    the same OpenBLAS once per matrix from C (gemm; gemv where a side is a vector; syrk for x @ x^T), after
    any matrix BLAS cannot read in place is copied."""
    import numpy as np

    if c.numel() == 0:
        return c
    if a.shape[2] == 0:
        return c.zero_()
    a, b = _batch_layout(_plain(a)), _batch_layout(_plain(b))
    an, bn, cn = a.detach().numpy(), b.detach().numpy(), c.numpy()
    B, m, k = a.shape
    n = b.shape[2]
    step = B if B * m * n * k < PARALLEL_MACS else max(1, BATCH_MACS // max(m * n * k, 1))
    _run([(lambda i=i: np.matmul(an[i:i + step], bn[i:i + step], out=cn[i:i + step])) for i in range(0, B, step)])
    return c


_BLAS = (torch.float32, torch.float64)
_HALF = (torch.float16, torch.bfloat16)


def _scalar(v, dtype):
    return float(v) if dtype.is_floating_point else v


def _product(a, b):
    """a @ b for 2-D or 3-D operands of any dtype, in a fresh contiguous tensor."""
    dt = a.dtype
    batched = a.dim() == 3
    if dt in _BLAS:
        shape = (a.shape[0], a.shape[1], b.shape[-1]) if batched else (a.shape[0], b.shape[1])
        c = torch.empty(shape, dtype=dt)
        return _bgemm_into(c, a, b) if batched else _gemm_into(c, a, b, 1.0, 0.0)
    if dt in _HALF:  # accumulate in float32, round once, as BLAS libraries do for half types
        return _product(a.float(), b.float()).to(dt)
    # integers, complex: exact (or IEEE) elementwise products and one sum over k
    out = (a.unsqueeze(-1) * b.unsqueeze(-3)).sum(-2)
    return out.to(dt) if out.dtype != dt else out


def _combine(self_, prod, alpha, beta):
    """beta * self + alpha * prod in torch's addmm semantics (self ignored when beta == 0)."""
    dt = prod.dtype
    if alpha != 1:
        prod = prod.mul_(_scalar(alpha, dt)) if dt != torch.bool else prod
    if beta == 0:
        return prod
    s = self_.expand(prod.shape)
    return prod.add_(s if beta == 1 else s * _scalar(beta, dt))


def _addmm_core(self_, a, b, beta, alpha):
    """beta * self + alpha * (a @ b) with self broadcast to the product's shape."""
    dt = a.dtype
    if dt in _BLAS and self_.dtype == dt and a.dim() == 2:  # BLAS adds beta * self itself
        c = torch.empty((a.shape[0], b.shape[1]), dtype=dt)
        if beta != 0:
            c.copy_(self_.expand(c.shape))
        return _gemm_into(c, a, b, float(alpha), float(beta))
    return _combine(self_, _product(a, b), alpha, beta)


def _to_out(out, value):
    if out.shape != value.shape:
        out.resize_(value.shape)
    out.copy_(value)
    return out


# aten operators, in their schemas' argument order ---------------------------------------------------------------

def _out_form(fn):
    """The ``out=`` overload of the functional ``fn``."""
    def out_form(*args, out, **kw):
        return _to_out(out, fn(*args, **kw))
    return out_form


def _inplace_form(fn):
    """The in-place overload (``addmm_`` ...) of the functional ``fn``: the result written into ``self``."""
    def inplace_form(self_, *args, **kw):
        return self_.copy_(fn(self_, *args, **kw))
    return inplace_form


def mm(a, b):
    _check_mm(a, b)
    return _product(a, b)


def addmm(self_, a, b, *, beta=1, alpha=1):
    _check_mm(a, b, "addmm")
    return _addmm_core(self_, a, b, beta, alpha)


def addmm_activation(self_, a, b, *, beta=1, alpha=1, use_gelu=False):
    y = addmm(self_, a, b, beta=beta, alpha=alpha)
    return torch.nn.functional.gelu(y, approximate="tanh") if use_gelu else torch.relu(y)


def _check_bmm(a, b, name="bmm"):
    if a.dim() != 3 or b.dim() != 3:
        raise RuntimeError(f"{name}: batch1 must be a 3D tensor (got {a.dim()}-D and {b.dim()}-D)")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{a.shape[0]}, {a.shape[2]}] but got: [{b.shape[0]}, {b.shape[1]}].")
    if a.dtype != b.dtype:
        raise RuntimeError(f"expected scalar type {a.dtype} but found {b.dtype}")


def bmm(a, b):
    _check_bmm(a, b)
    return _product(a, b)


def baddbmm(self_, a, b, *, beta=1, alpha=1):
    _check_bmm(a, b, "baddbmm")
    return _addmm_core(self_, a, b, beta, alpha)


def addbmm(self_, a, b, *, beta=1, alpha=1):
    _check_bmm(a, b, "addbmm")
    # the sum over the batch folded into k: one [m, B*k] @ [B*k, n] product
    B, m, k = a.shape
    a2 = a.permute(1, 0, 2).reshape(m, B * k)
    b2 = b.reshape(B * k, b.shape[2])
    return _addmm_core(self_, a2, b2, beta, alpha)


def mv(a, x):
    if a.dim() != 2 or x.dim() != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got {a.dim()}, {x.dim()}")
    _check_mm(a, x.unsqueeze(1), "mv")
    return _product(a, x.unsqueeze(1)).squeeze(1)


def addmv(self_, a, x, *, beta=1, alpha=1):
    if a.dim() != 2 or x.dim() != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got {self_.dim()}, {a.dim()}, {x.dim()}")
    _check_mm(a, x.unsqueeze(1), "addmv")
    return _addmm_core(self_.unsqueeze(-1) if self_.dim() == 1 else self_, a, x.unsqueeze(1), beta, alpha).squeeze(1)


def dot(x, y):
    if x.dim() != 1 or y.dim() != 1:
        raise RuntimeError(f"1D tensors expected, but got {x.dim()}D and {y.dim()}D tensors")
    if x.shape[0] != y.shape[0]:
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{x.shape[0]}] and src [{y.shape[0]}] to have "
                           f"the same number of elements, but got {x.shape[0]} and {y.shape[0]} elements respectively")
    if x.dtype != y.dtype:
        raise RuntimeError(f"dot : expected both vectors to have same dtype, but found {x.dtype} and {y.dtype}")
    return _product(x.unsqueeze(0), y.unsqueeze(1)).reshape(())


def vdot(x, y):
    return dot(x.conj() if x.is_complex() else x, y)


# operator (overload) -> implementation
_FUNCTIONAL = {"mm": mm, "addmm": addmm, "_addmm_activation": addmm_activation, "bmm": bmm, "baddbmm": baddbmm,
               "addbmm": addbmm, "mv": mv, "addmv": addmv, "dot": dot, "vdot": vdot}
_INPLACE = ("addmm", "baddbmm", "addbmm", "addmv")
ROUTES = {**_FUNCTIONAL, **{f"{op}.out": _out_form(fn) for op, fn in _FUNCTIONAL.items()},
          **{f"{op}_": _inplace_form(_FUNCTIONAL[op]) for op in _INPLACE}}
"""aten operator (overload) -> implementation: each functional form, its ``out=`` form, and the in-place forms."""


def install() -> dict:
    """Route this process's CPU matrix products through OpenBLAS's Haswell kernels and attention through
    torch's math path (idempotent; lasts for the process). Raises `PortableBlasError` when numpy's OpenBLAS
    cannot be loaded. Returns `describe`."""
    global _installed
    if _installed:
        return describe()
    _load()
    _single_threaded()  # every call on one thread: `_blocks` is the parallelism
    import warnings

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore")
        for op, fn in ROUTES.items():
            lib.impl(op, fn, "CPU")
    _libs.append(lib)
    # SDPA's fused CPU kernel calls MKL's sgemm below the dispatcher: torch's math path instead. The switch is
    # global (CUDA's flash kernel too); portable numerics cover CPU runs only, and a CUDA run in this process
    # keeps its other fused kernels.
    torch.backends.cuda.enable_flash_sdp(False)
    _installed = True
    return describe()
