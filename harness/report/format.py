"""Text rendering shared by every table the harness prints or writes, and every number in it: `table`, `number`, `percent`.

`table(headers, rows, style=...)` renders a list of rows as

* ``"plain"``: columns padded to their widest cell and separated by two spaces, trailing
  blanks stripped from each line (the sweep plan/results tables, the live progress table,
  ``harness eval``'s key/value table with ``headers=None``);
* ``"ruled"``: the same with a rule of dashes under the header and no stripping (the
  terminal summary of ``harness report``; ``align`` right-justifies numeric columns);
* ``"markdown"``: a GitHub-flavoured Markdown table, ``|`` and newlines escaped;
* ``"html"``: ``<table><thead>…</thead><tbody>…</tbody></table>`` with escaped text and
  optional attribute strings for the table, each row and each cell.

`number(x, spec, ...)` formats one value the way a column wants it (format spec for floats,
another for ints, a third above a magnitude, fixed text for missing or non-finite values).

`percent(fraction, digits)` is the one way an accuracy (or any share) is shown to a person:
a fraction in [0, 1] becomes ``"72.5%"``. Machine-readable files keep fractions, under names
that say so (``*_fraction`` or the metric's documented unit); only text meant for people
goes through `percent`.

The other shapes a number takes in text, each defined once here for the reports and the command
line: `count` (a budget counter, ``32,768 samples``), `value_text` (a setting's value, ``1e-05``),
`percent_or_text` (an evaluation value that may be missing), `plus_minus` (``mean ± half``) and
`with_interval` (a paired difference ``+x.x [lo, hi]``).
"""
from __future__ import annotations

import html
import json
import math
import numbers
import re
from typing import Any, Optional, Sequence

STYLES = ("plain", "ruled", "markdown", "html")


def number(x: Any, spec: str = "g", *, int_spec: Optional[str] = None, large_spec: Optional[str] = None,
           large: float = 1000.0, whole: bool = False, missing: Optional[str] = None,
           nonfinite: Optional[str] = None) -> str:
    """One value as text.

    * ``None`` -> ``missing`` (``str(None)`` when not given);
    * a float (any real that is not an integer, numpy scalars included): ``nonfinite`` for NaN/inf when given; with ``whole``, an integral float with
      1 <= |x| < 1e15 prints as an int; ``large_spec`` when given and not |x| < ``large``;
      otherwise ``format(x, spec)``;
    * an integer (bool and numpy ints included): ``format(x, int_spec)``, or ``str(x)`` when ``int_spec`` is None;
    * a dict: JSON with sorted keys; anything else: ``str(x)``.
    """
    if x is None:
        return str(x) if missing is None else missing
    if isinstance(x, numbers.Real) and not isinstance(x, numbers.Integral):
        x = float(x)
        if nonfinite is not None and not math.isfinite(x):
            return nonfinite
        if whole and x.is_integer() and 1 <= abs(x) < 1e15:
            return str(int(x))
        if large_spec is not None and not abs(x) < large:
            return format(x, large_spec)
        return format(x, spec)
    if isinstance(x, numbers.Integral):
        return str(x) if int_spec is None else format(x, int_spec)
    if isinstance(x, dict):
        return json.dumps(x, sort_keys=True)
    return str(x)


def percent(fraction: Any, digits: int = 1, *, sign: bool = False, missing: str = "-") -> str:
    """A fraction as a percentage for people: ``percent(0.725) == "72.5%"``.

    ``digits`` decimals after the point; ``sign`` prefixes ``+`` to a positive value (for
    differences, which are then in percentage points: ``percent(0.02, sign=True) == "+2.0%"``);
    ``None``/NaN/inf -> ``missing``.
    """
    if fraction is None or isinstance(fraction, bool):
        return missing if fraction is None else percent(float(fraction), digits, sign=sign, missing=missing)
    x = float(fraction)
    if not math.isfinite(x):
        return missing
    text = format(100.0 * x, f".{int(digits)}f")
    if text.lstrip("-").strip("0.") == "":  # -0.0 -> 0.0
        text = text.lstrip("-")
    return ("+" if sign and not text.startswith("-") and float(text) > 0 else "") + text + "%"


