"""Terms evaluated over the threads of a block, with the meaning codegen gives them in CUDA C.

A term is compiled once into a closure ``fn(env, lanes)``. Values are Python ints (uniform across
the block: loop variables, symbols, ``blockIdx``) or numpy arrays with one entry per thread
(``threadIdx``, registers). Arithmetic follows C: integer ``/`` and ``%`` truncate, an int meeting
a float becomes that float, float literals are ``float`` (codegen prints them with an ``f``), and
``&&`` does not evaluate its right side on threads where the left side is false -- which matters
for ``elect_one()``, whose ``elect.sync`` only the threads that reach it execute.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import numpy as np

from ..errors import CbrulesError
from ..ir.terms import Term, byte_perm, swizzle_index, to_c

Value = Any  # int | float | bool | np.ndarray
Compiled = Callable[[Mapping[str, Value], "Lanes"], Value]


class TermError(CbrulesError):
    """A term that cannot be evaluated (unknown name or function, division by zero)."""


class Lanes:
    """The threads a term is evaluated for: the active mask and how to elect one of them.

    ``elect`` is called with the mask of threads that execute ``elect_one()`` (or ``elect_warp(w)``,
    with ``w``) and returns the boolean array that is true for the elected thread only.
    """

    __slots__ = ("mask", "elect")

    def __init__(self, mask: np.ndarray, elect: Optional[Callable[[np.ndarray], np.ndarray]] = None):
        self.mask = mask
        self.elect = elect

    def narrowed(self, pred: Value) -> "Lanes":
        return Lanes(self.mask & np.asarray(pred, bool), self.elect)


_FLOAT_RANK = {np.dtype(np.float32): 1, np.dtype(np.float64): 2}


def _ctype(x: Value) -> int:
    """0 for C integers and booleans, 1 for float, 2 for double."""
    if isinstance(x, np.ndarray):
        return _FLOAT_RANK.get(x.dtype, 0)
    if isinstance(x, (float, np.float32)):
        return 2 if isinstance(x, np.float64) else 1  # a float literal is a C float
    if isinstance(x, np.floating):
        return _FLOAT_RANK.get(np.dtype(type(x)), 2)
    return 0


def _as(x: Value, dtype) -> Value:
    if isinstance(x, np.ndarray):
        return x if x.dtype == dtype else x.astype(dtype)
    return dtype.type(x)


def _promote(a: Value, b: Value) -> tuple[Value, Value, bool]:
    """Bring two operands to their common C type; the flag says whether it is an integer type."""
    ta, tb = _ctype(a), _ctype(b)
    if ta == tb == 0:
        # bool arrays take part in arithmetic as ints (numpy would make bool + bool a logical or)
        if isinstance(a, np.ndarray) and a.dtype == bool:
            a = a.astype(np.int64)
        if isinstance(b, np.ndarray) and b.dtype == bool:
            b = b.astype(np.int64)
        return a, b, True
    dtype = np.dtype(np.float64 if max(ta, tb) == 2 else np.float32)
    return _as(a, dtype), _as(b, dtype), False


def _is_py_int(x: Value) -> bool:
    return isinstance(x, (int, bool, np.integer, np.bool_))


def c_div(a: Value, b: Value) -> Value:
    """C division: truncating on integers."""
    if _is_py_int(a) and _is_py_int(b):
        a, b = int(a), int(b)
        if b == 0:
            raise TermError("integer division by zero")
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    a, b, integral = _promote(a, b)
    if not integral:
        return a / b
    if np.any(np.asarray(b) == 0):
        raise TermError("integer division by zero")
    q = np.abs(a) // np.abs(b)
    return np.where((np.asarray(a) >= 0) == (np.asarray(b) >= 0), q, -q)


def c_mod(a: Value, b: Value) -> Value:
    """C remainder: the sign of the dividend."""
    if _is_py_int(a) and _is_py_int(b):
        return int(a) - int(b) * c_div(a, b)
    a2, b2, integral = _promote(a, b)
    if not integral:
        return np.fmod(a2, b2)
    return a2 - b2 * c_div(a2, b2)


def _arith(fn: Callable[[Value, Value], Value]) -> Callable[[Value, Value], Value]:
    def go(a: Value, b: Value) -> Value:
        if _is_py_int(a) and _is_py_int(b):
            return fn(int(a), int(b))
        a, b, _ = _promote(a, b)
        return fn(a, b)
    return go


def _logical(fn) -> Callable[[Value, Value], Value]:
    def go(a: Value, b: Value) -> Value:
        if not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray):
            return bool(fn(bool(a), bool(b)))
        return fn(np.asarray(a, bool), np.asarray(b, bool))
    return go


def _select(pick_first: Callable[[Value, Value], Value]) -> Callable[[Value, Value], Value]:
    """``cb_min``/``cb_max``: ``a < b ? a : b`` (NaN handling as in the C expression)."""
    def go(a: Value, b: Value) -> Value:
        if _is_py_int(a) and _is_py_int(b):
            return a if pick_first(a, b) else b
        a, b, _ = _promote(a, b)
        return np.where(pick_first(a, b), a, b)
    return go


def ceil_div(a: Value, b: Value) -> Value:
    """``cb_ceil_div``: ``(a + b - 1) / b`` in C integer arithmetic."""
    return c_div(C_BINARY["-"](C_BINARY["+"](a, b), 1), b)


C_BINARY: dict[str, Callable[[Value, Value], Value]] = {
    "+": _arith(lambda a, b: a + b), "-": _arith(lambda a, b: a - b), "*": _arith(lambda a, b: a * b),
    "/": c_div, "%": c_mod,
    "<": _arith(lambda a, b: a < b), "<=": _arith(lambda a, b: a <= b), ">": _arith(lambda a, b: a > b),
    ">=": _arith(lambda a, b: a >= b), "==": _arith(lambda a, b: a == b), "!=": _arith(lambda a, b: a != b),
    "||": _logical(lambda a, b: a | b if isinstance(a, np.ndarray) else a or b),
}


def _float_fn(np_fn) -> Callable[[Value], Value]:
    def go(x: Value) -> Value:
        return np_fn(_as(x, np.dtype(np.float64 if _ctype(x) == 2 else np.float32)))
    return go


_CALLS: dict[str, Callable[..., Value]] = {
    "min": _select(lambda a, b: a < b), "max": _select(lambda a, b: a > b), "ceil_div": ceil_div,
    "exp": _float_fn(np.exp), "log": _float_fn(np.log), "sqrt": _float_fn(np.sqrt),
    "rsqrt": _float_fn(lambda x: x.dtype.type(1) / np.sqrt(x)), "fabs": _float_fn(np.abs),
    "abs": _float_fn(np.abs),
    "swizzle": lambda i, esize, span: swizzle_index(i, int(esize), int(span)),
    "byte_perm": lambda x, y, s: _as_uint32(byte_perm(*_integers("byte_perm", x, y, s))),
}


def _integers(fn: str, *args: Value) -> tuple:
    """``args`` if every one is a C integer (a float reaching __byte_perm would convert as C does, not
    as numpy truncates negative values: refused by name instead)."""
    if any(_ctype(a) for a in args):
        raise TermError(f"{fn}() takes unsigned integers (packed register values); one argument is a float")
    return args


def _as_uint32(v: Value) -> Value:
    """A C unsigned int: __byte_perm's result."""
    return v.astype(np.uint32) if isinstance(v, np.ndarray) else np.uint32(v)


