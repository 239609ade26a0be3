"""A run folder that is a dangling symbolic link, or a file: one line (exit 2), not a traceback."""
from harness.cli.main import main as cli_main
from harness.config.schema import load_config
from harness.rundir.ids import run_id
from support_paths import REPO

QS = str(REPO / "harness" / "configs" / "quickstart.yaml")
SETS = ["--set", "budget.amount=256", "--set", "budget.eval_points=1", "--set", "warmup.steps=1"]


def _run_dir(out):
    return out / "quickstart" / run_id(load_config(QS, ["budget.amount=256", "budget.eval_points=1", "warmup.steps=1"]))


def test_dangling_symlink_run_dir_is_one_line(tmp_path, capsys):
    d = _run_dir(tmp_path)
    d.parent.mkdir(parents=True)
    d.symlink_to(tmp_path / "nowhere")
    rc = cli_main(["train", QS, "--output-dir", str(tmp_path), "--no-progress", *SETS])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "is a symbolic link to" in err[0] and "which does not exist" in err[0] and "remove the link" in err[0]
    assert not (tmp_path / "nowhere").exists()


def test_file_where_the_run_dir_goes_is_one_line(tmp_path, capsys):
    d = _run_dir(tmp_path)
    d.parent.mkdir(parents=True)
    d.write_text("not a folder")
    rc = cli_main(["train", QS, "--output-dir", str(tmp_path), "--no-progress", *SETS])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is not a folder" in err[0]
