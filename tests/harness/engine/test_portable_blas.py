"""Portable matrix products (harness/foundation/portable_blas.py): every aten operator that reaches a BLAS on the CPU
runs in OpenBLAS's Haswell kernels, gives the right numbers in every layout and dtype, gives bits that depend on
the shape only (not the thread count, not the operand's memory layout), and a training step calls MKL not once.

tests/conftest.py installs the routes for the whole test process (numerics.enter('portable', 1)).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.foundation import numerics, portable_blas

ROOT = Path(__file__).resolve().parents[3]


def _r(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def test_routes_are_installed_in_the_test_process():
    d = portable_blas.describe()
    assert d["installed"] is True and d["core"] == "Haswell", d
    assert numerics.state("portable")["matmul"].startswith("OpenBLAS Haswell")
    assert not torch.backends.cuda.flash_sdp_enabled()  # attention takes torch's math path (its products land here)


SHAPES = [(7, 5, 3), (1, 5, 3), (7, 1, 3), (7, 5, 1), (1, 1, 1), (130, 70, 200), (300, 128, 384), (64, 2816, 96)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_products_against_float64_and_layouts_give_the_same_bits(m, k, n, dtype):
    a, b, bias = _r(m, k, dtype=dtype, seed=1), _r(k, n, dtype=dtype, seed=2), _r(n, dtype=dtype, seed=3)
    want = a.double() @ b.double()
    tol = 1e-5 * (k ** 0.5) * 4 if dtype == torch.float32 else 1e-12 * (k ** 0.5) * 4
    got = a @ b
    assert got.dtype == dtype and got.shape == (m, n)
    assert torch.allclose(got.double(), want, atol=tol, rtol=0), (got.double() - want).abs().max()
    # the same matrix stored column-major, or as a strided view, reads through BLAS's transposed forms (or a
    # copy): the same bits as the row-major operand
    at, bt = a.t().contiguous().t(), b.t().contiguous().t()
    wide = torch.stack([b, -b], -1)[..., 0]  # b itself as a view with strides (2n, 2): neither layout, a copy
    for x, y in ((at, b), (a, bt), (at, bt), (a, wide)):
        assert torch.equal(x @ y, got)
    assert torch.equal(F.linear(a, b.t()), got)
    ref = 0.5 * bias.double() + 2.0 * want
    assert torch.allclose(torch.addmm(bias, a, b, beta=0.5, alpha=2.0).double(), ref, atol=3 * tol, rtol=0)
    assert torch.allclose(F.linear(a, b.t(), bias).double(), want + bias.double(), atol=2 * tol, rtol=0)
    # beta = 0 ignores self, NaN included (torch's semantics)
    nan = torch.full((m, n), float("nan"), dtype=dtype)
    assert torch.equal(torch.addmm(nan, a, b, beta=0), got)


def test_batched_vector_and_inplace_forms():
    x, y = _r(4, 6, 5, 8, seed=4), _r(4, 6, 8, 3, seed=5)
    assert torch.allclose((x @ y).double(), x.double() @ y.double(), atol=1e-5)
    b0, b1, s = x[0], y[0], _r(6, 5, 3, seed=6)
    assert torch.allclose(torch.baddbmm(s, b0, b1, beta=2, alpha=0.5).double(),
                          2 * s.double() + 0.5 * (b0.double() @ b1.double()), atol=1e-5)
    assert torch.allclose(torch.addbmm(s[0], b0, b1).double(), s[0].double() + (b0.double() @ b1.double()).sum(0),
                          atol=1e-5)
    v = _r(8, seed=7)
    assert torch.allclose((b0[0] @ v).double(), b0[0].double() @ v.double(), atol=1e-5)
    assert torch.allclose(torch.addmv(_r(5, seed=8), b0[0], v).double(),
                          _r(5, seed=8).double() + b0[0].double() @ v.double(), atol=1e-5)
    assert torch.allclose((v @ v).double(), v.double() @ v.double(), atol=1e-5)
    out = torch.empty(0)
    torch.mm(b0[0], b1[0], out=out)
    assert torch.equal(out, b0[0] @ b1[0])
    c = _r(5, 3, seed=9)
    want = c + b0[0] @ b1[0]
    c.addmm_(b0[0], b1[0])
    assert torch.equal(c, want)


def test_other_dtypes_and_autograd():
    a, b = (_r(5, 4, seed=10) * 4).round().long(), (_r(4, 3, seed=11) * 4).round().long()
    assert torch.equal(a @ b, (a.double() @ b.double()).long())
    h = (_r(6, 16, seed=12).bfloat16() @ _r(16, 5, seed=13).bfloat16())
    assert h.dtype == torch.bfloat16
    assert torch.allclose(h.double(), _r(6, 16, seed=12).bfloat16().double() @ _r(16, 5, seed=13).bfloat16().double(),
                          atol=0.1)
    w = _r(6, 4, seed=14).requires_grad_()
    x = _r(4, 3, seed=15).requires_grad_()
    (w @ x).sum().backward()
    assert torch.allclose(w.grad.double(), torch.ones(6, 3, dtype=torch.float64) @ x.detach().double().t(), atol=1e-6)
    assert torch.allclose(x.grad.double(), w.detach().double().t() @ torch.ones(6, 3, dtype=torch.float64), atol=1e-6)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        _r(3, 4) @ _r(5, 2)


@pytest.mark.parametrize("m,k,n", [(2816, 128, 384), (128, 2816, 384), (96, 2816, 200), (300, 128, 70)])
def test_bits_do_not_depend_on_the_thread_count(m, k, n):
    """OpenBLAS's own threading partitions the output by the thread count and its edge kernels sum in another order
    (measured: 1 and 2 threads differ for 2816x128x384); portable_blas cuts by the shape only."""
    a, b = _r(m, k, seed=16), _r(k, n, seed=17)
    x, y = _r(64, 45, 32, seed=18), _r(64, 32, 45, seed=19)
    prev = torch.get_num_threads()
    try:
        res = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            res.append((a @ b, torch.bmm(x, y), a.t() @ (a @ b)))
    finally:
        torch.set_num_threads(prev)
    for r in res[1:]:
        assert all(torch.equal(p, q) for p, q in zip(res[0], r))
    assert len(portable_blas._blocks(m, n, k)) > 1  # these shapes are cut, so the threads really run


_STEP = """
import os, sys
from harness.foundation import numerics
numerics.pin_process(sys.argv[1])
import torch
from harness.config.schema import load_config
from harness.engine.learner import make_batch, token_logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.sampling import sample
numerics.enter(sys.argv[1], 2)
cfg = load_config("harness/configs/quickstart.yaml", ["device=cpu"])
tok = build_char_tokenizer(); model = build_tiny_model(cfg.model, tok, seed=0)
with torch.no_grad():
    r = sample(model, tok, ["1+2*3=", "4*5-6="], n=4, max_new_tokens=12, seed=1)