def negate(x: Value) -> Value:
    return -x if not (isinstance(x, np.ndarray) and x.dtype == bool) else -(x.astype(np.int64))


def logical_not(x: Value) -> Value:
    return np.logical_not(x) if isinstance(x, np.ndarray) else not x


ELECTS = ("elect_one", "elect_warp")


def _has_elect(t: Term) -> bool:
    return (t.op == "call" and t.value in ELECTS) or any(_has_elect(a) for a in t.args)


CACHE = "__invariant_values__"  # env key of the per-block cache of invariant subterms


def compile_term(t: Term, invariant: frozenset = frozenset()) -> Compiled:
    """A closure computing ``t`` for the threads in ``lanes`` from the names in ``env``.

    Subterms over ``invariant`` names only (values fixed for a whole block: builtins, symbols) are
    computed once per block and kept in ``env[CACHE]``, which the caller empties for each block;
    index arithmetic on ``threadIdx`` then costs nothing after the first iteration.
    """
    fn = _compile(t, invariant)
    if t.op in ("const", "name") or _has_elect(t) or not set(t.names()) <= invariant:
        return fn
    key = object()

    def cached(env, lanes):
        store = env[CACHE]
        v = store.get(key)
        if v is None:
            v = store[key] = fn(env, lanes)
        return v
    return cached


def _compile(t: Term, invariant: frozenset) -> Compiled:
    if t.op == "const":
        v = t.value
        return lambda env, lanes: v
    if t.op == "name":
        n = str(t.value)

        def name(env, lanes):
            try:
                return env[n]
            except KeyError:
                raise TermError(f"term {to_c(t)!r}: no value for {n!r}") from None
        return name
    args = [compile_term(a, invariant) for a in t.args]
    if t.op == "call":
        fn_name = str(t.value)
        if fn_name in ELECTS:  # elect_one(): in warp 0; elect_warp(w): in warp w
            def elect(env, lanes):
                if lanes.elect is None:
                    raise TermError(f"{fn_name}() needs the threads of a block")
                return lanes.elect(lanes.mask, *(int(a(env, lanes)) for a in args))
            return elect
        if fn_name not in _CALLS:
            raise TermError(f"term {to_c(t)!r}: the interpreter has no function {fn_name!r}; "
                            f"known: {', '.join(sorted(_CALLS))}, {', '.join(ELECTS)}")
        fn = _CALLS[fn_name]
        return lambda env, lanes: fn(*(a(env, lanes) for a in args))
    if len(args) == 1:
        (a,) = args
        if t.op == "-":
            return lambda env, lanes: negate(a(env, lanes))
        return lambda env, lanes: logical_not(a(env, lanes))
    a, b = args
    if t.op == "&&":
        if _has_elect(t.args[1]):
            # C short-circuits: only threads where the left side holds execute elect.sync
            def and_elect(env, lanes):
                left = a(env, lanes)
                return _logical(lambda x, y: x & y)(left, b(env, lanes.narrowed(left)))
            return and_elect
        land = _logical(lambda x, y: x & y if isinstance(x, np.ndarray) else x and y)
        return lambda env, lanes: land(a(env, lanes), b(env, lanes))
    op = C_BINARY[t.op]
    return lambda env, lanes: op(a(env, lanes), b(env, lanes))
