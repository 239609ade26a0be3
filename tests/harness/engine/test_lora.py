"""LoRA as a model option (harness/engine/lora.py) on the built-in tiny model: the trainable
parameters are the adapters (counted by hand), the reference of a LoRA policy is the frozen base
(the log-probs of a freshly built base, bit for bit) and holds no copy of it, PPO's critic shares
the base's tensors, the fast forward and the sampler compute what PEFT's own forward does, the
config section is left out of run ids while off, and final_model/ holds merged weights that
``from_pretrained`` loads plus the adapter alone that PEFT loads."""
import copy

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from harness.config.schema import load_config
from harness.engine import fastlm
from harness.engine.learner import make_batch, token_logprobs
from harness.engine.lora import (ADAPTER_DIR, AdapterOffView, apply_lora, load_trainable_state, trainable_count,
                                 trainable_state)
from harness.engine.models import build_char_tokenizer, build_tiny_model, save_policy
from harness.engine.sampling import sample
from harness.foundation.base import ConfigError
from harness.rundir.ids import run_id
from harness.tracking.base import config_dict
from harness.train.stage import build_models
from harness.train.warmup import warmup_key

QUICKSTART = "harness/configs/quickstart.yaml"
SMALL = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=48"]
PROMPTS = ["Q:1+2\nA:", "Q:33*4-25\nA:", "Q:7\nA:"]


def _cfg(*sets):
    return load_config(QUICKSTART, SMALL + list(sets))


def _base(cfg, seed=5):
    tok = build_char_tokenizer()
    return build_tiny_model(cfg.model, tok, seed=seed), tok


def _lora_policy(cfg, seed=5):
    """(LoRA policy with its B matrices drawn away from zero, a fresh identical base, tokenizer)."""
    base, tok = _base(cfg, seed)
    fresh, _ = _base(cfg, seed)
    torch.manual_seed(0)
    policy = apply_lora(base, cfg.model.lora)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.2)
    return policy, fresh, tok


def _batch(policy, tok):
    ro = sample(policy, tok, PROMPTS, n=3, max_new_tokens=8, seed=1)
    return ro, make_batch(ro, "cpu")


def test_trainable_parameters_are_the_adapters_counted_by_hand():
    h, i, L, r = 32, 48, 2, 3
    every = _cfg(f"model.lora.rank={r}")
    policy = apply_lora(_base(every)[0], every.model.lora)
    # per layer: q, k, v, o (h -> h): r (h + h) each; gate, up (h -> i) and down (i -> h): r (h + i) each
    assert trainable_count(policy) == L * r * (4 * 2 * h + 3 * (h + i)) == 2 * 3 * (256 + 240)
    two = _cfg(f"model.lora.rank={r}", "model.lora.target_modules=[q_proj,down_proj]")
    policy = apply_lora(_base(two)[0], two.model.lora)
    assert trainable_count(policy) == L * r * (2 * h + (i + h))
    names = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert all(("q_proj" in n or "down_proj" in n) for n in names)
    off = _cfg()
    assert apply_lora(_base(off)[0], off.model.lora).__class__.__name__ == "LlamaForCausalLM"  # rank 0: untouched


@pytest.mark.parametrize("fast", [True, False], ids=["fastlm", "transformers"])
def test_reference_is_the_frozen_base_and_holds_no_copy(fast):
    cfg = _cfg("model.lora.rank=4")
    policy, fresh, tok = _lora_policy(cfg)
    models = build_models(policy, cfg.algo, "cpu")
    ref = models.reference
    assert isinstance(ref, AdapterOffView) and list(ref.parameters()) == []   # no weights of its own
    assert fastlm._unwrap(ref)[0] is policy.get_base_model()                   # it computes with the policy's
    ro, b = _batch(policy, tok)
    with torch.no_grad(), (fastlm.disabled() if not fast else torch.no_grad()):
        assert fastlm.supported(ref) == fast and fastlm.supported(policy) == fast
        ref_lp, base_lp, pol_lp = (token_logprobs(m, b) for m in (ref, fresh, policy))
    # the base: bit for bit on the fast path (the learner's for Llama models); through PEFT's own forward
    # (adapters disabled) within float rounding (portable numerics' products differ there in the last bits)
    assert torch.equal(ref_lp, base_lp) if fast else (ref_lp - base_lp).abs().max() < 2e-6
    assert (pol_lp - base_lp).abs().max() > 0.05                                # the adapters do change the policy
    # the base's weights exist once: the policy's frozen tensors are the ones the reference reads
    ptrs = {p.data_ptr() for p in policy.parameters() if not p.requires_grad}
    assert {p.data_ptr() for p in ref.lm_head.parameters()} <= ptrs


