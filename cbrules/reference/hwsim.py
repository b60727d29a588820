"""What the prelude's hardware helpers do, in numpy: TMA box copies and the block reduction.

Kept apart from the interpreter so each can be checked against ``codegen/prelude.cu`` on its own.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .hazards import InterpError
from ..ir.terms import swizzle_index
from ..ir.tma_view import view_layout

_IDENTITY = {"sum": 0, "max": -np.inf, "min": np.inf}


def _clip(coords: Sequence[int], box: Sequence[int], shape: Sequence[int]):
    """(tensor slices, box slices) of the part of a box inside the tensor, or None if none is."""
    src, dst = [], []
    for c, b, n in zip(coords, box, shape):
        lo, hi = max(c, 0), min(c + b, n)
        if hi <= lo:
            return None
        src.append(slice(lo, hi))
        dst.append(slice(lo - c, hi - c))
    return tuple(src), tuple(dst)


def tensor_view(tensor: np.ndarray, name: str, split: Sequence, site: Callable) -> np.ndarray:
    """``tensor`` as the split tensor map ``name`` addresses it: a numpy view with the shape and byte
    strides :func:`cbrules.ir.tma_view.view_layout` gives the launcher's encoding, so boxes read and
    write what the hardware's would. A view reaching past the tensor's bytes is refused."""
    if not split:
        return tensor
    shape, strides = view_layout(name, tensor.shape, tensor.strides, split)
    reach = sum((n - 1) * s for n, s in zip(shape, strides)) + tensor.itemsize
    if not tensor.flags.c_contiguous or min(strides) <= 0 or reach > tensor.nbytes:
        raise InterpError(f"the split view {tuple(shape)} (strides {tuple(strides)} bytes) of tensor map {name!r} "
                          f"reaches {reach} bytes of a {tensor.nbytes}-byte tensor", site())
    return np.lib.stride_tricks.as_strided(tensor, shape, strides, writeable=tensor.flags.writeable)


def read_box(tensor: np.ndarray, coords: Sequence[int], box: Sequence[int]) -> np.ndarray:
    """``cp.async.bulk.tensor`` global -> shared: the box at ``coords`` (outermost-first, elements,
    may be negative) as a dense row-major flat array; elements outside the tensor read as zero
    (the tensor maps are encoded with ``OOB_FILL_NONE``, which fills zeros)."""
    out = np.zeros(tuple(box), tensor.dtype)
    part = _clip(coords, box, tensor.shape)
    if part is not None:
        out[part[1]] = tensor[part[0]]
    return out.reshape(-1)


def write_box(tensor: np.ndarray, coords: Sequence[int], data: np.ndarray) -> None:
    """``cp.async.bulk.tensor`` shared -> global: only the elements inside the tensor are written."""
    part = _clip(coords, data.shape, tensor.shape)
    if part is not None:
        tensor[part[0]] = data[part[1]]


def swizzled(data: np.ndarray, itemsize: int, span: int, lo: int, buf: str, site: Callable) -> np.ndarray:
    """A box (dense row-major ``data``) as a TMA load with a ``span``-byte swizzle lays it out from
    element ``lo`` of a shared buffer: element i goes to :func:`cbrules.ir.terms.swizzle_index` (i).
    The pattern is anchored on the buffer, so ``lo`` must be on its repeat (8 x span bytes)."""
    if (lo * itemsize) % (8 * span):
        raise InterpError(f"a TMA load with {span}B swizzle writes {buf}[{lo}], {lo * itemsize} bytes into the "
                          f"buffer: not on the {8 * span}-byte pattern, so the hardware would lay it out on "
                          "another phase of the pattern", site())
    out = np.empty_like(data)
    out[swizzle_index(np.arange(data.size), itemsize, span)] = data
    return out


def unswizzled(data: np.ndarray, itemsize: int, span: int, lo: int, buf: str, site: Callable) -> np.ndarray:
    """What a TMA store through a ``span``-byte swizzled map reads from ``data`` (a box's elements of a
    shared buffer from element ``lo``): the box dense again, logical element i taken from
    :func:`cbrules.ir.terms.swizzle_index` (i). ``lo`` must be on the pattern's repeat, as for loads."""
    if (lo * itemsize) % (8 * span):
        raise InterpError(f"a TMA store with {span}B swizzle reads {buf}[{lo}], {lo * itemsize} bytes into the "
                          f"buffer: not on the {8 * span}-byte pattern, so the hardware would read it on "
                          "another phase of the pattern", site())
    return data[swizzle_index(np.arange(data.size), itemsize, span)]


