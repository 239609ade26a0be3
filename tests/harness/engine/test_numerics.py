"""Numerics mode and provenance: environments for children, thread counts, refusal when the
pins cannot take effect, and provenance without machine paths."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.foundation import numerics
from harness.rundir import provenance


def test_portable_child_environment_overrides_inherited_dispatch():
    base = {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "PATH": "/bin"}
    env = numerics.env_for("portable", 3, base=base)
    assert env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["MKL_CBWR"] == "COMPATIBLE,STRICT"  # the one MKL branch honoured on Intel and AMD alike
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert env[numerics.ENV_MODE] == "portable"
    assert json.loads(env[numerics.ENV_INHERITED]) == {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX2",
                                                       "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    # a native grandchild of a portable child gets the user's values back, not the pins
    native = numerics.env_for("native", None, base=env)
    assert native["ATEN_CPU_CAPABILITY"] == "avx512" and native["MKL_CBWR"] == "AVX2"
    assert "DNNL_MAX_CPU_ISA" not in native and "MKL_DYNAMIC" not in native
    assert native[numerics.ENV_MODE] == "native"


def test_thread_count_is_a_fixed_number_in_portable_mode(monkeypatch):
    from harness.admission.gate import decide_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    assert decide_threads(0, "portable") == numerics.DEFAULT_THREADS == 2
    assert decide_threads(0, "native") == 0  # torch's default
    assert decide_threads(3, "native") == 3 and decide_threads(3, "portable") == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a launcher's cpus per run
    assert decide_threads(0, "portable") == 1


def test_unknown_mode_is_a_config_error():
    from harness.foundation.base import ConfigError
    from harness.config.schema import load_config

    with pytest.raises(ConfigError, match="numerics"):
        load_config(None, ["numerics=fast"])


def _python(code: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items()
         if k not in numerics.PINS and k not in (numerics.ENV_MODE, numerics.ENV_INHERITED)}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)


def test_portable_refused_when_torch_already_ran_other_kernels():
    """A library user who ran a kernel before the pins: the run is refused before any work,
    naming the problem, instead of being recorded as portable."""
    p = _python("import torch; torch.ones(4).exp()\n"
                "from harness.foundation import numerics\n"
                "try:\n    numerics.enter('portable', 1)\nexcept numerics.NumericsError as e:\n    print('REFUSED', e)\n",
                ATEN_CPU_CAPABILITY="default")
    assert p.returncode == 0, p.stderr
    assert "REFUSED" in p.stdout and "ATen kernels at DEFAULT" in p.stdout


def test_pins_take_effect_after_import_before_the_first_kernel():
    p = _python("import torch\nfrom harness.foundation import numerics\n"
                "st = numerics.enter('portable', 1)\n"
                "print(st['aten_capability'], st['mkl_cbwr'], st['pinned'], torch.get_num_threads())",
                ATEN_CPU_CAPABILITY="default", MKL_CBWR="AUTO")
    assert p.returncode == 0, p.stderr
    aten, mkl, pinned, threads = p.stdout.split()
    assert (aten, pinned, threads) == ("AVX2", "True", "1")
    assert mkl in ("COMPATIBLE,STRICT", "None")  # None: a torch without MKL


def test_provenance_paths_are_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "results"
    assert provenance.portable_path(str(root / "qs" / "grpo-s0-1"), root) == "<results>/qs/grpo-s0-1"
    assert provenance.portable_path(str(tmp_path / "sweeps" / "a.yaml"), root) == "./sweeps/a.yaml"
    assert provenance.portable_path("/opt/secret/home/x.yaml", root) == "<abs>/x.yaml"
    assert provenance.portable_path("relative/x", root) == "relative/x"
    cmd = provenance.command_line(["/usr/bin/harness", "sweep", str(tmp_path / "s.yaml"), "--output-dir",
                                   str(root), "--set", f"warmup.cache_dir={tmp_path}/cache"], root)
    assert cmd == "harness sweep ./s.yaml --output-dir <results> --set warmup.cache_dir=./cache"
    assert str(tmp_path) not in cmd


def test_provenance_records_numerics_cpu_versions_and_tags():
    prov = provenance.collect("portable", numerics_state={"mode": "portable", "portable": True,
                                                          "aten_capability": "AVX2", "mkl_cbwr": "COMPATIBLE,STRICT",
                                                          "matmul": "OpenBLAS Haswell (libopenblas.so)", "threads": 2})
    assert prov["cpu"]["arch"] and prov["cpu"]["model"]
    assert prov["versions"]["torch"] and prov["versions"]["python"].count(".") == 2
    tags = provenance.tags(prov)
    assert tags["provenance.numerics"] == "portable" and tags["provenance.portable"] == "True"
    assert tags["provenance.version.torch"] == prov["versions"]["torch"]
    lines = provenance.describe(prov)
    assert any(provenance.PORTABLE_CLAIM in line and "matmul OpenBLAS Haswell" in line for line in lines)
    # a record of the MKL era (no matmul entry) claims identity on its own CPU kind only
    old = dict(prov, numerics={k: v for k, v in prov["numerics"].items() if k != "matmul"})
    lines = provenance.describe(old)
    assert any(provenance.MKL_ERA_CLAIM in line and "MKL CNR COMPATIBLE,STRICT" in line for line in lines)
    assert not any(provenance.PORTABLE_CLAIM in line for line in lines)


def test_portable_children_pin_numpy_and_openblas_too():
    base = {"NPY_DISABLE_CPU_FEATURES": "", "OPENBLAS_CORETYPE": "SkylakeX", "PATH": "/bin"}
    env = numerics.env_for("portable", None, base=base)
    assert env["NPY_DISABLE_CPU_FEATURES"] == "X86_V4 AVX512_ICL AVX512_SPR"
    if numerics._has_avx2_fma():
        assert env["OPENBLAS_CORETYPE"] == "Haswell"
    else:  # never force OpenBLAS onto AVX2 code on a CPU without it
        assert "OPENBLAS_CORETYPE" not in env
    native = numerics.env_for("native", None, base=env)
    assert native["OPENBLAS_CORETYPE"] == "SkylakeX" and native["NPY_DISABLE_CPU_FEATURES"] == ""


_NUMPY_STATE = ("from harness.foundation import numerics\n"
                "st = numerics.enter('portable', 1)\n"
                "print(json.dumps({k: st[k] for k in ('numpy_simd', 'openblas', 'portable', 'why')}))\n")


def _x86_avx2() -> bool:
    return numerics.cpu_info()["arch"] in ("x86_64", "AMD64") and numerics._has_avx2_fma()


@pytest.mark.skipif(not _x86_avx2(), reason="portable numerics cover x86-64 CPUs with AVX2 and FMA")
def test_numpy_runs_its_avx2_kernels_under_the_pins_whatever_the_cpu_has():
    """numpy's float64 exp/log dispatch on the ISA group (X86_V4 on AVX-512 CPUs) and its OpenBLAS picks kernels
    by CPU model: under the pins both are the AVX2 ones on every x86-64 CPU with AVX2."""
    p = _python("import json\nfrom harness.foundation import numerics\nnumerics.pin_process('portable')\n"
                "import numpy\n" + _NUMPY_STATE)
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)
    assert st["numpy_simd"] == ["X86_V3"] and st["portable"] is True, st
    assert st["openblas"] and set(st["openblas"].values()) == {"Haswell"}, st


@pytest.mark.skipif(not _x86_avx2(), reason="portable numerics cover x86-64 CPUs with AVX2 and FMA")
def test_numpy_imported_before_the_pins_is_recorded_as_not_portable():
    import numpy as np

    p = _python("import json, numpy\nfrom harness.foundation import numerics\nnumerics.pin_process('portable')\n"
                + _NUMPY_STATE)
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)
    if set(st["numpy_simd"]) - {"X86_V3"}:  # an AVX-512 CPU: numpy chose its X86_V4 kernels at import
        assert st["portable"] is False
        assert "numpy was imported before the pins" in st["why"]
    else:  # an AVX2 CPU: the kernels numpy chose are the pinned ones anyway
        assert st["numpy_simd"] == ["X86_V3"] and st["portable"] is True
    # and this test process itself (tests/conftest.py pins before anything imports numpy) is portable
    here = numerics.state("portable")
    assert here["numpy_simd"] == ["X86_V3"] and here["portable"] is True, here
    assert np.exp(np.float64(1.0)) == np.float64(2.718281828459045)
