"""The raw config mappings before a config is built: layering (``deep_merge``), ``--set a.b=v`` overrides, the ``algorithm: ppo`` shorthand and section renaming, and the effective algorithm of a mapping read back."""
from __future__ import annotations

import functools
from typing import Any

import yaml

from algorithms.presets import ALGORITHMS, COMPONENTS, resolve
from algorithms.registry import UnknownComponentError
from harness.config.algorithm import AlgorithmConfig
from harness.config.fields import Config
from harness.foundation import yamlsafe
from harness.foundation.base import ConfigError, brief, expand_shorthand, flatten, to_dict
from harness.foundation.yamlsafe import DuplicateKeyError, YamlBadValue, YamlTooLarge


NAMED_SECTIONS = ("algorithm", "task")
"""Top-level sections with the ``section: name`` shorthand (``algorithm: ppo`` is
``algorithm: {name: ppo}``)."""


def deep_merge(a: dict, b: dict, top: bool = True) -> dict:
    """``b`` layered onto ``a`` (a new dict; nested mappings merge, other values replace).
    At the top level a named section given as a string on one side and a mapping on the
    other merges as ``{name: ...}`` (``algorithm: ppo`` + ``algorithm: {kl_coef: 0}``); a new
    name keeps the section's other fields as :func:`rename_section` says."""
    out = dict(a)
    for k, v in b.items():
        cur = out.get(k)
        if top and k in NAMED_SECTIONS:
            if isinstance(v, dict):
                cur = expand_shorthand(cur)
            elif isinstance(cur, dict):
                v = expand_shorthand(v)
            if isinstance(v, dict) and isinstance(cur, dict) and "name" in v:
                cur = rename_section(k, cur, v["name"])
        if isinstance(v, dict) and isinstance(cur, dict):
            out[k] = deep_merge(cur, v, top=False)
        else:
            out[k] = v
    return out


def rename_section(section: str, current: dict, name: Any) -> dict:
    """The named section ``current`` (a mapping) given the name ``name``, as ``--set algorithm=ppo``,
    ``--set algorithm.name=ppo`` or a sweep's ``algorithm`` grid do: every field written in it is kept
    (``kl_coef: 0.0, clip_eps: 0.1`` stay), except, when an ``algorithm`` section that names one
    algorithm gets another, the components (``COMPONENTS``: advantage, policy_loss, ..., kl_coef)
    whose value is the old algorithm's preset: those came with the old name (a run's config.yaml
    writes them all out) and become the new algorithm's (null)."""
    out = dict(current)
    old = out.get("name")
    out["name"] = name
    if (section != "algorithm" or not isinstance(old, str) or not isinstance(name, str) or old == name
            or old not in ALGORITHMS or name not in ALGORITHMS):
        return out
    preset = ALGORITHMS[old]
    for k in COMPONENTS:
        v = out.get(k)
        if v is not None and v == preset[k] and isinstance(v, bool) == isinstance(preset[k], bool):
            out[k] = None
    return out


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """Apply ``a.b.c=value`` into nested dict ``data``. A named section set to a name
    (``algorithm=ppo`` over an ``algorithm`` mapping) keeps the mapping's fields, as
    :func:`rename_section` says, rather than dropping them; a mapping set on a section
    (``train={lr: 0.5}``) merges into it (:func:`deep_merge`), its other fields kept."""
    keys = dotted.split(".")
    cur = data
    for k in keys[:-1]:
        nxt = cur.get(k)
        nxt = expand_shorthand(nxt)  # `algorithm: grpo` shorthand, now being refined
        if nxt is None:
            nxt = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {brief(dotted)[1:-1]}: '{brief(k)[1:-1]}' is not a section")
        cur[k] = nxt
        cur = nxt
    last = keys[-1]
    if cur is data and last in NAMED_SECTIONS and isinstance(cur.get(last), dict) and isinstance(value, str):
        cur[last] = rename_section(last, cur[last], value)  # `--set algorithm=ppo` over a mapping
    elif len(keys) == 2 and keys[0] in NAMED_SECTIONS and last == "name" and cur.get("name") != value:
        data[keys[0]] = rename_section(keys[0], cur, value)  # `--set algorithm.name=ppo`
    elif isinstance(value, dict) and isinstance(cur.get(last), (dict, str)):
        # `--set train={lr: 0.5}` merges into the section as the file's layers do (its other
        # fields stay; `--set budget={amount: 64}` keeps the budget's unit), never resets them
        cur[last] = deep_merge(cur, {last: value}, top=cur is data)[last]
    else:
        cur[last] = value


