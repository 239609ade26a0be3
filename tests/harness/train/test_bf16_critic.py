"""model.dtype=bfloat16 reaches every model of a run: PPO's critic (backbone and head), the
reference and the policy train together in bf16 (on CPU here; the same path runs on CUDA)."""
import torch

from harness.config.schema import load_config
from harness.engine.learner import ValueModel
from harness.train.loop import train

TINY = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "model.dtype=bfloat16", "task.min_ops=1", "task.max_ops=1", "task.eval_size=4", "warmup.steps=2",
    "warmup.examples_per_step=4", "sampling.samples_per_prompt=2", "sampling.max_new_tokens=6",
    "train.prompts_per_step=2", "train.threads=1", "train.save_final_model=false", "budget.unit=steps",
    "budget.amount=2", "budget.eval_points=1", "algorithm=ppo",
]


def test_value_model_takes_the_policy_dtype():
    from transformers import LlamaConfig, LlamaForCausalLM
    policy = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=2)).to(torch.bfloat16)
    critic = ValueModel(policy)
    assert {p.dtype for p in critic.parameters()} == {torch.bfloat16}


def test_ppo_trains_in_bfloat16(tmp_path):
    s = train(load_config(None, TINY + [f"output_dir={tmp_path}"]), progress=False)
    assert s["status"] == "finished" and s["budget"]["consumed"]["steps"] == 2
