"""`harness sweep` ends a sweep whose runs all finished by writing its report (as `harness report`
would, into <sweep_dir>/report) and printing where; the sweep file's report.columns are in the
written report, and `harness report` on the same directory applies them too (from sweep.json)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import support_paths
from harness.report.build import build_report

FAKE = "sweep_fake_trainer:train"


def test_sweep_writes_its_report_with_report_columns(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("""name: rep
config:
  train.prompts_per_step: 2
  sampling.samples_per_prompt: 4
grid:
  algorithm: [grpo, rft]
  seed: [0, 1]
budget: {unit: samples, amount: 24, eval_points: 1}
launcher: {workers: 2}
report:
  columns: [final_eval.eval/arith/acc, budget.consumed.steps]
  baseline: rft
""")
    out = tmp_path / "out"
    env = dict(os.environ, HARNESS_TRAIN_FN=FAKE,
               PYTHONPATH=os.pathsep.join([str(support_paths.REPO), str(support_paths.SUPPORT)]))
    p = subprocess.run([sys.executable, "-m", "harness.cli.main", "sweep", str(path), "--output-dir", str(out),
                        "--no-progress"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    report = out / "rep" / "report"
    assert f"report: {report / 'report.html'}" in p.stdout
    assert {f.name for f in report.iterdir()} >= {"report.html", "report.md", "table.csv", "runs.csv", "plots"}
    assert json.loads((out / "rep" / "sweep.json").read_text())["report_columns"] == [
        "final_eval.eval/arith/acc", "budget.consumed.steps"]
    assert json.loads((out / "rep" / "sweep.json").read_text())["report"]["baseline"] == "rft"
    md = (report / "report.md").read_text()
    assert "## Paired differences vs rft " in md and "| grpo − rft |" in md
    section = md.split("## Columns of the sweep file (report.columns)")[1].split("## Runs")[0]
    assert "| run id | status | final_eval.eval/arith/acc | budget.consumed.steps |" in section
    assert section.count("| finished |") == 4 and "| 0.23 | 3 |" in section   # 24 samples = 3 steps of 8
    assert "id='columns-table'" in (report / "report.html").read_text()
    # `harness report` on the sweep directory reads the same columns from sweep.json
    res = build_report(out / "rep", tmp_path / "again")
    assert "## Columns of the sweep file (report.columns)" in res["markdown"].read_text()


def test_sweep_report_is_logged_to_mlflow_parent_run_and_a_wandb_report_run(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("""name: logged
config:
  train.prompts_per_step: 2
  sampling.samples_per_prompt: 4
  tracking: {mlflow: true, wandb: true, wandb_mode: offline}
grid:
  algorithm: [grpo, rft]
  seed: [0]
budget: {unit: samples, amount: 16, eval_points: 1}
launcher: {workers: 1}
""")
    out = tmp_path / "out"
    env = dict(os.environ, HARNESS_TRAIN_FN=FAKE, WANDB_SILENT="true",
               PYTHONPATH=os.pathsep.join([str(support_paths.REPO), str(support_paths.SUPPORT)]))
    p = subprocess.run([sys.executable, "-m", "harness.cli.main", "sweep", str(path), "--output-dir", str(out),
                        "--no-progress"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "report logged to mlflow and wandb" in p.stdout
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("logged")
    parents = client.search_runs([exp.experiment_id], "tags.`harness.sweep_parent` = 'logged'")
    assert len(parents) == 1
    names = {a.path for a in client.list_artifacts(parents[0].info.run_id, "report")}
    assert {"report/report.html", "report/report.md", "report/runs.csv", "report/plots"} <= names
    plots = {a.path for a in client.list_artifacts(parents[0].info.run_id, "report/plots")}
    assert any(n.endswith(".png") for n in plots)
    runs = sorted((out / "logged" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and (next(runs[0].rglob("report.html"))).stat().st_size > 0