def effective_dict(cfg: Config | dict) -> dict:
    """The config as it runs, as a plain dict: :meth:`Config.effective_dict` of a loaded config; a
    config read back as a mapping (a run's config.yaml or summary) with its ``algorithm`` section
    (a mapping or the ``"ppo"`` shorthand) resolved the same way, every other key as written. An
    algorithm section naming an unknown algorithm or component is left as written."""
    if isinstance(cfg, Config):
        return cfg.effective_dict()
    d = dict(cfg)
    if "algorithm" in d:
        d["algorithm"] = _effective_section(d["algorithm"])
    return d


@functools.lru_cache(maxsize=1)
def _default_settings() -> dict:
    """Every field of a config at its default, flattened (the knobs config.yaml leaves out at their defaults too)."""
    cfg = Config()
    return flatten({**to_dict(cfg, every_field=True), "algorithm": to_dict(cfg.algo, every_field=True)},
                   keep_empty=True)


def settings(cfg: dict) -> dict:
    """A run's config (config.yaml or a summary's ``config``, as a mapping) as the flat ``{"train.lr": ...}`` of
    every setting in force: :func:`effective_dict` (the algorithm's preset filled in; the mapping as written when
    it cannot be resolved: never an error), then each field the file leaves out because it holds its default
    (``train.staleness`` 0, ``algorithm.correction`` none) at that default, unless the file writes its section
    as something else (a shorthand). The one reader of "a run's value of a setting" for reports and bench
    scripts."""
    try:
        eff = effective_dict(cfg)
    except Exception:  # a hand-edited config: read as written
        eff = cfg if isinstance(cfg, dict) else {}
    flat = flatten(eff, keep_empty=True)
    for k, v in _default_settings().items():
        if k not in flat and not any(k.startswith(p + ".") for p in flat):
            flat[k] = v
    return flat


def _effective_section(section: Any) -> Any:
    """An ``algorithm`` section as written (a mapping or the shorthand) with its null components
    filled from the preset (values as written, unchecked but for their names)."""
    sec = expand_shorthand(section)
    if not isinstance(sec, dict) or sec.get("name", AlgorithmConfig.name) not in ALGORITHMS:
        return section
    sec = {"name": AlgorithmConfig.name, **sec}
    try:
        algo = resolve(AlgorithmConfig(**{k: sec.get(k) for k in ("name",) + COMPONENTS}))
    except UnknownComponentError:
        return section
    return {**sec, **{k: getattr(algo, k) for k in COMPONENTS}}


def algorithm_name(data: dict) -> str:
    """The algorithm a config mapping names, whether as ``algorithm: ppo`` or
    ``algorithm: {name: ppo}`` (the default algorithm when it names none)."""
    a = expand_shorthand(data.get("algorithm", AlgorithmConfig.name))
    return str(a.get("name", AlgorithmConfig.name)) if isinstance(a, dict) else str(a)


def parse_overrides(overrides: list[str] | None) -> list[tuple[str, Any]]:
    """``["a.b=1e-4", ...]`` -> ``[("a.b", 0.0001), ...]``: each value read as YAML (text that is
    not YAML stays text); a value YAML refuses for its size, a repeated key or a value that
    cannot be read is an error naming the override."""
    out = []
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {brief(item)}")
        key, raw = item.split("=", 1)
        try:
            value = yamlsafe.load(raw) if raw != "" else ""
        except (DuplicateKeyError, YamlTooLarge, YamlBadValue) as e:
            raise ConfigError(f"--set {brief(key.strip())[1:-1]}=...: {e}") from None
        except yaml.YAMLError:
            value = raw
        out.append((key.strip(), value))
    return out
