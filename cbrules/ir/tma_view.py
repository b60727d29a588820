"""Split tensor maps: a TMA map of higher rank over the same tensor, some of its dimensions each seen
as (outer, inner), so one box can span several stretches of a dimension (a row of 32768 elements as
[128, 256], loaded 64 x 256 at a time instead of in 64 boxes of 256).

A split ``{d: inner}`` turns dimension ``d`` of extent ``n`` and stride ``s`` bytes into two: ``n /
inner`` of stride ``s * inner`` and ``inner`` of stride ``s``. It addresses the very bytes of the
tensor, so ``n`` must be a multiple of ``inner``: checked when the map is declared for a constant
extent, at launch for a symbolic one. The builder, the GPU launcher (which encodes the map from
the view's shape and strides) and the reference interpreter (which reads the tensor through the same
strides) all go through :func:`view_layout`, so the CPU model reads what the hardware reads.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

from .limits import TmaLimitError, check_tensor_map

MAX_RANK = 5  # cuTensorMapEncodeTiled: ranks 1..5
MAX_EXTENT = 2 ** 32  # a TMA dimension's extent


class TmaSplitError(TmaLimitError):
    """A split tensor map that cannot address its tensor: a bad split, a view of more than five
    dimensions, or a dimension that is not a whole number of the split's inner extent."""

    def __init__(self, message: str):
        ValueError.__init__(self, message)


def _whole(v: Any) -> int:
    if isinstance(v, bool):
        raise TypeError
    return operator.index(v)


def normalize_split(mname: str, split: Any, rank: int) -> tuple[tuple[int, int], ...]:
    """``split`` (a dict dimension -> inner extent, outermost-first dimensions; None or {} for none)
    as sorted ``(dimension, inner)`` pairs, or a :class:`TmaSplitError` naming the bad entry."""
    if split is None:
        return ()
    if not isinstance(split, dict):
        raise TmaSplitError(f"tensor map {mname!r}: split must be a dict {{dimension: inner extent}}, e.g. "
                            f"{{{rank - 1}: 256}}, got {split!r} ({type(split).__name__})")
    out = []
    for d, inner in split.items():
        try:
            d, inner = _whole(d), _whole(inner)
        except TypeError:
            raise TmaSplitError(f"tensor map {mname!r}: split entry {d!r}: {inner!r} must map a dimension "
                                "(an int) to an inner extent (an int); bools, floats and text are refused") from None
        if not 0 <= d < rank:
            raise TmaSplitError(f"tensor map {mname!r}: split dimension {d} is not a dimension of the rank-{rank} "
                                f"tensor; give one of 0..{rank - 1} (outermost first)")
        if not 2 <= inner <= MAX_EXTENT:
            raise TmaSplitError(f"tensor map {mname!r}: split of dimension {d} into inner extent {inner}: the "
                                f"inner extent must be in 2..2**32 (a TMA dimension's extent)")
        out.append((d, inner))
    if rank + len(out) > MAX_RANK:
        raise TmaSplitError(f"tensor map {mname!r}: splitting {len(out)} dimension(s) of a rank-{rank} tensor "
                            f"gives a view of rank {rank + len(out)}; TMA maps have at most {MAX_RANK} dimensions: "
                            "split fewer dimensions")
    return tuple(sorted(out))


def _expand(values: Sequence[Any], split: Sequence[tuple[int, int]], pair) -> tuple:
    """``values`` (one a tensor dimension) with each split dimension's value ``v`` replaced by the two
    of ``pair(v, inner)``."""
    inner = dict(split)
    out: list = []
    for d, v in enumerate(values):
        out += pair(v, inner[d]) if d in inner else [v]
    return tuple(out)


def view_shape(shape: Sequence[Any], split: Sequence[tuple[int, int]]) -> tuple:
    """The view's shape: each split dimension ``n`` becomes ``(n // inner, inner)`` (ints or terms)."""
    return _expand(shape, split, lambda n, inner: [n // inner, inner])


def view_strides(strides: Sequence[int], split: Sequence[tuple[int, int]]) -> tuple:
    """The view's strides (any unit): each split dimension of stride ``s`` becomes ``(s * inner, s)``."""
    return _expand(strides, split, lambda s, inner: [s * inner, s])


def check_divides(mname: str, shape: Sequence[int], split: Sequence[tuple[int, int]], when: str) -> None:
    """Each split dimension of a real (or constant) ``shape`` is a whole number of its inner extent."""
    for d, inner in split:
        if int(shape[d]) % inner:
            raise TmaSplitError(f"tensor map {mname!r} ({when}): dimension {d} of extent {shape[d]} is not a "
                                f"multiple of its split inner extent {inner}, so the view [{shape[d]} / {inner}, "
                                f"{inner}] would not address the tensor's elements; use a tensor whose dimension "
                                f"{d} is a multiple of {inner} (pad it) or split by a divisor of it")


def view_layout(mname: str, shape: Sequence[int], strides_bytes: Sequence[int],
                split: Sequence[tuple[int, int]]) -> tuple[tuple, tuple]:
    """(shape, strides in bytes) of the split view of a bound tensor, refusing a dimension the split
    does not divide (a :class:`TmaSplitError` at launch)."""
    if not split:
        return tuple(shape), tuple(strides_bytes)
    check_divides(mname, shape, split, "at launch")
    return view_shape(shape, split), view_strides(strides_bytes, split)


def checked_view(mname: str, shape: Sequence[int], strides_bytes: Sequence[int], itemsize: int, ptr: int,
                 box: Sequence[int], split: Sequence[tuple[int, int]],
                 elem_strides: Sequence[int] | None = None) -> tuple[tuple, tuple]:
    """:func:`view_layout` of a bound tensor, checked against the cuTensorMapEncodeTiled limits (the
    launcher's and the binder's one check of a map over a real tensor)."""
    shape, strides = view_layout(mname, shape, strides_bytes, split)
    check_tensor_map(mname, shape, strides, itemsize, ptr, box, elem_strides)
    return shape, strides
