"""Strict YAML <-> frozen-dataclass machinery.

Every config section is a frozen dataclass whose fields carry a docstring (a string
literal right under the field, CleanRL style). This module turns nested dicts (from YAML
or ``--set`` overrides) into those dataclasses and refuses anything it does not
understand: an unknown key names the key and the closest valid names, a wrong type names
the field and the value. Ranges, choices and the like are each field's rules (:mod:`harness.config.rules`).
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import json
import math
import reprlib
import sys
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Union


class ConfigError(ValueError):
    """A config could not be loaded; the message names the offending key and value."""


ECHO_LIMIT = 200
"""Most characters of a user's value that an error message repeats (:func:`brief`)."""

_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong = 3, ECHO_LIMIT, ECHO_LIMIT, ECHO_LIMIT
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxdict = _BRIEF.maxset = _BRIEF.maxfrozenset = 8


def brief(value: Any, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` for an error message, at most about ``limit`` characters and at a cost
    bounded whatever the value (a 2 MB string, a list of a billion shared elements, an integer
    of 10,000 digits): longer ones end in ``...`` and say how long the value was."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{repr(value[:limit])}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        return f"<an integer of about {int(value.bit_length() * 0.30103):,} digits>"
    text = _BRIEF.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def did_you_mean(word: Any, options, n: int = 3) -> str:
    """``"; did you mean 'a', 'b'?"`` naming the options closest to ``word``, or ``""``."""
    if not isinstance(word, (str, int, float)) or len(str(word)) > ECHO_LIMIT:
        return ""  # nothing is close to a long text or a structure; and comparing it costs
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=n, cutoff=0.5)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def expand_shorthand(value: Any) -> Any:
    """The one reading of the ``section: name`` shorthand: a string names the section
    (``"ppo"`` -> ``{"name": "ppo"}``); anything else is returned as is."""
    return {"name": value} if isinstance(value, str) else value


def _origin(tp):
    return typing.get_origin(tp)


def _is_optional(tp) -> tuple[bool, Any]:
    if _origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != len(typing.get_args(tp)):
            return True, args[0] if len(args) == 1 else Union[tuple(args)]
    return False, tp


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp, where: str):
    """Check ``value`` against annotation ``tp`` (with the usual YAML leniency: ints are
    floats, "1e-4" strings are floats) and return the converted value."""
    optional, inner = _is_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: null is not allowed (expected {_type_name(inner)})")
    tp = inner
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if "name" in {f.name for f in dataclasses.fields(tp)}:
            value = expand_shorthand(value)  # `algorithm: ppo`
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for section '{tp.__name__}', got {brief(value)}")
        return from_dict(tp, value, where)
    origin = _origin(tp)
    if origin in (list, tuple):
        (elem,) = typing.get_args(tp)[:1] or (Any,)
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {brief(value)}")
        out = [_coerce(v, elem, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {brief(value)}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {brief(value)}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}: expected an integer, got {brief(value)}")
        return value
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {brief(value)}")
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{where}: expected a number, got {brief(value)}") from None
        if not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {brief(value)}")
        value = float(value)
        if math.isnan(value):
            raise ConfigError(f"{where}: NaN is not a valid value")
        if math.isinf(value):
            raise ConfigError(invalid(where, value, "must be a finite number"))
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {brief(value)}")
        check_text(value, where)
        return value
    return value


def dotted_fields(cls, prefix: str = "") -> list[str]:
    """Every leaf field of dataclass ``cls`` as a dotted key (``train.lr``), sections descended."""
    out = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += dotted_fields(tp, f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def did_you_mean_dotted(key: Any, cls, where: str = "", exact: bool = False) -> str:
    """``"; did you mean 'train.lr'?"`` when ``key`` (or a close spelling) is a field further down
    (``lr`` given at the top level; ``learning_rate`` for ``lr``), or ``""``."""
    if not isinstance(key, str) or len(key) > ECHO_LIMIT:
        return ""
    word = ALIASES.get(key.replace("-", "_").lower(), key)
    full = sorted((f"{where}.{d}" if where else d for d in dotted_fields(cls)), key=section_rank)
    same = [d for d in full if d.rsplit(".", 1)[-1] == word]
    close = same or ([] if exact else
                     [d for d in full if difflib.get_close_matches(word, [d.rsplit(".", 1)[-1]], n=1, cutoff=0.75)])
    return f"; did you mean {', '.join(repr(c) for c in close[:3])}?" if close else ""


SECTION_ORDER = ("train", "algorithm", "sampling", "budget", "task", "model", "eval", "warmup", "tracking",
                 "reward_model")
"""Which section's field a bare name most likely means first (``lr``: train.lr before warmup.lr)."""


def section_rank(key: str) -> int:
    """Sort key of a dotted field by `SECTION_ORDER` (top-level fields first, a section missing
    from the order last)."""
    head = key.split(".", 1)[0]
    if "." not in key:
        return -1
    return SECTION_ORDER.index(head) if head in SECTION_ORDER else len(SECTION_ORDER)


ALIASES = {"learning_rate": "lr", "num_generations": "samples_per_prompt", "group_size": "samples_per_prompt",
           "beta": "kl_coef", "epsilon": "clip_eps", "max_completion_length": "max_new_tokens",
           "num_iterations": "inner_epochs", "per_device_train_batch_size": "micro_batch_size"}
"""Other projects' names (TRL's GRPOConfig, Hydra-style configs) for our fields, for suggestions."""


@lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def from_dict(cls, data: dict, where: str = ""):
    """Build dataclass ``cls`` from ``data``, strictly."""
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            shown = brief(key) if not isinstance(key, str) or len(key) > ECHO_LIMIT else key
            full = f"{where}.{shown}" if where else shown
            hint = (did_you_mean_dotted(key, cls, where, exact=True) or did_you_mean(key, names)
                    or did_you_mean_dotted(key, cls, where))
            raise ConfigError(
                f"unknown config key '{full}'{hint} (valid keys{' in ' + where if where else ''}: {', '.join(names)})"
            )
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            full = f"{where}.{f.name}" if where else f.name
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], full)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate()  # its messages name the full dotted field
    return obj


def _default(f: dataclasses.Field) -> Any:
    """A dataclass field's default value (a section's: a fresh one from its factory)."""
    if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def to_dict(obj, every_field: bool = False) -> Any:
    """Plain nested dict (lists, not tuples) for YAML/JSON. A dataclass's fields named in its
    ``OMITTED_AT_DEFAULT`` class attribute are left out while they hold their default (knobs that
    came later: configs without them keep their run ids, cache keys and config.yaml), unless
    ``every_field`` (what a reader comparing configs needs: the value in force, never a gap)."""
    if dataclasses.is_dataclass(obj):
        omit = () if every_field else getattr(obj, "OMITTED_AT_DEFAULT", ())
        return {f.name: to_dict(getattr(obj, f.name), every_field) for f in dataclasses.fields(obj)
                if not (f.name in omit and getattr(obj, f.name) == _default(f))}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v, every_field) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v, every_field) for k, v in obj.items()}
    return obj


def _integral_floats_as_ints(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _integral_floats_as_ints(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_integral_floats_as_ints(v) for v in obj]
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    return obj


def stable_hash(obj: Any, length: int, integral_floats_as_ints: bool = False) -> str:
    """The first ``length`` hex digits of the SHA-256 of ``obj`` (a config, section or dict) as
    sorted JSON. ``integral_floats_as_ints``: 1000.0 hashes as 1000 (run ids, whose configs may
    read back from YAML either way); off for the cache keys (warm-up, start evaluation), which
    were defined without it and would otherwise all change."""
    d = to_dict(obj)
    if integral_floats_as_ints:
        d = _integral_floats_as_ints(d)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:length]


def flatten(d: Any, prefix: str = "", sep: str = ".", keep_empty: bool = False) -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: dotted keys, as ``--set``, trackers and reports use
    (``sep="/"``: metric names). An empty mapping inside is dropped, or with ``keep_empty`` kept as
    the value of its key (a summary or config as written, which a reader shows as it is)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}{sep}{k}" if prefix else str(k)
            if isinstance(v, dict) and (v or not keep_empty):
                out.update(flatten(v, key, sep, keep_empty))
            else:
                out[key] = v
    elif prefix:
        out[prefix] = d
    return out


@lru_cache(maxsize=None)
def _class_nodes(filename: str) -> dict:
    """{class name: its ast.ClassDef} for the top-level classes of one source file, parsed once
    (`harness config` documents a dozen classes of one module)."""
    try:
        tree = ast.parse(Path(filename).read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def field_docs(cls) -> dict[str, str]:
    """The docstring written under each field of ``cls`` or of a dataclass it extends (CleanRL style)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        node = _class_nodes(getattr(sys.modules.get(klass.__module__), "__file__", None) or "").get(klass.__qualname__)
        if node is None:
            continue
        body = node.body
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant) and isinstance(nxt.value.value, str):
                    docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def invalid(field: str, value: Any, why: str) -> str:
    """The one form of a refused value: ``field=value is invalid: why`` (the value :func:`brief`)."""
    return f"{field}={brief(value)} is invalid: {why}"


def check(cond: bool, field: str, value: Any, why: str) -> None:
    """Raise a ConfigError naming ``field`` and ``value`` (:func:`invalid`) unless ``cond``."""
    if not cond:
        raise ConfigError(invalid(field, value, why))


def check_text(value: str, field: str) -> None:
    """Raise a ConfigError unless ``value`` is text every path, name and file can hold: no
    NUL byte (the OS cuts a path there, or refuses it) and no lone surrogate (not encodable)."""
    if "\0" in value:
        raise ConfigError(invalid(field, value, "it contains a NUL byte (\\0), which no path, name or value may "
                                                "hold; remove it"))
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ConfigError(invalid(field, value, "it contains a lone surrogate (not text); remove it")) from None
