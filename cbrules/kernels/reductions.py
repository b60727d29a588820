"""Reductions of the seed matrix: inner (over each row), outer (over each column), and the
inner-persistent normalisation that keeps its row in registers."""
from __future__ import annotations

from typing import Optional

from ..errors import CbrulesError
from ..ir.builder import Kernel, blockIdx, ceil_div, circular_buffer, lanes, threadIdx
from ..ir.limits import MAX_SHARED_BYTES
from ..ir.ops import DTYPE_BYTES, HALF_DTYPES
from ..ir.terms import call

COLS = 256
MAX_BOX = 256  # elements of a TMA box in one dimension


class KernelParameterError(CbrulesError, ValueError):
    """A reduction kernel's build parameter that cannot work: not a whole number, not a multiple of
    what the tiling needs, or a tile too large for a block's shared memory or a thread's registers."""


class PersistentWalkError(KernelParameterError):
    """``persistent(walk=...)`` was given something other than a count of blocks."""


STATS = ("two-pass", "stable")  # how persistent takes a row's mean and variance

MAX_THREAD_VALUES = 255  # row elements a thread of `persistent` keeps in registers (a thread has at most 255)


def _whole(fn: str, **params) -> None:
    """Each parameter a whole number of at least 1, checked before anything is sized by it."""
    for name, v in params.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise KernelParameterError(f"{fn}: {name}={v!r}: give a whole number of at least 1")


def _fits(fn: str, what: str, nbytes: int) -> None:
    """A stage's tile within the shared memory a block may have (so a huge tile is refused, not unrolled)."""
    if nbytes > MAX_SHARED_BYTES:
        raise KernelParameterError(f"{fn}: {what} takes {nbytes} bytes of shared memory a stage, more than the "
                                   f"{MAX_SHARED_BYTES} a block may have; use a smaller tile")


def vector_lanes(dtype: str, per: int) -> int:
    """Elements a thread takes side by side (one vectorize loop, which the vectorize rules turn into one
    access of up to 16 bytes) when it takes ``per`` of a tile: 1 for float32, whose kernels keep one
    element per access, else as many as fit 16 bytes and divide ``per``."""
    if dtype not in HALF_DTYPES:
        return 1
    v = 16 // DTYPE_BYTES[dtype]
    while per % v:
        v //= 2
    return v


