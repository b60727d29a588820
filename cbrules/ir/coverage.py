"""Which elements of a shared buffer a kernel's TMA loads write, checked where the buffer is read.

A TMA load writes one tile (``tile``, by default one box) at ``offset`` of its buffer; a buffer wider
than what its loads write keeps stale or uninitialised elements, which a reader would then use
silently (the interpreter sees NaN, the GPU garbage). The builder records every TMA write and,
at each read of the buffer, refuses a buffer its writes provably do not cover, and a read whose
index provably leaves the buffer. "Provably": offsets and indices are enumerated over the block's
threads and the enclosing unrolled loops of literal bounds; a term over anything else (a serial
loop variable, a symbol, a register) is the kernel's to get right and is not judged.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

from ..errors import CbrulesError
from .terms import Term, evaluate

if TYPE_CHECKING:
    from .graph import KernelGraph

MAX_POINTS = 1 << 14  # a check enumerates at most this many (thread, unrolled iteration) points


class PartialTileError(CbrulesError, ValueError):
    """A shared buffer read while the TMA loads into it leave part of it unwritten (or a load or read
    that leaves the buffer); the message names the buffer, the box and the fix."""


@dataclass(frozen=True)
class TileWrite:
    """One TMA load into a buffer: ``elements`` dense elements at ``offset``, under ``ranges`` (the
    enclosing unrolled loops of literal bounds, variable -> values)."""

    buf: str
    offset: Term
    elements: int
    box: tuple
    tile: tuple
    tmap: str
    where: str
    ranges: tuple[tuple[str, tuple[int, ...]], ...]


def scope_ranges(kg: KernelGraph, scopes: Iterable[int]) -> list[tuple[str, tuple[int, ...]]]:
    """The values of the block's thread indices and of the variables of the unrolled loops of literal
    bounds among ``scopes`` (the builder's open scopes): what the checks enumerate."""
    out = [(f"threadIdx.{a}", tuple(range(d))) for a, d in zip("xyz", kg.kernel()["block"])]
    for s in scopes:
        a = kg[s]
        if kg.op(s) == "for" and a["kind"] in ("unroll", "unswitch", "vectorize") \
                and all(a[k].op == "const" and type(a[k].value) is int for k in ("start", "stop", "step")):
            out.append((a["var"], tuple(range(a["start"].value, a["stop"].value, a["step"].value))))
    return out


def scope_preds(kg: KernelGraph, scopes: Iterable[int]) -> tuple[Term, ...]:
    """The predicates of the ``if`` scopes among ``scopes``."""
    return tuple(kg[s]["pred"] for s in scopes if kg.op(s) == "if")


def _points(ranges: Iterable[tuple[str, tuple[int, ...]]]) -> Optional[list[dict]]:
    ranges = list(ranges)
    if math.prod(len(v) for _, v in ranges) > MAX_POINTS:
        return None
    names = [n for n, _ in ranges]
    return [dict(zip(names, vals)) for vals in itertools.product(*(v for _, v in ranges))]


def _exact(t: Term) -> tuple:
    """A key for ``t`` that tells apart constants equal in Python but not in C (1, 1.0 and True)."""
    return (t.op, type(t.value), t.value, tuple(_exact(a) for a in t.args))


# (term, ranges, predicates) -> values: a kernel built again (each trip count the checker tries, each
# test) enumerates the same terms, up to MAX_POINTS evaluations each
_VALUES: dict[tuple, Optional[frozenset[int]]] = {}
_VALUES_MAX = 4096


def values(t: Term, ranges: Iterable[tuple[str, tuple[int, ...]]], preds: tuple[Term, ...] = ()) -> Optional[set[int]]:
    """Every value ``t`` takes over ``ranges`` where every one of ``preds`` holds; None when a term
    depends on anything else (or there are too many points)."""
    used = set(t.names()).union(*(p.names() for p in preds))
    ranges = tuple((n, tuple(v)) for n, v in ranges if n in used)
    key = (_exact(t), ranges, tuple(_exact(p) for p in preds))
    if key not in _VALUES:
        if len(_VALUES) >= _VALUES_MAX:
            _VALUES.clear()
        _VALUES[key] = _enumerate(t, ranges, preds)
    got = _VALUES[key]
    return None if got is None else set(got)


def _enumerate(t: Term, ranges: tuple, preds: tuple[Term, ...]) -> Optional[frozenset[int]]:
    points = _points(ranges)
    if points is None:
        return None
    try:
        out = {evaluate(t, p) for p in points if all(evaluate(q, p) for q in preds)}
    except (KeyError, ZeroDivisionError):
        return None
    return frozenset(out) if all(isinstance(v, int) and not isinstance(v, bool) for v in out) else None


def check_write(w: TileWrite, size: int, shape: tuple) -> None:
    """A TMA load must land inside its buffer."""
    offs = values(w.offset, w.ranges)
    if offs and (min(offs) < 0 or max(offs) + w.elements > size):
        bad = min(offs) if min(offs) < 0 else max(offs)
        raise PartialTileError(
            f"tma_load at {w.where}: a tile {w.tile} of tensor map {w.tmap!r} ({w.elements} elements) at offset "
            f"{bad} of buffer {w.buf!r} (shape {shape}, {size} elements) writes past the buffer; allocate the "
            f"buffer as large as the tile, or load a tile that fits")


def check_covered(buf: str, shape: tuple, writes: list[TileWrite], where: str) -> None:
    """Refuse a read of ``buf`` (at ``where``) when the TMA loads so far provably leave elements of it
    unwritten. Buffers some write of which cannot be enumerated are not judged."""
    size = math.prod(shape)
    covered = bytearray(size)
    for w in writes:
        offs = values(w.offset, w.ranges)
        if offs is None:
            return
        for o in offs:
            lo, hi = max(o, 0), min(o + w.elements, size)
            if lo < hi:
                covered[lo:hi] = b"\1" * (hi - lo)
    if all(covered):
        return
    first = covered.index(0)
    last = size - 1 - covered[::-1].index(0)
    w = writes[0]
    if len(writes) == 1 and w.tile == w.box and len(shape) == len(w.box) and all(s == 1 for s in shape[:-1]) \
            and shape[-1] % w.box[-1] == 0:
        fix = (f"pass tile={tuple(shape)} to that tma_load (the rules split a one-row tile into {shape[-1] // w.box[-1]} "
               f"boxes of {w.box})")
    else:
        fix = (f"make the loads cover the buffer: pass tile={tuple(shape)} (one row, split into boxes by the rules), "
               "use a box as large as the buffer, or add loads at the missing offsets")
    raise PartialTileError(
        f"load from buffer {buf!r} at {where}: its TMA loads ({', '.join(f'box {x.box} tile {x.tile} of {x.tmap!r} at {x.where}' for x in writes)}) "
        f"write {size - covered.count(0)} of its {size} elements (shape {tuple(shape)}); elements {first}..{last} "
        f"are never written, so the read would see stale data. Fix: {fix}")


def check_read(buf: str, shape: tuple, index: Term, ranges: Iterable[tuple[str, tuple[int, ...]]],
               preds: tuple[Term, ...], where: str) -> None:
    """Refuse a read whose index provably leaves the buffer (it would read another buffer's bytes);
    ``preds``: the conditions of the enclosing ``if`` scopes."""
    size = math.prod(shape)
    got = values(index, ranges, preds)
    if got and (min(got) < 0 or max(got) >= size):
        bad = min(got) if min(got) < 0 else max(got)
        raise PartialTileError(f"load at {where}: index {index} of buffer {buf!r} reaches {bad}, outside its {size} "
                               f"elements (shape {tuple(shape)}); index within 0..{size - 1} (fewer threads or a "
                               "larger buffer)")
