"""`harness rm train`: its help answers without torch, bad arguments are one line (exit 2) before any work, and
a tiny training prints the held-out accuracy and AUC it wrote."""
import json
import subprocess
import sys

import pytest

from harness.cli.main import main
from support_paths import REPO

QS = str(REPO / "harness" / "configs" / "quickstart.yaml")
HEAVY = ("torch", "transformers", "pandas", "matplotlib")
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
TINY = ["--set", "model.hidden_size=16", "--set", "model.num_layers=1", "--set", "model.num_heads=2",
        "--set", "model.intermediate_size=32", "--set", "warmup.steps=0", "--set", "task.max_ops=2",
        "--set", "sampling.samples_per_prompt=2", "--set", "sampling.max_new_tokens=8", "--set", "train.threads=1"]


@pytest.mark.parametrize("argv", [["rm", "--help"], ["rm", "train", "--help"], ["rm", "train", QS],
                                  ["rm", "train", QS, "--type", "prm", "--set", "task.name=gsm8k"]])
def test_help_and_refusals_load_no_heavy_library(argv):
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO, capture_output=True, text=True, timeout=60)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["loaded"] == [], res
    assert res["rc"] in (0, 2)


@pytest.mark.parametrize("extra,match", [
    ([], "--type None is invalid"),
    (["--type", "prm", "--set", "task.name=gsm8k"], "no exact step checker; use --step-labels mc"),
    (["--type", "orm", "--heldout-frac", "1.5"], "--heldout-frac 1.5 is invalid"),
    (["--type", "orm", "--samples", "0"], "--samples=0 is invalid"),
    (["--type", "orm", "--policy", "/no/such/model"], "--policy '/no/such/model' is invalid"),
    (["--type", "orm", "--init", "/no/such/rm"], "--init '/no/such/rm' is invalid: no reward_model.json there"),
    (["--type", "implicit"], "invalid choice"),
])
def test_bad_arguments_are_one_line(extra, match, capsys, tmp_path):
    with pytest.raises(SystemExit) if "invalid choice" in match else _nothing():
        rc = main(["rm", "train", QS, "--output-dir", str(tmp_path / "r"), *extra])
        assert rc == 2
    err = capsys.readouterr().err
    assert match in err.strip().splitlines()[-1]  # argparse's own refusals print the usage above it
    assert "invalid choice" in match or err.strip().count("\n") == 0
    assert not (tmp_path / "r" / "reward_models").exists()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_a_tiny_training_prints_and_writes_its_quality(tmp_path, capsys):
    out = tmp_path / "orm"
    rc = main(["rm", "train", QS, "--type", "orm", "--samples", "16", "--out", str(out), "--no-progress",
               "--set", f"warmup.cache_dir={tmp_path / 'wc'}", *TINY])
    assert rc == 0
    text = capsys.readouterr().out
    assert f"reward model (orm) written to {out}" in text and "held-out outcome" in text
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["kind"] == "orm" and metrics["cost"]["samples"] == 16
    assert sum(metrics["examples"].values()) == 16
