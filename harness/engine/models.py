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
  A GGUF file is de-quantised once into a normal Hugging Face folder
  (:func:`gguf_to_hf_dir`, cached under :func:`model_cache_dir`, keyed by the file's
  resolved path, size and mtime) and the model is loaded from there: transformers refuses
  to ``save_pretrained`` a model loaded with ``gguf_file=`` ("quantized with gguf and is
  not serializable"), so a run's ``final_model`` could not be written otherwise.
  ``pkg:<package>/<file>`` names a file shipped inside an installed Python package
  (:func:`resolve_model_path`).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch

from evals.prm import RM_SPEC_FILE, CausalLMPRM, RuleBasedPRM, read_spec, spec_kwargs
from harness.admission.gate import resolve_device  # noqa: F401 (models.resolve_device: the gate's rule)
from harness.config.schema import tiny_param_count
from harness.engine.lora import is_lora, save_lora_policy
from harness.foundation.errors import ModelLoadError  # raised here; the CLI imports it without torch
from harness.foundation.modelfiles import (PICKLE_SUFFIXES, WHAT_TO_DO, check_model_folder, looks_like_hub_id,
                                           resolve_model_path, short_error, weight_files)

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
        try:
            model = LlamaForCausalLM(conf)
        except (MemoryError, RuntimeError) as e:
            if not is_out_of_memory(e):
                raise
            raise ModelLoadError(_no_room(cfg, e)) from None
    return model


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed (Python's MemoryError, torch's CPU allocator or
    CUDA out of memory), not a bug."""
    if isinstance(e, MemoryError):
        return True
    text = str(e).lower()
    return any(s in text for s in ("can't allocate memory", "defaultcpuallocator", "out of memory"))


def _no_room(cfg, e: BaseException) -> str:
    """The one line for a tiny model this machine cannot allocate: its size and what to lower."""
    n = tiny_param_count(cfg)
    return (f"the built-in tiny model (about {n:,} parameters, {n * 4 / 2**30:,.1f} GiB of float32 weights; "
            f"model.hidden_size={cfg.hidden_size}, model.num_layers={cfg.num_layers}, "
            f"model.intermediate_size={cfg.intermediate_size}) cannot be allocated on this machine "
            f"({type(e).__name__}: {short_error(e, 120)}): lower model.hidden_size, model.num_layers or "
            f"model.intermediate_size")


def _dtype(name: str):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


MODEL_CACHE_ENV = "GRPO_HARNESS_MODEL_CACHE"
GGUF_SOURCE_FILE = "gguf_source.json"


def model_cache_dir() -> Path:
    """Where de-quantised GGUF models are kept: ``$GRPO_HARNESS_MODEL_CACHE``, else
    ``$XDG_CACHE_HOME/grpo-harness/models`` (``~/.cache/grpo-harness/models``)."""
    env = os.environ.get(MODEL_CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "grpo-harness" / "models"


def gguf_cache_key(gguf_path: str | os.PathLike) -> str:
    """Hash of the GGUF file's resolved path, size and modification time (a changed or
    replaced file gets a new folder; the 100s of MB are not read to key them)."""
    p = Path(gguf_path).resolve()
    st = p.stat()
    return hashlib.sha256(f"{p}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]


def gguf_to_hf_dir(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A normal Hugging Face folder (float32 safetensors + tokenizer) holding the de-quantised
    weights of ``gguf_path``; made on first use (written to a temporary folder and renamed,
    so concurrent runs never see half a model), then reused."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(gguf_path).resolve()
    if not src.is_file():
        raise FileNotFoundError(f"GGUF file not found: {src}")
    root = Path(cache_dir).expanduser() if cache_dir is not None else model_cache_dir()
    out = root / f"{src.stem}-{gguf_cache_key(src)}"
    if (out / GGUF_SOURCE_FILE).is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=root))
    try:
        kw = dict(gguf_file=src.name, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(str(src.parent), **kw)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), dtype=torch.float32, **kw)
        model.config.quantization_config = None  # plain weights from here on
        for attr in ("quantization_config", "hf_quantizer"):
            if hasattr(model, attr):
                setattr(model, attr, None)
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        st = src.stat()
        (tmp / GGUF_SOURCE_FILE).write_text(json.dumps(
            {"gguf": str(src), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "dtype": "float32"}, indent=1))
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, out)
        except OSError:  # another process got there first
            if not (out / GGUF_SOURCE_FILE).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _load_error(p: Path, e: BaseException) -> ModelLoadError:
    """One line for a failure of transformers' loading of folder ``p``, naming the file it likely came from."""
    import pickle

    weights = weight_files(p) if p.is_dir() else []
    pickled = [f for f in weights if f.suffix in PICKLE_SUFFIXES]
    if pickled and (isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e) or "pickle" in str(e).lower()
                    or isinstance(e, (EOFError, RuntimeError))):
        return ModelLoadError(
            f"{pickled[0]}: pickled PyTorch weights that torch.load(weights_only=True) refuses ({short_error(e)}); the "
            f"harness does not unpickle arbitrary objects: convert the model to safetensors where you trust the "
            f"file (model.save_pretrained(folder, safe_serialization=True)) and give that folder")
    return ModelLoadError(f"{p}: the model cannot be loaded ({type(e).__name__}: {short_error(e)}): {WHAT_TO_DO}")


