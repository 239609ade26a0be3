"""`harness sync` and the trackers, round 3 (issue 25): nothing that resolves outside a run
directory is ever uploaded (a symlinked secret stays home, with one warning naming the link);
a FIFO among a run's files never hangs the sync; a corrupt run (summary.json ``[1]``, binary,
a FIFO) is listed with its reason while the good runs are synced; `harness ui --host 0.0.0.0`
warns what it exposes. MLflow runs on SQLite only; no server is started here."""
from __future__ import annotations

import json
import os
import signal
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

from _fake_results import make_run, make_sweep
from harness.cli import tracking as cli_tracking
from harness.cli.main import main
from harness.tracking import sync as tracking_sync
from harness.tracking.base import artifact_files
from harness.tracking.sync import exposure_warning, run_problem, sync

pytestmark = [pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:not uploading:RuntimeWarning")]  # asserted where it matters

SECRET = "TOPSECRET-4f1c9e"
TWO = [("grpo", 0, 8, "finished"), ("ppo", 0, 0, "finished")]


@contextmanager
def deadline(seconds: int):
    """Fail instead of hanging the suite when something blocks (on a FIFO)."""
    def _timeout(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    prev = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, prev)


def _quiet(*a):
    pass


def _secret(tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "home"
    (home / "keys").mkdir(parents=True)
    f = home / "id_rsa"
    f.write_text(f"-----BEGIN KEY----- {SECRET}\n")
    (home / "keys" / "token.png").write_text(SECRET)
    (home / "keys" / "token.jsonl").write_text(json.dumps({"token": SECRET}) + "\n")
    return home, f


def _leaked(tmp_path: Path, home: Path) -> list[str]:
    """Regular files (not links) anywhere under tmp_path but the secrets' home that hold the secret."""
    hits = []
    for dirpath, dirnames, filenames in os.walk(tmp_path):
        d = Path(dirpath)
        if d == home or home in d.parents:
            continue
        for name in filenames:
            f = d / name
            if f.is_symlink() or not f.is_file():
                continue
            if SECRET.encode() in f.read_bytes():
                hits.append(str(f.relative_to(tmp_path)))
    return hits


def _plant_links(run: Path, home: Path, secret: Path) -> None:
    (run / "worker.log").symlink_to(secret)                         # a file link out
    (run / "eval" / "leak.jsonl").symlink_to(secret)                # one among the eval files
    (run / "plots").symlink_to(home / "keys", target_is_directory=True)  # a folder link out
    inside = sorted((run / "eval").glob("arith_*.jsonl"))[0]
    (run / "eval" / "alias.jsonl").symlink_to(inside.name)          # a link that stays inside: fine


def _store(tmp_path: Path, monkeypatch) -> str:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "store").mkdir()
    return f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"


def _mlflow_artifacts(uri: str, sweep: str) -> dict[str, list[str]]:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name(sweep)
    out = {}
    for r in c.search_runs([exp.experiment_id], "tags.`harness.run_id` != ''"):
        names = []
        stack = [None]
        while stack:
            for a in c.list_artifacts(r.info.run_id, stack.pop()):
                (stack.append(a.path) if a.is_dir else names.append(a.path))
        out[r.data.tags["harness.run_id"]] = sorted(names)
    return out


# --------------------------------------------------------------------------- 3: links out of a run


def test_artifact_files_keeps_regular_files_inside_and_names_each_link_out(tmp_path):
    home, secret = _secret(tmp_path)
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "a.jsonl").write_text("{}\n")
    (run / "eval" / "b.jsonl").symlink_to("a.jsonl")
    (run / "eval" / "out.jsonl").symlink_to(secret)
    (run / "eval" / "keys").symlink_to(home / "keys", target_is_directory=True)
    os.mkfifo(run / "eval" / "pipe.jsonl")
    (run / "eval" / "loop.jsonl").symlink_to("loop.jsonl")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with deadline(20):
            got = artifact_files(run / "eval", run)
            assert artifact_files(run / "eval" / "out.jsonl", run) == []  # asked again: no second warning
            assert artifact_files(run / "eval" / "keys", run) == []
    assert sorted(p.name for p in got) == ["a.jsonl", "b.jsonl"]
    said = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
    assert len([m for m in said if "out.jsonl" in m]) == 1 and "outside" in next(m for m in said if "out.jsonl" in m)
    assert any("keys" in m and "outside" in m for m in said)
    assert any("pipe.jsonl" in m and "not a regular file" in m for m in said)
    assert any("loop.jsonl" in m for m in said)


