"""bench/profile_step.py (issue 29): a step's op classes add up to its profiled wall time, phase by phase,
and the counted matmul FLOPs are the hand formula of the toy model's step."""
import pytest
import torch

import profile_step  # bench/ is on pytest's pythonpath (pyproject.toml)
from harness.engine.models import build_char_tokenizer


@pytest.fixture(scope="module")
def toy():
    a = profile_step.parse_args(["--shape", "toy", "--warmup", "1", "--plain-steps", "1", "--steps", "2"])
    s = profile_step.shape_args(a, "toy")
    return s, profile_step.profile_shape(s, keep_stage=True)


def test_classes_add_up_to_the_profiled_wall_time_in_every_phase(toy):
    _, res = toy
    assert len(res["profiled_steps"]) == 2
    for step in res["profiled_steps"]:
        assert set(step["classes"]) <= {*profile_step.CLASSES, profile_step.OVERHEAD}
        assert sum(step["classes"].values()) == pytest.approx(step["wall"], rel=1e-9)
        assert sum(v["wall"] for v in step["phases"].values()) == pytest.approx(step["wall"], rel=1e-9)
        for name, v in step["phases"].items():
            assert sum(v["classes"].values()) == pytest.approx(v["wall"], rel=1e-9, abs=1e-12), name
        # the learner's phases and generation are all there, and the step's main classes are seen
        assert {"generate", "reference", "policy_forward", "backward", "optimizer"} <= set(step["phases"])
        for c in ("matmul", "attention", "norms/activations/elementwise", "softmax/log-prob", "optimizer"):
            assert step["classes"].get(c, 0.0) > 0, c
        assert step["classes"][profile_step.OVERHEAD] > 0  # ops' self times never exceed the wall time
    rows = profile_step.class_rows(res)
    assert sum(r["share"] for r in rows[:-1]) == pytest.approx(1.0)
    assert rows[-1]["class"] == "total" and rows[-1]["seconds"] == res["profiled_steps"][res["median_step"]]["wall"]


def test_matmul_flops_are_the_formula(toy):
    s, res = toy
    st = res["stage"]
    ro = st.rollouts
    H, I, L = 32, 64, 2  # the toy shape's model (2 heads: q, k, v are H x H each)
    assert s.model == ["hidden_size=32", "num_layers=2", "num_heads=2", "intermediate_size=64"]
    V = len(build_char_tokenizer())
    per_tok = 2 * L * (3 * H * H + H * H + 2 * I * H + I * H)  # q,k,v,o + gate,up + down, 2 FLOPs per MAC
    head = 2 * V * H  # lm_head (tied embedding), per position whose logits are formed
    n_prompts, B, N = s.prompts, s.prompts * s.group, s.max_new_tokens
    P = ro.prompt_ids.shape[1]
    assert int(ro.completion_mask.sum()) == B * N  # forced length
    # generation: each prompt prefilled once (its last position's logits), then N - 1 decode steps of B rows
    gen = n_prompts * P * per_tok + n_prompts * head + (N - 1) * B * (per_tok + head)
    # a learner forward, per micro-batch: its distinct prompts' P positions, N - 1 completion inputs per row,
    # logits at the N positions that predict a completion token
    fwd = 0
    for lo in range(0, B, s.micro_batch):
        ids, mask = ro.prompt_ids[lo:lo + s.micro_batch], ro.prompt_mask[lo:lo + s.micro_batch]
        U = torch.unique(torch.cat([ids, mask.long()], 1), dim=0).shape[0]
        rows = ids.shape[0]
        fwd += U * P * per_tok + rows * (N - 1) * per_tok + rows * N * head
    got = {p: v.get("matmul", 0) for p, v in res["flops_by_phase"].items()}
    assert got["generate"] == gen
    assert got["reference"] == fwd
    assert got["policy_forward"] == fwd
    assert got["backward"] == 2 * fwd  # input and weight gradients of every product
    assert res["flops"]["matmul"] == gen + 4 * fwd
    assert sum(got.values()) == res["flops"]["matmul"]
