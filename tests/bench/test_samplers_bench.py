"""bench/samplers.py: its worker's measurement (forced length: every row exactly the asked tokens, on
every backend), the summary's arithmetic on hand-made timings, and its refusals of bad input (one
line, exit 2, before any work)."""
import pytest

from harness.config.schema import ModelConfig
from harness.engine.models import build_char_tokenizer, build_tiny_model
import samplers  # bench/samplers.py: bench/ is on pytest's pythonpath (pyproject.toml)


class _Task:
    """The prompts a worker draws: stands in for the quickstart task (only the two calls it makes)."""

    def sample_train(self, rng, n):
        return [f"{rng.randint(1, 9)}+{rng.randint(1, 9)}" for _ in range(n)]

    def format_prompt(self, p):
        return f"Q:{p}\nA:"


@pytest.mark.parametrize("backend", ["hf", "paged"])
def test_every_row_decodes_exactly_the_asked_tokens(backend):
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok,
                             seed=0)
    cells = [(1, 5), (8, 7)]  # 1 prompt x 1 sample; 2 prompts x G = 4
    out = samplers.measure(backend, model, tok, _Task(), cells, group=4, warmup=1, reps=2, temperature=1.0, seed=0)
    assert [(c["rows"], c["length"]) for c in out] == cells
    assert [c["tokens"] for c in out] == [[5, 5], [56, 56]]
    assert all(len(c["seconds"]) == 2 and min(c["seconds"]) > 0 for c in out)


def test_rows_are_prompts_times_group():
    assert [samplers.rows_split(r, 8) for r in (1, 4, 8, 16, 64)] == [(1, 1), (1, 4), (1, 8), (2, 8), (8, 8)]


def _worker(backend, rnd, secs_by_cell):
    return {"backend": backend, "round": rnd,
            "cells": [{"rows": r, "length": L, "seconds": s, "tokens": [r * L] * len(s)}
                      for (r, L), s in secs_by_cell.items()]}


def test_summary_medians_paired_ratios_and_winner():
    # 8 rows x 10 tokens = 80 tokens per call; hf takes 0.1/0.2/0.4 s (round 0) and 0.2/0.2/0.2 s
    # (round 1): 800/400/200 and 400/400/400 tok/s; paged 0.4 s in both rounds (200 tok/s); at 1 row x
    # 10 tokens paged is faster (0.01 s = 1000 tok/s vs hf's 0.02 s = 500 tok/s)
    results = {
        "hf": [_worker("hf", 0, {(8, 10): [0.1, 0.2, 0.4], (1, 10): [0.02]}),
               _worker("hf", 1, {(8, 10): [0.2, 0.2, 0.2], (1, 10): [0.02]})],
        "paged": [_worker("paged", 0, {(8, 10): [0.4, 0.4, 0.4], (1, 10): [0.01]}),
                  _worker("paged", 1, {(8, 10): [0.4, 0.4, 0.4], (1, 10): [0.01]})],
    }
    summary = samplers.summarize(results)
    assert [(s["rows"], s["length"]) for s in summary] == [(1, 10), (8, 10)]
    one, eight = summary
    hf, paged = eight["backends"]["hf"], eight["backends"]["paged"]
    assert hf["tokens_per_s"] == pytest.approx(400.0)  # median of 800, 400, 200, 400, 400, 400
    assert hf["per_round"] == pytest.approx([400.0, 400.0])  # each round's median call
    assert paged["tokens_per_s"] == pytest.approx(200.0) and paged["ratio_to_hf"] == pytest.approx([0.5, 0.5])
    assert hf["tokens_per_call"] == [80] and eight["winner"] == "hf"
    assert one["winner"] == "paged" and one["backends"]["paged"]["ratio_to_hf"] == pytest.approx([2.0, 2.0])


@pytest.mark.parametrize("argv,words", [
    (["--rows", "12"], "12 is above the group size 8"),
    (["--rows", "0,8"], "--rows: expected positive integers"),
    (["--lengths", "long"], "--lengths: expected positive integers"),
    (["--backends", "hf,nope"], "unknown backend 'nope'"),
    (["--reps", "0"], "--reps: must be >= 1"),
    (["--shape", "huge"], "invalid choice: 'huge'"),
    (["--model", "hidden_size=-3"], "--model:"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        samplers.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err


def test_vllm_is_refused_where_it_does_not_import(capsys):
    if samplers.vllm_sampler.available():
        pytest.skip("vllm imports here")
    with pytest.raises(SystemExit) as e:
        samplers.main(["--backends", "vllm"])
    assert e.value.code == 2 and "vllm is not available here" in capsys.readouterr().err
    assert samplers.resolve_backends("all", "cuda") == ["hf", "paged"]
