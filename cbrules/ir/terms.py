"""Index and predicate terms: small immutable expression trees.

A term is a constant, a name (loop variable, tensor extent, register value, a CUDA builtin such as
``threadIdx.x``), a unary/binary operation, or a call of one of :data:`DEVICE_FUNCTIONS`
(``elect_one()``, ``min(a, b)``, ``ceil_div(n, 256)``): the one table of functions a term may call,
shared by the builder, the rule values, the host evaluator and codegen.
Terms parse from C-like text (``"(i + 2) % 3"``), print as C, and compare structurally, so graph
rules and the egglog bridge can treat them as values. Division and modulo follow C: they truncate.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Optional, Union

from ..errors import CbrulesError

BINARY_OPS = ("||", "&&", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%")
UNARY_OPS = ("-", "!")
# C precedence, loosest first: every level is left-associative.
_LEVELS = (("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="), ("+", "-"), ("*", "/", "%"))
_PREC = {op: i for i, level in enumerate(_LEVELS) for op in level}


@dataclass(frozen=True)
class Term:
    """One node of an expression tree; ``op`` is 'const', 'name', 'call', or an operator symbol.

    A term never changes, so what is read of it is kept in its instance dict, outside the fields that
    equality and hashing compare: its names (:meth:`names`), its size and height (:func:`extent`; set
    when the term is made over operands that have theirs, as builders and rules make terms) and
    whether it is printable (``cbrules.ir.attributes.term_problem``)."""

    op: str
    args: tuple["Term", ...] = ()
    value: Union[int, float, bool, str, None] = None

    def __init__(self, op: str, args: tuple["Term", ...] = (), value: Union[int, float, bool, str, None] = None):
        # the fields written straight into the instance: a frozen dataclass's own __init__ goes through
        # object.__setattr__ for each, twice the cost, and lowering a large kernel makes ~10**5 terms
        d = self.__dict__
        d["op"], d["args"], d["value"] = op, args, value
        if not args:
            d["_extent"] = _LEAF
        elif len(args) <= 2:  # an operator over measured operands (the usual case): measured now
            a = args[0].__dict__.get("_extent") if args[0].__class__ is Term else _LEAF
            b = args[-1].__dict__.get("_extent") if args[-1].__class__ is Term else _LEAF
            if a is not None and b is not None:
                d["_extent"] = (1 + a[0] + (b[0] if len(args) == 2 else 0), 1 + (a[1] if a[1] > b[1] else b[1]))

    # -- construction helpers so that builder code reads like the kernel ----------------------
    def _bin(self, op: str, other: "TermLike", swap: bool = False) -> "Term":
        a, b = self, as_term(other)
        return Term(op, (b, a) if swap else (a, b))

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    # ``/`` and ``//`` both mean C division (truncating on integers)
    def __truediv__(self, o): return self._bin("/", o)
    def __rtruediv__(self, o): return self._bin("/", o, True)
    __floordiv__, __rfloordiv__ = __truediv__, __rtruediv__
    def __mod__(self, o): return self._bin("%", o)
    def __rmod__(self, o): return self._bin("%", o, True)
    def __neg__(self): return Term("-", (self,))
    def lt(self, o): return self._bin("<", o)
    def le(self, o): return self._bin("<=", o)
    def gt(self, o): return self._bin(">", o)
    def ge(self, o): return self._bin(">=", o)
    def eq(self, o): return self._bin("==", o)
    def ne(self, o): return self._bin("!=", o)
    def and_(self, o): return self._bin("&&", o)
    def or_(self, o): return self._bin("||", o)

    def __str__(self) -> str:
        return to_c(self)

    def __deepcopy__(self, memo) -> "Term":
        return self  # immutable: graph copies share terms

    def __repr__(self) -> str:
        return f"Term({to_c(self)!r})"

    def names(self) -> Iterator[str]:
        """Every name the term mentions (loop variables, symbols, registers, builtins), in order of
        mention. Read once per term object and kept on it (terms never change; lowering a large kernel
        asks this of every term several times, mostly of the same objects), with an explicit stack:
        a generator per level cost most of the walk."""
        got = self.__dict__.get("_names")
        if got is None:
            out, stack = [], [self]
            while stack:
                t = stack.pop()
                if t.op == "name":
                    out.append(str(t.value))
                if t.args:
                    stack.extend(reversed(t.args))
            got = self.__dict__["_names"] = tuple(out)
        return iter(got)


TermLike = Union[Term, int, float, bool, str]
_LEAF = (1, 0)  # a leaf's extent (see extent())

# how large a term may be in a graph (verify refuses larger ones, and a rule may not set one): codegen,
# egglog and the interpreter read terms recursively and print every part, and the shipped kernels'
# largest term has 27 parts and is 7 levels deep
MAX_TERM_DEPTH = 200
MAX_TERM_PARTS = 10_000
# a kernel as built gets half of each, so that what the rules put around a user's term stays within them
BUILT_TERM_DEPTH = MAX_TERM_DEPTH // 2
BUILT_TERM_PARTS = MAX_TERM_PARTS // 2


def fits(t: Term, levels: int, parts: int) -> bool:
    """Whether ``t`` nests at most ``levels`` operators deep and prints in at most ``parts`` parts:
    a walk that stops as soon as either is passed, so it takes at most ``parts`` steps and never
    recurses deeper than ``levels`` whatever ``t`` is (the cheap test; :func:`extent` gives the figures)."""
    return _fits(t, levels, [parts])


def _fits(t: Term, left: int, budget: list[int]) -> bool:
    budget[0] -= 1
    if left < 0 or budget[0] < 0:
        return False
    for a in getattr(t, "args", ()):
        if not _fits(a, left - 1, budget):
            return False
    return True


def extent(t: Term) -> tuple[int, int]:
    """(parts, height) of ``t`` as printed (a leaf: 1 part, height 0), with an explicit stack and
    each distinct subterm object counted once: a term may be far too deep to walk recursively, and
    one that shares its subterms (``x + x`` doubled 40 times) is 2**40 parts as printed but 41
    objects. Anything but a term counts as a leaf. Each subterm keeps its figures (terms never
    change; most got theirs when made, see :class:`Term`)."""
    if not isinstance(t, Term):
        return 1, 0
    got = t.__dict__.get("_extent")
    if got is not None:
        return got
    stack = [(t, False)]
    while stack:
        x, ready = stack.pop()
        d = x.__dict__
        if "_extent" in d:
            continue
        if not ready:
            stack.append((x, True))
            stack.extend((a, False) for a in x.args if isinstance(a, Term))
            continue
        parts, height = 1, 0
        for a in x.args:
            p, h = a.__dict__["_extent"] if isinstance(a, Term) else (1, 0)
            parts, height = parts + p, max(height, h + 1)
        d["_extent"] = (parts, height)
    return t.__dict__["_extent"]


def const(v: Union[int, float, bool]) -> Term:
    """A literal."""
    return Term("const", (), v)


def name(n: str) -> Term:
    """A reference to a loop variable, symbol, register value or CUDA builtin."""
    return Term("name", (), n)


def call(fn: str, *args: TermLike) -> Term:
    """A function application such as ``elect_one()`` or ``min(a, b)``; ``fn`` must be one of
    :data:`DEVICE_FUNCTIONS`, called with its number of arguments (else :class:`DeviceFunctionError`)."""
    check_call(fn, len(args))
    return Term("call", tuple(as_term(a) for a in args), fn)


class TermTypeError(CbrulesError, TypeError):
    """A value that is no number, term or expression text where a term is needed (a TypeError too,
    for callers that catch that)."""


def as_term(x: TermLike) -> Term:
    """Coerce Python numbers, text (parsed) and terms into a term."""
    if isinstance(x, Term):
        return x
    if isinstance(x, bool):
        return const(x)
    if isinstance(x, (int, float)):
        return const(x)
    if isinstance(x, str):
        return parse(x)
    raise TermTypeError(f"cannot make a term from {x!r} ({type(x).__name__}); give an int, a float, a term "
                        "(e.g. threadIdx.x, a loaded value) or an expression text")


# ------------------------------------------------------------------------------ device functions

def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


@dataclass(frozen=True)
class DeviceFunction:
    """A function a term may call: its number of arguments and, where the host can compute it,
    its value there (``elect_one`` picks a thread: only the device knows)."""

    arity: int
    host: Optional[Callable[..., object]] = None


def swizzle_index(i, esize, span):
    """The element of a TMA-swizzled tile where logical element ``i`` (dense row-major) lies: its byte
    offset ``o = i * esize`` with the 16-byte chunk ``(o >> 4) & m`` XORed by the row ``(o >> 7) & m``,
    ``m = span / 16 - 1`` (span 128, 64 or 32 bytes; the pattern repeats every 8 * span bytes).
    Works on ints and numpy arrays alike."""
    o = i * esize
    return (o ^ (((o >> 7) & (span // 16 - 1)) << 4)) // esize


def byte_perm(x, y, selector):
    """CUDA's ``__byte_perm(x, y, s)`` (PTX ``prmt.b32``): byte i of the result is byte ``(s >> 4i) & 7``
    of the eight bytes of ``y:x`` (x's bytes 0-3, y's 4-7). Works on ints and numpy arrays (as int64) alike."""
    if any(hasattr(v, "shape") for v in (x, y, selector)):
        import numpy as np
        x, y, selector = (np.asarray(v).astype(np.int64) for v in (x, y, selector))
    out = 0
    for i in range(4):
        pick = (selector >> (4 * i)) & 7
        source = (pick < 4) * (x & 0xFFFFFFFF) + (pick >= 4) * (y & 0xFFFFFFFF)
        out = out | (((source >> (8 * (pick & 3))) & 0xFF) << (8 * i))
    return out


DEVICE_FUNCTIONS: dict[str, DeviceFunction] = {
    "elect_one": DeviceFunction(0),
    "elect_warp": DeviceFunction(1),  # one elected thread of warp w (the producer warp group's first warp)
    # ceil_div as the device computes it: (a + b - 1) / b with C's truncating division
    "ceil_div": DeviceFunction(2, lambda a, b: _trunc_div(a + b - 1, b)),
    "min": DeviceFunction(2, min),
    "max": DeviceFunction(2, max),
    # swizzle(i, element bytes, span bytes): see swizzle_index
    "swizzle": DeviceFunction(3, swizzle_index),
    # byte_perm(x, y, selector): CUDA's __byte_perm (an FP8 register operand's bytes moved between lanes)
    "byte_perm": DeviceFunction(3, byte_perm),
}


class DeviceFunctionError(CbrulesError, ValueError):
    """A call of a function that is not in :data:`DEVICE_FUNCTIONS`, or with the wrong arity."""


def call_problem(fn: object, nargs: int) -> Optional[str]:
    """Why ``fn(<nargs arguments>)`` may not appear in a term, or None."""
    if not isinstance(fn, str) or fn not in DEVICE_FUNCTIONS:
        known = ", ".join(f"{f}/{d.arity}" for f, d in DEVICE_FUNCTIONS.items())
        return f"{fn!r} is not a device function a term may call; the table holds {known}"
    want = DEVICE_FUNCTIONS[fn].arity
    if nargs != want:
        return f"{fn}() takes {want} argument(s), got {nargs}"
    return None


def check_call(fn: object, nargs: int) -> None:
    """Raise :class:`DeviceFunctionError` unless ``fn`` may be called with ``nargs`` arguments."""
    why = call_problem(fn, nargs)
    if why:
        raise DeviceFunctionError(why)


ELECT_ONE = call("elect_one")


# ---------------------------------------------------------------------------------- parsing

# ASCII only: a name must be a C identifier (or a builtin such as threadIdx.x), a digit a C digit
_TOKEN = re.compile(r"\s*(?:(\d+\.\d*(?:[eE][-+]?\d+)?f?|\d+)|([A-Za-z_][\w.]*)|(\|\||&&|==|!=|<=|>=|[-+*/%<>!(),]))",
                    re.ASCII)


class TermSyntaxError(CbrulesError, ValueError):
    """Text that is not a term; the message points at the column."""


# how much term text is read: a term within MAX_TERM_PARTS prints in far fewer characters, and a
# 64-bit integer or a double's 17 significant digits (with its exponent) in far fewer digits; both are
# judged before a token is converted (int() of thousands of digits is refused by Python itself)
MAX_TERM_TEXT = 100_000
MAX_LITERAL_DIGITS = 40


def _tokens(text: str) -> list[tuple[str, str, int]]:
    if len(text) > MAX_TERM_TEXT:
        raise TermSyntaxError(f"term text of {len(text)} characters ({text[:40]!r}...); a term is at most "
                              f"{MAX_TERM_TEXT} characters")
    out, pos = [], 0
    while pos < len(text):
        if text[pos:pos + 1].isspace() and text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:
            col = len(text) - len(text[pos:].lstrip())
            raise TermSyntaxError(f"unexpected character {text[col]!r} in term {_short(text)} at column {col + 1}")
        kind = "num" if m.group(1) else "id" if m.group(2) else "op"
        if kind == "num" and len(m.group(1)) > MAX_LITERAL_DIGITS:
            raise TermSyntaxError(f"a number of {len(m.group(1))} digits in term {_short(text)} at column "
                                  f"{m.start(1) + 1}; a literal has at most {MAX_LITERAL_DIGITS} (a 64-bit integer "
                                  "has 19)")
        out.append((kind, m.group(m.lastindex), m.start(m.lastindex)))
        pos = m.end()
    return out


def _short(text: str) -> str:
    """The term text as quoted in a message: long text cut short."""
    return repr(text) if len(text) <= 60 else repr(text[:60]) + "..."


def parse(text: str) -> Term:
    """Parse C-like text (``"(i + 2) % 3"``, ``"threadIdx.x < 32 && elect_one()"``) into a term.

    Operator precedence is resolved with explicit stacks (no recursion), so that no text can exhaust
    Python's stack; text longer than :data:`MAX_TERM_TEXT`, a literal of more than
    :data:`MAX_LITERAL_DIGITS` digits, and a term nested deeper than :data:`MAX_TERM_DEPTH` (or of more
    than :data:`MAX_TERM_PARTS` parts) are a :class:`TermSyntaxError` before any of it is built."""
    toks = _tokens(text)
    quoted = _short(text)
    operands: list[Term] = []
    # pending: ["(", col] | ["call", name, col, args so far] | ["u", op, col] | ["b", op, col]
    pending: list[list] = []
    depth = 0  # open parentheses, calls and unary operators not yet applied
    want_operand = True

    def apply(entry: list) -> None:
        if entry[0] == "u":
            inner = operands.pop()
            if entry[1] == "-" and inner.op == "const" and not isinstance(inner.value, bool):
                operands.append(const(-inner.value))
            else:
                operands.append(Term(entry[1], (inner,)))
        else:
            rhs = operands.pop()
            operands.append(Term(entry[1], (operands.pop(), rhs)))

    def operand_done(t: Term) -> None:
        nonlocal want_operand, depth
        operands.append(t)
        want_operand = False
        while pending and pending[-1][0] == "u":  # unary operators bind to the operand they precede
            apply(pending.pop())
            depth -= 1

    def reduce(prec: int) -> None:  # apply the pending binary operators of precedence >= prec
        while pending and pending[-1][0] == "b" and _PREC[pending[-1][1]] >= prec:
            apply(pending.pop())

    def finish_call(entry: list) -> None:
        nonlocal depth
        _, fn, col, nargs = entry
        why = call_problem(fn, nargs)
        if why:
            raise DeviceFunctionError(f"in term {quoted} at column {col + 1}: {why}")
        args = tuple(operands[len(operands) - nargs:]) if nargs else ()
        del operands[len(operands) - nargs:]
        depth -= 1
        operand_done(Term("call", args, fn))

    i = 0
    while i < len(toks):
        kind, tok, col = toks[i]
        i += 1
        if want_operand:
            if kind == "num":
                operand_done(const(float(tok.rstrip("f")) if "." in tok else int(tok)))
            elif kind == "id" and tok in ("true", "false"):
                operand_done(const(tok == "true"))
            elif kind == "id" and i < len(toks) and toks[i][1] == "(":
                i += 1
                depth += 1
                if i < len(toks) and toks[i][1] == ")":
                    i += 1
                    finish_call(["call", tok, col, 0])
                else:
                    pending.append(["call", tok, col, 0])
            elif kind == "id":
                operand_done(name(tok))
            elif tok == "(" or tok in UNARY_OPS:
                pending.append(["(", col] if tok == "(" else ["u", tok, col])
                depth += 1
            else:
                raise TermSyntaxError(f"unexpected {tok!r} in term {quoted} at column {col + 1}")
            if depth > MAX_TERM_DEPTH:
                raise TermSyntaxError(f"term {quoted} nests parentheses, calls and unary operators more than "
                                      f"{MAX_TERM_DEPTH} deep (at column {col + 1})")
        elif kind == "op" and tok in _PREC:  # left-associative: equal precedence applies first
            reduce(_PREC[tok])
            pending.append(["b", tok, col])
            want_operand = True
        elif tok in (")", ","):
            reduce(0)
            top = pending[-1] if pending else None
            if top is None or top[0] not in ("(", "call") or (tok == "," and top[0] != "call"):
                raise TermSyntaxError(f"unexpected {tok!r} in term {quoted} at column {col + 1}")
            top_call = top[0] == "call"
            if top_call:
                top[3] += 1
            if tok == ",":
                want_operand = True
            elif top_call:
                finish_call(pending.pop())
            else:
                pending.pop()
                depth -= 1
                t = operands.pop()
                operand_done(t)
        else:
            raise TermSyntaxError(f"unexpected {tok!r} in term {quoted} at column {col + 1}")
    if want_operand:
        raise TermSyntaxError(f"term {quoted} ends too early")
    reduce(0)
    if pending:
        raise TermSyntaxError(f"expected ')' in term {quoted} at column {len(text) + 1}")
    t = operands.pop()
    parts, height = extent(t)  # measured as built: a long chain (a + a + ... + a) is deep without nesting
    if height > MAX_TERM_DEPTH or parts > MAX_TERM_PARTS:
        raise TermSyntaxError(f"term {quoted} is {height} operators deep and {parts} parts; a term is at most "
                              f"{MAX_TERM_DEPTH} deep and {MAX_TERM_PARTS} parts")
    return t


# ---------------------------------------------------------------------------------- printing

NON_FINITE_C = {"inf": "__int_as_float(0x7f800000)", "-inf": "__int_as_float(0xff800000)",
                "nan": "__int_as_float(0x7fffffff)"}


def to_c(t: Term, calls: Optional[Mapping[str, str]] = None, names: Optional[Mapping[str, str]] = None) -> str:
    """C text of a term with the fewest parentheses that keep its meaning.

    ``calls`` and ``names`` rename functions and names on the way out (codegen maps ``elect_one``
    onto its helper and ``threadIdx.x`` onto a signed int).
    """
    calls = calls or {}
    names = names or {}

    def go(t: Term, parent_prec: int, right: bool) -> str:
        if t.op == "const":
            v = t.value
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, float):
                # C has no literal for them: float bit patterns (a double context widens them exactly)
                return NON_FINITE_C[repr(v)] if repr(v) in NON_FINITE_C else repr(v) + "f"
            return str(v) if v >= 0 or parent_prec < 0 else f"({v})"
        if t.op == "name":
            return names.get(str(t.value), str(t.value))
        if t.op == "call":
            fn = calls.get(str(t.value), str(t.value))
            return f"{fn}({', '.join(go(a, -1, False) for a in t.args)})"
        if len(t.args) == 1:
            return f"{t.op}{go(t.args[0], len(_LEVELS), False)}"
        prec = _PREC[t.op]
        s = f"{go(t.args[0], prec, False)} {t.op} {go(t.args[1], prec, True)}"
        # left-associative: a right operand of equal precedence needs parentheses
        return f"({s})" if prec < parent_prec or (right and prec == parent_prec) else s

    return go(t, -1, False)


# ---------------------------------------------------------------------------------- evaluation

_EVAL = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: _trunc_div(a, b) if isinstance(a, int) and isinstance(b, int) else a / b,
    "%": lambda a, b: a - b * _trunc_div(a, b) if isinstance(a, int) else a % b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "&&": lambda a, b: bool(a) and bool(b), "||": lambda a, b: bool(a) or bool(b),
}


def evaluate(t: Term, env: Mapping[str, object]) -> object:
    """Value of a term under ``env`` with C semantics for ``/`` and ``%`` on integers."""
    if t.op == "const":
        return t.value
    if t.op == "name":
        if t.value not in env:
            raise KeyError(f"term {to_c(t)!r}: no value for {t.value!r}")
        return env[t.value]
    args = [evaluate(a, env) for a in t.args]
    if t.op == "call":
        fn = DEVICE_FUNCTIONS.get(t.value)  # type: ignore[arg-type]
        if fn is None or fn.host is None:
            raise KeyError(f"cannot evaluate call {t.value!r} on the host")
        return fn.host(*args)
    if len(args) == 1:
        return -args[0] if t.op == "-" else not args[0]
    return _EVAL[t.op](*args)


def substitute(t: Term, mapping: Mapping[str, Term]) -> Term:
    """Replace names by terms (e.g. a loop variable ``i`` by ``i + 2``)."""
    if t.op == "name":
        return mapping.get(str(t.value), t)
    if not t.args:
        return t
    args = tuple([substitute(a, mapping) for a in t.args])
    for a, b in zip(args, t.args):
        if a is not b:
            return Term(t.op, args, t.value)
    return t  # nothing replaced: the same object (with the figures it keeps)


# ------------------------------------------------------------------------------ linear facts

def coefficient(t: Term, var: str) -> Optional[int]:
    """The integer ``c`` with ``t = c * var + (a term without var)`` for every value of the names, decided
    from the term's structure; None when ``t`` is not of that form (``var`` under ``/``, ``%``, a call,
    or times something that is not a constant)."""
    if var not in set(t.names()):
        return 0
    if t.op == "name":
        return 1
    if t.op in ("+", "-") and len(t.args) == 2:
        a, b = (coefficient(x, var) for x in t.args)
        return None if a is None or b is None else a + b if t.op == "+" else a - b
    if t.op == "-" and len(t.args) == 1:
        a = coefficient(t.args[0], var)
        return None if a is None else -a
    if t.op == "*":
        for x, y in (t.args, t.args[::-1]):
            if var not in set(x.names()) and x.op == "const" and isinstance(x.value, int) \
                    and not isinstance(x.value, bool):
                c = coefficient(y, var)
                return None if c is None else x.value * c
    return None


def divisor(t: Term) -> int:
    """A ``d`` >= 0 that divides ``t`` for every value of its names (0: t is 0), decided from the
    structure: constants, sums, products and C remainders (``a % b`` is ``a - (a / b) * b``) of
    multiples of d are multiples of d; any other name or call gives 1."""
    if t.op == "const":
        v = t.value
        return abs(v) if isinstance(v, int) and not isinstance(v, bool) else 1
    if t.op in ("+", "-", "%") and len(t.args) == 2:
        return math.gcd(divisor(t.args[0]), divisor(t.args[1]))
    if t.op == "-" and len(t.args) == 1:
        return divisor(t.args[0])
    if t.op == "*":
        return divisor(t.args[0]) * divisor(t.args[1])
    return 1