def test_sync_to_mlflow_never_uploads_a_symlinked_secret(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    home, secret = _secret(tmp_path)
    uri = _store(tmp_path, monkeypatch)
    sweep = make_sweep(tmp_path / "results", "leak", spec=TWO)
    good, linked = sorted(sweep.iterdir())
    _plant_links(linked, home, secret)
    with pytest.warns(RuntimeWarning, match="not uploading .*worker.log: it resolves to .*outside"):
        res = sync(sweep, "mlflow", uri=uri, echo=_quiet)
    assert [r.get("error") for r in res] == [None, None]              # both runs synced
    arts = _mlflow_artifacts(uri, "leak")
    assert "worker.log" not in arts[linked.name] and not any("leak" in a or "plots" in a for a in arts[linked.name])
    assert "eval/alias.jsonl" in arts[linked.name] and "config.yaml" in arts[linked.name]
    assert _leaked(tmp_path, home) == []


def test_sync_to_wandb_never_copies_a_symlinked_secret(tmp_path):
    pytest.importorskip("wandb")
    home, secret = _secret(tmp_path)
    run = make_run(tmp_path / "results", "leakw", "grpo", 0, 8)
    _plant_links(run, home, secret)
    with pytest.warns(RuntimeWarning, match="not uploading"):
        res = sync(run, "wandb", mode="offline", echo=_quiet)
    assert "error" not in res[0], res
    copied = {p.name for p in (run / "wandb").rglob("*") if p.is_file()}
    assert "alias.jsonl" in copied and "leak.jsonl" not in copied and "worker.log" not in copied
    assert _leaked(tmp_path, home) == []


def test_a_run_file_linked_out_of_the_run_is_not_read(tmp_path, monkeypatch):
    """summary.json / config.yaml linked to a file outside: their content would become params,
    tags and artifacts; the run is listed, not synced."""
    pytest.importorskip("mlflow")
    home, secret = _secret(tmp_path)
    uri = _store(tmp_path, monkeypatch)
    sweep = make_sweep(tmp_path / "results", "leak2", spec=TWO)
    good, linked = sorted(sweep.iterdir())
    fake = home / "summary.json"
    fake.write_text(json.dumps({**json.loads((linked / "summary.json").read_text()), "api_key": SECRET}))
    (linked / "summary.json").unlink()
    (linked / "summary.json").symlink_to(fake)
    skipped = []
    res = sync(sweep, "mlflow", uri=uri, echo=_quiet, skipped=skipped)
    assert [r["run_id"] for r in res] == [good.name] and "error" not in res[0]
    assert [s["run_dir"] for s in skipped] == [str(linked)]
    assert "summary.json" in skipped[0]["error"] and "outside" in skipped[0]["error"]
    assert _leaked(tmp_path, home) == []


def test_report_upload_skips_links_out_of_the_report_folder(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from types import SimpleNamespace

    from harness.config.schema import load_config
    from harness.tracking.report_upload import _to_mlflow

    home, secret = _secret(tmp_path)
    uri = _store(tmp_path, monkeypatch)
    run_dir = make_run(tmp_path / "results", "rep", "grpo", 0, 8)
    report = tmp_path / "results" / "rep" / "report"
    (report / "plots").mkdir(parents=True)
    (report / "index.md").write_text("# report\n")
    (report / "plots" / "acc.png").write_bytes(b"\x89PNG")
    (report / "runs.csv").symlink_to(secret)
    (report / "plots" / "keys").symlink_to(home / "keys", target_is_directory=True)
    cfg = load_config(overrides=["name=rep", f"tracking.mlflow_uri={uri}"])
    with pytest.warns(RuntimeWarning, match="not uploading .*runs.csv"):
        parent = _to_mlflow(SimpleNamespace(config=cfg, run_dir=run_dir, run_id=run_dir.name), "rep", report)
    from mlflow.tracking import MlflowClient
    c = MlflowClient(tracking_uri=uri)
    names = {a.path for d in ("report", "report/plots") for a in c.list_artifacts(parent, d)}
    assert "report/index.md" in names and "report/plots/acc.png" in names
    assert "report/runs.csv" not in names and not any("keys" in n for n in names)
    assert _leaked(tmp_path, home) == []


# --------------------------------------------------------------------------- 6: FIFOs and corrupt runs


def _break(sweep: Path) -> dict[str, str]:
    """Six runs of the sweep broken six ways (the first run stays good); run dir -> reason text."""
    runs = sorted(sweep.iterdir())
    bad = {}

    def fifo(run: Path, name: str, why: str):
        (run / name).unlink(missing_ok=True)
        os.mkfifo(run / name)
        bad[str(run)] = why

    fifo(runs[1], "metrics.jsonl", "metrics.jsonl: it is not a regular file")
    (runs[2] / "summary.json").write_text("[1]")
    bad[str(runs[2])] = "summary.json holds a JSON list, not an object"
    (runs[3] / "summary.json").write_bytes(b"\xff\xfe\x00binary\x80\x81")
    bad[str(runs[3])] = "summary.json is not UTF-8 text"
    fifo(runs[4], "summary.json", "summary.json: it is not a regular file")
    fifo(runs[5], "config.yaml", "config.yaml: it is not a regular file")
    (runs[6] / "summary.json").unlink()
    (runs[6] / "summary.json").symlink_to("/dev/zero")
    bad[str(runs[6])] = "summary.json: it resolves to /dev/zero, outside"
    return bad


def test_sync_lists_fifo_and_corrupt_runs_and_syncs_the_good_one(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mlflow")
    uri = _store(tmp_path, monkeypatch)
    sweep = make_sweep(tmp_path / "results", "broken")
    good = sorted(sweep.iterdir())[0]
    os.mkfifo(good / "worker.log")                                   # an artifact that is a FIFO: skipped
    bad = _break(sweep)
    with deadline(180), pytest.warns(RuntimeWarning, match="worker.log: it is not a regular file"):
        rc = main(["sync", str(sweep), "--to", "mlflow", "--uri", uri])
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    assert "synced 1/7 runs to mlflow" in out
    assert "Traceback" not in err and "6 run(s) not synced" in err
    listed = [line.strip() for line in err.splitlines() if line.startswith("  ")]
    assert len(listed) == 6
    for run_dir, why in bad.items():
        assert any(line.startswith(run_dir + ":") and why in line for line in listed), (run_dir, why, listed)
    assert list(_mlflow_artifacts(uri, "broken")) == [good.name]


def test_sync_to_wandb_does_not_block_on_a_fifo_marker(tmp_path):
    pytest.importorskip("wandb")
    run = make_run(tmp_path / "results", "fifo", "grpo", 0, 8)
    (run / "wandb").mkdir()
    os.mkfifo(run / "wandb" / "harness_sync.json")
    with deadline(120):
        res = sync(run, "wandb", mode="offline", echo=_quiet)
    assert "error" not in res[0] and not res[0]["skipped"], res


def test_a_run_that_breaks_the_reader_or_the_replay_does_not_stop_the_others(tmp_path, monkeypatch):
    runs = sorted(make_sweep(tmp_path / "results", "iso").iterdir())
    real_load = tracking_sync.load_run

    def load(d):
        if Path(d) == runs[1]:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return real_load(d)

    def replay(run, uri=None):
        if run.run_dir == runs[2]:
            raise RuntimeError("store went away")
        return {"run_id": run.run_id, "created": True, "points": 1, "uri": "x", "status": run.status}

    monkeypatch.setattr(tracking_sync, "load_run", load)
    monkeypatch.setattr(tracking_sync, "replay_mlflow", replay)
    lines = []
    res = sync(tmp_path / "results", "mlflow", echo=lines.append)
    assert len(res) == len(runs)
    errors = {r["run_dir"]: r.get("error") for r in res}
    assert "UnicodeDecodeError" in errors[str(runs[1])] and "store went away" in errors[str(runs[2])]
    assert sum(e is None for e in errors.values()) == len(runs) - 2
    assert sum("NOT SYNCED" in line for line in lines) == 2


def test_run_problem_names_each_file(tmp_path):
    run = make_run(tmp_path, "p", "grpo", 0, 8)
    assert run_problem(run) is None
    (run / "error.txt").symlink_to(tmp_path / "elsewhere.txt")
    assert "error.txt" in run_problem(run) and "outside" in run_problem(run)


# --------------------------------------------------------------------------- 2: harness ui --host


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "myhost.example"])
def test_ui_beyond_loopback_warns_what_it_exposes(host, tmp_path, monkeypatch, capsys):
    pytest.importorskip("mlflow")
    started = []

    class Exited:
        pid, returncode = 0, 1

        def poll(self):
            return 1

        def wait(self):
            return 1

    monkeypatch.setattr(tracking_sync, "start_ui", lambda root, port, h, log=None: started.append(h) or Exited())
    monkeypatch.setattr(tracking_sync, "wait_healthy", lambda url, proc: False)
    monkeypatch.setattr(tracking_sync, "stop_group", lambda proc: None)
    monkeypatch.setattr(cli_tracking, "port_problem", lambda host, port: None)  # these hosts are not this machine
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "mlflow.db").touch()  # a store: without one, `harness ui` starts nothing
    main(["ui", str(tmp_path / "results"), "--host", host, "--port", "5999"])
    err = capsys.readouterr().err
    assert started == [host]
    warning = err[err.index("harness ui: WARNING"):]
    assert f"--host {host}" in warning and "port 5999" in warning and "no login" in warning
    assert "DNS rebinding" in warning and "--allowed-hosts" in warning and "--cors-allowed-origins" in warning
    assert "ssh -L 5999:127.0.0.1:5999" in warning
    if host in ("0.0.0.0", "::"):
        assert "every network interface" in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.5"])
