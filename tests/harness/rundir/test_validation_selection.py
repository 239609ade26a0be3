"""The report picks each algorithm's learning rate by validation accuracy (never the test split)."""
from pathlib import Path

from harness.report.aggregate import select_by_validation, selection_notes
from harness.rundir.read import RunData


def _run(algo, seed, lr, val, test, status="finished"):
    return RunData(run_dir=Path(f"/x/s/{algo}-{seed}-{lr}"), run_id=f"{algo}-s{seed}-{lr}", sweep="s",
                   algorithm=algo, seed=seed, status=status, error=None,
                   summary={"final_val_eval": {"eval/arith/acc": val, "eval/arith/n": 200},
                            "final_eval": {"eval/arith/acc": test}},
                   config={"algorithm": {"name": algo}, "train": {"lr": lr}, "seed": seed})


def test_best_lr_per_algorithm_by_mean_validation_accuracy():
    runs = [_run("grpo", 0, 5e-4, 0.70, 0.50), _run("grpo", 1, 5e-4, 0.60, 0.50),   # mean 0.65
            _run("grpo", 0, 8e-4, 0.66, 0.90), _run("grpo", 1, 8e-4, 0.62, 0.90),   # mean 0.64, best on test
            _run("ppo", 0, 3e-4, 0.55, 0.1), _run("ppo", 0, 1e-4, 0.55, 0.2),       # tie -> smaller lr
            _run("rft", 0, 2e-4, 0.99, 0.9, status="failed")]                      # unfinished: ignored
    sel = select_by_validation(runs)
    assert [(s["algorithm"], s["best"], round(s["val_acc"], 6)) for s in sel] == [
        ("grpo", 5e-4, 0.65), ("ppo", 1e-4, 0.55)]
    assert {k: round(v, 6) for k, v in sel[0]["candidates"].items()} == {5e-4: 0.65, 8e-4: 0.64} and sel[0]["split"] == "validation"
    assert selection_notes(sel)[0] == ("selection on the arith validation split (never the test split): grpo -> "
                                       "train.lr=0.0005 (validation acc 0.650; candidates 0.0005: 0.650, "
                                       "0.0008: 0.640)")


def test_no_validation_scores_no_selection():
    r = _run("grpo", 0, 5e-4, 0.7, 0.5)
    r.summary.pop("final_val_eval")
    assert select_by_validation([r]) == []
