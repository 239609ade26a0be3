"""Command-line conventions applied in one place: plain help text, one list syntax, Hydra-style arguments refused with a hint, --set errors naming the override, third-party noise off unless --verbose.

:func:`finish_parser` runs over the assembled parser (:mod:`harness.cli.main`): help text
loses its Sphinx markup (double backticks, ``:func:`` roles), every subcommand gets
``--verbose``. :func:`hydra_hint` refuses ``key=value`` arguments with the ``--set``
spelling. :func:`blame_override` rewrites a config error caused by a ``--set`` override to
name it instead of the YAML file. :func:`quiet_third_party` silences transformers' and
huggingface_hub's progress bars and logs, DeepSpeed's accelerator warning and the GGUF
de-quantising bar. :func:`count` and :func:`split_list` are the shared formatters.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import logging
import os
import re
import sys
from typing import Iterable, Optional

from harness.config.schema import Config
from harness.foundation.base import ALIASES, dotted_fields, section_rank

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc|ref|doc|py:\w+):`~?([^`]+)`")
_DOUBLE = re.compile(r"``([^`]+)``")
KEY_VALUE = re.compile(r"^[A-Za-z_][\w\-]*(\.[\w\-]+)*=")
"""What a Hydra-style override looks like: ``train.lr=1e-4``."""
VERBOSE_HELP = "show third-party logs and progress bars (transformers, huggingface_hub, DeepSpeed, GGUF)"


def plain(text: Optional[str]) -> Optional[str]:
    """Help text without Sphinx markup: ``x`` and :func:`x` read as `x`."""
    if not text or text is argparse.SUPPRESS:
        return text
    return _DOUBLE.sub(r"`\1`", _ROLE.sub(r"`\1`", text))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def finish_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Plain help text everywhere and ``--verbose`` on every subcommand."""
    for p in [parser, *_subparsers(parser).values()]:
        p.description, p.epilog = plain(p.description), plain(p.epilog)
        for action in p._actions:
            action.help = plain(action.help)
        if p is not parser and "--verbose" not in p._option_string_actions:
            p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain(choice.help)
                sub = action.choices.get(choice.dest)
                if sub is not None and not sub.description:
                    sub.description = choice.help  # at least the one-liner
    return parser


