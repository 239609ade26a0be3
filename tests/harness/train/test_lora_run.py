"""A LoRA run (``model.lora.rank`` > 0) through the trainer on a tiny model: GRPO (KL to the reference, the
policy with its adapters off) and PPO (a critic sharing the frozen base). Stopped by Ctrl-C after step 2 and
resumed, it ends bit for bit where the same run uninterrupted ends (adapters and metrics); its resume point
holds the adapters and their optimizer state, not the frozen base; ``final_model/`` is the merged policy
that ``from_pretrained`` loads (the adapter alone in ``final_model/adapter/``) and ``harness eval`` scores
it as the run's final evaluation did; the summary counts the trainable parameters and no reference copy.

The untrained tiny model scores 0 on arith, which leaves GRPO nothing to learn: the trainer's scorer is
replaced by a fixed function of each completion's text (:func:`_reward`), so the groups are mixed and the
adapters move."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from harness.cli.main import main
from harness.config.schema import load_config
from harness.rundir.layout import read_jsonl
from harness.train import loop
from harness.train.checkpoint import checkpoint_path
from harness.train.loop import run_dir, train

QUICKSTART = "harness/configs/quickstart.yaml"
TINY = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=4", "warmup.steps=0",
    "sampling.samples_per_prompt=4", "sampling.max_new_tokens=6", "train.prompts_per_step=2",
    "train.threads=1", "budget.unit=steps", "budget.amount=4", "budget.eval_points=2",
    "eval.greedy=true", "eval.n=0", "train.checkpoint_minutes=0", "train.lr=0.05", "train.lr_warmup_steps=0",
    "model.lora.rank=2", "model.lora.alpha=4",
]
RANK, H, I = 2, 16, 32
ADAPTERS = RANK * (4 * 2 * H + 3 * (H + I))  # one layer, all seven linear layers adapted


def _reward(text: str) -> float:
    return float(sum(map(ord, text)) % 2)


def _score(task, problems_rep, rollouts, prm=None):
    return torch.tensor([_reward(c) for c in rollouts.completions]), []


@pytest.fixture(autouse=True)
def mixed_rewards(monkeypatch):
    monkeypatch.setattr(loop, "score", _score)


def _cfg(root: Path, cache: Path, algo: str):
    return load_config(QUICKSTART, TINY + [f"output_dir={root}", f"warmup.cache_dir={cache}", f"algorithm={algo}"])


def _train_rows(out: Path) -> list:
    keys = ("step", "train/loss", "train/kl", "train/value_loss", "rollout/reward_mean", "train/grad_norm")
    return [{k: r[k] for k in keys if k in r} for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]


def _adapter(out: Path) -> dict:
    return load_file(out / "final_model" / "adapter" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{algorithm: (uninterrupted run dir, resumed run dir, resume point as it was after step 2)}."""
    root = tmp_path_factory.mktemp("lora")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "score", _score)
        for algo in ("grpo", "ppo"):
            whole = _cfg(root / "whole", root / "wc", algo)
            train(whole, progress=False)
            cut = _cfg(root / "cut", root / "wc", algo)
            real = loop._stage

            def stage(run, k, real=real):
                if k == 2:
                    raise KeyboardInterrupt("injected stop")
                return real(run, k)

            mp.setattr(loop, "_stage", stage)
            with pytest.raises(KeyboardInterrupt):
                train(cut, progress=False)
            mp.setattr(loop, "_stage", real)
            point = root / f"{algo}_state.pt"
            shutil.copy(checkpoint_path(run_dir(cut)), point)
            summary = train(cut, progress=False)
            assert summary["resumed_from_step"] == 2
            out[algo] = (run_dir(whole), run_dir(cut), point)
    return out


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_resumed_lora_run_ends_bit_for_bit_where_the_whole_run_ends(runs, algo):
    whole, cut, _ = runs[algo]
    a, b = _adapter(whole), _adapter(cut)
    assert a.keys() == b.keys() and len(a) == 14                               # A and B of 7 layers
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(v.abs().sum() > 0 for k, v in a.items() if "lora_B" in k)       # the adapters did move
    assert _train_rows(whole) == _train_rows(cut) and len(_train_rows(cut)) == 4
    ends = [{k: v for k, v in json.loads((d / "summary.json").read_text())["final_eval"].items()
             if not k.endswith("/seconds")} for d in (whole, cut)]
    assert ends[0] == ends[1]
    assert (whole / "eval" / "arith_4.jsonl").read_text() == (cut / "eval" / "arith_4.jsonl").read_text()


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_resume_point_holds_the_adapters_and_their_optimizer_state_not_the_base(runs, algo):
    _, _, point = runs[algo]
    learner = torch.load(point, weights_only=True)["learner"]
    assert learner["policy"] and all(".lora_A." in k or ".lora_B." in k for k in learner["policy"])
    assert sum(v.numel() for v in learner["policy"].values()) == ADAPTERS
    assert len(learner["opt"]["state"]) == len(learner["policy"])             # Adam moments for the adapters only
    if algo == "ppo":
        assert all(".lora_" in k or k.startswith("head.") for k in learner["critic"])
        assert len(learner["critic_opt"]["state"]) == len(learner["critic"])


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_summary_counts_the_adapters_and_no_copy_of_the_base(runs, algo):
    whole, _, _ = runs[algo]
    s = json.loads((whole / "summary.json").read_text())
    assert s["params"]["policy_trainable"] == ADAPTERS
    assert s["params"]["reference"] == 0 and s["param_mb"]["reference"] == 0.0
    assert s["params"]["critic"] == (ADAPTERS + H + 1 if algo == "ppo" else 0)   # its adapters and head


def test_final_model_loads_merged_and_harness_eval_scores_it_as_the_run_did(runs, tmp_path):
    whole, _, _ = runs["grpo"]
    fm = whole / "final_model"
    merged = AutoModelForCausalLM.from_pretrained(fm)
    assert type(merged).__name__ == "LlamaForCausalLM" and not any("lora" in k for k in merged.state_dict())
    assert (fm / "adapter" / "adapter_config.json").is_file()
    assert main(["eval", "--model", str(fm), "--no-progress", "--output-dir", str(tmp_path)]) == 0
    scored = json.loads((tmp_path / "arith_metrics.json").read_text())["metrics"]
    final = json.loads((whole / "summary.json").read_text())["final_eval"]
    assert scored["eval/arith/acc"] == final["eval/arith/acc"]
    # the same greedy completions, problem by problem, as the run's own final evaluation (the unmerged policy)
    greedy = [[(r["id"], r["greedy"]["completion"]) for r in read_jsonl(f)]
              for f in (tmp_path / "arith.jsonl", whole / "eval" / "arith_4.jsonl")]
    assert greedy[0] == greedy[1] and len(greedy[0]) == 4
    assert len({c for _, c in greedy[0]}) > 1 or greedy[0][0][1] != "::::"   # not the untrained model's output
