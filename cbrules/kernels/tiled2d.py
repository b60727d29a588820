"""2-D kernels of the seed matrix: pointwise ops over [M, N] with 2-D boxes of ROWS x 256.

Blocks cover ROWS rows each; the serial loop over the N-tiles of those rows is circular-buffered.
Its trip count ceil(N / 256) is known only at launch, so the launcher checks it against the
stage count (the rules add that requirement).
"""
from __future__ import annotations

from ..builder import Kernel, blockIdx, ceil_div, circular_buffer, threadIdx

COLS = 256
ROWS = 4


def _pointwise(name: str, inputs: tuple[str, ...], stages: int, prefetch, war: str, rows: int = ROWS) -> Kernel:
    ROWS = rows  # noqa: N806 (rows of a tile: a tuning parameter)
    k = Kernel(name, block=COLS)
    m, n = k.symbol("M"), k.symbol("N")
    tensors = [k.tensor(t, (m, n)) for t in inputs]
    out = k.tensor("out", (m, n))
    maps = [k.tensor_map(t, box=(ROWS, COLS)) for t in tensors]
    tiles = [k.alloc(f"{t}_tile", "shared", "float32", (ROWS, COLS)) for t in inputs]
    k.grid(ceil_div(m, ROWS))
    row0 = blockIdx.x * ROWS
    with k.loop("j", ceil_div(n, COLS), circular_buffer=circular_buffer(stages, prefetch, war)) as j:
        for mp, tile in zip(maps, tiles):
            k.tma_load(mp, (row0, j * COLS), tile)
        col = j * COLS + threadIdx.x
        with k.loop("r", ROWS, kind="unroll") as r:
            vals = [k.load(tile, r * COLS + threadIdx.x) for tile in tiles]
            y = k.exp(vals[0]) if len(vals) == 1 else k.add(vals[0], vals[1])
            with k.if_((row0 + r).lt(m).and_(col.lt(n))):
                k.store(out, (row0 + r) * n + col, y)
    return k


def multi_dim(stages: int = 3, prefetch=None, war: str = "sync", rows: int = ROWS) -> Kernel:
    """``out = exp(x)`` over [M, N], box ``rows`` x 256 (default 4), blocks over M."""
    return _pointwise("multi_dim", ("x",), stages, prefetch, war, rows)


def pointwise(stages: int = 3, prefetch=None, war: str = "sync", rows: int = ROWS) -> Kernel:
    """``out = x + y``: two TMA buffers on one loop, one barrier per stage with two arrivals."""
    return _pointwise("pointwise", ("x", "y"), stages, prefetch, war, rows)
