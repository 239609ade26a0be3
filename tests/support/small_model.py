"""A small complete model folder for tests: the built-in tiny model (character tokenizer, Llama layers) at hidden
size 16 and one layer, saved as a Hugging Face folder, as a run's final_model is."""
from __future__ import annotations

from pathlib import Path

from harness.config.schema import ModelConfig
from harness.engine.models import build_char_tokenizer, build_tiny_model, save_policy

SMALL = ModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)


def save_small_model(folder: Path):
    """Save the small model (seed 0) to ``folder`` (created); return the model."""
    tok = build_char_tokenizer()
    model = build_tiny_model(SMALL, tok)
    save_policy(model, tok, folder)
    return model
