"""harness.engine.evaluate.evaluate and `harness eval`: exact metrics with a scripted sampler, and the
real sampler on the tiny model (the same path as the SmolLM2 test, in seconds)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from evals.records import read_records, summarize, write_records
from harness.engine.evaluate import evaluate
from evals.catalog import get_task
from harness.config.schema import ModelConfig, TaskConfig
from harness.cli.main import COMMAND_MODULES, main as cli_main

ANSWERS = ["1", "2", "3"]


@pytest.fixture
def gsm_file(tmp_path) -> Path:
    f = tmp_path / "test.jsonl"
    f.write_text("".join(json.dumps({"question": f"Problem number {i}?", "answer": f"so\n#### {a}"}) + "\n"
                         for i, a in enumerate(ANSWERS)))
    return f


# completions per problem: greedy (text, finished) and 4 samples
SCRIPT = {
    0: (("#### 1", True), [("#### 1", True), ("#### 2", True), ("#### 1", True), ("#### 3", True)]),
    1: (("#### 3", True), [("#### 5", True), ("#### 2", True), ("#### 2.0", True), ("#### 5", True)]),
    2: (("\\boxed{3}", False), [("no answer", True), ("#### 3", False), ("the answer is 4", True),
                                ("\\boxed{\\frac{6}{2}}", True)]),
}


def scripted_sampler(calls):
    def sample(model, tokenizer, prompts, n=1, max_new_tokens=32, temperature=1.0, top_p=1.0, greedy=False,
               seed=0, batch_size=None):
        calls.append({"prompts": len(prompts), "n": n, "greedy": greedy, "seed": seed,
                      "temperature": temperature, "max_new_tokens": max_new_tokens})
        texts, fin = [], []
        for p in prompts:
            i = int(p.split("Problem number ")[-1].split("?")[0])
            items = [SCRIPT[i][0]] * n if greedy else SCRIPT[i][1][:n]
            texts += [t for t, _ in items]
            fin += [f for _, f in items]
        mask = torch.zeros(len(texts), 8, dtype=torch.long)
        for r, t in enumerate(texts):
            mask[r, :min(len(t), 8)] = 1
        return SimpleNamespace(completions=texts, finished=fin, completion_mask=mask)
    return sample


def test_evaluate_metrics_with_a_scripted_sampler(gsm_file, tmp_path):
    task = get_task(TaskConfig(name="gsm8k", data_path=str(gsm_file), eval_size=3))
    calls = []
    out = tmp_path / "eval" / "gsm8k_0.jsonl"
    m = evaluate(None, None, task, greedy=True, n=4, temperature=0.7, max_new_tokens=16, seed=5, batch_size=8,
                 out_path=out, sampler=scripted_sampler(calls))
    ns = "eval/gsm8k/"
    # greedy: right, wrong, truncated
    assert m[ns + "acc"] == pytest.approx(1 / 3)
    assert m[ns + "answered"] == pytest.approx(2 / 3) and m[ns + "truncated"] == pytest.approx(1 / 3)
    # per-problem pass@k: [.5, 5/6, 1, 1], [.5, 5/6, 1, 1], [.25, .5, .75, 1]
    assert [m[f"{ns}pass@{k}"] for k in range(1, 5)] == pytest.approx(
        [1.25 / 3, (5 / 6 + 5 / 6 + 0.5) / 3, (1 + 1 + 0.75) / 3, 1.0])
    # per-problem maj@k (by hand, ties to the answer seen first):
    # [.5, 5/6, 1, 1], [.5, 1/6, .5, 0] ("2.0" votes with "2"), [.25, 1/3, .25, 0]
    assert [m[f"{ns}maj@{k}"] for k in range(1, 5)] == pytest.approx(
        [1.25 / 3, (5 / 6 + 1 / 6 + 1 / 3) / 3, (1 + 0.5 + 0.25) / 3, 1 / 3])
    assert m[ns + "mean_acc"] == pytest.approx(5 / 12) == m[ns + "pass@1"]
    assert m[ns + "num_problems"] == 3
    # the sampler was asked for greedy (n=1) then sampled (n=4) completions in chunks of batch_size/n prompts
    assert [(c["greedy"], c["n"], c["prompts"]) for c in calls] == [(True, 1, 3), (False, 4, 2), (False, 4, 1)]
    assert all(c["max_new_tokens"] == 16 for c in calls) and calls[1]["temperature"] == 0.7
    assert len({c["seed"] for c in calls[1:]}) == 2
    # records
    recs = read_records(out)
    assert [r["id"] for r in recs] == ["test/0", "test/1", "test/2"]
    assert [r["gold"] for r in recs] == ANSWERS
    assert recs[2]["greedy"] == {"completion": "\\boxed{3}", "answer": None, "key": None, "correct": False,
                                 "finished": False, "num_tokens": 8}
    assert [s["answer"] for s in recs[2]["samples"]] == [None, None, "4", "\\frac{6}{2}"]
    assert [s["key"] for s in recs[1]["samples"]] == ["5", "2", "2", "5"]
    assert [s["correct"] for s in recs[0]["samples"]] == [True, False, True, False]
    assert recs[1]["maj@k"] == pytest.approx([0.5, 1 / 6, 0.5, 0.0]) and recs[2]["num_correct"] == 1
    # everything but the time can be recomputed from the records
    again = summarize(recs, "gsm8k")
    assert again == pytest.approx({k: v for k, v in m.items() if not k.endswith("/seconds")})


def test_evaluate_greedy_only_and_no_samples(gsm_file):
    task = get_task(TaskConfig(name="gsm8k", data_path=str(gsm_file), eval_size=3))
    calls = []
    m = evaluate(None, None, task, task.eval_problems()[:2], n=0, sampler=scripted_sampler(calls))
    assert m["eval/gsm8k/acc"] == 0.5 and m["eval/gsm8k/num_problems"] == 2
    assert not any("pass@" in k or "maj@" in k or "mean_acc" in k for k in m)
    m = evaluate(None, None, task, greedy=False, n=2, sampler=scripted_sampler(calls))
    assert "eval/gsm8k/acc" not in m and "eval/gsm8k/pass@2" in m and "eval/gsm8k/pass@3" not in m


@pytest.fixture(scope="module")
def tiny():
    from harness.engine.models import build_char_tokenizer, build_tiny_model
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                         max_length=1024), tok, seed=0)
    return model, tok


def test_evaluate_with_the_real_sampler_on_the_tiny_model(tiny, tmp_path):
    model, tok = tiny
    task = get_task(TaskConfig(name="gsm8k", eval_size=3))
    kw = dict(greedy=True, n=3, temperature=1.0, max_new_tokens=6, batch_size=4)
    model.train()
    m1 = evaluate(model, tok, task, seed=1, out_path=tmp_path / "a.jsonl", **kw)
    m2 = evaluate(model, tok, task, seed=1, out_path=tmp_path / "b.jsonl", **kw)
    evaluate(model, tok, task, seed=2, out_path=tmp_path / "c.jsonl", **kw)
    a, b, c = (read_records(tmp_path / f) for f in ("a.jsonl", "b.jsonl", "c.jsonl"))
    assert [r["id"] for r in a] == ["test/0", "test/1", "test/2"]
    for r in a:
        assert 1 <= r["greedy"]["num_tokens"] <= 6 and isinstance(r["greedy"]["completion"], str)
        assert len(r["samples"]) == 3 and all(1 <= s["num_tokens"] <= 6 for s in r["samples"])
    assert a == b  # seeded
    assert [s["completion"] for r in a for s in r["samples"]] != [s["completion"] for r in c for s in r["samples"]]
    assert [r["greedy"] for r in a] == [r["greedy"] for r in c]  # greedy does not depend on the seed
    assert {k: v for k, v in m1.items() if "seconds" not in k} == {k: v for k, v in m2.items() if "seconds" not in k}
    pk = [m1[f"eval/gsm8k/pass@{k}"] for k in (1, 2, 3)]
    assert pk == sorted(pk) and m1["eval/gsm8k/mean_acc"] == pytest.approx(pk[0])
    assert model.training is True  # evaluation leaves the model in the mode it found it in
    model.eval()


def test_evaluate_arith_on_the_tiny_model(tiny):
    model, tok = tiny
    task = get_task(TaskConfig(name="arith", eval_size=4))
    m = evaluate(model, tok, task, greedy=True, n=2, max_new_tokens=4, batch_size=8)
    assert m["eval/arith/num_problems"] == 4 and 0.0 <= m["eval/arith/acc"] <= 1.0
    assert "eval/arith/maj@2" in m


def _cli(argv):
    return cli_main(argv)  # through main: it maps errors to exit codes


def test_cli_eval_writes_metrics_and_records(tiny, tmp_path, capsys):
    from harness.engine.models import save_policy
    model, tok = tiny
    save_policy(model, tok, tmp_path / "model")
    out = tmp_path / "out"
    rc = _cli(["eval", "--model", str(tmp_path / "model"), "--task", "gsm8k", "--limit", "2", "--n", "2",
               "--max-new-tokens", "4", "--out", str(out), "--no-progress", "--threads", "1", "--device", "cpu"])
    assert rc == 0
    res = json.loads((out / "gsm8k_metrics.json").read_text())
    assert res["metrics"]["eval/gsm8k/num_problems"] == 2 and "eval/gsm8k/maj@2" in res["metrics"]
    assert res["settings"]["n"] == 2 and res["settings"]["max_new_tokens"] == 4
    assert len(read_records(out / "gsm8k.jsonl")) == 2
    printed = capsys.readouterr().out
    assert "pass@k / maj@k" in printed and "acc" in printed
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    assert _cli(["eval", "--model", str(tmp_path / "model"), "--task", "gsm8k", "--data", str(bad),
                 "--out", str(out)]) == 2
    assert "bad.jsonl:1: missing field 'answer'" in capsys.readouterr().err


def test_eval_is_a_registered_subcommand():
    assert "harness.cli.eval" in COMMAND_MODULES


def test_write_records_that_fails_leaves_the_earlier_file_and_no_temp(tmp_path):
    """A per-problem JSONL write cut short (here: a record that cannot be serialised halfway
    through, standing in for a full disk) raises, removes its ``.tmp`` and keeps the earlier file."""
    path = tmp_path / "eval" / "arith_0.jsonl"
    write_records(path, [{"i": 0}, {"i": 1}])
    with pytest.raises(TypeError):
        write_records(path, [{"i": 0}, {"i": object()}])
    assert read_records(path) == [{"i": 0}, {"i": 1}]
    assert sorted(p.name for p in path.parent.iterdir()) == ["arith_0.jsonl"]