def load_policy(path: str, gguf_file: Optional[str] = None, dtype: str = "float32",
                cache_dir: str | os.PathLike | None = None):
    """Load (model, tokenizer) from a local directory (or a GGUF file, de-quantised once into
    a cached Hugging Face folder: see :func:`gguf_to_hf_dir`). Never downloads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(path)
    p = Path(path)
    if gguf_file is None and p.suffix.lower() == ".gguf":
        gguf_file, p = p.name, p.parent
    if not p.exists():
        if looks_like_hub_id(path) and gguf_file is None:  # a hub name: only what the local HF cache holds
            p = Path(path)
        else:
            raise FileNotFoundError(f"model path not found: {path} (a local directory or .gguf file is expected; "
                                    f"nothing is downloaded at run time)")
    if gguf_file is not None:
        if not (p / gguf_file).exists():
            raise FileNotFoundError(f"GGUF file not found: {p / gguf_file}")
        try:
            p = gguf_to_hf_dir(p / gguf_file, cache_dir)
        except Exception as e:
            if isinstance(e, (OSError, MemoryError)) and not _file_format_error(e):
                raise  # a full disk (exit 3), a missing file: as they are
            raise ModelLoadError(f"{p / gguf_file}: not a GGUF model transformers can read ({type(e).__name__}: "
                                 f"{short_error(e)}): give a complete .gguf file") from None
    check_model_folder(p)
    kw = dict(local_files_only=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(p), **kw)
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=_dtype(dtype), **kw)
    except OSError as e:
        if not p.exists():
            raise FileNotFoundError(f"model '{path}' is neither a local directory nor in the local Hugging Face "
                                    f"cache; download it beforehand (nothing is downloaded at run time): "
                                    f"{short_error(e)}") from None
        if not _file_format_error(e):
            raise  # a full disk, a permission: as they are
        raise _load_error(p, e) from None
    except (ValueError, RuntimeError, EOFError, KeyError) as e:  # a bad config.json, tensor or pickle
        raise _load_error(p, e) from None
    except Exception as e:  # SafetensorError, pickle.UnpicklingError, ...: the files, not the code
        if type(e).__module__.startswith(("safetensors", "pickle", "_pickle", "tokenizers")):
            raise _load_error(p, e) from None
        raise
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def _file_format_error(e: BaseException) -> bool:
    """Whether an OSError from loading says the files are wrong (transformers raises OSError for a
    folder without the files it needs) rather than the machine (a full disk, a permission)."""
    if not isinstance(e, OSError):
        return False
    return e.errno is None or e.errno in (errno.EINVAL, errno.EIO, errno.ENOENT)


def save_policy(model, tokenizer, path: str | os.PathLike) -> None:
    """``model`` and ``tokenizer`` into folder ``path`` (``from_pretrained`` loads them); a LoRA model
    as its merged weights, with the adapter alone in ``path/adapter`` (:func:`harness.engine.lora.save_lora_policy`)."""
    if is_lora(model):
        save_lora_policy(model, tokenizer, path)
        return
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))


def num_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def load_prm(spec: Optional[str], task, device: str = "cpu"):
    """The process reward model named by ``algorithm.prm``: the task's rule-based step checker
    (None, '' or 'rule'), or a Math-Shepherd-style causal LM loaded from a local directory (its
    tags from the folder's ``reward_model.json`` when `harness rm train` wrote it)."""
    if spec in (None, "", "rule"):
        return RuleBasedPRM(task)
    rm_spec = read_spec(spec) if Path(spec).is_dir() else None
    if rm_spec is not None and rm_spec["kind"] != "prm":
        raise ModelLoadError(f"algorithm.prm={spec}: an outcome reward model ({RM_SPEC_FILE} says kind "
                             f"{rm_spec['kind']}); give it as reward_model.type=orm reward_model.init={spec}")
    model, tokenizer = load_policy(spec)
    return CausalLMPRM(model, tokenizer, device=device, **spec_kwargs(rm_spec))