def test_ppo_critic_shares_the_frozen_base_and_trains_its_own_adapters():
    cfg = _cfg("model.lora.rank=4", "algorithm=ppo")
    policy, _, _ = _lora_policy(cfg)
    critic = build_models(policy, cfg.algo, "cpu").critic
    frozen = {p.data_ptr() for p in policy.parameters() if not p.requires_grad}
    mine = [p for p in critic.parameters() if p.requires_grad]
    assert {p.data_ptr() for p in critic.parameters() if not p.requires_grad} <= frozen   # shared, not copied
    assert not {p.data_ptr() for p in mine} & {p.data_ptr() for p in policy.parameters()}
    assert sum(p.numel() for p in mine) == trainable_count(policy) + cfg.model.hidden_size + 1  # adapters + head


@pytest.mark.parametrize("layout", ["fused", "unfused", "mixed"])
def test_fast_forward_and_sampler_compute_what_peft_computes(layout, monkeypatch):
    """fused: q|k|v and gate|up adapted as one weight each (small models); unfused: the projections one by one
    (larger models); mixed: q_proj and down_proj adapted only (q|k|v then unfused, gate|up fused plain)."""
    if layout == "unfused":
        monkeypatch.setattr(fastlm, "FUSE_MAX_PARAMS", 0)
    targets = ["model.lora.target_modules=[q_proj,down_proj]"] if layout == "mixed" else []
    cfg = _cfg("model.lora.rank=4", "model.lora.alpha=8", *targets)
    policy, _, tok = _lora_policy(cfg)
    layer = policy.get_base_model().model.layers[0]
    kinds = [type(w).__name__ for w in fastlm._weights(layer, fastlm._fuse(policy.get_base_model().model,
                                                                           fastlm.FUSE_MAX_PARAMS))]
    assert kinds[1] == {"fused": "_Lora", "unfused": "tuple", "mixed": "tuple"}[layout]           # q|k|v
    assert kinds[4] == {"fused": "_Lora", "unfused": "tuple", "mixed": "Tensor"}[layout]          # gate|up
    ro, b = _batch(policy, tok)
    assert fastlm.supported(policy)
    fast = token_logprobs(policy, b)
    with fastlm.disabled():
        slow = token_logprobs(policy, b)                                        # PEFT's own forward
    assert ((fast - slow) * b.mask).abs().max() < 1e-5                         # where a real token is predicted
    assert ((ro.logprobs - fast) * b.mask).abs().max() < 1e-5                    # the sampler (merged weights)
    g_fast = torch.autograd.grad((fast * b.mask).sum(), [p for p in policy.parameters() if p.requires_grad])
    with fastlm.disabled():
        slow = token_logprobs(policy, b)
    g_slow = torch.autograd.grad((slow * b.mask).sum(), [p for p in policy.parameters() if p.requires_grad])
    assert max((x - y).abs().max().item() for x, y in zip(g_fast, g_slow)) < 1e-4
    assert all(x.abs().sum() > 0 for x in g_fast)                               # every adapter gets a gradient


def test_trainable_state_is_the_adapters_and_loads_back_exactly():
    cfg = _cfg("model.lora.rank=2")
    policy, _, _ = _lora_policy(cfg)
    state = trainable_state(policy)
    assert set(state) == {n for n, p in policy.named_parameters() if p.requires_grad}
    other, _, _ = _lora_policy(cfg)
    with torch.no_grad():
        for n, p in other.named_parameters():
            if p.requires_grad:
                p.zero_()
    load_trainable_state(other, state)
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), other.state_dict().values()))
    with pytest.raises(KeyError, match="missing"):
        load_trainable_state(other, {k: v for k, v in state.items() if "lora_B" not in k})


