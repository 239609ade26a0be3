"""Models and tokenizers.

- ``build_char_tokenizer()``: a real ``transformers`` fast tokenizer (``tokenizers``
  WordLevel over single characters), so ``save_pretrained`` / ``AutoTokenizer.from_pretrained``
  round-trip with no custom code. One token per printable ASCII character plus newline;
  ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>`` special tokens; a BOS is prepended to every
  encoded text; decoding concatenates characters.
- ``build_tiny_model(cfg, tokenizer)``: a small Llama (``LlamaForCausalLM``) sized by
  ``ModelConfig``.
- ``load_policy(path_or_name, gguf_file=None)``: any local Hugging Face causal-LM
  directory, or a GGUF file through ``gguf_file=``. Nothing is fetched from a hub.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch

from evals.prm import CausalLMPRM, RuleBasedPRM

SPECIAL = {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"}
CHARS = [chr(i) for i in range(32, 127)] + ["\n"]


def build_char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {SPECIAL["pad"]: 0, SPECIAL["bos"]: 1, SPECIAL["eos"]: 2, SPECIAL["unk"]: 3}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL['bos']} $A", pair=f"{SPECIAL['bos']} $A $B",
        special_tokens=[(SPECIAL["bos"], 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIAL["bos"], eos_token=SPECIAL["eos"],
        pad_token=SPECIAL["pad"], unk_token=SPECIAL["unk"], padding_side="left",
        clean_up_tokenization_spaces=False)
    return fast


def build_tiny_model(cfg, tokenizer, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    conf = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads, max_position_embeddings=cfg.max_length,
        rms_norm_eps=1e-5, tie_word_embeddings=True, attention_dropout=0.0,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(conf)
    return model


def _dtype(name: str):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_policy(path: str, gguf_file: Optional[str] = None, dtype: str = "float32"):
    """Load (model, tokenizer) from a local directory (or a GGUF file). Never downloads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path)
    if gguf_file is None and p.suffix == ".gguf":
        gguf_file, p = p.name, p.parent
    if not p.exists():
        if _looks_like_hub_id(path):  # a hub name: only what the local HF cache already holds
            p = Path(path)
        else:
            raise FileNotFoundError(f"model path not found: {path} (a local directory or .gguf file is expected; "
                                    f"nothing is downloaded at run time)")
    if gguf_file is not None and not (p / gguf_file).exists():
        raise FileNotFoundError(f"GGUF file not found: {p / gguf_file}")
    kw = dict(local_files_only=True)
    if gguf_file:
        kw["gguf_file"] = gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(p), **kw)
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=_dtype(dtype), **kw)
    except OSError as e:
        if not p.exists():
            raise FileNotFoundError(f"model '{path}' is neither a local directory nor in the local Hugging Face "
                                    f"cache; download it beforehand (nothing is downloaded at run time): {e}") from None
        raise
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def save_policy(model, tokenizer, path: str | os.PathLike) -> None:
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))


def num_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_prm(spec: Optional[str], task, device: str = "cpu"):
    """The process reward model named by ``algorithm.prm``: the task's rule-based step checker
    (None, '' or 'rule'), or a Math-Shepherd-style causal LM loaded from a local directory."""
    if spec in (None, "", "rule"):
        return RuleBasedPRM(task)
    model, tokenizer = load_policy(spec)
    return CausalLMPRM(model, tokenizer, device=device)
