"""Equivalence-checking worker process of :mod:`evals.verifier`'s pool (not imported by it).

Run as a script (``python evals/_verify_worker.py``); it reads one JSON request per line
on stdin, ``{"pred": str, "gold": str}``, and writes one JSON reply per line on stdout,
``{"ok": bool, "how": str}``. It prints ``{"ready": true}`` once its imports are done.

It is deliberately self-contained (imports nothing from the project) and runs
``math_verify`` with its own signal-based timeouts switched off: the parent process
enforces the per-answer time limit by killing this process when a reply is late, so a
hung sympy computation costs one restart, never a hung trainer. Without math_verify (or
when math_verify cannot parse one side) a small fallback parses both sides into sympy
expressions with its own whitelisted grammar (numbers, fractions, roots, powers, letters as
symbols): it never evaluates the text, so an answer written as Python code is a parse error,
graded wrong.
"""
import json
import os
import sys

# This file lives in evals/, which also holds datasets.py etc.: keep that folder off the
# import path so nothing here can shadow a real package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def _limit_resources():
    try:  # die with the parent, even while stuck in C code that holds the GIL
        import ctypes
        import signal
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    mb = int(os.environ.get("GRPO_HARNESS_VERIFY_MEM_MB", "3072") or 0)
    if mb > 0:
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            lim = mb * 1024 * 1024
            if hard == resource.RLIM_INFINITY or hard > lim:
                resource.setrlimit(resource.RLIMIT_AS, (lim, hard))
        except Exception:
            pass


_CACHE: dict = {}
_CACHE_MAX = 20000


def _mv_parse(s):
    from math_verify import parse
    key = ("mv", s)
    if key in _CACHE:
        return _CACHE[key]
    out = []
    for text in ("\\boxed{" + s + "}", "$" + s + "$", s):
        try:
            out = parse(text, parsing_timeout=None)
        except Exception:
            out = []
        if out:
            break
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = out
    return out


# -- sympy fallback ----------------------------------------------------------------------
# The fallback never evaluates the answer's text: no ``parse_expr``, ``sympify`` or ``eval``,
# which would run whatever Python a model writes (``__import__('os').system(...)``). A small
# recursive-descent parser builds the sympy expression itself from a fixed grammar:
#
#     expr   := term (('+' | '-') term)*
#     term   := factor (('*' | '/') factor | factor)*        (juxtaposition multiplies: 2x, 2(x+1))
#     factor := ('+' | '-') factor | power
#     power  := atom ('^' factor)?                           (right-associative; ** is ^)
#     atom   := number | letters | 'sqrt' '(' expr ')' | '(' expr ')'
#
# Characters outside digits, ASCII letters, spaces, ``+ - * / ^ ( ) .`` are refused before
# parsing (no quotes, underscores, brackets other than parentheses, commas, colons, ...), so
# nothing resembling a call, an attribute or a dunder reaches sympy. Letters are only ever
# sympy Symbols: ``pi`` is pi, ``sqrt`` the one function, a Greek letter name one symbol, and any
# other run of letters the product of its letters (``2xy`` = 2*x*y), as sympy's own parser did.
_ALLOWED_RE = None
_GREEK = frozenset("alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu "
                   "xi omicron rho sigma tau upsilon phi varphi chi psi omega".split())
_MAX_DEPTH = 60          # nesting of parentheses / unary signs / powers
_MAX_POW_BITS = 200000   # a numeric power that would build a larger number is refused, not computed


