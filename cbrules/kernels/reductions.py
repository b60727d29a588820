"""Reductions of the seed matrix: inner (over each row), outer (over each column), and the
inner-persistent normalisation that keeps its row in registers."""
from __future__ import annotations

from ..builder import Kernel, blockIdx, ceil_div, circular_buffer, threadIdx

COLS = 256


def inner_reduction(stages: int = 3, prefetch=None, war: str = "sync", width: int = COLS) -> Kernel:
    """``out[m] = sum(x[m, :])``: one block per row, the loop over its N-tiles circular-buffered.
    A tile is ``width`` columns (a multiple of 256; wider tiles arrive as several 256-wide boxes)."""
    if width % COLS:
        raise ValueError(f"inner_reduction: width {width} must be a multiple of {COLS}")
    k = Kernel("inner_reduction", block=COLS)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n)), k.tensor("out", (m,))
    x_map = k.tensor_map(x, box=(1, COLS))
    tile = k.alloc("tile", "shared", "float32", (1, width))
    k.grid(m)
    acc = k.assign(0.0, dst="acc")
    with k.loop("j", ceil_div(n, width), circular_buffer=circular_buffer(stages, prefetch, war)) as j:
        k.tma_load(x_map, (blockIdx.x, j * width), tile, tile=(1, width))  # columns past N arrive as zeros
        for c in range(width // COLS):  # unrolled here: each thread takes one column of every box
            k.reduce(k.load(tile, threadIdx.x + c * COLS if c else threadIdx.x), kind="serial", dst="acc")
    total = k.reduce(acc, kind="block")
    with k.if_(threadIdx.x.eq(0)):
        k.store(out, blockIdx.x, total)
    return k


def outer_reduction(stages: int = 3, prefetch=None, war: str = "sync", rows: int = 8, cols: int = COLS) -> Kernel:
    """``out[n] = sum(x[:, n])``: a block per ``cols`` columns, the serial loop over M (in tiles of
    ``rows`` rows) circular-buffered. With ``cols`` < 256 the block's 256 threads split each tile's
    rows into 256 / cols groups and add the groups' sums through shared memory at the end (more
    blocks for narrow tensors)."""
    if COLS % cols or rows % (COLS // cols):
        raise ValueError(f"outer_reduction: cols={cols} must divide {COLS} and rows={rows} must be a multiple "
                         f"of {COLS // max(cols, 1)}")
    groups = COLS // cols
    k = Kernel("outer_reduction", block=COLS)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n)), k.tensor("out", (n,))
    x_map = k.tensor_map(x, box=(rows, cols))
    tile = k.alloc("tile", "shared", "float32", (rows, cols))
    k.grid(ceil_div(n, cols))
    lane, group = (threadIdx.x, None) if groups == 1 else (threadIdx.x % cols, threadIdx.x / cols)
    col = blockIdx.x * cols + lane
    k.assign(0.0, dst="acc")
    with k.loop("i", ceil_div(m, rows), circular_buffer=circular_buffer(stages, prefetch, war)) as i:
        k.tma_load(x_map, (i * rows, blockIdx.x * cols), tile)  # rows past M arrive as zeros
        with k.loop("r", rows // groups, kind="unroll") as r:
            row = r if groups == 1 else r * groups + group
            k.reduce(k.load(tile, row * cols + lane), kind="serial", dst="acc")
    if groups > 1:  # each column's group sums meet in shared memory
        partial = k.alloc("partial", "shared", "float32", (COLS,))
        k.store(partial, threadIdx.x, "acc")
        k.syncthreads()
        with k.if_(threadIdx.x.lt(cols)):
            k.assign(0.0, dst="total")
            for g in range(groups):
                k.reduce(k.load(partial, threadIdx.x + g * cols if g else threadIdx.x), kind="serial", dst="total")
            with k.if_(col.lt(n)):
                k.store(out, col, k.assign("total"))
        return k
    with k.if_(col.lt(n)):
        k.store(out, col, k.assign("acc"))
    return k


def persistent(stages: int = 3, prefetch=None, war: str = "sync", row: int = 1024, box: int = 128) -> Kernel:
    """``out = (x - mean) / sqrt(var)`` per row of a [M, row] tensor (``row`` fixed at build time).

    One block per row; each stage brings a 256-wide tile as several ``box``-wide TMA boxes under one
    barrier arrival; every thread keeps its elements of the row in registers for the second pass.
    """
    if row % COLS:
        raise ValueError(f"persistent: row length {row} must be a multiple of {COLS}")
    tiles = row // COLS
    k = Kernel("persistent", block=COLS)
    m = k.symbol("M")
    x, out = k.tensor("x", (m, row)), k.tensor("out", (m, row))
    x_map = k.tensor_map(x, box=(1, box))
    tile = k.alloc("tile", "shared", "float32", (1, COLS))
    vals = k.alloc("vals", "register", "float32", (tiles,))
    k.grid(m)
    k.assign(0.0, dst="s1")
    with k.loop("j", tiles, circular_buffer=circular_buffer(stages, prefetch, war)) as j:
        k.tma_load(x_map, (blockIdx.x, j * COLS), tile, tile=(1, COLS))
        v = k.load(tile, threadIdx.x)
        k.store(vals, j, v)
        k.reduce(v, kind="serial", dst="s1")
    mean = k.div(k.reduce("s1", kind="block"), float(row))
    k.assign(0.0, dst="s2")
    with k.loop("q", tiles, kind="unroll") as q:
        d = k.sub(k.load(vals, q), mean)
        k.reduce(k.mul(d, d), kind="serial", dst="s2")
    rstd = k.rsqrt(k.div(k.reduce("s2", kind="block"), float(row)))
    with k.loop("q2", tiles, kind="unroll") as q:
        k.store(out, blockIdx.x * row + q * COLS + threadIdx.x, k.mul(k.sub(k.load(vals, q), mean), rstd))
    return k
