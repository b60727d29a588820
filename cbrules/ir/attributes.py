"""What value an attribute may hold: identifier-valued attributes (names codegen prints), the
integer-valued ones (sizes, counts, ids) with their ranges, and terms codegen can print. :mod:`cbrules.ir.verify` checks a whole
graph with these; rule actions and the interpreter ask :func:`attribute_problem` of one value, so an
error points at the rule text or the step that set it."""
from __future__ import annotations

import math
from typing import Any

from .limits import SETMAXNREG_MAX, SETMAXNREG_MIN, SETMAXNREG_STEP
from .names import RULES, problem
from .ops import BINARY, CACHE_HINTS, L2_PROMOTIONS, MAX_BACKOFF_NS, MAX_WAIT_TIMEOUT_NS, OPS, UNARY, WARP_SIZE
from .terms import BINARY_OPS, MAX_TERM_DEPTH, MAX_TERM_PARTS, UNARY_OPS, Term, call_problem, extent


def register_count(x) -> bool:
    """A register count setmaxnreg accepts: a multiple of 8 in 24..256 (:mod:`.limits`)."""
    return isinstance(x, int) and not isinstance(x, bool) and SETMAXNREG_MIN <= x <= SETMAXNREG_MAX \
        and x % SETMAXNREG_STEP == 0


# identifier-valued attributes codegen prints, per op (compute ops: their ``dst`` register)
IDENT_KEYS = {"kernel": ("name",), "alloc": ("buf",), "for": ("var",), "load": ("dst", "src"), "store": ("dst",),
              "copy": ("dst", "src"),
              "tma_load": ("tmap", "dst", "barrier"), "tma_store": ("tmap", "src"),
              "mma": ("acc", "a", "b"), "block_stats": ("dst", "dst_m2")}


def ident_keys(op: str) -> tuple[str, ...]:
    """The attributes of an ``op`` node that hold names codegen prints."""
    spec = OPS.get(op)
    return IDENT_KEYS.get(op) or (("dst",) if spec and spec.category == "compute" else ("barrier",))


# how many terms an op's args holds (codegen prints each by position: fmaf(a, b, c))
ARG_COUNTS = {"fma": 3, "select": 3, "block_stats": 2, "shfl": 2, "cvt_pack": 2, **{u: 1 for u in UNARY},
              **{b: 2 for b in BINARY}}


def attribute_problem(op: str, key: str, value: Any) -> str | None:
    """Why ``value`` cannot be attribute ``key`` of an ``op`` node for codegen (a name that is not a
    valid identifier, an int attribute that is not an int in range, args of the wrong count), else
    None. Rule actions may call it when they set an attribute, so that the error points at the rule's
    own text."""
    if key == "args" and op in ARG_COUNTS:
        want = ARG_COUNTS[op]
        if not isinstance(value, tuple):
            return f"is {value!r}, not a tuple of {want} terms"
        if len(value) != want:
            return f"holds {len(value)} value(s); {op} takes exactly {want}"
    if key in ident_keys(op):
        why = problem(value, RULES)
        return f"{value!r} {why[0]}; {why[1]}" if why else None
    choices = ENUM_ATTRS.get((op, key))
    if choices is not None:
        return None if isinstance(value, str) and value in choices else \
            f"{value!r} is not one of {', '.join(map(repr, choices))}"
    entry = INT_LOWEST.get((op, key))
    if entry is None:
        return None
    low, many = entry
    if (op, key) in TERM_OR_INT and isinstance(value, Term):
        if value.op != "const":  # computed where it runs (range-checked there); it must print as C
            return term_problem(value)
        value = value.value
    if many and not isinstance(value, tuple):
        return f"{value!r} is not a tuple of ints"
    bad = next((p for p in map(lambda v: _int_problem(v, low), value if many else (value,)) if p), None)
    high = INT_HIGH.get((op, key))
    if bad is None and high is not None and value > high:
        bad = f"{value} is above {high}"
    if bad is None and (op, key) in POWERS_OF_TWO and value & (value - 1):
        bad = f"{value} is not a power of two ({POWERS_OF_TWO[op, key]})"
    return bad


