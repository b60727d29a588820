"""Bind numpy arguments to a kernel graph's parameters on the host, as the GPU launcher does.

Symbols are inferred from the tensors' shapes and the kernel's ``requires`` list is checked by
:func:`bind_symbols`, which the GPU launcher (:mod:`cbrules.codegen.launch`) uses too, so the interpreter
refuses exactly the launches the GPU path refuses, with the same messages: symbols must be integers
in int32 range (:func:`check_symbol`), extents positive (:func:`check_extents`), the grid within
the launch limits (:func:`launch_grid`). Tensor maps are checked against the TMA encoding limits
(:mod:`cbrules.ir.limits`) as ``cuTensorMapEncodeTiled`` would be.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Union

import ml_dtypes
import numpy as np

from ..errors import CbrulesError
from .graph import KernelGraph
from .tma_view import checked_view
from .terms import evaluate

NP_DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64,
             "uint32": np.uint32, "uint64": np.uint64, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
             "float8_e4m3": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
BlocksLike = Union[None, str, Iterable[Union[int, tuple]]]
INT32_LIMIT = 2**31  # kernels index with C int and take symbols as int
GRID_LIMITS = (2**31 - 1, 65535, 65535)  # cuLaunchKernel's gridDim.x, .y, .z


@dataclass
class Bound:
    """A launch with every parameter bound: symbols, the grid and the global tensors."""

    symbols: dict[str, int]
    grid: tuple[int, int, int]
    tensors: dict[str, np.ndarray]  # written tensors are private copies
    written: tuple[str, ...]


class LaunchError(CbrulesError, ValueError):
    """Arguments that do not fit the kernel's parameters, or a launch the kernel's ``requires``
    forbid (the GPU launcher and the interpreter raise the same); ``code`` is the failed
    requirement's code, if it has one (e.g. ``short-loop``)."""

    code = None


def check_symbol(name: str, symbol: str, value: Any) -> int:
    """``value`` as the int32 a kernel takes for ``symbol``: Python and numpy integers only.

    Floats are refused rather than truncated (``N=4096.7`` is a mistake, not 4096), and so are
    bools, strings and None, which ``int()`` would quietly accept or turn into another error.
    """
    fix = f"pass {symbol} as a Python or numpy integer in -2**31..2**31-1 (floats are never rounded)"
    if isinstance(value, (bool, np.bool_)):
        raise LaunchError(f"{name}: symbol {symbol} = {value!r} is a bool, not an integer; {fix}")
    try:
        v = operator.index(value)  # ints, numpy integers, 0-d integer arrays; never floats
    except TypeError:
        raise LaunchError(f"{name}: symbol {symbol} = {value!r} ({type(value).__name__}) is not an "
                          f"integer; {fix}") from None
    if not -INT32_LIMIT <= v < INT32_LIMIT:
        raise LaunchError(f"{name}: symbol {symbol} = {_shown(v)} does not fit the kernel's 32-bit int parameter; "
                          f"{fix}")
    return v


def _shown(value: Any) -> str:
    """A launch value as a message shows it: a huge integer by its size (Python refuses to print one
    of more than 4300 digits)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


_INT_RANGES = {"int32": (-2**31, 2**31), "int64": (-2**63, 2**63), "uint32": (0, 2**32), "uint64": (0, 2**64)}


def check_scalar(name: str, param, value: Any) -> Any:
    """``value`` as the scalar parameter ``param`` (``k.scalar``) takes: an int of its range for an
    integer dtype (floats never rounded), a number representable in its float dtype (finite unless
    the parameter allows otherwise), as the numpy type the kernel computes with."""
    if param.dtype == "int32":
        return check_symbol(name, param.name, value)
    where = f"{name}: scalar {param.name} ({param.dtype}) = {_shown(value)}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or (isinstance(value, np.ndarray)):
        raise LaunchError(f"{where} ({type(value).__name__}) is not a number; pass a Python or numpy "
                          f"{'integer' if param.dtype in _INT_RANGES else 'number'}")
    if param.dtype in _INT_RANGES:
        lo, hi = _INT_RANGES[param.dtype]
        if isinstance(value, (float, np.floating)):
            raise LaunchError(f"{where} is a float; pass an integer (floats are never rounded)")
        if not lo <= int(value) < hi:
            raise LaunchError(f"{where} is outside {param.dtype}'s range {lo}..{hi - 1}")
        return NP_DTYPES[param.dtype](int(value))
    want = NP_DTYPES[param.dtype]
    try:
        v = float(value)
        too_large = bool(np.isfinite(v) and abs(v) > float(np.finfo(want).max))
    except OverflowError:  # an int beyond any double (10**400)
        v, too_large = 0.0, True
    if too_large:
        raise LaunchError(f"{where} is too large for {param.dtype} (at most {np.finfo(want).max:.6g})")
    if param.finite and not np.isfinite(v):
        raise LaunchError(f"{where} is not finite; pass a finite number (or declare k.scalar(..., finite=False))")
    return want(v)


def check_arguments(name: str, params: Iterable, args: Mapping[str, Any]) -> dict[str, int]:
    """Refuse unknown arguments and missing tensors; return the symbols passed explicitly."""
    params = list(params)
    unknown = set(args) - {p.name for p in params if p.kind != "tmap"}
    if unknown:
        raise LaunchError(f"{name}: unknown argument(s) {', '.join(sorted(map(str, unknown)))}; parameters are "
                          f"{', '.join(p.name for p in params if p.kind != 'tmap')}")
    missing = [p.name for p in params if p.kind == "tensor" and p.name not in args]
    if missing:
        raise LaunchError(f"{name}: missing tensor argument {missing[0]!r}")
    return {p.name: check_scalar(name, p, args[p.name]) for p in params if p.kind == "symbol" and p.name in args}


def check_dtype(name: str, param, dtype) -> None:
    """Refuse a tensor whose element type is not the parameter's."""
    want = np.dtype(NP_DTYPES[param.dtype])
    if np.dtype(dtype) != want:
        raise LaunchError(f"{name}: tensor {param.name!r} is {dtype}, the kernel expects {want}")


