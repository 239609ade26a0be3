"""The quickstart's compute floor (bench/step_report.py, issue 29): the warm-up's model FLOPs replayed from
its config equal the count over the batches a real warm-up trains on, by the hand formula; the floor of a
quickstart folder adds every run's perf/flops, scaled to each group's prompt once, and divides by cores x roof."""
import json

import pytest

import harness.train.warmup as warmup
import step_report  # bench/ is on pytest's pythonpath (pyproject.toml)
from evals.catalog import get_task
from harness.config.schema import load_config, save_config
from harness.engine.models import build_char_tokenizer
from harness.train.stage import stage_problems
from support_paths import REPO

QUICKSTART = REPO / "harness" / "configs" / "quickstart.yaml"
SMALL = ["warmup.steps=3", "warmup.examples_per_step=5"]


def _cfg(overrides=SMALL):
    return load_config(str(QUICKSTART), overrides=list(overrides))


def test_warmup_flops_equal_the_hand_formula_over_the_batches_the_warmup_trains_on(tmp_path, monkeypatch):
    cfg = _cfg()
    seen = []
    real_loss = warmup.sft_loss

    def spy(model, ids, mask, pos, labels):
        seen.append(mask.sum(1).tolist())
        return real_loss(model, ids, mask, pos, labels)

    monkeypatch.setattr(warmup, "sft_loss", spy)
    warmup.train_warmup(cfg, get_task(cfg.task), tmp_path / "entry", "cpu", progress=False)
    assert len(seen) == 3 and all(len(b) == 5 for b in seen)

    # M by hand: per layer q, k, v, o (4 h^2) and gate, up, down (3 h i); the LM head h x V
    h, layers, inter, vocab = 128, 4, 384, len(build_char_tokenizer())
    m = layers * (4 * h * h + 3 * h * inter) + h * vocab
    lengths = [t for b in seen for t in b]
    expected = 3 * (2 * m * sum(lengths) + 2 * h * layers * sum(t * (t + 1) for t in lengths))
    assert warmup.warmup_flops(cfg, get_task(cfg.task)) == pytest.approx(expected, rel=1e-12)


def test_the_floor_adds_the_warmup_and_every_runs_counted_flops(tmp_path):
    cfg = _cfg()
    for run, flops in (("grpo-s0-aaaa", [1e12, 2e12]), ("ppo-s0-bbbb", [5e12])):
        d = tmp_path / "quickstart" / run
        d.mkdir(parents=True)
        save_config(cfg, d / "config.yaml")
        rows = [{"step": 0, "eval/arith/acc": 0.5}] + [{"step": i + 1, "perf/flops": f, "samples": 256, "tokens": 5000}
                                                      for i, f in enumerate(flops)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fl = step_report.quickstart_floor(str(tmp_path), roof_1thread=50.0, cores=2)
    warm = warmup.warmup_flops(cfg, get_task(cfg.task))
    assert fl["run_flops"] == {"grpo-s0-aaaa": 3e12, "ppo-s0-bbbb": 5e12}
    assert fl["total_flops"] == pytest.approx(warm + 8e12)
    assert fl["model_floor_seconds"] == pytest.approx((warm + 8e12) / 100e9)
    # executed: each stage scaled by (P + C) / (G P + C); P = the stage's 32 prompts' characters + 1 BOS each
    # (the character tokenizer), C = 5000 completion tokens, G = 8
    task = get_task(cfg.task)

    def scale(step):
        p = sum(len(task.format_prompt(q)) + 1 for q in stage_problems(task, cfg.seed, step - 1, 32))
        assert 32 * 9 < p < 32 * 20          # prompts like "Q:5*6*5*3\nA:"
        return (p + 5000) / (8 * p + 5000)
    grpo, ppo = 1e12 * scale(1) + 2e12 * scale(2), 5e12 * scale(1)
    assert fl["executed_run_flops"] == {"grpo-s0-aaaa": pytest.approx(grpo), "ppo-s0-bbbb": pytest.approx(ppo)}
    assert fl["floor_seconds"] == pytest.approx((warm + grpo + ppo) / 100e9)
    assert 0.6 < (grpo + ppo) / 8e12 < 0.8       # about a third of the counted rows' tokens are prompts


def test_floor_of_a_folder_without_a_quickstart_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no quickstart run"):
        step_report.quickstart_floor(str(tmp_path), 50.0, 2)