def test_ui_on_loopback_says_nothing(host, tmp_path):
    assert exposure_warning(host, 5000, tmp_path) is None


def test_ui_warning_names_mlflow_settings_that_remove_its_checks(tmp_path):
    off = exposure_warning("0.0.0.0", 5000, tmp_path, env={"MLFLOW_SERVER_DISABLE_SECURITY_MIDDLEWARE": "true"})
    assert "MLFLOW_SERVER_DISABLE_SECURITY_MIDDLEWARE" in off and "off" in off
    anyhost = exposure_warning("0.0.0.0", 5000, tmp_path, env={"MLFLOW_SERVER_ALLOWED_HOSTS": "*"})
    assert "every Host header is accepted" in anyhost


def test_ui_port_taken_after_the_check_is_one_line(tmp_path, monkeypatch, capsys):
    """Issue 26: a port that was free when checked but taken when the server binds it is the
    same one line (exit 2) as a busy port, not the server's traceback."""
    pytest.importorskip("mlflow")

    class Exited:
        pid, returncode = 0, 1

        def poll(self):
            return 1

    def start(root, port, host, log=None):
        log.write(b"Traceback (most recent call last):\n  ...\nOSError: [Errno 98] Address already in use\n")
        return Exited()

    monkeypatch.setattr(tracking_sync, "start_ui", start)
    monkeypatch.setattr(tracking_sync, "wait_healthy", lambda url, proc: False)
    monkeypatch.setattr(tracking_sync, "stop_group", lambda proc: None)
    monkeypatch.setattr(cli_tracking, "port_problem", lambda host, port: None)  # free when checked
    (tmp_path / "mlflow.db").touch()
    assert main(["ui", str(tmp_path), "--port", "5998"]) == 2
    err = capsys.readouterr().err
    assert err == "harness ui: port 5998 on 127.0.0.1 cannot be used (in use): pick another with --port\n"
