"""Compact per-problem records (evals.records.compact_record): no texts, no per-sample items, and
still exact: the curves at every k come back from the counts and answer histograms."""
import json
import random

from evals.metrics import maj_at_k_bruteforce
from evals.records import compact_curves, compact_ks, compact_record, summarize, valid_keys


def _record(rng, n, gold="7"):
    samples = []
    for _ in range(n):
        r = rng.random()
        key = None if r < 0.1 else gold if r < 0.45 else str(rng.randrange(12))
        correct = key == gold
        samples.append({"completion": "x" * 30, "answer": key, "key": key, "correct": correct,
                        "finished": key is not None, "num_tokens": 30, "valid": correct and rng.random() < 0.7})
    greedy = dict(samples[0], completion="the greedy text")
    return {"id": "3+4", "question": "3+4", "gold": gold, "greedy": greedy, "samples": samples}


def test_compact_ks():
    assert compact_ks(1) == [1]
    assert compact_ks(8) == [1, 2, 4, 8]
    assert compact_ks(12) == [1, 2, 4, 8, 12]
    assert compact_ks(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_hand_computed_small_record():
    # keys a, b, a, None, b with a right: groups [a 2 right], [b 2 wrong], one sample without a key
    s = [{"key": k, "correct": k == "a", "valid": v} for k, v in
         [("a", True), ("b", False), ("a", False), (None, False), ("b", False)]]
    for x in s:
        x.update(answer=x["key"], finished=True, num_tokens=3, completion="t")
    c = compact_record({"id": "p", "gold": "a", "greedy": None, "samples": s})
    assert c["answers"] == [["a", 2, True], ["b", 2, False]] and c["no_answer"] == 1
    # the correct-but-invalid second "a" votes for ("invalid", "a"), a wrong answer of its own
    assert c["valid_answers"] == [["a", 1, True], ["b", 2, False], [("invalid", "a"), 1, False]]
    assert c["num_correct"] == 2 and c["num_valid"] == 1 and c["ks"] == [1, 2, 4, 5]
    # pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 0.7; maj@1 = 2/5
    assert abs(c["pass@k"][0] - 0.4) < 1e-12 and abs(c["pass@k"][1] - 0.7) < 1e-12
    assert abs(c["maj@k"][0] - 0.4) < 1e-12 and abs(c["valid_pass@k"][0] - 0.2) < 1e-12
    assert "completion" not in json.dumps(c) and "samples" not in c


def test_curves_come_back_exactly_and_match_summarize():
    rng = random.Random(5)
    recs = [_record(rng, 24) for _ in range(6)]
    full = summarize(recs, "arith")
    compact = [json.loads(json.dumps(compact_record(r))) for r in recs]  # through JSON, as committed
    for r, c in zip(recs, compact):
        curves = compact_curves(c)
        for k in (1, 3, 24):  # against brute force over every k-subset
            assert abs(curves["maj@k"][k - 1] - maj_at_k_bruteforce([s["key"] for s in r["samples"]],
                                                                    [s["correct"] for s in r["samples"]], k)) < 1e-12
            vk = valid_keys(r["samples"])
            assert abs(curves["valid_maj@k"][k - 1] - maj_at_k_bruteforce(vk, [s["valid"] for s in r["samples"]], k)) < 1e-12
        for name in ("pass@k", "maj@k", "valid_pass@k", "valid_maj@k"):
            assert [curves[name][k - 1] for k in c["ks"]] == c[name]  # the kept values are the same floats
    for name in ("pass", "maj", "valid_pass", "valid_maj"):
        for k in (1, 2, 16, 24):
            mean = sum(compact_curves(c)[f"{name}@k"][k - 1] for c in compact) / len(compact)
            assert abs(mean - full[f"eval/arith/{name}@{k}"]) < 1e-12