def _evaluate(name: str, term, symbols: Mapping[str, int], what: str) -> Any:
    """``term`` under ``symbols``; a missing name or a zero divisor is the launch's fault."""
    try:
        return evaluate(term, symbols)
    except (KeyError, ZeroDivisionError, OverflowError) as e:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(symbols.items()))
        raise LaunchError(f"{name}: cannot evaluate {what} {term} for {shown or 'no symbols'} "
                          f"({type(e).__name__}: {e}); pass every symbol the kernel needs as a keyword") from None


def check_extents(name: str, param, shape: tuple) -> None:
    """Refuse a tensor of the wrong rank or with an empty or negative extent."""
    if len(shape) != len(param.shape):
        raise LaunchError(f"{name}: tensor {param.name!r} has rank {len(shape)}, the kernel expects "
                          f"{len(param.shape)} ({', '.join(map(str, param.shape))})")
    for dim, n in enumerate(shape):
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise LaunchError(f"{name}: tensor {param.name!r} dimension {dim} is {n!r} (shape {tuple(shape)}); "
                              "extents must be positive integers: skip the launch for an empty problem")


def bind_symbols(name: str, params: Iterable, requires: Iterable, shapes: Mapping[str, tuple],
                 given: Mapping[str, Any]) -> dict[str, int]:
    """Infer every symbol from the tensors' shapes (or take it from ``given``), check that every
    extent agrees, and check each ``(predicate, message[, code])`` of ``requires``."""
    params = list(params)
    declared = {p.name: p for p in params if p.kind == "symbol"}
    unknown = sorted(map(str, set(given) - set(declared)))
    if unknown:
        raise LaunchError(f"{name}: unknown symbol(s) {', '.join(unknown)}; the kernel's symbols are "
                          f"{', '.join(sorted(declared)) or 'none'}")
    symbols = {sym: check_scalar(name, declared[sym], v) for sym, v in given.items()}
    tensors = [p for p in params if p.kind == "tensor"]
    for p in tensors:  # first plain names, which bind symbols
        shape = shapes[p.name]
        check_extents(name, p, shape)
        for term, actual in zip(p.shape, shape):
            if term.op == "name" and str(term.value) not in symbols:
                symbols[str(term.value)] = int(actual)
    missing = [p.name for p in params if p.kind == "symbol" and p.name not in symbols]
    if missing:
        raise LaunchError(f"{name}: no value for symbol(s) {', '.join(missing)}; pass them as keywords")
    for sym, v in symbols.items():
        if declared[sym].dtype == "int32" and not -INT32_LIMIT <= v < INT32_LIMIT:
            raise LaunchError(f"{name}: symbol {sym} = {v} does not fit the kernel's 32-bit int parameter")
    for p in tensors:  # then every extent must agree
        for dim, (term, actual) in enumerate(zip(p.shape, shapes[p.name])):
            want = _evaluate(name, term, symbols, f"tensor {p.name!r} dimension {dim}")
            if want != actual:
                raise LaunchError(f"{name}: tensor {p.name!r} dimension {dim} is {actual}, but "
                                  f"{term} = {want} from the other arguments")
    for p in tensors:  # generated indices are C int: an element past 2**31 - 1 would wrap around
        elements = int(np.prod(shapes[p.name], dtype=np.int64))
        if elements > INT32_LIMIT:
            raise LaunchError(f"{name}: tensor {p.name!r} has {elements} elements; the generated kernel indexes "
                              f"with 32-bit int, so at most {INT32_LIMIT} are addressable: split the problem "
                              "into launches over smaller views")
    for pred, message, *code in requires:  # an optional third entry: the refusal's code
        if not _evaluate(name, pred, symbols, "requirement"):
            shown = ", ".join(f"{k}={v}" for k, v in sorted(symbols.items()))
            err = LaunchError(f"{name}: {message} [{pred} is false for {shown}]")
            err.code = str(code[0]) if code else None
            raise err
    return symbols