class DefaultsOnceFormatter(argparse.HelpFormatter):
    """Help that shows each option's default once: ``(default: X)`` is added only where the help
    text does not already say what the default is (and never for ``None``/``False``, which read
    as "not given")."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" in text.lower() or action.default is None or action.default is False
                or action.default is argparse.SUPPRESS or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


def subparser(parser: argparse.ArgumentParser, command: str) -> Optional[argparse.ArgumentParser]:
    """The parser of ``command`` (None when there is no such command)."""
    return _subparsers(parser).get(command)


def unknown_command_hint(parser: argparse.ArgumentParser, argv: list[str]) -> Optional[str]:
    """``harness trian`` -> the refusal naming the nearest command (None when the first word is a
    command, an option, or absent)."""
    commands = _subparsers(parser)
    if not argv or argv[0].startswith("-") or argv[0] in commands:
        return None
    close = difflib.get_close_matches(argv[0], list(commands), n=1, cutoff=0.5)
    near = f"; did you mean `harness {close[0]}`?" if close else ""
    return f"harness: unknown command {argv[0]!r}{near} (commands: {', '.join(commands)}; `harness --help`)"


def _config_keys() -> list[str]:
    return sorted(dotted_fields(Config), key=section_rank)


def _flag_hint(command: str, sub: Optional[argparse.ArgumentParser], flag: str, value: Optional[str]) -> Optional[str]:
    """What one unknown ``--flag[=value]`` should have been: an option of the command spelled with
    dashes (``--no_progress``), a close option, or a config field (``--lr``, ``--train.lr=``)
    given with ``--set``."""
    options = list(sub._option_string_actions) if sub is not None else []
    name = flag.lstrip("-")
    dashed = "--" + name.replace("_", "-")
    if dashed in options and dashed != flag:
        return f"{flag} is spelled {dashed}"
    key = name.replace("-", "_")
    keys = _config_keys() if sub is not None and "--set" in options else []
    alias = ALIASES.get(key.lower(), key)
    if keys:
        match = ([k for k in keys if k == key] or [k for k in keys if k.rsplit(".", 1)[-1] == alias]
                 or [k for k in keys if "." in key and difflib.get_close_matches(key, [k], n=1, cutoff=0.8)])
        if match:
            shown = value if value is not None else "VALUE"
            sets = " or ".join(f"--set {k}={shown}" for k in match[:2])
            return f"{flag}{'=' + value if value is not None else ''} is a config field: {sets}"
    close = difflib.get_close_matches(dashed, options, n=1, cutoff=0.6)
    return f"{flag}: did you mean {close[0]}?" if close else None


def unknown_hint(command: str, sub: Optional[argparse.ArgumentParser], extra: list[str]) -> Optional[str]:
    """The refusal of arguments ``command`` does not know, naming the right spelling of each:
    ``--no_progress`` -> ``--no-progress``; ``--lr 1e-5``, ``--learning_rate=1e-5``,
    ``--train.lr=1e-5`` -> ``--set train.lr=1e-5``; Hydra's ``+key=value`` -> ``--set key=value``
    and ``~key`` (no deletion here: a field keeps its default unless set). None when nothing
    is recognised (argparse's own message follows)."""
    hints, i = [], 0
    while i < len(extra):
        tok = extra[i]
        nxt = extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("-") else None
        if tok.startswith("+") and "=" in tok:
            hints.append(f"{tok}: overrides are given with --set: --set {tok.lstrip('+')}")
        elif tok.startswith("~") and len(tok) > 1:
            hints.append(f"{tok}: a field cannot be deleted; it keeps its default unless set "
                         f"(`harness config` lists defaults): drop it, or --set {tok[1:]}=VALUE")
        elif tok.startswith("-") and len(tok) > 1:
            flag, _, val = tok.partition("=")
            value = val if "=" in tok else nxt
            h = _flag_hint(command, sub, flag, value)
            if h:
                hints.append(h)
                if "=" not in tok and nxt is not None and "is a config field" in h:
                    i += 1  # its value was taken into the hint
        i += 1
    if not hints:
        return None
    return f"harness {command}: " + "; ".join(hints)


def split_list(values: Optional[Iterable]) -> Optional[list[str]]:
    """``--only a b --only c,d`` -> ``[a, b, c, d]`` (None stays None): one list syntax."""
    if values is None:
        return None
    out: list[str] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(split_list(v) or [])
        else:
            out.extend(s.strip() for s in str(v).split(",") if s.strip())
    return out


def hydra_hint(command: str, tokens: Iterable[str]) -> Optional[str]:
    """The refusal for Hydra-style ``key=value`` arguments (None if there are none)."""
    kv = [t for t in tokens if isinstance(t, str) and KEY_VALUE.match(t) and not os.path.exists(t)]
    if not kv:
        return None
    sets = " ".join(f"--set {t}" for t in kv)
    return (f"harness {command}: {' '.join(kv)}: overrides are given with --set, e.g. "
            f"`harness {command} ... {sets}`")


def blame_override(message: str, overrides: Optional[Iterable[str]]) -> str:
    """A config error caused by a ``--set`` override names the override, not the YAML file."""
    overrides = [o for o in (overrides or []) if isinstance(o, str) and "=" in o]
    for exact in (True, False):
        for ov in overrides:
            key = ov.split("=", 1)[0].strip()
            tail = r"(?![\w.])" if exact else r"(?![\w])"
            if key and re.search(rf"(?<![\w.]){re.escape(key)}{tail}", message):
                message = re.sub(r" \(in [^()]*\)$", "", message)
                return f"{message} (from --set {ov})"
    return message


LINE_LIMIT = 1000
"""Most characters of an error line the command line prints (:func:`one_line`)."""


def one_line(message: str, limit: int = LINE_LIMIT) -> str:
    """``message`` as the one line an error prints: line breaks become spaces, and a message
    longer than ``limit`` (a huge value echoed by some check) keeps its start (what is wrong)
    and its end (what to do) around ``...``."""
    text = " ".join(str(message).split("\n"))
    if len(text) <= limit:
        return text
    tail = limit // 4
    return f"{text[:limit - tail - 30]} ... ({len(text) - limit:,} characters left out) ... {text[-tail:]}"


def empty_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Optional[str]:
    """The refusal of an option or argument given as the empty string (``--output-dir ''``), which
    would otherwise read as "not given" or as the current directory; None if there is none."""
    sub = _subparsers(parser).get(getattr(args, "command", None) or "")
    for action in (sub._actions if sub is not None else []):
        if action.dest in ("help", "version") or action.default == "":
            continue
        if getattr(args, action.dest, None) == "":
            name = max(action.option_strings, key=len) if action.option_strings else action.dest
            return (f"{name} '' is invalid: an empty value; give a path or value"
                    + (", or leave the option out for its default" if action.option_strings else ""))
    return None


def quiet_third_party(verbose: bool) -> None:
    """Third-party progress bars and chatter off (inherited by sweep workers through the
    environment), unless ``verbose``."""
    if verbose:
        return
    for k, v in {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                 "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)
    if "DS_ACCELERATOR" not in os.environ and not _cuda():
        os.environ["DS_ACCELERATOR"] = "cpu"  # no "unable to detect" warning on CPU machines
    for name in ("DeepSpeed", "deepspeed", "accelerate", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if "transformers" in sys.modules:
        _quiet_transformers()


def _cuda() -> bool:
    """Whether CUDA is usable, without importing torch when nothing has (`harness config` and
    `--help` stay free of it): torch's answer once it is loaded, else whether an NVIDIA device
    node exists (DeepSpeed then detects the GPU itself)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return bool(torch.cuda.is_available())
        except Exception:
            return False
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as tlog
        tlog.set_verbosity_error()
        tlog.disable_progress_bar()  # "Loading weights", "Writing model shards"
    except Exception:
        return
    try:  # GGUF loading draws its own tqdm bar
        import functools

        from tqdm.auto import tqdm

        import transformers.modeling_gguf_pytorch_utils as gguf
        gguf.tqdm = functools.partial(tqdm, disable=True)
    except Exception:
        pass


class LazyModule:
    """A module imported on first attribute access.

    The command modules of harness/cli/ hold their parsers and handlers together, but a handler's
    libraries (torch, transformers, pandas, MLflow) are loaded only when the handler runs, so
    `harness --help`, `harness <command> --help` and argument errors answer at once
    (bench/cli_startup.py measures it). tests/support/import_graph.py counts ``lazy("m")`` as an edge."""

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name}{' (loaded)' if self._module is not None else ''}>"


def not_installed(*packages: str) -> Optional[str]:
    """The first of ``packages`` that is not installed, or None; found without importing it
    (MLflow takes seconds to import, and a wrong folder or flag should be answered at once)."""
    for package in packages:
        try:
            if importlib.util.find_spec(package) is None:
                return package
        except (ImportError, ValueError):
            return package
    return None


def lazy(name: str) -> LazyModule:
    """``lazy("harness.train.loop")``: that module, imported when first used."""
    return LazyModule(name)

