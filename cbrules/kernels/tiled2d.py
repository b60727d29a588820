"""2-D kernels of the seed matrix: pointwise ops over [M, N] in tiles of ROWS x WIDTH.

Blocks cover ROWS rows each; the serial loop over the N-tiles of those rows is circular-buffered.
Its trip count ceil(N / WIDTH) is known only at launch, so the launcher checks it against the
stage count (the rules add that requirement). A one-row tile may be wider than a 256-column box:
it arrives as several boxes (longer contiguous runs of DRAM per stage). With ``per_block`` T > 0,
each block instead takes a run of T consecutive tiles of the row-major tile order (a fixed trip
count, many short blocks: an even spread over the SMs whatever the shape).
"""
from __future__ import annotations

from ..builder import Kernel, blockIdx, ceil_div, circular_buffer, lanes

COLS = 256
ROWS = 4


def _pointwise(name: str, inputs: tuple[str, ...], stages: int, prefetch, war: str, rows: int = ROWS,
               width: int = COLS, per_block: int = 0, dtype: str = "float32") -> Kernel:
    ROWS = rows  # noqa: N806 (rows of a tile: a tuning parameter)
    if width % COLS:
        raise ValueError(f"{name}: width {width} must be a multiple of {COLS}")
    k = Kernel(name, block=COLS)
    m, n = k.symbol("M"), k.symbol("N")
    tensors = [k.tensor(t, (m, n), dtype) for t in inputs]
    out = k.tensor("out", (m, n), dtype)
    maps = [k.tensor_map(t, box=(ROWS, COLS)) for t in tensors]
    tiles = [k.alloc(f"{t}_tile", "shared", dtype, (ROWS, width)) for t in inputs]
    across = ceil_div(n, width)  # tiles in a row strip
    if per_block:
        k.grid(ceil_div(ceil_div(m, ROWS) * across, per_block))
    else:
        k.grid(ceil_div(m, ROWS))
    with k.loop("j", per_block or across, circular_buffer=circular_buffer(stages, prefetch, war)) as j:
        if per_block:  # tiles past the last one lie below M: they arrive as zeros and store nothing
            t = blockIdx.x * per_block + j
            row0, col0 = t / across * ROWS, t % across * width
        else:
            row0, col0 = blockIdx.x * ROWS, j * width
        for mp, tile in zip(maps, tiles):
            k.tma_load(mp, (row0, col0), tile, tile=(ROWS, width))  # past M or N: zeros
        with k.loop("r", ROWS, kind="unroll") as r:
            for lane in lanes(width // COLS, COLS):  # unrolled here: one column of every box
                col = col0 + lane
                vals = [k.load(tile, r * width + lane) for tile in tiles]
                y = k.exp(vals[0]) if len(vals) == 1 else k.add(vals[0], vals[1])
                with k.if_((row0 + r).lt(m).and_(col.lt(n))):
                    k.store(out, (row0 + r) * n + col, y)
    return k


def multi_dim(stages: int = 3, prefetch=None, war: str = "sync", rows: int = ROWS, width: int = COLS,
              per_block: int = 0, dtype: str = "float32") -> Kernel:
    """``out = exp(x)`` over [M, N], tiles ``rows`` x ``width`` (default 4 x 256); a block per row
    strip, or per ``per_block`` consecutive tiles."""
    return _pointwise("multi_dim", ("x",), stages, prefetch, war, rows, width, per_block, dtype)


def pointwise(stages: int = 3, prefetch=None, war: str = "sync", rows: int = ROWS, width: int = COLS,
              per_block: int = 0, dtype: str = "float32") -> Kernel:
    """``out = x + y``: two TMA buffers on one loop, one barrier per stage with two arrivals."""
    return _pointwise("pointwise", ("x", "y"), stages, prefetch, war, rows, width, per_block, dtype)
