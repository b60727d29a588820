"""2-D kernels of the seed matrix: pointwise ops over [M, N] in tiles of ROWS x WIDTH.

Blocks cover ROWS rows each; the serial loop over the N-tiles of those rows is circular-buffered.
Its trip count ceil(N / WIDTH) is known only at launch, so the launcher checks it against the
stage count (the rules add that requirement). A one-row tile may be wider than a 256-column box:
it arrives as several boxes (longer contiguous runs of DRAM per stage). With ``per_block`` T > 0,
each block instead takes a run of T consecutive tiles of the row-major tile order (a fixed trip
count, many short blocks: an even spread over the SMs whatever the shape).
"""
from __future__ import annotations

from typing import Optional

from ..ir.builder import Kernel, blockIdx, ceil_div, circular_buffer, lanes, threadIdx
from ..ir.limits import SWIZZLE_SPAN, swizzle_repeat
from ..ir.ops import DTYPE_BYTES
from .reductions import vector_lanes

COLS = 256
ROWS = ROWS_DEFAULT = 4


def _pointwise(name: str, inputs: tuple[str, ...], stages: int, prefetch, war: Optional[str],
               rows: Optional[int] = None, width: int = COLS, per_block: int = 0, dtype: str = "float32",
               tma_store: bool = False, swizzle: str = "none", warp_specialize: bool = False,
               registers=None) -> Kernel:
    # rows of a tile: a tuning parameter; a swizzled box has 8 rows, the length of the XOR pattern
    ROWS = rows or (8 if swizzle != "none" else ROWS_DEFAULT)  # noqa: N806
    if width % COLS:
        raise ValueError(f"{name}: width {width} must be a multiple of {COLS}")
    if tma_store and width != COLS:
        raise ValueError(f"{name}: tma_store stores one box a tile: width must be {COLS}, got {width}")
    k = Kernel(name, block=COLS)
    m, n = k.symbol("M"), k.symbol("N")
    tensors = [k.tensor(t, (m, n), dtype) for t in inputs]
    out = k.tensor("out", (m, n), dtype)
    # a swizzled map has boxes one swizzle span wide: a tile is `boxes` of them, box-major in shared
    # memory, each laid out in the XOR pattern (the rules swizzle the reads' addresses)
    bw = SWIZZLE_SPAN[swizzle] // DTYPE_BYTES[dtype] if swizzle != "none" else COLS
    boxes = width // bw
    maps = [k.tensor_map(t, box=(ROWS, bw), swizzle=swizzle) for t in tensors]
    out_map = k.tensor_map(out, box=(ROWS, COLS)) if tma_store else None
    align = swizzle_repeat(swizzle) if swizzle != "none" else None
    tiles = [k.alloc(f"{t}_tile", "shared", dtype, (ROWS, width), align=align) for t in inputs]
    across = ceil_div(n, width)  # tiles in a row strip
    if per_block:
        k.grid(ceil_div(ceil_div(m, ROWS) * across, per_block))
    else:
        k.grid(ceil_div(m, ROWS))
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    with k.loop("j", per_block or across, circular_buffer=cb) as j:
        if per_block:  # tiles past the last one lie below M: they arrive as zeros and store nothing
            t = blockIdx.x * per_block + j
            row0, col0 = t / across * ROWS, t % across * width
        else:
            row0, col0 = blockIdx.x * ROWS, j * width
        for mp, tile in zip(maps, tiles):
            if swizzle == "none":
                k.tma_load(mp, (row0, col0), tile, tile=(ROWS, width))  # past M or N: zeros
            else:
                with k.loop("u", boxes, kind="unroll") as u:
                    k.tma_load(mp, (row0, col0 + u * bw), tile, offset=u * (ROWS * bw))
        vec = vector_lanes(dtype, ROWS * width // COLS) if swizzle == "none" else 1
        if vec > 1:  # half precision: `vec` elements side by side a thread, in one vector access each
            _vector_body(k, tiles, out, out_map, m, n, row0, col0, ROWS, width, vec)
        else:
            with k.loop("r", ROWS, kind="unroll") as r:
                for lane in lanes(width // COLS, COLS):  # unrolled here: one column of every box
                    col = col0 + lane
                    at = r * width + lane if swizzle == "none" else lane / bw * (ROWS * bw) + r * bw + lane % bw
                    vals = [k.load(tile, at) for tile in tiles]
                    y = k.exp(vals[0]) if len(vals) == 1 else k.add(vals[0], vals[1])
                    with k.if_((row0 + r).lt(m).and_(col.lt(n))):
                        tile = (out_map, (row0, col0), r * width + lane) if tma_store else None
                        k.store(out, (row0 + r) * n + col, y, tile=tile)
    return k


def _vector_body(k: Kernel, tiles, out, out_map, m, n, row0, col0, rows: int, width: int, vec: int) -> None:
    """The tile's elements in runs of ``vec`` a thread: run c of thread t starts at element
    (t + c * COLS) * vec of the row-major tile (a run never crosses a row: width is a multiple of vec).
    A run is stored whole or not at all: N is a multiple of vec (the input's tensor map has a row
    pitch of a multiple of 16 bytes, which the launcher and the interpreter check), so a run starting
    before N ends before it, and the row pitch written N / vec * vec (equal to N) shows the rules
    that a run starts on a multiple of vec: its store becomes one vector too."""
    pitch = n / vec * vec
    for c in range(rows * width // (COLS * vec)):
        first = (threadIdx.x + c * COLS) * vec
        r, lane = first / width, first % width
        with k.if_((row0 + r).lt(m).and_((col0 + lane).lt(n))), k.loop("v", vec, kind="vectorize") as v:
            vals = [k.load(tile, first + v) for tile in tiles]
            y = k.exp(vals[0]) if len(vals) == 1 else k.add(vals[0], vals[1])
            k.store(out, (row0 + r) * pitch + col0 + lane + v, y,
                    tile=(out_map, (row0, col0), first + v) if out_map is not None else None)


def multi_dim(stages: int = 3, prefetch=None, war: Optional[str] = None, rows: Optional[int] = None,
              width: int = COLS, per_block: int = 0, dtype: str = "float32", tma_store: bool = False,
              swizzle: str = "none", warp_specialize: bool = False, registers=None) -> Kernel:
    """``out = exp(x)`` over [M, N], tiles ``rows`` x ``width`` (default 4 x 256, 8 rows when swizzled);
    a block per row strip, or per ``per_block`` consecutive tiles; ``tma_store``: tiles of ``out``
    leave by TMA; ``swizzle``: the input arrives in swizzled boxes one span wide."""
    return _pointwise("multi_dim", ("x",), stages, prefetch, war, rows, width, per_block, dtype, tma_store, swizzle,
                      warp_specialize, registers)


def pointwise(stages: int = 3, prefetch=None, war: Optional[str] = None, rows: Optional[int] = None,
              width: int = COLS, per_block: int = 0, dtype: str = "float32", tma_store: bool = False,
              swizzle: str = "none", warp_specialize: bool = False, registers=None) -> Kernel:
    """``out = x + y``: two TMA buffers on one loop, one barrier per stage with two arrivals;
    ``tma_store``: tiles of ``out`` leave by TMA; ``swizzle``: inputs arrive in swizzled boxes."""
    return _pointwise("pointwise", ("x", "y"), stages, prefetch, war, rows, width, per_block, dtype, tma_store,
                      swizzle, warp_specialize, registers)