def launch_grid(name: str, terms: Iterable, symbols: Mapping[str, int]) -> tuple[int, int, int]:
    """The grid's extents under ``symbols``, each within what ``cuLaunchKernel`` accepts (0 launches
    nothing)."""
    terms = tuple(terms)
    grid = tuple(int(_evaluate(name, t, symbols, "grid extent")) for t in terms)
    for axis, (n, limit) in enumerate(zip(grid, GRID_LIMITS)):
        if not 0 <= n <= limit:
            raise LaunchError(f"{name}: grid {'xyz'[axis]} = {terms[axis]} = {n} is outside 0..{limit}; "
                              "use a smaller problem or split it into several launches")
    return grid  # type: ignore[return-value]


def bind(kg: KernelGraph, args: Mapping[str, Any], symbols: Optional[Mapping[str, int]] = None) -> Bound:
    """Check ``args`` against the kernel's parameters and bind symbols, grid and tensors.

    Raises :class:`LaunchError` (unknown, missing or mistyped arguments, shapes that disagree, a
    failed ``requires``) or :class:`cbrules.ir.limits.TmaLimitError` (a tensor map TMA cannot encode).
    """
    k = kg.kernel()
    name, params = k["name"], kg.params()
    given = {**(symbols or {}), **check_arguments(name, params.values(), args)}
    tensors: dict[str, np.ndarray] = {}
    for p in params.values():
        if p.kind != "tensor":
            continue
        try:
            value = np.asarray(args[p.name])
        except (TypeError, ValueError) as e:  # ragged lists, device tensors numpy cannot read: no array
            raise LaunchError(f"{name}: tensor {p.name!r} is a {type(args[p.name]).__name__} numpy cannot "
                              f"read ({type(e).__name__}: {e}); pass a numpy array") from None
        check_dtype(name, p, value.dtype)
        # the kernel writes into a private copy; inputs are read through a read-only view
        arr = np.array(value, order="C", copy=True) if p.written else np.ascontiguousarray(value)
        if not p.written:
            arr = arr.view()
            arr.flags.writeable = False
        tensors[p.name] = arr
    bound_symbols = bind_symbols(name, params.values(), k.get("requires", ()),
                                 {n: a.shape for n, a in tensors.items()}, given)
    for p in params.values():
        if p.kind == "tmap":
            arr = tensors[p.tensor]
            checked_view(p.name, arr.shape, arr.strides, arr.itemsize, 0, p.box, p.split)
    grid = launch_grid(name, k["grid"], bound_symbols)
    written = tuple(p.name for p in params.values() if p.written)
    return Bound(bound_symbols, grid, tensors, written)  # type: ignore[arg-type]


def select_blocks(grid: tuple[int, int, int], blocks: BlocksLike = None) -> list[tuple[int, int, int]]:
    """The blocks to run: all (``None``), ``"sample"`` (first, middle and last), or the given ones
    (linear indices, x fastest, or ``(x, y, z)`` tuples)."""
    gx, gy, gz = grid
    total = gx * gy * gz

    def unflatten(i: int) -> tuple[int, int, int]:
        if not 0 <= i < total:
            raise ValueError(f"block {i} is outside the grid {grid} ({total} blocks)")
        return (i % gx, (i // gx) % gy, i // (gx * gy))

    if total <= 0:
        return []
    if blocks is None:
        return [unflatten(i) for i in range(total)]
    if isinstance(blocks, str):
        if blocks != "sample":
            raise ValueError(f"blocks={blocks!r}: use None (all), 'sample' or a list of blocks")
        return [unflatten(i) for i in sorted({0, total // 2, total - 1})]
    out = []
    for b in blocks:
        if isinstance(b, tuple):
            b = tuple(b) + (0,) * (3 - len(b))
            if not all(0 <= c < g for c, g in zip(b, grid)):
                raise ValueError(f"block {b} is outside the grid {grid}")
            out.append(b)
        else:
            out.append(unflatten(int(b)))
    return out
