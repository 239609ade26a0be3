"""The report picks each arm's learning rate by validation accuracy (never the test split)."""
import json
import math
import statistics
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
                                       "0.0008: 0.640); the winner's train.lr is the smallest tried: the optimum "
                                       "may lie below it")


def test_no_validation_scores_no_selection():
    r = _run("grpo", 0, 5e-4, 0.7, 0.5)
    r.summary.pop("final_val_eval")
    assert select_by_validation([r]) == []


def _prm(seed, lr, kl, samples, val, start=None):
    r = _run("grpo_ps", seed, lr, val, 0.5)
    r.config["algorithm"]["kl_coef"] = kl
    r.config["reward_model"] = {"type": "prm", "samples_per_round": samples}
    if start is not None:
        r.summary["initial_val_eval"] = {"eval/arith/acc": start, "eval/arith/num_problems": 200}
    return r


def test_every_varying_setting_is_part_of_a_candidate_and_the_gain_over_the_start_is_named():
    # lr alone would pool the settings: 2.5e-5 -> (0.40 + 0.58) / 2 = 0.49 < 1e-4 -> 0.50; the best combination
    # is 2.5e-5 with kl 0.4 and 4,096 samples (0.58)
    runs = [_prm(100, 2.5e-5, 0.04, 1024, 0.40, start=0.55), _prm(100, 2.5e-5, 0.4, 4096, 0.58, start=0.55),
            _prm(100, 1e-4, 0.04, 1024, 0.50, start=0.55), _prm(100, 1e-4, 0.4, 4096, 0.50, start=0.55)]
    sel, = select_by_validation(runs)
    assert sel["over"] == "train.lr, algorithm.kl_coef, reward_model.samples_per_round"
    assert sel["best"] == {"train.lr": 2.5e-5, "algorithm.kl_coef": 0.4, "reward_model.samples_per_round": 4096}
    assert sel["val_acc"] == 0.58 and sel["start_val_acc"] == 0.55 and len(sel["candidates"]) == 4
    assert selection_notes([sel])[0] == (
        "selection on the arith validation split (never the test split): grpo_ps_prm -> train.lr=2.5e-05, "
        "algorithm.kl_coef=0.4, reward_model.samples_per_round=4096 (validation acc 0.580, start 0.550, gain "
        "+3.0 points; candidates (train.lr, algorithm.kl_coef, reward_model.samples_per_round) 2.5e-05, 0.04, 1024: "
        "0.400, 2.5e-05, 0.4, 4096: 0.580, 0.0001, 0.04, 1024: 0.500, 0.0001, 0.4, 4096: 0.500); the winner's "
        "train.lr is the smallest tried: the optimum may lie below it")
    runs[1].summary.pop("initial_val_eval")  # the winner's start not recorded: no gain claimed
    assert "start_val_acc" not in select_by_validation(runs)[0]


def test_one_candidate_is_no_selection():
    assert select_by_validation([_run("grpo", 0, 5e-4, 0.7, 0.5), _run("grpo", 1, 5e-4, 0.6, 0.5)]) == []


def test_a_winner_inside_the_grid_has_no_edge_note_and_one_at_the_top_says_above():
    mid = [_run("grpo", 0, 1e-4, 0.50, 0.5), _run("grpo", 0, 2e-4, 0.60, 0.5), _run("grpo", 0, 4e-4, 0.55, 0.5)]
    sel, = select_by_validation(mid)
    assert sel["best"] == 2e-4 and "edge" not in sel and "optimum" not in selection_notes([sel])[0]
    top, = select_by_validation(mid + [_run("grpo", 1, 4e-4, 0.90, 0.5), _run("grpo", 1, 2e-4, 0.6, 0.5),
                                       _run("grpo", 1, 1e-4, 0.5, 0.5)])
    assert top["best"] == 4e-4 and top["edge"] == "largest"
    assert selection_notes([top])[0].endswith(
        "; the winner's train.lr is the largest tried: the optimum may lie above it")


def _lora(seed, lr, rank, val):
    r = _run("dr_grpo", seed, lr, val, 0.5)
    r.config["model"] = {"lora": {"rank": rank, "alpha": 32}}
    return r


def test_lora_and_full_fine_tuning_of_one_algorithm_get_a_winner_each():
    # grouped by algorithm, rank would be a knob beside lr and one winner (LoRA 1e-4, 0.30) would hide the full
    # fine-tuning arm's own optimum (2e-5, 0.28)
    runs = [_lora(100, 1e-4, 16, 0.30), _lora(100, 2e-4, 16, 0.27), _lora(100, 1e-5, 0, 0.25),
            _lora(100, 2e-5, 0, 0.28), _lora(100, 4e-5, 0, 0.20)]
    sel = select_by_validation(runs)
    assert [(s["algorithm"], s["over"], s["best"], s["val_acc"], s.get("edge")) for s in sel] == [
        ("dr_grpo", "train.lr", 2e-5, 0.28, None), ("dr_grpo_lora", "train.lr", 1e-4, 0.30, "smallest")]
    assert selection_notes(sel)[0].startswith("selection on the arith validation split (never the test split): "
                                              "dr_grpo -> train.lr=2e-05 (validation acc 0.280; candidates "
                                              "1e-05: 0.250, 2e-05: 0.280, 4e-05: 0.200)")