def _latex_to_sympy_text(s: str) -> str:
    import re
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\[dt]?frac\s*\{", r"\\frac{", s)
    for _ in range(20):  # innermost \frac{a}{b} / \sqrt{a} first
        new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        new = re.sub(r"\\sqrt\[([^{}\]]*)\]\{([^{}]*)\}", r"((\2)**(1/(\1)))", new)
        new = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", new)
        if new == s:
            break
        s = new
    s = re.sub(r"\\sqrt\s*(\d+|[a-zA-Z])", r"sqrt(\1)", s)
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"((\1)/(\2))", s)
    s = (s.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", "pi").replace("^", "**")
         .replace("{", "(").replace("}", ")").replace("\\", ""))
    s = s.replace("\u00d7", "*").replace("\u22c5", "*").replace("\u00b7", "*").replace("\u00f7", "/") \
        .replace("\u2212", "-")
    return s


def _tokens(text: str) -> list:
    """(kind, value) tokens of a whitelisted expression; ValueError for anything else."""
    import re
    global _ALLOWED_RE
    if _ALLOWED_RE is None:
        _ALLOWED_RE = re.compile(r"[0-9A-Za-z\s+\-*/^().]*")
    if not _ALLOWED_RE.fullmatch(text):
        raise ValueError("character outside the expression whitelist")
    text = text.replace("**", "^")
    tok_re = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
                        r"|(?P<name>[A-Za-z]+)|(?P<op>[+\-*/^()]))")
    out, i = [], 0
    text = text.rstrip()
    while i < len(text):
        m = tok_re.match(text, i)
        if not m or m.end() == i:
            raise ValueError(f"unexpected text at {i}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        i = m.end()
    return out


class _Parser:
    def __init__(self, tokens: list):
        import sympy
        self.sp = sympy
        self.toks = tokens
        self.i = 0
        self.depth = 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else (None, None)

    def take(self, value=None):
        tok = self.peek()
        if tok[0] is None or (value is not None and tok[1] != value):
            raise ValueError(f"expected {value or 'more'}")
        self.i += 1
        return tok

    def _nest(self):
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise ValueError("expression nested too deeply")

    def parse(self):
        e = self.expr()
        if self.i != len(self.toks):
            raise ValueError("trailing text")
        return e

    def expr(self):
        e = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            t = self.term()
            e = e + t if op == "+" else e - t
        return e

    def _starts_atom(self) -> bool:
        kind, val = self.peek()
        return kind in ("num", "name") or (kind, val) == ("op", "(")

    def term(self):
        e = self.factor()
        while True:
            kind, val = self.peek()
            if (kind, val) in (("op", "*"), ("op", "/")):
                self.take()
                f = self.factor()
                e = e * f if val == "*" else e / f
            elif self._starts_atom():
                e = e * self.power()
            else:
                return e

    def factor(self):
        kind, val = self.peek()
        if (kind, val) in (("op", "+"), ("op", "-")):
            self.take()
            self._nest()
            f = self.factor()
            self.depth -= 1
            return -f if val == "-" else f
        return self.power()

    def power(self):
        base = self.atom()
        if self.peek() == ("op", "^"):
            self.take()
            self._nest()
            exp = self.factor()
            self.depth -= 1
            _check_power(base, exp)
            return base ** exp
        return base

    def atom(self):
        sp = self.sp
        kind, val = self.take()
        if kind == "num":
            from fractions import Fraction
            f = Fraction(val)
            return sp.Rational(f.numerator, f.denominator)
        if kind == "op" and val == "(":
            self._nest()
            e = self.expr()
            self.take(")")
            self.depth -= 1
            return e
        if kind == "name":
            if val == "sqrt":
                self.take("(")
                self._nest()
                e = self.expr()
                self.take(")")
                self.depth -= 1
                return sp.sqrt(e)
            if val == "pi":
                return sp.pi
            if val in _GREEK:
                return sp.Symbol(val)
            out = sp.Integer(1)
            for ch in val:
                out = out * sp.Symbol(ch)
            return out
        raise ValueError(f"unexpected {val!r}")


def _check_power(base, exp) -> None:
    """Refuse a numeric power whose value would be huge (10^{10^{10}}): sympy would compute it."""
    if not (base.is_Rational and exp.is_Rational):
        return
    if base in (0, 1, -1):
        return
    bits = max(abs(int(base.p)).bit_length(), abs(int(base.q)).bit_length())
    if bits * abs(exp.p) > _MAX_POW_BITS * max(1, abs(int(exp.q))):
        raise ValueError("power too large")


def _sympy_parse(s: str):
    """A sympy expression for the answer ``s`` (LaTeX or plain), built without evaluating
    text; ValueError when ``s`` is outside the grammar above."""
    return _Parser(_tokens(_latex_to_sympy_text(s))).parse()


def _split_top(s: str):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]


def _sympy_equal(pred: str, gold: str) -> bool:
    import sympy
    p, g = pred.strip(), gold.strip()
    if p[:1] + p[-1:] in ("()", "[]") and g[:1] + g[-1:] == p[:1] + p[-1:]:  # tuples: order matters
        ps, gs = _split_top(p[1:-1]), _split_top(g[1:-1])
        return len(ps) == len(gs) and all(_sympy_equal(a, b) for a, b in zip(ps, gs))
    a, b = _sympy_parse(p), _sympy_parse(g)
    try:
        if sympy.simplify(a - b) == 0:
            return True
    except Exception:
        pass
    try:
        return bool(abs(complex(sympy.N(a - b))) < 1e-9)
    except Exception:
        return False


def check(pred: str, gold: str):
    """(equal, how) for two extracted answers; never raises."""
    try:
        import math_verify  # noqa: F401
        have_mv = True
    except Exception:
        have_mv = False
    if have_mv:
        try:
            from math_verify import verify
            g, p = _mv_parse(gold), _mv_parse(pred)
            if g and p:
                return bool(verify(g, p, timeout_seconds=None)), "math_verify"
        except Exception:
            pass
    try:
        return _sympy_equal(pred, gold), "sympy"
    except Exception:
        return False, "error"


def main():
    _limit_resources()
    if os.environ.get("GRPO_HARNESS_VERIFY_PRELOAD", "1") != "0":
        try:
            import math_verify  # noqa: F401  (pay the import before the first timed request)
            import sympy  # noqa: F401
        except Exception:
            pass
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            ok, how = check(str(req["pred"]), str(req["gold"]))
        except BaseException as e:  # noqa: BLE001 (MemoryError, RecursionError, ...)
            ok, how = False, f"error: {type(e).__name__}"
        out.write(json.dumps({"ok": bool(ok), "how": how}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
