"""A sweep's report reaches its trackers after the fact (issue 26): `harness report` calls
``attach_report`` (trackers from the runs' configs), `harness sync` attaches the report of each
sweep folder it syncs. MLflow: artifacts of the sweep's parent run; wandb: one offline
``<sweep>-report`` run, not duplicated when nothing changed, replaced when the report did."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")

from _fake_results import make_run  # noqa: E402
from harness.tracking.report_upload import attach_report  # noqa: E402
from harness.tracking.sync import sync_report  # noqa: E402
from harness.rundir.read import load_run  # noqa: E402


def _png(path: Path) -> None:
    """A real 2x2 PNG (wandb.Image opens it)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * 2 for _ in range(2))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _report(sweep: Path) -> Path:
    report = sweep / "report"
    (report / "plots").mkdir(parents=True)
    (report / "report.html").write_text("<html>GRPO vs PPO</html>")
    (report / "runs.csv").write_text("run_id,acc\ngrpo-s0,0.7\nppo-s0,0.6\n")
    _png(report / "plots" / "accuracy.png")
    return report


def _offline_reports(sweep: Path) -> list[Path]:
    return sorted((sweep / "wandb").glob("offline-run-*-rep-report"))


def test_attach_report_reaches_the_trackers_the_runs_used(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    track = {"tracking": {"mlflow": True, "mlflow_uri": uri, "wandb": True, "wandb_mode": "offline"}}
    for algo, seed, n in (("grpo", 0, 8), ("ppo", 0, 0)):
        make_run(tmp_path / "results", "rep", algo, seed, n, overrides=track)
    sweep = tmp_path / "results" / "rep"
    report = _report(sweep)

    assert attach_report(sweep, report) == ["mlflow", "wandb"]
    from mlflow.tracking import MlflowClient
    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("rep")
    (parent,) = c.search_runs([exp.experiment_id], "tags.`harness.sweep_parent` = 'rep'")
    names = {a.path for d in ("report", "report/plots") for a in c.list_artifacts(parent.info.run_id, d)}
    assert {"report/report.html", "report/runs.csv", "report/plots/accuracy.png"} <= names
    (first,) = _offline_reports(sweep)
    assert (next(first.rglob("report.html"))).read_text() == "<html>GRPO vs PPO</html>"

    # again, nothing changed: the wandb report run is not written twice (MLflow's artifacts are replaced)
    assert attach_report(sweep, report) == ["mlflow", "wandb"]
    assert _offline_reports(sweep) == [first]
    # `harness sync --to wandb` on the same folder: the same report, still one run
    assert sync_report(sweep, load_run(next(p for p in sweep.iterdir() if p.name.startswith("grpo-"))), "wandb",
                       echo=lambda line: None) is True
    assert _offline_reports(sweep) == [first]

    # a changed report replaces it; the old one is set aside, not left beside it
    (report / "report.html").write_text("<html>GRPO vs PPO, rerun</html>")
    assert attach_report(sweep, report) == ["mlflow", "wandb"]
    (new,) = _offline_reports(sweep)
    assert (next(new.rglob("report.html"))).read_text() == "<html>GRPO vs PPO, rerun</html>"
    assert len(list((sweep / "wandb" / "superseded").iterdir())) == 1


def test_attach_report_without_trackers_reaches_none(tmp_path):
    make_run(tmp_path / "results", "quiet", "grpo", 0, 8)  # tracking off (the default)
    sweep = tmp_path / "results" / "quiet"
    assert attach_report(sweep, _report(sweep)) == []
    assert not (sweep / "wandb").exists() and not (tmp_path / "results" / "mlflow.db").exists()


def test_harness_report_attaches_what_it_writes(tmp_path, monkeypatch, capsys):
    """`harness report` itself: the report it builds lands in the parent run's artifacts, and it says so."""
    from harness.cli.main import main
    from mlflow.tracking import MlflowClient
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    for algo, n in (("grpo", 8), ("ppo", 4)):
        for seed in (0, 1):
            make_run(tmp_path / "results", "cli", algo, seed, n, overrides={"tracking": {"mlflow": True,
                                                                                      "mlflow_uri": uri}})
    sweep = tmp_path / "results" / "cli"
    assert main(["report", str(sweep)]) == 0
    assert "report logged to mlflow: artifacts of the sweep's parent run 'cli'" in capsys.readouterr().out
    c = MlflowClient(tracking_uri=uri)
    (parent,) = c.search_runs([c.get_experiment_by_name("cli").experiment_id], "tags.`harness.sweep_parent` = 'cli'")
    names = {a.path for a in c.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.html", "report/report.md", "report/table.csv"} <= names