def _int_problem(v: Any, low: int) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return f"{v!r} is not an int"
    return f"{v} is below {low}" if v < low else None


# integer-valued attributes codegen prints or sizes memory by: (op, key, lowest value, a tuple?)
INT_ATTRS = (("alloc", "shape", 1, True), ("alloc", "align", 1, False), ("mbarrier_init", "count", 1, False),
             ("mbarrier_arrive_expect_tx", "bytes", 0, False), ("tma_load", "bytes", 0, False),
             ("tma_load", "box", 1, True), ("tma_load", "tile", 1, True), ("bar_sync", "id", 0, False),
             ("bar_sync", "count", 1, False), ("bar_arrive", "id", 0, False), ("bar_arrive", "count", 1, False), ("kernel", "block", 1, True), ("mbarrier_wait", "backoff", 0, False),
             ("tma_store_wait", "pending", 0, False), ("copy", "count", 1, False), ("mma", "shape", 1, True),
             ("mma", "groups", 1, False), ("mma", "swizzle", 0, False), ("mma", "b_swizzle", 0, False),
             ("wgmma_wait", "pending", 0, False), ("block_stats", "n", 1, False), ("shfl", "width", 1, False),
             ("mbarrier_wait", "backoff_max", 1, False),
             ("mbarrier_wait", "spin", 0, False), ("mbarrier_wait", "suspend_hint", 1, False),
             ("mbarrier_wait", "timeout", 1, False))
# block_stats n: the merge weighs with n as a float32, exact up to 2**24 (a thread holds a few hundred)
INT_HIGH = {("mbarrier_wait", "backoff"): MAX_BACKOFF_NS, ("copy", "count"): 16, ("block_stats", "n"): 1 << 24,
            ("mbarrier_wait", "backoff_max"): MAX_BACKOFF_NS, ("mbarrier_wait", "spin"): (1 << 31) - 1,
            ("mbarrier_wait", "suspend_hint"): (1 << 32) - 1, ("mbarrier_wait", "timeout"): MAX_WAIT_TIMEOUT_NS,
            ("bar_arrive", "id"): 15,
            ("shfl", "width"): WARP_SIZE}
POWERS_OF_TWO = {("shfl", "width"): "a shuffle's segments of lanes tile the warp"}
# int attributes that may also hold a term computed on the device (a constant term is checked as an
# int): a wait's backoff, a warp group's own named barrier (base + its index)
TERM_OR_INT = frozenset({("mbarrier_wait", "backoff"), ("bar_sync", "id"), ("bar_arrive", "id")})
# attributes that hold one of a few words (codegen picks a form by them)
ENUM_ATTRS = {("tma_load", "cache_hint"): CACHE_HINTS, ("tma_store", "cache_hint"): CACHE_HINTS,
              ("tma_load", "l2_promotion"): L2_PROMOTIONS, ("tma_store", "l2_promotion"): L2_PROMOTIONS,
              ("tma_store", "wait"): ("read", "none")}
ENUM_KEYS: dict[str, list[str]] = {}  # op -> its word-valued keys
for (_o, _k) in ENUM_ATTRS:
    ENUM_KEYS.setdefault(_o, []).append(_k)
INT_LOWEST: dict[tuple[str, str], tuple[int, bool]] = {}  # (op, key) -> (lowest value, a tuple?); the linter reads it too
INT_KEYS: dict[str, list[tuple[str, int]]] = {}  # op -> its (key, lowest value), in INT_ATTRS order
for _o, _k, _low, _many in INT_ATTRS:
    INT_LOWEST.setdefault((_o, _k), (_low, _many))
    INT_KEYS.setdefault(_o, []).append((_k, _low))


