"""bench/offpolicy.py diagnostics against a hand computation: per arm (staleness x correction, a file that leaves
them out reading as 0 / none) and seed, the mean and largest mismatch KL over the steps, the largest raw ratio, the
shares truncated and masked (%), the final accuracy and the seconds."""
import json
import sys

import pytest

from support_paths import REPO

sys.path.insert(0, str(REPO / "bench"))
import offpolicy  # noqa: E402


def _run(root, name, seed, k, corr, kl, rmax, trunc, acc):
    d = root / name
    d.mkdir(parents=True)
    algo = {"name": "grpo", **({"correction": corr} if corr != "none" else {})}
    cfg = {"seed": seed, "task": {"name": "arith"}, "algorithm": algo, **({"train": {"staleness": k}} if k else {})}
    n = len(kl)
    (d / "summary.json").write_text(json.dumps({
        "run_id": name, "algorithm": "grpo", "seed": seed, "status": "finished", "config": cfg,
        "budget": {"unit": "steps", "amount": n, "consumed": {"steps": n, "seconds": 10.0 * n}},
        "initial_eval": {"eval/arith/acc": 0.5}, "final_eval": {"eval/arith/acc": acc}, "wall_seconds": 12.0 * n}))
    rows = [{"step": 0, "eval/arith/acc": 0.5}]
    rows += [{"step": i + 1, "seconds": 10.0 * (i + 1), "offpolicy/mismatch_kl": kl[i], "offpolicy/ratio_max": rmax[i],
              "offpolicy/truncated_frac": trunc[i], "offpolicy/masked_frac": 0.0} for i in range(n)]
    rows.append({"step": n, "seconds": 10.0 * n, "eval/arith/acc": acc})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_per_arm_figures_equal_a_hand_computation(tmp_path, capsys):
    _run(tmp_path, "grpo-s0-a", 0, 0, "none", [1e-13, 3e-13], [1.0, 1.0], [0.0, 0.0], 0.70)
    _run(tmp_path, "grpo-s0-b", 0, 4, "token_tis", [2e-3, 4e-3, 6e-3], [3.0, 9.0, 2.0], [0.01, 0.02, 0.03], 0.68)
    _run(tmp_path, "grpo-s1-b", 1, 4, "token_tis", [1e-3, 1e-3, 1e-3], [5.0, 4.0, 1.5], [0.0, 0.0, 0.0], 0.72)
    out = offpolicy.diagnostics(type("A", (), {"runs": str(tmp_path)})())
    capsys.readouterr()
    arms = {(r["staleness"], r["correction"]): r for r in out["arms"]}
    assert set(arms) == {(0, "none"), (4, "token_tis")}
    b = arms[(4, "token_tis")]
    assert b["seeds"] == [0, 1]
    assert b["kl_mean"] == pytest.approx([4e-3, 1e-3]) and b["kl_max"] == pytest.approx([6e-3, 1e-3])
    assert b["ratio_max"] == [9.0, 5.0] and b["truncated"] == pytest.approx([2.0, 0.0])
    assert b["acc"] == pytest.approx([68.0, 72.0]) and b["train_s"] == [30.0, 30.0] and b["wall_s"] == [36.0, 36.0]
    assert arms[(0, "none")]["kl_max"] == pytest.approx([3e-13])
