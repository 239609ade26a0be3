"""The command line answers before it loads the heavy libraries: `--help` of every command,
`harness config` and the argument errors of `ui`, `report`, `sync` import no torch, transformers,
pandas or MLflow (bench/cli_startup.py measures the seconds); `harness ui` refuses a bad or busy
port and a folder without a store in one line, before starting a server."""
import json
import socket
import subprocess
import sys

import pytest

from support_paths import REPO

HEAVY = ("torch", "transformers", "pandas", "matplotlib", "mlflow", "wandb", "scipy")
COMMANDS = [["--help"], ["train", "--help"], ["quickstart", "--help"], ["warmup", "--help"], ["config"],
            ["config", "--show", "harness/configs/quickstart.yaml"], ["eval", "--help"], ["sweep", "--help"],
            ["report", "--help"], ["sync", "--help"], ["ui", "--help"], ["report", "/no/such/folder"],
            ["sync", "/no/such/folder", "--to", "mlflow"], ["ui", "/no/such/folder"]]

PROBE = """
import contextlib, io, json, sys
from harness.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
        rc = main(sys.argv[1:])
    except SystemExit as e:
        rc = e.code
print(json.dumps({"rc": rc, "loaded": [m for m in %r if m in sys.modules], "out": out.getvalue()}))
""" % (HEAVY,)


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_command_answers_without_heavy_libraries(argv):
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO, capture_output=True, text=True, timeout=60)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["loaded"] == [], f"harness {' '.join(argv)} imported {res['loaded']}"
    assert res["rc"] in (0, 2), res
    if argv[-1] == "/no/such/folder" or (len(argv) > 1 and argv[1] == "/no/such/folder"):
        assert res["rc"] == 2 and "no such directory" in res["out"] and "Traceback" not in res["out"]


def _ui(args, tmp_path):
    return subprocess.run([sys.executable, "-m", "harness.cli.main", "ui", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_ui_refuses_a_port_out_of_range_and_a_busy_port_in_one_line(tmp_path):
    (tmp_path / "mlflow.db").touch()
    out = _ui([str(tmp_path), "--port", "70000"], tmp_path)
    assert out.returncode == 2 and out.stderr.strip() == "harness ui: --port 70000 is invalid: a port is 1-65535"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = _ui([str(tmp_path), "--port", str(port)], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == f"harness ui: port {port} on 127.0.0.1 cannot be used (in use): pick another with --port"


def test_ui_without_a_store_says_so_and_creates_no_database(tmp_path):
    out = _ui([str(tmp_path)], tmp_path)
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("harness ui: nothing to show yet: no MLflow store at ")
    assert "harness sync" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "mlflow.db").exists() and not list(tmp_path.iterdir())