def term_problem(t: Any, finite: bool = True) -> str | None:
    """Why ``t`` cannot be printed as C, or None; ``finite``: infinities and NaN are refused. The walk
    stops past :data:`MAX_TERM_DEPTH` levels or :data:`MAX_TERM_PARTS` parts, so that a term too deep
    to walk, or one that repeats a subexpression into more parts than can be printed, is refused by
    name, not a crash or a hang. A term found fine is marked so (terms never change; a clone's nodes
    share their terms, and verify reads every term of a graph)."""
    if t.__class__ is Term:
        fine = t.__dict__.get("_fine")
        if fine is True or fine is False and not finite:
            return None
        parts, height = extent(t)  # kept on the term: within the bounds, the walk below recurses at most height deep
        if parts <= MAX_TERM_PARTS and height <= MAX_TERM_DEPTH:
            return _problem_of(t, finite)
    why = _problem_within(t, finite, 0, [MAX_TERM_PARTS])
    if why is not _TOO_LARGE:
        return why
    parts, height = extent(t)  # each shared part once: the figures for the message
    if height > MAX_TERM_DEPTH:
        return (f"holds an expression nested more than {MAX_TERM_DEPTH} operators deep ({height}), more than the "
                "generated code and the simplifier take")
    return (f"holds an expression of more than {MAX_TERM_PARTS} parts as printed ({parts}), more than the "
            "generated code and the simplifier take")


_TOO_LARGE = "too large"  # _problem_within's answer past the bounds (compared by identity)


def _problem_within(t: Any, finite: bool, depth: int, budget: list[int]) -> str | None:
    """:func:`_term_problem` below ``depth`` with ``budget[0]`` parts left to read (recursion at most
    MAX_TERM_DEPTH deep; the common parts, a name, an int or a binary operator, checked inline)."""
    budget[0] -= 1
    if depth > MAX_TERM_DEPTH or budget[0] < 0:
        return _TOO_LARGE
    if t.__class__ is Term and (t.op == "name" and t.value.__class__ is str or
                                t.op == "const" and t.value.__class__ is int or
                                len(t.args) == 2 and t.op in BINARY_OPS):
        pass
    else:
        why = _own_problem(t, finite)
        if why:
            return why
    for a in t.args:
        why = _problem_within(a, finite, depth + 1, budget)
        if why:
            return why
    return None


def _problem_of(t: Any, finite: bool) -> str | None:
    """:func:`_problem_within` for a term within the bounds: the same problem found first, parts
    marked fine (``_fine``: True when checked with ``finite``, False when only without) skipped."""
    if t.__class__ is not Term:
        return _own_problem(t, finite)
    d = t.__dict__
    fine = d.get("_fine")
    if fine is True or fine is False and not finite:
        return None
    if not (t.op == "name" and t.value.__class__ is str or t.op == "const" and t.value.__class__ is int or
            len(t.args) == 2 and t.op in BINARY_OPS):
        why = _own_problem(t, finite)
        if why:
            return why
    for a in t.args:
        why = _problem_of(a, finite)
        if why:
            return why
    d["_fine"] = True if finite else fine is True
    return None


def _own_problem(t: Any, finite: bool) -> str | None:
    """Why the top of ``t`` (not its operands) cannot be printed as C, or None."""
    if not isinstance(t, Term):
        return f"holds {t!r}, which is not a term"
    if t.op == "const":
        v = t.value
        if finite and isinstance(v, float) and not math.isfinite(v):
            return f"holds the constant {v!r}, which is no index, bound or predicate (only computed values may be infinite or NaN)"
        return None if isinstance(v, (bool, int, float)) else f"holds the constant {v!r}, not a number"
    if t.op == "name":
        return None if isinstance(t.value, str) else f"holds the name {t.value!r}, not text"
    if t.op == "call":
        why = call_problem(t.value, len(t.args))
        if why:
            return f"calls {t.value!r}: {why}"
    elif not ((len(t.args) == 1 and t.op in UNARY_OPS) or (len(t.args) == 2 and t.op in BINARY_OPS)):
        return f"holds operator {t.op!r} with {len(t.args)} operand(s)"
    return None
