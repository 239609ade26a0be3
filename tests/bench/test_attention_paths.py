"""bench/attention_paths.py: every contender computes attention (against a float64 loop over rows, heads and
queries), the harness's paths are the ones the bench calls its own (same bits as fastlm's), and the script's
table and JSON carry each case with its calls per step."""
import json
import math

import pytest
import torch

import attention_paths as ap  # bench/ is on pytest's pythonpath (pyproject.toml)


def _brute(q, k, v, allowed):
    """softmax over the allowed keys of q.k / sqrt(d), times v, one query at a time in float64."""
    B, H, T, D = q.shape
    out = torch.zeros(B, H, T, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                s = [float(q[b, h, t].double() @ k[b, h, j].double()) / math.sqrt(D) if allowed[b, 0, t, j]
                     else -math.inf for j in range(k.shape[2])]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                z = sum(w)
                out[b, h, t] = sum((wi / z) * v[b, h, j].double() for j, wi in enumerate(w))
    return out


def _fmask(m):
    return torch.zeros(m.shape).masked_fill(~m, float("-inf"))


@pytest.mark.parametrize("which", ["completion", "prompt"])
def test_learner_contenders_compute_attention(which):
    if which == "completion":
        q, k, v, m = ap.learner_inputs(rows=3, heads=2, head_dim=8, prompt=4, completion=5, seed=3)
    else:
        q, k, v, m = ap.prompt_inputs(rows=3, heads=2, head_dim=8, prompt=6, seed=3)
    assert not m.all() and m.any(-1).all()  # padding present, no query without a key
    want = _brute(q, k, v, m)
    for name, fn in ap.LEARNER.items():
        got = fn(q, k, v, m, _fmask(m))
        assert torch.allclose(got.double(), want, atol=2e-6), name


def test_decode_contenders_compute_attention_and_bmm_is_the_decode_step():
    g = torch.Generator().manual_seed(0)
    BH, L, D, t = 6, 9, 8, 7
    q, K, V = torch.randn(BH, 1, D, generator=g), torch.randn(BH, L, D, generator=g), torch.randn(BH, L, D, generator=g)
    bias = torch.zeros(BH, L)
    bias[0, 2] = bias[3, 0] = float("-inf")
    allowed = (bias[:, :t] == 0)[:, None, None, :]  # [BH, 1, 1, t]
    want = _brute(q[:, None], K[:, None, :t], V[:, None, :t], allowed)[:, 0]
    for name, fn in ap.DECODE.items():
        assert torch.allclose(fn(q, K, V, bias, t).double(), want, atol=2e-6), name
    # the harness's decode attention, as fastlm.DecodeState.step writes it (one query per kv head: groups 1)
    s = torch.bmm(q, K[:, :t].transpose(1, 2))
    p = torch.softmax(s.view(BH, 1, t) * D ** -0.5 + bias[:, None, :t], -1)
    assert torch.equal(torch.bmm(p.view(BH, 1, t), V[:, :t]), ap.decode_bmm(q, K, V, bias, t))


def test_report_at_toy_size(tmp_path, capsys):
    out = tmp_path / "attn.json"
    assert ap.main(["--rounds", "1", "--reps", "2", "--rows", "4", "--prompts", "2", "--decode-rows", "4",
                    "--prompt", "4", "--completion", "5", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert set(data["cases"]) == set(ap.CALLS)
    for case, rec in data["cases"].items():
        assert f"## {case}: {ap.CALLS[case]} calls per step" in text
        first, *others = rec["paths"].values()
        assert first["same_bits"] and first["max_abs_diff"] == 0 and first["step_saving_s"] == 0
        assert all(o["max_abs_diff"] < 1e-5 for o in others)
        assert all(len(p["seconds"]) == 1 and p["median_s"] > 0 for p in rec["paths"].values())
    same = sum(o["same_bits"] for rec in data["cases"].values() for o in list(rec["paths"].values())[1:])
    assert data["other_paths_same_bits"] == [same, 9]
    assert f"{same} of the 9 other paths gave the harness's bits" in text
