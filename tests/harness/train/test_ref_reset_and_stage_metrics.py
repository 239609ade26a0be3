"""The reference-reset schedule (``algorithm.ref_reset_every``) as the loop runs it, and the per-step
metrics process supervision is judged by: the share of short outputs, the per-group sum of token
advantages, the KL to the reference and the entropy estimate, against hand-computed values."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from algorithms.advantages import ADVANTAGES, AdvantageInput, group_token_sums
from algorithms.presets import resolve
from evals.arith import ArithTask
from evals.tasks import Task
from harness.config.schema import ModelConfig, load_config
from harness.engine.learner import Learner, make_batch
from harness.engine.models import build_char_tokenizer, build_tiny_model, load_prm
from harness.engine.perf import PerfTracker
from harness.engine.sampling import sample
from harness.engine.step_metrics import StepMetrics, group_advantage_sums
from harness.rundir.layout import read_jsonl
from harness.train import loop
from harness.train.loop import ref_reset_due, run_dir, short_outputs, train

TINY = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=4", "warmup.steps=0",
    "sampling.samples_per_prompt=2", "sampling.max_new_tokens=4", "train.prompts_per_step=2",
    "train.threads=1", "budget.unit=steps", "budget.eval_points=1",
    "train.save_final_model=false", "eval.greedy=true", "eval.n=0",
]


@pytest.mark.parametrize("every", [1, 2, 3, 5])
def test_reset_schedule_counts(every):
    for k in range(13):  # k stages reset the reference k // N times, after stages N-1, 2N-1, ...
        assert sum(ref_reset_due(s, every) for s in range(k)) == k // every
    assert [s for s in range(12) if ref_reset_due(s, every)] == list(range(every - 1, 12, every))


def test_no_reset_when_off():
    assert not any(ref_reset_due(s, 0) for s in range(50))


def test_the_loop_resets_the_reference_on_schedule(tmp_path, monkeypatch):
    """The real loop, 5 steps with N = 2: two resets, after steps 2 and 4 (not every step)."""
    resets = []
    real = Learner.reset_reference

    def counted(self):
        resets.append(self.updates)  # updates so far: the step the reset follows
        return real(self)
    monkeypatch.setattr(Learner, "reset_reference", counted)
    cfg = load_config(None, TINY + ["algorithm=grpo_ps", "algorithm.ref_reset_every=2", "budget.amount=5",
                                    f"output_dir={tmp_path / 'runs'}", f"warmup.cache_dir={tmp_path / 'wc'}"])
    assert train(cfg, progress=False)["status"] == "finished"
    assert resets == [2, 4]
    rows = [r for r in read_jsonl(run_dir(cfg) / "metrics.jsonl") if "train/loss" in r]
    assert len(rows) == 5
    for r in rows:  # the process-supervision metrics are logged every step
        assert 0.0 <= r["rollout/short_frac"] <= 1.0
        assert r["rollout/entropy_est"] > 0.0
        assert "train/adv_group_sum_mean" in r and r["train/adv_group_sum_abs_mean"] >= 0.0
        assert r["train/kl"] >= 0.0


def test_short_outputs_by_hand():
    task = ArithTask()
    p, q = task.make_problem("3+4*2-5"), task.make_problem("2*3")
    ro = SimpleNamespace(completions=["4*2=8;3+8=11;11-5=6;#6", "#6", "4*2=8;#6", "2*3=6;#6", "#6", "4*2"],
                         finished=[True, True, True, True, True, False])
    assert short_outputs(task, [p, p, p, q, q, p], ro) == [False, True, True, False, True, False]
    assert short_outputs(Task(), [p] * 6, ro) == []  # a task that does not know: nothing logged


def test_stage_row_short_frac_and_entropy_estimate_by_hand():
    # 4 sequences of 2, 1, 3, 0 tokens; sampled log-probs sum to -(0.5+1.5) - 1 - (1+2+3) = -9 over 6 tokens
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    lp = torch.tensor([[-0.5, -1.5, 0.0], [-1.0, 0.0, 0.0], [-1.0, -2.0, -3.0], [0.0, 0.0, 0.0]])
    ro = SimpleNamespace(lengths=mask.sum(1), finished=[True, True, False, True], num_sequences=4,
                         num_tokens=6, logprobs=lp, completion_mask=mask)
    run = SimpleNamespace(prm=object(), dist=SimpleNamespace(is_distributed=False))
    steps = [[(1.0, 0), (0.0, 1)], [(0.0, 0)], [(1.0, 2)], [(0.0, 0)]]
    stats = loop._stage_stats(run, ro, torch.tensor([1.0, 0.0, 0.0, 0.0]), steps, None, 1.0, {"generate": 0.5},
                              [False, True, False, True])
    row = loop._stage_row({}, stats, {}, 2, True)
    assert row["rollout/short_frac"] == 0.5
    assert row["rollout/entropy_est"] == pytest.approx(9 / 6)
    assert row["rollout/step_reward_mean"] == pytest.approx(2 / 5)
    no_steps = loop._stage_row({}, loop._stage_stats(run, ro, torch.zeros(4), steps, None, 1.0, {}), {}, 2, True)
    assert "rollout/short_frac" not in no_steps


def test_group_advantage_metrics_by_hand():
    # row sums over real tokens: 1, 2, -4, 3, 14, 18; groups of 2 (rows 0-1, 2-3, 4-5) sum to 3, -1, 32
    adv = torch.tensor([[1.0, 0.0], [1.0, 1.0], [-2.0, -2.0], [3.0, 5.0], [7.0, 7.0], [9.0, 9.0]])
    mask = torch.tensor([[1, 0], [1, 1], [1, 1], [1, 0], [1, 1], [1, 1]])
    assert group_token_sums(adv, mask, 2).tolist() == pytest.approx([3.0, -1.0, 32.0])
    # as the update uses them: row 1 dropped (group 0 sums to 1), group 2 has no kept row (not counted)
    keep = torch.tensor([True, False, True, True, False, False])
    sums = group_advantage_sums(adv, mask, keep, 2)
    assert sums.numel() == 2
    m = _group_metrics(sums).values()
    assert m["train/adv_group_sum_mean"] == pytest.approx(0.0)      # (1 + -1) / 2
    assert m["train/adv_group_sum_abs_mean"] == pytest.approx(1.0)  # (1 + 1) / 2


def _group_metrics(sums: torch.Tensor) -> StepMetrics:
    """The group-sum metrics as the learner records them."""
    m = StepMetrics()
    m.mean("train/adv_group_sum_mean", sums)
    m.mean("train/adv_group_sum_abs_mean", sums.abs())
    return m


def test_grpo_ps_step_logs_its_group_sums_and_kl():
    """A real grpo_ps update on a sampled batch scored by the arith checker: the logged group sums are
    those of the §4.1.3 advantages of that batch."""
    tok = build_char_tokenizer()
    policy = build_tiny_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, seed=1)
    cfg = load_config(None, ["algorithm=grpo_ps", "train.micro_batch_size=4"])
    task = ArithTask()
    problems = [task.make_problem("1+2"), task.make_problem("3*4-1")]
    ro = sample(policy, tok, [task.format_prompt(p) for p in problems], n=4, max_new_tokens=10, seed=3)
    ro.completions = ["1+2=3;#3", "#3", "1+2=4;#4", "1+2=3;#3", "4*3=12;#11", "3*4=12;12-1=11;#11", "#11", "3*"]
    reps = [p for p in problems for _ in range(4)]
    rewards, steps = loop.score(task, reps, ro, load_prm(None, task))
    b = make_batch(ro, "cpu")
    adv = ADVANTAGES.get("grpo_ps")(AdvantageInput(rewards=rewards, mask=b.mask, n=4, step_rewards=steps))
    sums = group_token_sums(adv, b.mask, 4)
    algo = resolve(cfg.algorithm)
    m = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=copy.deepcopy(policy).requires_grad_(False)).step(
        ro, rewards, steps, 0)
    assert sums.abs().max() > 1e-3  # the estimator is not zero-sum on this batch
    assert m["train/adv_group_sum_mean"] == pytest.approx(sums.mean().item(), rel=1e-5, abs=1e-6)
    assert m["train/adv_group_sum_abs_mean"] == pytest.approx(sums.abs().mean().item(), rel=1e-5, abs=1e-6)
    assert m["train/kl"] == pytest.approx(0.0, abs=1e-6)  # the reference is the sampling policy


def test_group_sums_combine_over_ranks_as_one_process():
    """Several processes: each rank's groups (whole groups per rank) pooled, as one process sees them."""
    adv = torch.tensor([[1.0, 0.0], [1.0, 1.0], [-2.0, -2.0], [3.0, 5.0], [7.0, 7.0], [9.0, 9.0]])
    mask = torch.tensor([[1, 0], [1, 1], [1, 1], [1, 0], [1, 1], [1, 1]])
    keep = torch.ones(6, dtype=torch.bool)
    ranks = [_group_metrics(group_advantage_sums(adv[rows], mask[rows], keep[rows], 2))
             for rows in (slice(0, 2), slice(2, 6))]  # rank 0 holds group 0, rank 1 groups 1 and 2
    fake = SimpleNamespace(is_distributed=True, gather_objects=lambda mine: [r.share() for r in ranks])
    out = ranks[0].values(fake)
    assert out["train/adv_group_sum_mean"] == pytest.approx((3 - 1 + 32) / 3)
    assert out["train/adv_group_sum_abs_mean"] == pytest.approx((3 + 1 + 32) / 3)
