"""Valid-step metrics (issue 30 item 5): a sample counts for valid_pass@k / valid_maj@k /
valid_acc only when it is correct and every process step reward is 1. Values worked by hand."""
from types import SimpleNamespace

import pytest

from evals.arith import ArithTask
from evals.metrics import maj_at_k_bruteforce
from evals.records import record_item, summarize, valid_keys
from harness.engine.evaluate import N_DRAW_MAX, evaluate

TASK = ArithTask()
P = TASK.make_problem("3+4*2-5")  # = 6, K = 3 operations

VALID = "4*2=8;3+8=11;11-5=6;#6"      # correct, every step 1
SKIPPED = "4*2=8;#6"                  # right answer over two skipped steps: correct, not valid
WRONG_STEP = "4*2=8;3+8=11;11-5=7;#6"  # a wrong step value, right final answer: correct, not valid
WRONG = "4*2=8;3+8=11;11-5=6;#7"      # wrong answer


def item(c):
    return record_item(TASK, c, P, True, 10, keep_text=False)


def test_items_flag_valid():
    assert [item(c)["correct"] for c in (VALID, SKIPPED, WRONG_STEP, WRONG)] == [True, True, True, False]
    assert [item(c)["valid"] for c in (VALID, SKIPPED, WRONG_STEP, WRONG)] == [True, False, False, False]
    # truncated: neither correct nor valid
    t = record_item(TASK, VALID, P, False, 10, keep_text=False)
    assert (t["correct"], t["valid"]) == (False, False)


def test_task_without_process_rewards_has_no_valid_field():
    class Plain:
        name = "plain"
        has_process_rewards = False

        def is_correct(self, c, p, finished=True):
            return True

        def extract_answer(self, c):
            return "6"

    it = record_item(Plain(), "x", P, True, 1, keep_text=False)
    assert "valid" not in it
    m = summarize([{"greedy": it, "samples": [it, it]}], "plain")
    assert not any("valid" in k for k in m)


def test_summarize_valid_metrics_by_hand():
    samples = [item(c) for c in (VALID, SKIPPED, WRONG, VALID)]
    rec = {"id": P.id, "greedy": item(SKIPPED), "samples": samples}
    m = summarize([rec], "arith")
    ns = "eval/arith"
    # the existing metrics are as before (3 of 4 correct)
    assert m[f"{ns}/acc"] == 1.0 and m[f"{ns}/mean_acc"] == 0.75
    assert m[f"{ns}/pass@2"] == pytest.approx(1.0)          # 1 - C(1,2)/C(4,2)
    # valid: 2 of 4; the greedy completion skipped steps
    assert m[f"{ns}/valid_acc"] == 0.0
    assert m[f"{ns}/valid_mean_acc"] == 0.5
    assert m[f"{ns}/valid_pass@1"] == pytest.approx(0.5)
    assert m[f"{ns}/valid_pass@2"] == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2)
    assert m[f"{ns}/valid_pass@3"] == pytest.approx(1.0)
    # valid maj@k: the skipped sample votes for ('invalid', 6), a wrong answer of its own.
    # maj@1 = 2/4; maj@2 over the 6 pairs: only {SKIPPED, WRONG} (a tie won by the invalid key,
    # which appears first) misses: 5/6; maj@4: 6 has 2 votes, the others 1: 1.
    assert m[f"{ns}/valid_maj@1"] == pytest.approx(0.5)
    assert m[f"{ns}/valid_maj@2"] == pytest.approx(5 / 6)
    assert m[f"{ns}/valid_maj@4"] == pytest.approx(1.0)
    keys, ok = valid_keys(samples), [s["valid"] for s in samples]
    for k in range(1, 5):
        assert m[f"{ns}/valid_maj@{k}"] == pytest.approx(maj_at_k_bruteforce(keys, ok, k))
    # plain maj@4: 6 has 3 votes
    assert m[f"{ns}/maj@4"] == pytest.approx(1.0)


def test_old_records_without_valid_give_old_metrics_only():
    samples = [item(c) for c in (VALID, SKIPPED)]
    for s in samples:
        del s["valid"]
    m = summarize([{"greedy": None, "samples": samples}], "arith")
    assert m["eval/arith/mean_acc"] == 1.0
    assert not any("valid" in k for k in m)


def test_large_n_is_drawn_in_bounded_draws():
    """n > 256 (and > batch_size): one problem at a time, in draws of <= 256 sequences; n <= 256
    keeps the one call per chunk of before (same seeds)."""
    calls = []

    def sampler(model, tokenizer, prompts, *, n, max_new_tokens, temperature, top_p, greedy, seed, batch_size):
        calls.append((len(prompts), n, seed))
        return SimpleNamespace(completions=[VALID if (seed + j) % 2 else SKIPPED for j in range(len(prompts) * n)],
                               finished=[True] * (len(prompts) * n), completion_mask=None)

    probs = [P, TASK.make_problem("1+2")]
    m = evaluate(None, None, TASK, probs, greedy=False, n=600, batch_size=64, sampler=sampler)
    assert N_DRAW_MAX == 256
    assert [(k, n) for k, n, _ in calls] == [(1, 256), (1, 256), (1, 88)] * 2
    assert len({s for *_, s in calls}) == 6  # a seed per draw
    assert m["eval/arith/num_problems"] == 2 and "eval/arith/valid_pass@600" in m
    calls.clear()
    evaluate(None, None, TASK, probs, greedy=False, n=64, batch_size=128, sampler=sampler)
    assert calls == [(2, 64, 1 * 1_000_003 + 0)]  # as before: seed + 1 for samples, chunk 0