def _scored(tmp_path, seed, lr, correct):
    """A finished run whose validation records hold ``correct`` (0/1 per problem) and whose summary agrees."""
    r = _run("grpo", seed, lr, sum(correct) / len(correct), 0.5)
    r.run_dir = tmp_path / r.run_id
    (r.run_dir / "eval").mkdir(parents=True)
    with open(r.run_dir / "eval" / "arith_validation.jsonl", "w") as f:
        for i, c in enumerate(correct):
            f.write(json.dumps({"id": f"p{i}", "gold": "1", "greedy": {"correct": bool(c)}, "samples": []}) + "\n")
    return r


def test_the_winners_lead_over_the_runner_up_is_paired_by_problem_with_its_interval(tmp_path):
    win = [1, 1, 1, 1, 1, 0, 0, 0, 1, 1]      # 0.7
    second = [1, 0, 1, 0, 1, 0, 1, 0, 0, 1]   # 0.5
    third = [0, 0, 0, 0, 1, 0, 0, 0, 0, 0]    # 0.1
    sel, = select_by_validation([_scored(tmp_path, 0, 1e-4, third), _scored(tmp_path, 0, 2e-4, win),
                                 _scored(tmp_path, 0, 4e-4, second)])
    d = [a - b for a, b in zip(win, second)]
    half = 2.262157 * statistics.stdev(d) / math.sqrt(len(d))    # t(0.975, 9 df), from a table
    m = sel["margin"]
    assert m["runner_up"] == 4e-4 and m["seeds"] == 1 and m["problems"] == 10
    assert math.isclose(m["diff"], 0.2) and math.isclose(m["hi"] - m["diff"], half, rel_tol=1e-5)
    assert list(sel["candidates"]) == [1e-4, 2e-4, 4e-4]
    assert selection_notes([sel])[0].endswith(
        f"; ahead of the runner-up (0.0004) by +20.0 points, paired 95% interval [{100 * (0.2 - half):+.1f}, "
        f"{100 * (0.2 + half):+.1f}] over 10 validation problems, one seed: the problems' sampling only, not the runs' "
        "own randomness; the interval includes 0: the winner is not separated from the runner-up")


def test_with_two_seeds_the_lead_counts_the_seeds_spread_and_the_problems_main_effect(tmp_path):
    a = {0: [1, 1, 1, 1, 0, 1, 1, 1], 1: [1, 1, 1, 0, 1, 1, 1, 0]}
    b = {0: [1, 0, 0, 1, 0, 0, 1, 0], 1: [0, 0, 1, 0, 1, 0, 1, 0]}
    runs = [_scored(tmp_path, s, lr, v[s]) for s in (0, 1) for lr, v in ((1e-4, a), (2e-4, b))]
    m = select_by_validation(runs)[0]["margin"]
    d = [[x - y for x, y in zip(a[s], b[s])] for s in (0, 1)]        # seeds x problems
    seed_means = [sum(row) / 8 for row in d]
    grand = sum(seed_means) / 2
    prob_means = [(d[0][p] + d[1][p]) / 2 for p in range(8)]
    ms_e = sum((d[s][p] - seed_means[s] - prob_means[p] + grand) ** 2 for s in (0, 1) for p in range(8)) / 7
    sigma_b2 = max(0.0, statistics.variance(prob_means) - ms_e / 2)
    se = math.sqrt(statistics.variance(seed_means) / 2 + sigma_b2 / 8)
    assert m["seeds"] == 2 and m["runner_up"] == 2e-4 and math.isclose(m["diff"], grand)
    assert math.isclose(m["hi"] - m["diff"], 12.706205 * se, rel_tol=1e-5)   # t(0.975, 1 df)
    assert m["lo"] > 0 or "not separated" in selection_notes(select_by_validation(runs))[0]


def test_records_that_disagree_with_the_summary_give_no_lead(tmp_path):
    r1, r2 = _scored(tmp_path, 0, 1e-4, [1, 1, 0]), _scored(tmp_path, 0, 2e-4, [1, 0, 0])
    r2.summary["final_val_eval"]["eval/arith/acc"] = 0.9
    sel, = select_by_validation([r1, r2])
    assert "margin" not in sel and "runner-up" not in selection_notes([sel])[0]
