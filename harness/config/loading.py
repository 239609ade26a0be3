"""Reading and writing run configs: YAML files (strictly) plus ``--set`` overrides into a validated config, config.yaml, the config hash, and the field table of ``harness config --help``."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml

from harness.config.fields import Config
from harness.config.overrides import deep_merge, parse_overrides, set_dotted
from harness.foundation import yamlsafe
from harness.foundation.base import ConfigError, field_docs, from_dict, stable_hash
from harness.foundation.files import write_text_atomic
from harness.foundation.yamlsafe import DuplicateKeyError, YamlBadValue, YamlTooLarge


def config_from_dict(data: dict | None) -> Config:
    return from_dict(Config, dict(data or {}))


def yaml_error_line(e: yaml.YAMLError) -> str:
    """One line for a YAML parse error: the problem and where (line, column)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if problem and mark is not None:
        ctx = getattr(e, "context", None)
        return f"{ctx + ': ' if ctx else ''}{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(e).split())


def strict_yaml_load(text: str) -> Any:
    """``yaml.safe_load`` that raises a ``yaml.YAMLError`` on a repeated key (`DuplicateKeyError`),
    on aliases that expand beyond reason or a recursive structure (`YamlTooLarge`) and on a value
    that cannot be read (:mod:`harness.foundation.yamlsafe`). Config files, sweep files and ``--set``
    values are read with it."""
    return yamlsafe.load(text)


def read_yaml_file(path: str | os.PathLike, kind: str = "config", error: type = ConfigError) -> Any:
    """The parsed YAML of a ``kind`` file (config or sweep), every failure an ``error`` naming the file."""
    p = Path(path)
    if not p.exists():
        raise error(f"{kind} file not found: {p}")
    if not p.is_file():
        raise error(f"{kind} file is not a file: {p}")
    try:
        return strict_yaml_load(p.read_text())
    except (DuplicateKeyError, YamlTooLarge, YamlBadValue) as e:
        raise error(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        raise error(f"{p}: not valid YAML: {yaml_error_line(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{p}: cannot read: {e}") from None


def load_yaml(path: str | os.PathLike) -> dict:
    p = Path(path)
    data = read_yaml_file(p)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping of config sections, got {type(data).__name__}")
    return data


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None,
                base: dict | None = None, values: dict | None = None) -> Config:
    """YAML file (optional) + ``key.sub=value`` overrides -> validated Config. ``values``
    (``{"output_dir": "2024-11-28"}``): fields set last, as given, never read as YAML (a
    command's path options: ``--output-dir "x #c"`` is the folder ``x #c``)."""
    data: dict = dict(base or {})
    if path is not None:
        data = deep_merge(data, load_yaml(path))
    for key, value in [*parse_overrides(overrides), *(values or {}).items()]:
        set_dotted(data, key, value)
    where = f" (in {path})" if path else ""
    try:
        return config_from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{e}{where}") from None


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """``config.yaml``: the effective config (:meth:`Config.effective_dict`, the algorithm's
    preset-filled components written out), which is also what the run id hashes: a config.yaml
    loads back as the same run."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, yaml.safe_dump(cfg.effective_dict(), sort_keys=False))


def config_hash(obj: Any, length: int = 10) -> str:
    """Stable short hash of a config (or any section / dict): the cache keys' hash
    (:func:`harness.foundation.base.stable_hash`; run ids use the same with integral floats as ints)."""
    return stable_hash(obj, length)


def describe(cls=Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default, doc) for every field, for `harness config --help`."""
    rows = []
    docs = field_docs(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        v = getattr(default, f.name)
        if dataclasses.is_dataclass(v):
            rows.extend(describe(type(v), f"{prefix}{f.name}."))
        else:
            rows.append((f"{prefix}{f.name}", repr(v), docs.get(f.name, "")))
    return rows