def inner_reduction(stages: int = 3, prefetch=None, war: Optional[str] = None, width: int = COLS,
                    dtype: str = "float32", warp_specialize: bool = False, registers=None, rows: int = 1) -> Kernel:
    """``out[m] = sum(x[m, :])``: a block per ``rows`` rows, the loop over their N-tiles circular-buffered.
    A tile is ``width`` columns (a multiple of 256; wider tiles arrive as several 256-wide boxes) of
    each of the block's rows; a thread keeps one sum per row and the block reduces each at the end
    (several short rows a block share its set-up, prologue and launch)."""
    _whole("inner_reduction", width=width, rows=rows)
    if width % COLS:
        raise KernelParameterError(f"inner_reduction: width {width} must be a multiple of {COLS}")
    _fits("inner_reduction", f"a tile of {rows} x {width}", rows * width * DTYPE_BYTES.get(dtype, 4))
    k = Kernel("inner_reduction", block=COLS)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n), dtype), k.tensor("out", (m,), dtype)
    x_map = k.tensor_map(x, box=(1, COLS))
    tile = k.alloc("tile", "shared", dtype, (rows, width))
    k.grid(ceil_div(m, rows) if rows > 1 else m)
    sums = ["acc"] if rows == 1 else [f"acc{r}" for r in range(rows)]
    for s in sums:
        k.assign(0.0, dst=s)
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    vec = vector_lanes(dtype, width // COLS)
    with k.loop("j", ceil_div(n, width), circular_buffer=cb) as j:
        if rows == 1:
            k.tma_load(x_map, (blockIdx.x, j * width), tile, tile=(1, width))  # columns past N arrive as zeros
        else:  # one row of the tile a load (rows past M arrive as zeros too)
            with k.loop("r", rows, kind="unroll") as r:
                k.tma_load(x_map, (blockIdx.x * rows + r, j * width), tile, offset=r * width, tile=(1, width))
        for r, acc in enumerate(sums):
            if vec == 1:
                for lane in lanes(width // COLS, COLS):  # unrolled here: one column of every box
                    k.reduce(k.load(tile, lane + r * width if rows > 1 else lane), kind="serial", dst=acc)
            for c in range(width // COLS // vec if vec > 1 else 0):  # `vec` side by side, a sum needs no order
                with k.loop("v", vec, kind="vectorize") as v:
                    at = (threadIdx.x + c * COLS) * vec + v
                    k.reduce(k.load(tile, at + r * width if rows > 1 else at), kind="serial", dst=acc)
    if rows == 1:
        total = k.reduce(acc, kind="block")
        with k.if_(threadIdx.x.eq(0)):
            k.store(out, blockIdx.x, total)
        return k
    for r, acc in enumerate(sums):
        total = k.reduce(acc, kind="block")
        with k.if_(threadIdx.x.eq(0).and_((blockIdx.x * rows + r).lt(m))):
            k.store(out, blockIdx.x * rows + r, total)
    return k


def outer_reduction(stages: int = 3, prefetch=None, war: Optional[str] = None, rows: int = 8, cols: int = COLS,
                    dtype: str = "float32", warp_specialize: bool = False, registers=None) -> Kernel:
    """``out[n] = sum(x[:, n])``: a block per ``cols`` columns, the serial loop over M (in tiles of
    ``rows`` rows) circular-buffered. With ``cols`` < 256 the block's 256 threads split each tile's
    rows into 256 / cols groups and add the groups' sums through shared memory at the end (more
    blocks for narrow tensors). A tile taller than a box (256 rows) arrives as several boxes, one
    under the other (more bytes in flight a block where there are few blocks)."""
    _whole("outer_reduction", rows=rows, cols=cols)
    if COLS % cols or rows % (COLS // cols):
        raise KernelParameterError(f"outer_reduction: cols={cols} must divide {COLS} and rows={rows} must be a "
                                   f"multiple of {COLS // max(cols, 1)}")
    if rows > MAX_BOX and rows % MAX_BOX:
        raise KernelParameterError(f"outer_reduction: rows={rows} is taller than a box ({MAX_BOX} rows): it must "
                                   f"be a multiple of {MAX_BOX}")
    _fits("outer_reduction", f"a tile of {rows} x {cols}", rows * cols * DTYPE_BYTES.get(dtype, 4))
    groups = COLS // cols
    k = Kernel("outer_reduction", block=COLS)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n), dtype), k.tensor("out", (n,), dtype)
    box = min(rows, MAX_BOX)
    x_map = k.tensor_map(x, box=(box, cols))
    tile = k.alloc("tile", "shared", dtype, (rows, cols))
    k.grid(ceil_div(n, cols))
    lane, group = (threadIdx.x, None) if groups == 1 else (threadIdx.x % cols, threadIdx.x / cols)
    col = blockIdx.x * cols + lane
    k.assign(0.0, dst="acc")
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    with k.loop("i", ceil_div(m, rows), circular_buffer=cb) as i:
        if rows == box:
            k.tma_load(x_map, (i * rows, blockIdx.x * cols), tile)  # rows past M arrive as zeros
        else:  # boxes of whole rows, one under the other: the tile stays row-major
            with k.loop("b", rows // box, kind="unroll") as b:
                k.tma_load(x_map, (i * rows + b * box, blockIdx.x * cols), tile, offset=b * (box * cols),
                           tile=(box, cols))
        with k.loop("r", rows // groups, kind="unroll") as r:
            row = r if groups == 1 else r * groups + group
            k.reduce(k.load(tile, row * cols + lane), kind="serial", dst="acc")
    if groups > 1:  # each column's group sums meet in shared memory
        partial = k.alloc("partial", "shared", "float32", (COLS,))
        k.store(partial, threadIdx.x, "acc")
        k.syncthreads()
        with k.if_(threadIdx.x.lt(cols)):
            k.assign(0.0, dst="total")
            for lane in lanes(groups, cols):
                k.reduce(k.load(partial, lane), kind="serial", dst="total")
            with k.if_(col.lt(n)):
                k.store(out, col, k.assign("total"))
        return k
    with k.if_(col.lt(n)):
        k.store(out, col, k.assign("acc"))
    return k


def persistent(stages: int = 3, prefetch=None, war: Optional[str] = None, row: int = 1024, box: int = 128,
               width: int = COLS, threads: int = COLS, dtype: str = "float32", warp_specialize: bool = False,
               registers=None, one_box: bool = False, walk: int = 0, stats: str = "two-pass",
               direct: bool = False) -> Kernel:
    """``out = (x - mean) / sqrt(var)`` per row of a [M, row] tensor (``row`` fixed at build time).

    One block of ``threads`` per row; each stage brings a ``width``-wide tile as several ``box``-wide
    TMA boxes under one barrier arrival; every thread keeps its row/threads elements of the row in
    registers for the second pass. Wider tiles keep more bytes in flight; more threads hold fewer
    elements each (a row of 32768 floats is 128 registers a thread at 256 threads, 32 at 1024).
    ``one_box=True`` brings each stage as ONE box instead, (width / box, box) through a map over the
    rows split into stretches of ``box`` (fewer TMA copies in flight per byte); the same shared layout.
    ``walk=P`` launches P blocks (fewer where M is smaller), each walking rows blockIdx.x, +P, ... as
    matmul_tc's persistent walk does (0: one block a row): with ``warp_specialize=True`` the producer warp group
    loads the next row's stages while the consumers still reduce and store this one; without, each row's
    loop is pipelined on its own.
    ``stats="two-pass"`` reduces the sum over the block, then the squares about the block's mean (two block
    reductions, three syncs each); ``stats="stable"`` takes each thread's own mean and M2 about it from its
    registers and merges the pairs in ONE block reduction (``block_stats``: pairwise, so nothing cancels
    when the mean is large against the spread; one sync; threads a power-of-two count of warps).
    ``direct=True`` loads each thread's elements straight from global memory (16-byte vector loads for
    half precision) instead of through TMA stages: no circular buffer, no barriers, no tensor map (stages,
    prefetch, war, box, one_box and warp_specialize then do not apply).
    """
    if stats not in STATS:
        raise KernelParameterError(f"persistent: stats={stats!r}: give one of {', '.join(STATS)}")
    if not isinstance(direct, bool):
        raise KernelParameterError(f"persistent: direct={direct!r}: give True (each thread loads its elements "
                                   "from global memory) or False (TMA stages)")
    if direct and (warp_specialize or one_box):
        raise KernelParameterError("persistent: direct=True loads without TMA stages: warp_specialize and one_box "
                                   "apply only to the TMA path")
    if not isinstance(walk, int) or isinstance(walk, bool) or walk < 0:
        raise PersistentWalkError(f"persistent: walk={walk!r}: give the number of blocks that walk the rows, e.g. "
                                  f"walk=132 (one an SM of an H200); 0 launches one block a row")
    _whole("persistent", row=row, box=box, width=width, threads=threads)
    warps = threads // 32
    if stats == "stable" and (threads % 32 or warps & (warps - 1)):
        raise KernelParameterError(f"persistent: stats='stable' merges equal halves of the block: threads={threads} "
                                   "must be a power-of-two count of whole warps (32, 64, ..., 1024)")
    if width % threads or row % width:
        raise KernelParameterError(f"persistent: width {width} must be a multiple of threads={threads}, and row "
                                   f"{row} a multiple of width")
    if one_box and width % box:
        raise KernelParameterError(f"persistent: one_box=True loads a stage as (width / box, box): width {width} "
                                   f"must be a multiple of box={box}")
    _fits("persistent", f"a tile of {width}", width * DTYPE_BYTES.get(dtype, 4))
    if row // threads > MAX_THREAD_VALUES:
        raise KernelParameterError(f"persistent: a row of {row} over {threads} threads keeps {row // threads} "
                                   f"elements a thread in registers, more than {MAX_THREAD_VALUES}; use more threads "
                                   "or two_pass for such rows")
    tiles, per = row // width, width // threads  # stages in a row, elements a thread takes per stage
    k = Kernel("persistent", block=threads)
    m = k.symbol("M")
    x, out = k.tensor("x", (m, row), dtype), k.tensor("out", (m, row), dtype)
    if direct:
        x_map = tile = None
    elif one_box:  # the row as [row / box, box]: a stage's tile is one box of width / box such stretches
        x_map = k.tensor_map(x, box=(1, width // box, box), split={1: box})
    else:
        x_map = k.tensor_map(x, box=(1, box))
    if not direct:
        tile = k.alloc("tile", "shared", dtype, (1, width))
    vals = k.alloc("vals", "register", "float32", (row // threads,))
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    # half precision: a thread's elements come `vec` side by side (one vector access each); element
    # q = j * per + c * vec + u of its registers is column (q / vec * threads + threadIdx.x) * vec + u
    vec = vector_lanes(dtype, per)

    def normalize_row(r):
        k.assign(0.0, dst="s1")
        loop = k.loop("j", tiles, kind="unroll") if direct else k.loop("j", tiles, circular_buffer=cb)
        with loop as j:
            if direct:  # element i of the stage's tile is element j * width + i of the row
                src, at = x, lambda i: r * row + j * width + i
            elif one_box:
                k.tma_load(x_map, (r, j * (width // box), 0), tile)
            else:
                k.tma_load(x_map, (r, j * width), tile, tile=(1, width))
            if not direct:
                src, at = tile, lambda i: i
            for c, lane in enumerate(lanes(per, threads) if vec == 1 else ()):  # unrolled: a column of every `threads`
                v = k.load(src, at(lane))
                k.store(vals, j * per + c if per > 1 else j, v)
                k.reduce(v, kind="serial", dst="s1")
            for c in range(per // vec if vec > 1 else 0):
                with k.loop("u", vec, kind="vectorize") as u:
                    v = k.load(src, at((threadIdx.x + c * threads) * vec + u))
                    k.store(vals, j * per + c * vec + u, v)
                    k.reduce(v, kind="serial", dst="s1")
        if stats == "stable":  # the thread's own mean and M2 about it, then one merge over the block
            own = k.mul("s1", 1.0 / (row // threads))
            mean = own
        else:
            mean = k.div(k.reduce("s1", kind="block"), float(row))
        k.assign(0.0, dst="s2")
        with k.loop("q", row // threads, kind="unroll") as q:
            d = k.sub(k.load(vals, q), mean)
            k.reduce(k.mul(d, d), kind="serial", dst="s2")
        if stats == "stable":
            mean, m2 = k.block_stats(own, "s2", row // threads)
            rstd = k.rsqrt(k.div(m2, float(row)))
        else:
            rstd = k.rsqrt(k.div(k.reduce("s2", kind="block"), float(row)))
        if vec > 1:
            with k.loop("q2", row // threads // vec, kind="unroll") as g, k.loop("u", vec, kind="vectorize") as u:
                k.store(out, r * row + (g * threads + threadIdx.x) * vec + u,
                        k.mul(k.sub(k.load(vals, g * vec + u), mean), rstd))
            return
        with k.loop("q2", row // threads, kind="unroll") as q:  # element q of a thread: stage q / per, column q % per
            col = q * threads + threadIdx.x if per == 1 else q / per * width + q % per * threads + threadIdx.x
            k.store(out, r * row + col, k.mul(k.sub(k.load(vals, q), mean), rstd))

    if not walk:
        k.grid(m)
        normalize_row(blockIdx.x)
        return k
    k.grid(call("min", m, walk))
    with k.loop("row", blockIdx.x, m, walk) as r:
        normalize_row(r)
    return k


def two_pass(stages: int = 3, prefetch=None, war: Optional[str] = None, width: int = COLS, threads: int = COLS,
             dtype: str = "float32", tma_store: bool = False, warp_specialize: bool = False,
             registers=None) -> Kernel:
    """``out = (x - mean) / sqrt(var)`` per row of [M, N] for rows too long to keep on chip (N known
    only at launch): one block per row reads it twice, each pass a circular-buffered loop over
    ``width``-wide tiles (a row this long outgrows L2's share of a block, so the second read comes
    mostly from DRAM again). The first pass sums x - x[row, 0] and its
    square: shifting by an element of the row keeps the variance E[d^2] - E[d]^2 from cancelling."""
    _whole("two_pass", width=width, threads=threads)
    if width % threads:
        raise KernelParameterError(f"two_pass: width {width} must be a multiple of threads={threads}")
    _fits("two_pass", f"a tile of {width}", width * DTYPE_BYTES.get(dtype, 4))
    if tma_store and width > 256:
        raise KernelParameterError(f"two_pass: tma_store stores one box a tile: width must be at most 256, got "
                                   f"{width}")
    per = width // threads
    k = Kernel("two_pass", block=threads)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n), dtype), k.tensor("out", (m, n), dtype)
    x_map = k.tensor_map(x, box=(1, COLS))
    out_map = k.tensor_map(out, box=(1, width)) if tma_store else None
    tile = k.alloc("tile", "shared", dtype, (1, width))
    k.grid(m)
    shift = k.load(x, blockIdx.x * n)
    k.assign(0.0, dst="s1")
    k.assign(0.0, dst="s2")
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    with k.loop("j", ceil_div(n, width), circular_buffer=cb) as j:
        k.tma_load(x_map, (blockIdx.x, j * width), tile, tile=(1, width))  # columns past N arrive as zeros
        for lane in lanes(per, threads):
            with k.if_((j * width + lane).lt(n)):
                d = k.sub(k.load(tile, lane), shift)
                k.reduce(d, kind="serial", dst="s1")
                k.reduce(k.mul(d, d), kind="serial", dst="s2")
    inv_n = k.div(1.0, n)
    mean_d = k.mul(k.reduce("s1", kind="block"), inv_n)
    var = k.sub(k.mul(k.reduce("s2", kind="block"), inv_n), k.mul(mean_d, mean_d))
    rstd = k.rsqrt(var)
    mean = k.add(mean_d, shift)
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    with k.loop("i", ceil_div(n, width), circular_buffer=cb) as i:
        k.tma_load(x_map, (blockIdx.x, i * width), tile, tile=(1, width))
        for lane in lanes(per, threads):
            y = k.mul(k.sub(k.load(tile, lane), mean), rstd)
            with k.if_((i * width + lane).lt(n)):
                k.store(out, blockIdx.x * n + i * width + lane, y,
                        tile=(out_map, (blockIdx.x, i * width), lane) if tma_store else None)
    return k
