"""Model FLOPs of a stage (harness.train.flops), by hand on a tiny Llama: F(T) = 2 M T + 4 A L T(T+1)/2
per forward, 3 F for a forward with its backward, and which passes each algorithm asks for."""
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from harness.config.schema import load_config
from harness.engine.learner import ValueModel
from harness.train.flops import drawn_stage_flops, forward_flops, matmul_weights, stage_flops

QS = "harness/configs/quickstart.yaml"


@pytest.fixture(scope="module")
def tiny():
    cfg = LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=12, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def test_forward_flops_by_hand(tiny):
    # per layer: q 8x8, k 8x4, v 8x4 (one KV head of width 4), o 8x8, gate/up 8x12 each, down 12x8; LM head 8x10
    per_layer = 64 + 32 + 32 + 64 + 96 + 96 + 96
    assert matmul_weights(tiny) == 2 * per_layer + 80
    M = 2 * per_layer + 80
    lengths = torch.tensor([3, 5])
    # 2 M T over 8 tokens; attention 4 * A * L * T(T+1)/2 with A = 2 heads x 4 = 8, L = 2: pairs 6 + 15
    assert forward_flops(tiny, lengths) == 2 * M * 8 + 4 * 8 * 2 * (6 + 15)


def _rollouts():
    # two rows: prompts of 2 and 3 real tokens (left-padded), completions of 3 and 1 real tokens
    return SimpleNamespace(prompt_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]),
                           completion_mask=torch.tensor([[1, 1, 1], [1, 0, 0]]))


def _learner(policy, algo_cfg, critic=None, steps_per_batch=1, sampler_usable=True):
    needs_old = steps_per_batch > 1 or algo_cfg.algo.kl_placement == "reward"  # as Learner.needs_old_logprobs
    return SimpleNamespace(policy=policy, reference=policy if algo_cfg.algo.uses_reference else None, critic=critic,
                           steps_per_batch=steps_per_batch, needs_old_logprobs=needs_old,
                           sampler_logprobs_usable=lambda: sampler_usable)


def test_stage_flops_per_algorithm(tiny):
    f = forward_flops(tiny, torch.tensor([5, 4]))
    grpo = load_config(QS)
    assert stage_flops(grpo, _learner(tiny, grpo), _rollouts(), 1.0, False) == pytest.approx(5 * f, rel=1e-12)
    # online RFT: no reference; trains on its correct rows only (half here)
    rft = load_config(QS, ["algorithm=rft"])
    assert stage_flops(rft, _learner(tiny, rft), _rollouts(), 0.5, False) == pytest.approx(2.5 * f, rel=1e-12)
    # two epochs: the update twice; the sampler's float32 log-probs stand in for the old ones
    two = load_config(QS, ["train.inner_epochs=2"])
    assert stage_flops(two, _learner(tiny, two, steps_per_batch=2), _rollouts(), 1.0, False) == pytest.approx(8 * f)
    # ... and where they cannot (another sampler, lower precision), one more forward for them
    assert stage_flops(two, _learner(tiny, two, steps_per_batch=2, sampler_usable=False), _rollouts(), 1.0,
                       False) == pytest.approx(9 * f)
    # PPO: reference, and the critic: one training pass fused with its values (3 F_c), or values + pass (4 F_c)
    ppo = load_config(QS, ["algorithm=ppo"])
    critic = ValueModel(tiny)
    fc = forward_flops(critic, torch.tensor([5, 4]))
    assert matmul_weights(critic) == matmul_weights(tiny) - 80 + 8  # the backbone and a scalar head, no LM head
    assert stage_flops(ppo, _learner(tiny, ppo, critic), _rollouts(), 1.0, True) == pytest.approx(5 * f + 3 * fc)
    assert stage_flops(ppo, _learner(tiny, ppo, critic), _rollouts(), 1.0, False) == pytest.approx(5 * f + 4 * fc)
    # a learned reward model's costs are not counted, so nothing is
    prm = load_config(QS, ["algorithm=grpo_ps", "reward_model.type=prm"])
    assert stage_flops(prm, _learner(tiny, prm), _rollouts(), 1.0, False) is None


def test_dropped_groups_cost_their_generation(tiny):
    """Dynamic sampling (dapo: no reference, no critic): the update's 3 F on the rows used, and one forward
    (generation) for every row drawn, the dropped ones too."""
    dapo = load_config(QS, ["algorithm=dapo"])
    learner = _learner(tiny, dapo)
    learner._fuses_critic = lambda keep: False
    used = SimpleNamespace(num_sequences=2, **vars(_rollouts()))
    # drawn: the two used rows and a dropped one of 2 prompt and 3 completion tokens
    drawn = SimpleNamespace(num_sequences=3, prompt_mask=torch.cat([used.prompt_mask, torch.tensor([[0, 1, 1]])]),
                            completion_mask=torch.cat([used.completion_mask, torch.tensor([[1, 1, 1]])]))
    f_used, f_dropped = forward_flops(tiny, torch.tensor([5, 4])), forward_flops(tiny, torch.tensor([5]))
    got = drawn_stage_flops(dapo, learner, used, drawn, 1.0)
    assert got == pytest.approx(4 * f_used + f_dropped, rel=1e-12)
    assert drawn_stage_flops(dapo, learner, used, None, 1.0) == pytest.approx(4 * f_used, rel=1e-12)
    empty = SimpleNamespace(num_sequences=0, prompt_mask=torch.zeros(0, 2), completion_mask=torch.zeros(0, 3))
    assert drawn_stage_flops(dapo, learner, empty, drawn, 1.0) == pytest.approx(f_used + f_dropped, rel=1e-12)


def test_a_lora_update_counts_no_gradient_for_the_frozen_weights(tiny):
    """LoRA (rank 2 on q_proj and v_proj): the backward computes every matmul's input gradient but weight
    gradients only for the adapters, so the update is F + 2 M T + 2 M_t T + 2 x attention, about 2 F, not 3 F."""
    import copy

    from harness.config.sections import LoraConfig
    from harness.engine.lora import apply_lora
    from harness.train.flops import update_flops

    full = copy.deepcopy(tiny)
    lengths = torch.tensor([5, 4])
    tokens, attention = 9, 4 * 8 * 2 * (15 + 10)  # 4 A L T(T+1)/2 with A = 8, L = 2: pairs 15 + 10
    M = matmul_weights(full)
    assert update_flops(full, lengths) == pytest.approx(3 * forward_flops(full, lengths), rel=1e-12)
    lora = apply_lora(copy.deepcopy(tiny), LoraConfig(rank=2, alpha=4, target_modules=("q_proj", "v_proj")))
    # per layer: q's A 8x2, B 2x8; v's A 8x2, B 2x4 (one KV head of width 4)
    adapters = 2 * (16 + 16 + 16 + 8)
    assert matmul_weights(lora) == M + adapters and matmul_weights(lora, trained_only=True) == adapters
    f = 2 * (M + adapters) * tokens + attention
    assert forward_flops(lora, lengths) == f
    assert update_flops(lora, lengths) == pytest.approx(f + 2 * (M + adapters) * tokens + 2 * adapters * tokens
                                                        + 2 * attention, rel=1e-12)
    assert 2.0 < update_flops(lora, lengths) / f < 2.5  # 3 F for full fine-tuning; attention weighs more here
    grpo = load_config(QS)  # generation, reference and one update, the update at about 2 F
    assert stage_flops(grpo, _learner(lora, grpo), _rollouts(), 1.0, False) == pytest.approx(
        2 * f + update_flops(lora, lengths), rel=1e-12)