b = make_batch(r, "cpu")
(token_logprobs(model, b) * b.mask).sum().backward()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3); opt.step()
x = torch.randn(2, 4, 9, 16, requires_grad=True)
torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True).sum().backward()
for f in (torch.mm, torch.bmm, torch.mv, torch.dot, torch.addmm, torch.baddbmm, torch.addmv, torch.addbmm):
    pass
a = torch.randn(8, 8); v = torch.randn(8); t3 = torch.randn(2, 8, 8)
a @ a; a @ v; v @ v; torch.bmm(t3, t3); torch.addmm(a, a, a); torch.baddbmm(t3, t3, t3); torch.addmv(v, a, v)
torch.addbmm(a, t3, t3); torch.vdot(v, v); torch.nn.functional.linear(t3, a, v)
print("ok")
"""


@pytest.mark.parametrize("mode,calls", [("portable", False), ("native", True)])
def test_a_training_step_calls_mkl_only_in_native_numerics(mode, calls):
    """MKL_VERBOSE=1 makes MKL print a line per call: none in portable mode (sampler, fastlm forward and backward,
    AdamW, SDPA, every product operator); the native control shows the probe sees MKL's calls."""
    env = numerics.env_for(mode, base={k: v for k, v in os.environ.items() if k != "MKL_VERBOSE"})
    env["MKL_VERBOSE"] = "1"
    p = subprocess.run([sys.executable, "-c", _STEP, mode], env=env, capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr[-3000:]
    n = sum(1 for line in p.stdout.splitlines() if line.startswith("MKL_VERBOSE") and "(" in line)
    assert (n > 0) == calls, (mode, n, [line for line in p.stdout.splitlines() if "MKL_VERBOSE" in line][:5])


def test_without_numpys_openblas_portable_mode_is_refused_in_one_line(tmp_path):
    """A numpy without its bundled OpenBLAS (a distro build): portable numerics cannot hold, and `harness train` says
    so in one line naming the way out (exit 2), before any work; nothing is left behind but the empty output root."""
    code = ("import sys\nfrom harness.foundation import portable_blas\nportable_blas.openblas_path = lambda: None\n"
            "from harness.cli.main import main\n"
            f"sys.exit(main(['train', 'harness/configs/quickstart.yaml', '--set', 'warmup.steps=1', '--output-dir', {str(tmp_path / 'out')!r}]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env=numerics.env_for("portable"))
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "numpy's wheel ships" in lines[0] and "numerics: native" in lines[0], p.stderr
    assert not list((tmp_path / "out").rglob("metrics.jsonl"))
