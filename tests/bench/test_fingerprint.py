"""The product's numerics fingerprint (bench/fingerprint.py) against the committed one (bench/fingerprint.json).

Every entry is a hash of bits the harness computes in portable numerics: its kernels in its own call pattern and
short real GRPO / PPO / RFT runs. The committed values were made on one machine (its CPU is named in the file);
equal values here mean this machine computes the same bits. A difference names the kernel or run stage that is
not portable to this CPU kind: that is a defect of portable numerics, not of this test.

The control shows the comparison has power: native numerics (each library's own path: MKL's sgemm, SDPA's fused
kernel) give other values for every kernel entry.
"""
import json
import subprocess
import sys
from pathlib import Path

from harness.foundation import numerics

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "bench" / "fingerprint.json"


def _fingerprint(mode: str, *args: str) -> subprocess.CompletedProcess:
    env = numerics.env_for(mode)
    return subprocess.run([sys.executable, str(ROOT / "bench" / "fingerprint.py"), "--check", str(COMMITTED), *args],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)


def test_the_committed_fingerprint_names_its_machine_and_covers_every_stage():
    fp = json.loads(COMMITTED.read_text())
    assert fp["_machine"]["portable"] is True and fp["_machine"]["numerics"] == "portable"
    assert fp["_machine"]["matmul"].startswith("OpenBLAS Haswell")
    keys = [k for k in fp if not k.startswith("_")]
    for part in ("kernel/t1/", "kernel/t2/", "run/grpo t1", "run/ppo t1", "run/rft t1", "run/grpo t2", "stats/"):
        assert any(k.startswith(part) for k in keys), part
    assert len(keys) == 33


def test_this_machine_computes_the_committed_bits():
    p = _fingerprint("portable")
    assert "33 entries equal, 0 differ" in p.stdout and p.returncode == 0, p.stdout + p.stderr[-3000:]


def test_control_native_numerics_change_every_kernel_entry():
    p = _fingerprint("native", "--only", "kernel")
    assert p.returncode == 1, p.stdout + p.stderr[-3000:]
    assert "0 entries equal, 10 differ" in p.stdout, p.stdout