def count(value: Any, unit: str = "") -> str:
    """A counter as people read it: ``32,768 samples``, never ``32768.0``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value} {unit}".strip()
    if isinstance(value, float) and not value.is_integer():
        text = f"{value:,.1f}" if unit in ("seconds", "s") else f"{value:,.3g}"
    else:
        text = f"{int(value):,}"
    return f"{text} {unit}".strip()


def value_text(v: Any, missing: Optional[str] = None) -> str:
    """A setting's value for people: a number (not a bool) in ``g`` format (``1e-05``, ``0.2``,
    ``8``), anything else as its text; ``missing`` for None when given."""
    if v is None and missing is not None:
        return missing
    return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def percent_or_text(v: Any) -> str:
    """An evaluation value for people: a number (not a bool) as :func:`percent`, anything else
    (a placeholder such as ``-``) as its text."""
    return percent(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def plus_minus(mean: float, half: float, spec: str = ".1f") -> str:
    """``mean ± half`` (just the mean without an interval; an em dash without data)."""
    if not math.isfinite(mean):
        return "—"
    return f"{mean:{spec}}" + (f" ± {half:{spec}}" if math.isfinite(half) else "")


def with_interval(d: dict, spec: str = "+.1f") -> str:
    """A paired difference (``{"n", "mean", "half", "lo", "hi"}``) as ``+x.x [lo, hi]``."""
    if d["n"] == 0 or not math.isfinite(d["mean"]):
        return "no data"
    if not math.isfinite(d["half"]):
        return f"{d['mean']:{spec}} (n=1, no interval)"
    return f"{d['mean']:{spec}} [{d['lo']:{spec}}, {d['hi']:{spec}}]"


def _aligned(headers: Optional[Sequence], rows: Sequence[Sequence], align: Optional[Sequence[str]],
             ruled: bool) -> str:
    head = [list(headers)] if headers is not None else []
    body = [list(r) for r in rows]
    ncol = len(head[0]) if head else max((len(r) for r in body), default=0)
    widths = [max((len(str(r[i])) for r in head + body), default=0) for i in range(ncol)]
    align = list(align or "l" * ncol)

    def line(cells) -> str:
        text = "  ".join(str(c).rjust(w) if a == "r" else str(c).ljust(w) for c, w, a in zip(cells, widths, align))
        return text if ruled else text.rstrip()

    lines = [line(r) for r in head]
    if ruled:
        lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines + [line(r) for r in body])


_RAW_HTML = re.compile(r"<(?=[A-Za-z/!?])")
_CODE_SPAN = re.compile(r"(`+)[^`\n](?:.*?[^`])??\1(?!`)")


def md_safe(text: str) -> str:
    """Markdown text in which no raw HTML survives: every ``<`` that could open a tag, a comment
    or a declaration (``<img src=x onerror=...>``, ``</b>``, ``<!--``) becomes ``&lt;`` (a viewer shows
    it as ``<``); ``< 0.05`` and ``<=`` stay as they are, and so does a code span (`` `<folder>` ``: shown as
    written, never as HTML). Reports apply it to the whole of report.md,
    so run fields (names, statuses, errors, config values) reach it as text, as report.html
    escapes them."""
    text, out, at = str(text), [], 0
    for m in _CODE_SPAN.finditer(text):  # a code span shows its text as it is, HTML included: kept
        out += [_RAW_HTML.sub("&lt;", text[at:m.start()]), m.group(0)]
        at = m.end()
    return "".join(out + [_RAW_HTML.sub("&lt;", text[at:])])


def _markdown(headers: Sequence, rows: Sequence[Sequence]) -> str:
    def esc(s) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _html(headers: Sequence, rows: Sequence[Sequence], table_attrs: str,
          row_attrs: Optional[Sequence[str]], cell_attrs: Optional[Sequence[Sequence[str]]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = []
    for i, r in enumerate(rows):
        attrs = cell_attrs[i] if cell_attrs is not None else [""] * len(r)
        cells = "".join(f"<td{a}>{html.escape(str(c))}</td>" for c, a in zip(r, attrs))
        body.append(f"<tr{row_attrs[i] if row_attrs is not None else ''}>{cells}</tr>")
    return f"<table{table_attrs}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def table(headers: Optional[Sequence], rows: Sequence[Sequence], style: str = "plain", *,
          align: Optional[Sequence[str]] = None, table_attrs: str = "", row_attrs: Optional[Sequence[str]] = None,
          cell_attrs: Optional[Sequence[Sequence[str]]] = None) -> str:
    """Rows of cells (anything ``str()`` can render) as a text table; see the module doc for
    the styles. ``headers=None`` (plain/ruled only) prints no header line. ``align`` gives
    ``"l"`` or ``"r"`` per column (plain/ruled; default all left). ``table_attrs``,
    ``row_attrs[i]`` and ``cell_attrs[i][j]`` are attribute strings (e.g. ``' id="t"'``)
    pasted into the HTML tags as given."""
    if style in ("plain", "ruled"):
        return _aligned(headers, rows, align, style == "ruled")
    if headers is None:
        raise ValueError(f"a {style} table needs headers")
    if style == "markdown":
        return _markdown(headers, rows)
    if style == "html":
        return _html(headers, rows, table_attrs, row_attrs, cell_attrs)
    raise ValueError(f"unknown table style {style!r} (one of {', '.join(STYLES)})")
