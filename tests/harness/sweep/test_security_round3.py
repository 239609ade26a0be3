"""Sweep security, round 3 (issue 25): ``launcher.env`` is an allow-list of named, known-safe
variables (a prefix let library-loading ones through), and a worker's payload travels in a
0600 file in its run directory, the command line carrying only the path (a large config no
longer fails every run with "Argument list too long", and ``ps`` shows no config)."""
from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.foundation import numerics
from harness.rundir.layout import read_json
from harness.sweep import launchers
from harness.sweep.launchers import WORKER_PAYLOAD, read_payload
from harness.sweep.plan import load_sweep
from harness.sweep.spec import ENV_ALLOWED, ENV_LOADS_CODE, SweepError, launcher_section
from sweep_testing import run_inproc, sweep_file

# each makes a runtime load a library (or Python / the loader load code) from where it points
LOADERS = ["CUDA_INJECTION64_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN",
           "OMP_TOOL_LIBRARIES", "OMP_TOOL", "NCCL_CONF_FILE", "LD_PRELOAD", "PYTHONPATH", "HF_HOME"]
# not loaders, but not known-safe either: files read or written, or a mere suffix/prefix match
UNKNOWN = ["NCCL_TOPO_FILE", "NCCL_DEBUG_FILE", "CUDA_CACHE_PATH", "MY_THREADS", "CUDA_SOMETHING_NEW",
           "omp_num_threads"]


def _refused_in_one_line(capsys, tmp_path: Path, env_yaml: str, must: str) -> str:
    path = sweep_file(tmp_path, f"name: s\ngrid: {{seed: [0]}}\nbudget: {{unit: steps, amount: 2}}\n"
                                f"launcher: {{env: {env_yaml}}}\n")
    rc = main(["sweep", str(path), "--output-dir", str(tmp_path / "out"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert must in err, (must, err)
    assert not (tmp_path / "out").exists()
    return err


@pytest.mark.parametrize("name", LOADERS + UNKNOWN)
def test_env_refuses_every_variable_off_the_allow_list(name, tmp_path, capsys):
    err = _refused_in_one_line(capsys, tmp_path, f"{{{name}: /tmp/x.so}}", f"launcher.env.{name}")
    if name in LOADERS:
        assert "load" in err
    assert "export" in err  # what to do if the user trusts it


def test_env_accepts_the_known_safe_variables(tmp_path, capsys):
    ls = launcher_section({"env": {k: "1" for k in ENV_ALLOWED}}, "s.yaml", tmp_path)
    assert set(ls.env) == ENV_ALLOWED
    path = sweep_file(tmp_path, "name: s\ngrid: {seed: [0]}\nbudget: {unit: steps, amount: 2}\n"
                                "launcher: {env: {OMP_NUM_THREADS: 1, CUDA_VISIBLE_DEVICES: '0', NCCL_DEBUG: INFO, "
                                "NCCL_SOCKET_IFNAME: eth0, PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments:True', "
                                "TOKENIZERS_PARALLELISM: false}}\n")
    assert main(["sweep", str(path), "--output-dir", str(tmp_path / "out"), "--dry-run"]) == 0, capsys.readouterr()


def test_allow_list_holds_nothing_that_loads_or_points_at_files():
    assert not ENV_ALLOWED & ENV_LOADS_CODE
    for name in ENV_ALLOWED:
        for word in ("PLUGIN", "INJECTION", "TOOL", "PRELOAD", "LIBRARY", "_FILE", "_PATH", "_HOME", "_DIR"):
            assert word not in name, name


@pytest.mark.parametrize("value,shown", [("[1, 2]", "OMP_NUM_THREADS"), ("{a: 1}", "OMP_NUM_THREADS"),
                                         ("null", "OMP_NUM_THREADS"), ('"1\\0"', "OMP_NUM_THREADS")],
                         ids=["list", "mapping", "null", "nul"])
def test_env_values_must_be_plain(value, shown, tmp_path, capsys):
    _refused_in_one_line(capsys, tmp_path, f"{{OMP_NUM_THREADS: {value}}}", f"launcher.env.{shown}")


def test_env_refusal_is_a_sweep_error(tmp_path):
    with pytest.raises(SweepError, match=r"launcher\.env\.NCCL_NET_PLUGIN is refused"):
        launcher_section({"env": {"NCCL_NET_PLUGIN": "libevil.so"}}, "s.yaml", tmp_path)


# --------------------------------------------------------------------------- the worker payload


def test_large_config_runs_and_the_payload_is_a_private_file(tmp_path, monkeypatch):
    big = "x" * 300_000  # one argument is at most 128 KiB on Linux: this failed every run
    path = sweep_file(tmp_path, f"  tracking.wandb_project: {big}\n"  # one more key of sweep_file's config
                                f"name: big\ngrid: {{seed: [0, 1]}}\n"
                                f"budget: {{unit: steps, amount: 2, eval_points: 1}}\n")
    seen = []
    real = subprocess.Popen

    class Spy(real):
        def __init__(self, cmd, *a, **k):
            if "harness.sweep.launchers" in cmd:
                f = Path(cmd[-1])
                seen.append((list(cmd), stat.S_IMODE(f.stat().st_mode), json.loads(f.read_text())))
            super().__init__(cmd, *a, **k)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    rc, text = run_inproc(path, tmp_path / "out")
    assert rc == 0, text
    sw = load_sweep(path, output_dir=str(tmp_path / "out"))
    assert len(seen) == 2
    for run, (cmd, mode, payload) in zip(sw.runs, seen):
        assert cmd[-2:] == ["worker", str(run.run_dir / WORKER_PAYLOAD)]
        assert sum(map(len, cmd)) < 2000 and not any("wandb_project" in a or "xxxx" in a for a in cmd)
        assert mode == 0o600
        assert payload["config"]["tracking"]["wandb_project"] == big
        # the numerics pins still travel with the run
        assert payload["numerics"] == "portable"
        assert {k: payload["env"][k] for k in numerics.PINS} == numerics.PINS
        assert read_json(run.run_dir / "summary.json")["status"] == "finished"
        assert not (run.run_dir / WORKER_PAYLOAD).exists()  # removed when the worker ended
        assert not list(run.run_dir.glob(WORKER_PAYLOAD + "*"))


def test_torchrun_ranks_get_the_payload_file(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    payload = {"run_id": "r", "run_dir": str(run_dir), "config": {"note": "y" * 200_000}, "train": "m:f",
               "threads": 1, "procs": 2, "cwd": str(tmp_path), "sys_path": [], "env": {"MKL_CBWR": "COMPATIBLE,STRICT"},
               "numerics": "portable"}
    seen = []

    def fake_call(cmd, env=None):
        f = Path(cmd[-1])
        seen.append((list(cmd), stat.S_IMODE(f.stat().st_mode), read_payload(f)))
        return 0

    monkeypatch.setattr(launchers.subprocess, "call", fake_call)
    assert launchers._torchrun(payload) == 0
    (cmd, mode, got), = seen
    assert "torch.distributed.run" in cmd and cmd[-2:] == ["worker", str(run_dir / WORKER_PAYLOAD)]
    assert sum(map(len, cmd)) < 2000 and mode == 0o600 and got == payload
    assert not (run_dir / WORKER_PAYLOAD).exists()


def test_worker_refuses_a_missing_or_bad_payload_file(tmp_path, capsys):
    assert launchers.main(["worker", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text("[1]")
    assert launchers.main(["worker", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "missing.json" in err[0] and "bad.json" in err[1]