def test_final_model_is_the_merged_policy_and_the_adapter_loads_in_peft(tmp_path):
    cfg = _cfg("model.lora.rank=4")
    policy, fresh, tok = _lora_policy(cfg)
    save_policy(policy, tok, tmp_path / "final_model")
    ro, b = _batch(policy, tok)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final_model")
    assert type(merged).__name__ == "LlamaForCausalLM"
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "final_model" / ADAPTER_DIR)
    peft_merged = copy.deepcopy(reloaded).merge_and_unload()
    with torch.no_grad():
        lp, lp_merged, lp_peft, lp_pm = (token_logprobs(m, b) for m in (policy, merged, reloaded, peft_merged))
    assert torch.equal(lp_peft, lp)                                             # the adapter alone: the policy
    assert torch.equal(lp_merged, lp_pm)                                        # final_model: PEFT's own merge
    assert (lp_merged - lp).abs().max() < 1e-5                                  # = the policy, up to rounding
    with torch.no_grad():
        assert (lp_merged - token_logprobs(_base(cfg)[0], b)).abs().max() > 0.05   # not the base's weights


def test_lora_section_is_left_out_of_run_ids_while_off_and_of_the_warmup_key_and_reaches_the_trackers():
    assert run_id(_cfg()) == run_id(_cfg("model.lora.rank=0", "model.lora.alpha=3"))
    on = _cfg("model.lora.rank=8", "model.lora.alpha=16")
    assert run_id(on) != run_id(_cfg())
    assert warmup_key(on) == warmup_key(_cfg())                                 # one warm-up serves both
    assert "lora" not in config_dict(_cfg())["model"]
    assert config_dict(on)["model"]["lora"] == {"rank": 8, "alpha": 16.0, "target_modules": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


@pytest.mark.parametrize("sets,field", [
    (["model.lora.target_modules=[lm_head]"], "model.lora.target_modules"),
    (["model.lora.target_modules=[q_proj,q_proj]"], "model.lora.target_modules"),
    (["model.lora.rank=-1"], "model.lora.rank"),
    (["algorithm=grpo_iter", "algorithm.ref_reset_every=2"], "algorithm.ref_reset_every"),
    (["train.reuse_warmup_optimizer=true"], "train.reuse_warmup_optimizer"),
])
def test_what_lora_cannot_hold_is_refused_naming_the_field(sets, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        _cfg("model.lora.rank=2", *sets)


def _values_and_grads(policy, b):
    lp = token_logprobs(policy, b)
    return lp, torch.autograd.grad((lp * b.mask).sum(), [p for p in policy.parameters() if p.requires_grad])


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recomputed_lora_layers_give_the_same_bits(mode, monkeypatch):
    """Layer recomputation in backward (fastlm.recompute_plan; selective: LoRA's B products recomputed from
    the kept A products, not kept) changes no value and no gradient of a LoRA policy, bit for bit."""
    cfg = _cfg("model.lora.rank=4")
    policy, _, tok = _lora_policy(cfg)
    ro, b = _batch(policy, tok)
    monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", 2**62)
    kept = _values_and_grads(policy, b)
    monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", -1)
    monkeypatch.setattr(fastlm, "RECOMPUTE", mode)
    monkeypatch.setattr(fastlm, "RECOMPUTE_BUDGET_BYTES", float("inf"))
    plans = []
    real = fastlm.recompute_plan
    monkeypatch.setattr(fastlm, "recompute_plan", lambda *a: plans.append(real(*a)) or plans[-1])
    again = _values_and_grads(policy, b)
    assert plans and set(plans[0]) == {mode}
    assert torch.equal(kept[0], again[0]) and all(torch.equal(x, y) for x, y in zip(kept[1], again[1]))
    assert fastlm._lora_up_ptrs(policy.get_base_model().model.layers[0])              # the B matrices are found


def test_paged_sampler_samples_the_adapted_policy():
    """``sampling.backend=paged`` (transformers' continuous batching) runs PEFT's modules: its log-probs are
    the LoRA policy's, not the base's."""
    cfg = _cfg("model.lora.rank=4")
    policy, fresh, tok = _lora_policy(cfg)
    ro = sample(policy, tok, PROMPTS, n=2, max_new_tokens=6, seed=1, backend="paged")
    b = make_batch(ro, "cpu")
    with torch.no_grad():
        lp, base = token_logprobs(policy, b), token_logprobs(fresh, b)
    assert ((ro.logprobs - lp) * b.mask).abs().max() < 1e-5
    assert ((ro.logprobs - base) * b.mask).abs().max() > 0.05