def inside_box(mask: np.ndarray, coords: Sequence[int], shape: Sequence[int]) -> None:
    """Set ``mask`` (the box's shape) where the box at ``coords`` lies inside a tensor of ``shape``."""
    part = _clip(coords, mask.shape, shape)
    if part is not None:
        mask[part[1]] = True


def block_reduce(v: np.ndarray, combine: str, op: Callable) -> np.ndarray:
    """``cb_block_reduce``: an xor-butterfly over each warp's 32 lanes, one value per warp through
    shared scratch, the same butterfly over those values in warp 0; every thread gets the result.
    Floating-point results match the GPU bit for bit because the combination order is the same."""
    warps = v.size // 32
    lane = np.arange(32)
    w = v.reshape(warps, 32)
    for o in (16, 8, 4, 2, 1):
        w = op(w, w[:, lane ^ o])
    if v.dtype.kind in "iu":
        info = np.iinfo(v.dtype)
        identity = {"sum": 0, "max": info.min, "min": info.max}[combine]
    else:
        identity = _IDENTITY[combine]
    x = np.full(32, identity, v.dtype)
    x[:warps] = w[:, 0]
    for o in (16, 8, 4, 2, 1):
        x = op(x, x[lane ^ o])
    return np.full(v.size, x[0], v.dtype)


def block_stats(mean: np.ndarray, m2: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``cb_block_stats``: each thread's (mean, M2) of ``n`` elements merged pairwise in float32 (Chan's
    update with equal counts: mean = (ma + mb) / 2, M2 = M2a + M2b + d^2 c / 2), an xor-butterfly over
    each warp's lanes, then over the warps' pairs (a power-of-two count) in every warp: the GPU's merge
    order (where nvcc contracts d * d * c + s into one fma the two differ by a rounding). Every thread
    gets the block's pair."""
    f32 = np.float32

    def merge(mean, m2, o, c):
        lane = np.arange(mean.shape[-1])
        mb, m2b = mean[..., lane ^ o], m2[..., lane ^ o]
        d = mb - mean
        return f32(0.5) * (mean + mb), (m2 + m2b) + d * d * c

    warps = mean.size // 32
    w, w2 = mean.astype(f32).reshape(warps, 32), m2.astype(f32).reshape(warps, 32)
    c = f32(0.5 * n)
    for o in (1, 2, 4, 8, 16):
        w, w2 = merge(w, w2, o, c)
        c = c * f32(2)
    x, x2 = w[:, 0], w2[:, 0]
    o = 1
    while o < warps:
        x, x2 = merge(x, x2, o, c)
        c, o = c * f32(2), o * 2
    return np.full(mean.size, x[0], f32), np.full(mean.size, x2[0], f32)


def shfl_source(lane: np.ndarray, b, mode: str, width: int) -> np.ndarray:
    """The lane each lane of a warp reads in ``shfl.sync.{bfly,down,up,idx}`` (PTX ISA, shfl.sync) as
    CUDA's ``__shfl_*_sync(mask, v, b, width)`` issues it: the segment mask is ``32 - width`` and
    the clamp 31 (0 for up); only ``b``'s low 5 bits count; a lane whose source is out of its segment
    (past the segment's last lane; before its first for up) reads its own value. ``lane``: 0..31 per
    thread; ``b``: a scalar or one per thread."""
    b = np.asarray(b).astype(np.int64) & 31
    lane = lane.astype(np.int64)
    seg = 32 - width
    low = lane & seg  # the segment's first lane
    high = low | (31 & ~seg)  # ... and its last
    if mode == "up":
        j = lane - b
        ok = j >= low
    else:
        j = {"down": lambda: lane + b, "xor": lambda: lane ^ b, "idx": lambda: low | (b & ~seg)}[mode]()
        ok = j <= high
    return np.where(ok, j, lane)
