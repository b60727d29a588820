"""Builder calls for the tensor cores (warpgroup MMA, sm_90a), mixed into :class:`cbrules.ir.builder.Kernel`.

A kernel author writes a tile step ``C[BM, BN] += A[BM, BK] @ B[BK, BN]`` as

    acc = k.mma_accumulator(bm=128, bn=256)           # zeroed float32 fragments, one warp group per 64 rows
    with k.loop("t", ceil_div(K, 64), circular_buffer=cb):
        k.tma_load(a_map, (row0, t * 64), a_tile)     # a_tile [BM, BK], B given as [N, K]: b_tile [BN, BK]
        k.tma_load(b_map, (col0, t * 64), b_tile)
        k.mma(acc, a_tile, b_tile)
    k.mma_store(acc, c_map, (row0, col0))            # c_map's box: [BM, W], BN / W chunks TMA-stored

Both operands are K-major (K contiguous, as the tensor cores read bfloat16/float16 without a
transpose): B is given as ``[N, K]``, i.e. ``B^T`` row-major. Or B is given as a row-major ``[K, N]``
(``k.mma(..., b_layout="kn")``, MN-major, read through the instruction's transpose bit): the b tile is
[BK, BN] as BN / W panels [BK, W] (W = 64 columns at BN a multiple of 64), each one TMA box:

    b_map = k.tensor_map(b, box=(64, 64), swizzle="128B")             # b [K, N]
    for p in range(BN // 64):
        k.tma_load(b_map, (t * 64, col0 + 64 * p), b_tile, offset=p * 64 * 64)
    k.mma(acc, a_tile, b_tile, b_layout="kn") Each tile row is exactly one swizzle span
(BK * 2 bytes = 32, 64 or 128) and the tiles are filled by TMA loads with that swizzle. The rules
(rules/mma.rules) add the ordering around each mma (wgmma fence, commit, wait) and release a stage
slot only once the mma reading it has completed; codegen unrolls the node into the instruction sequence.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .builder_values import BuildError, _call_site, _int
from .mma_layout import B_LAYOUTS, MmaLayoutError, mn_major_span
from .ops import DTYPE_BYTES
from .terms import Term, TermLike, as_term, name

MMA_DTYPES = ("bfloat16", "float16")  # operand types of wgmma with float32 accumulators (here)
MMA_M = 64  # rows of one wgmma (m64nNk16)
MMA_K = 16  # K of one wgmma
MMA_MAX_N = 256
WARPGROUP = 128  # threads


def fragment_coords(bn: int, rows_per_group: int, j: TermLike, r: TermLike, tid: TermLike) -> tuple[Term, Term]:
    """(row, column) inside the tile C[BM, BN] of register ``r`` of 64-row block ``j`` of consumer
    thread ``tid`` (the m64nNk16 float32 accumulator layout: warp w = tid/32 % 4, lane l = tid % 32;
    row = g*BM/groups + 64j + 16w + l/4 + 8*((r/2)%2), column = 8*(r/4) + 2*(l%4) + r%2)."""
    tid, j, r = as_term(tid), as_term(j), as_term(r)
    lane = tid % 32
    row = (tid / WARPGROUP) * rows_per_group + j * MMA_M + ((tid / 32) % 4) * 16 + lane / 4 + ((r / 2) % 2) * 8
    col = (r / 4) * 8 + (lane % 4) * 2 + r % 2
    return row, col


class MmaBuilder:
    """The tensor-core calls of :class:`Kernel` (see the module docstring)."""

    def _mma_fragment(self, acc, call: str) -> tuple[int, int, int]:
        nm = self._known(acc, ("buffer",), call)
        frag = self._fragments.get(nm)
        if frag is None:
            raise BuildError(f"{call} at {_call_site()}: {nm!r} is not an accumulator; pass the handle "
                             "mma_accumulator(...) returned")
        return frag

    def mma_accumulator(self, bm: int, bn: int, acc: str = "acc", groups: Optional[int] = None):
        """A zeroed float32 accumulator for a tile C[bm, bn] on ``groups`` consumer warp groups (default: the
        block's threads / 128); each warp group holds bm/groups rows in 64-row blocks. Returns its handle."""
        where = f"mma_accumulator at {_call_site()}"
        bm, bn = _int(bm, where, "bm", 1), _int(bn, where, "bn", 1)
        block = self.graph.kernel()["block"]
        if block[1] != 1 or block[2] != 1 or block[0] % WARPGROUP:
            raise BuildError(f"{where}: warpgroup MMA runs on whole warp groups of a one-dimensional block; the "
                             f"block is {block}: use 128 x (consumer warp groups) threads in x")
        groups = block[0] // WARPGROUP if groups is None else _int(groups, where, "groups", 1)
        if groups * WARPGROUP != block[0]:
            raise BuildError(f"{where}: {groups} consumer warp groups need a block of {groups * WARPGROUP} threads, "
                             f"the block has {block[0]}; make them agree")
        if bm % (MMA_M * groups):
            raise BuildError(f"{where}: bm={bm} does not split into 64-row blocks over {groups} warp groups; use a "
                             f"multiple of {MMA_M * groups}")
        if bn % 8 or not 8 <= bn <= MMA_MAX_N:
            raise BuildError(f"{where}: bn={bn}: a wgmma computes N = 8..256 columns in steps of 8; use such a bn")
        size = (bm // groups // MMA_M) * (bn // 2)
        buf = self.alloc(acc, "register", "float32", (size,))
        self._fragments[buf.name] = (bm, bn, groups)
        self.mma_zero(buf)
        return buf

    def mma_zero(self, acc) -> None:
        """Zero an accumulator again (the next tile of a persistent block)."""
        bm, bn, groups = self._mma_fragment(acc, "mma_zero")
        with self.loop(f"{acc.name}_zero", (bm // groups // MMA_M) * (bn // 2), kind="unroll") as i:
            self.store(acc, i, 0.0)

    def mma(self, acc, a, b, a_offset: TermLike = 0, b_offset: TermLike = 0, scale_d: TermLike = 1,
            b_layout: str = "nk") -> None:
        """Issue ``acc += a @ b^T`` on the tensor cores: ``a`` a shared [BM, BK] tile, ``b`` a shared
        [BN, BK] tile (B given K-major), both bfloat16 or both float16, their rows BK * 2 = 32, 64 or 128
        bytes and filled by TMA loads with that swizzle. ``scale_d=0`` overwrites acc instead.

        ``b_layout="kn"``: ``acc += a @ b`` with ``b`` a shared [BK, BN] tile (B given MN-major, as a
        row-major [K, N] tensor: no transpose needed), read through the instruction's transpose bit. The
        tile is BN / W panels [BK, W] one after the other, W = 64, 32 or 16 columns (the widest dividing
        BN, :func:`cbrules.ir.mma_layout.mn_major_span`), each one TMA box of a map with box (BK, W) and
        the W * 2-byte swizzle, loaded at element offset ``p * BK * W`` for panel p."""
        where = f"mma at {_call_site()}"
        if b_layout not in B_LAYOUTS:
            raise BuildError(f"{where}: b_layout={b_layout!r}: give 'nk' (b a [BN, BK] tile of B given as [N, K]) "
                             "or 'kn' (b a [BK, BN] tile of B given as [K, N])")
        bm, bn, groups = self._mma_fragment(acc, "mma")
        a_name, b_name = self._known(a, ("buffer",), "mma"), self._known(b, ("buffer",), "mma")
        for t, nm in ((a, "a"), (b, "b")):
            if t.space != "shared" or t.dtype not in MMA_DTYPES or len(t.shape) != 2:
                raise BuildError(f"{where}: operand {nm} ({t.name!r}, {t.space} {t.dtype} {t.shape}) must be a "
                                 f"two-dimensional shared tile of {' or '.join(MMA_DTYPES)}")
        if a.dtype != b.dtype:
            raise BuildError(f"{where}: operands of different types ({a.dtype}, {b.dtype}); give both one type")
        bk = a.shape[1]
        want_b = (bn, bk) if b_layout == "nk" else (bk, bn)
        if a.shape != (bm, bk) or b.shape != want_b:
            other = "kn" if b_layout == "nk" else "nk"
            hint = (f"; b is the {other} layout's tile: pass b_layout={other!r}"
                    if a.shape == (bm, bk) and b.shape == want_b[::-1] else "")
            raise BuildError(f"{where}: tiles a {a.shape} and b {b.shape} do not fit the accumulator's tile "
                             f"[{bm}, {bn}]: a must be [{bm}, BK] and b {list(want_b)} (b_layout={b_layout!r}: B "
                             f"given as {'[N, K]' if b_layout == 'nk' else '[K, N]'}){hint}")
        row_bytes = bk * DTYPE_BYTES[a.dtype]
        if row_bytes not in (32, 64, 128):
            raise BuildError(f"{where}: BK={bk} makes tile rows of {row_bytes} bytes; a row must be one swizzle "
                             f"span (32, 64 or 128 bytes): use BK = 16, 32 or 64 for {a.dtype}")
        extra = {}  # K-major B keeps the node as it was (unchanged graphs); MN-major names its layout and span
        if b_layout == "kn":
            try:
                extra = {"b_major": B_LAYOUTS[b_layout], "b_swizzle": mn_major_span(bn)}
            except MmaLayoutError as e:
                raise BuildError(f"{where}: {e}") from None
        self._node("mma", acc=acc.name, a=a_name, b=b_name, shape=(bm, bn, bk), groups=groups, dtype=a.dtype,
                   swizzle=row_bytes, a_offset=as_term(a_offset), b_offset=as_term(b_offset),
                   scale_d=as_term(scale_d), **extra)

    def mma_store(self, acc, tmap, coords: Sequence[TermLike]) -> None:
        """The epilogue: every accumulator element to the output tile at ``coords`` (row, column of its first
        element), rounded to the tensor's dtype; elements outside the tensor are not written. ``tmap`` maps
        the two-dimensional output with box [BM, W], W dividing BN: a serial loop walks the BN / W column
        chunks and each element is a ``store(..., tile=..., clip=True)``, so the rules stage each chunk and
        write it with one TMA store while the next is staged (rules/tma_store.rules), in BM x W of shared
        memory a slot; the TMA store clips the box at the tensor's edges, so the staged elements need no
        bounds test. Its register indices depend on the chunk, so the rules unroll that loop (rules/mma.rules)."""
        where = f"mma_store at {_call_site()}"
        bm, bn, groups = self._mma_fragment(acc, "mma_store")
        self._known(tmap, ("tensor map",), "mma_store")
        tensor = tmap.tensor
        width = tmap.box[-1]
        if len(tensor.shape) != 2 or tmap.box[0] != bm or bn % width or width % 8:
            raise BuildError(f"{where}: tensor map {tmap.name!r} has box {tmap.box}; the accumulator's tile is "
                             f"[{bm}, {bn}]: map the two-dimensional output with box ({bm}, W), W a multiple of 8 "
                             f"dividing {bn}")
        if not isinstance(coords, (tuple, list)) or len(coords) != 2:
            raise BuildError(f"{where}: coords {coords!r} must be (row, column) of the tile's first element")
        row0, col0 = (as_term(c) for c in coords)
        n = tensor.shape[1]
        half, chunk_regs = bn // 2, width // 2
        tid = name("threadIdx.x")
        with self.loop(f"{acc.name}_q", bn // width) as q:
            with self.loop(f"{acc.name}_j", bm // groups // MMA_M, kind="unroll") as j:
                with self.loop(f"{acc.name}_r", chunk_regs, kind="unroll") as r:
                    reg = q * chunk_regs + r
                    v = self.load(acc, j * half + reg)
                    row, col = fragment_coords(bn, bm // groups, j, reg, tid)
                    # clip: a bounds test the rules drop once the element goes to a staging slot
                    self.store(tensor, (row0 + row) * n + col0 + col, v,
                               tile=(tmap, (row0, col0 + q * width), row * width + col - q * width), clip=True)

    def wgmma_fence(self) -> None:
        """``wgmma.fence``: earlier register and shared writes are seen by the next mma."""
        self._node("wgmma_fence")

    def wgmma_commit(self) -> None:
        """``wgmma.commit_group``: the mma issued since the last commit form one group."""
        self._node("wgmma_commit")

    def wgmma_wait(self, pending: int = 0) -> None:
        """``wgmma.wait_group pending``: all but the newest ``pending`` committed groups are complete."""
        self._node("wgmma_wait", pending=_int(pending, f"wgmma_wait at {_call_site()}", "pending", 0))
