"""Builder calls for the tensor cores (warpgroup MMA, sm_90a), mixed into :class:`cbrules.ir.builder.Kernel`.

A kernel author writes a tile step ``C[BM, BN] += A[BM, BK] @ B[BK, BN]`` as

    acc = k.mma_accumulator(bm=128, bn=256)           # zeroed float32 fragments, one warp group per 64 rows
    with k.loop("t", ceil_div(K, 64), circular_buffer=cb):
        k.tma_load(a_map, (row0, t * 64), a_tile)     # a_tile [BM, BK], B given as [N, K]: b_tile [BN, BK]
        k.tma_load(b_map, (col0, t * 64), b_tile)
        k.mma(acc, a_tile, b_tile)
    k.mma_store(acc, c_map, (row0, col0))            # c_map's box: [BM, W], BN / W chunks TMA-stored

Both operands are K-major (K contiguous, as the tensor cores read bfloat16/float16 without a
transpose, and FP8 only so): B is given as ``[N, K]``, i.e. ``B^T`` row-major. FP8 tiles (float8_e4m3,
float8_e5m2, or one of each) have rows of 128 elements (BK = 128: one 128-byte swizzle span) and are
multiplied k32 at a time. Or B is given as a row-major ``[K, N]``
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

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

from .builder_values import Buffer, BuildError, _call_site, _int
from .mma_layout import B_LAYOUTS, HALF_MMA_DTYPES, MMA_DTYPES, MmaLayoutError, mn_major_span
from .ops import DTYPE_BYTES, FP8_DTYPES
from .terms import Term, TermLike, as_term, call, name

MMA_M = 64  # rows of one wgmma (m64nNk16)
MMA_K = 16  # K of one wgmma of 2-byte inputs (FP8: 32, mma_layout.k_step)
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


@dataclass(frozen=True)
class FragmentElement:
    """One element of an accumulator fragment inside :meth:`MmaBuilder.fragment_elements`: the body
    runs once per element a thread holds (unrolled), so every field is a term of that element.

    ``value`` is the register holding the element (float32); ``row`` and ``col`` are its place in the
    output (the tile's ``origin`` plus ``tile_row`` / ``tile_col``, its place inside the BM x BN tile);
    ``index`` is its register index in the fragment. ``set(v)`` writes the element back."""

    value: Term
    row: Term
    col: Term
    tile_row: Term
    tile_col: Term
    index: Term
    fragment: Buffer
    kernel: Any  # the Kernel being built (writes go through it)
    block: Term  # the element's 64-row block j and its register r in the block (index = j * BN/2 + r)
    register: Term

    def set(self, value: TermLike) -> None:
        """Write ``value`` (rounded to float32) as this element's new value."""
        self.kernel.store(self.fragment, self.index, value)

    def inside(self, rows: TermLike, cols: TermLike) -> Term:
        """The predicate ``row < rows && col < cols``: the element lies inside an output of ``rows`` x
        ``cols`` (the ragged edge of the last tiles; for ``select`` or ``if_``)."""
        return self.row.lt(rows).and_(self.col.lt(cols))

    def load_col(self, vector: Buffer) -> Term:
        """``vector[col]`` of a one-dimensional per-column tensor (a bias over N), as float32. Past its
        end (a ragged last tile) the last element is read instead: such elements are outside the output,
        which the stores clip."""
        return self.kernel.load(vector, _clamped(self.col, _vector_length(vector, "load_col")))

    def load_row(self, vector: Buffer) -> Term:
        """``vector[row]`` of a one-dimensional per-row tensor (a scale over M), as float32, clamped at
        its end like :meth:`load_col`."""
        return self.kernel.load(vector, _clamped(self.row, _vector_length(vector, "load_row")))

    def load_tile(self, tile: Buffer) -> Term:
        """The element at this element's place in a tile of the same layout, as float32: a global
        ``[rows, cols]`` tensor at (``row``, ``col``), clamped at its edges like :meth:`load_col` (a
        residual), or a shared ``[BM, BN]`` buffer at (``tile_row``, ``tile_col``) (a tile a TMA load
        wrote)."""
        if len(tile.shape) != 2:
            raise BuildError(f"load_tile at {_call_site()}: {tile.name!r} has shape {tile.shape}; a tile in the "
                             "fragment's layout is two-dimensional, [rows, columns]")
        rows, cols = tile.shape
        if tile.space == "global":
            return self.kernel.load(tile, _clamped(self.row, rows) * cols + _clamped(self.col, cols))
        return self.kernel.load(tile, self.tile_row * cols + self.tile_col)

    def reduced(self, reduction: Buffer) -> Term:
        """The value of :meth:`MmaBuilder.fragment_reduce`'s ``reduction`` for this element: the reduction
        over its row (axis "row") or its column (axis "col") of the tile, as float32."""
        got = self.kernel._reductions.get(getattr(reduction, "name", None))
        if got is None or got[0] != self.fragment.name:
            raise BuildError(f"reduced at {_call_site()}: {reduction!r} is not a reduction of fragment "
                             f"{self.fragment.name!r}; pass what fragment_reduce(...) of it returned")
        return self.kernel.load(reduction, _reduced_index(got[1], self.block, self.register))


def _reduced_index(axis: str, j: TermLike, r: TermLike) -> Term:
    """Where a thread keeps the reduction of the row (axis "row": 2 rows per 64-row block j, the half
    (r/2)%2 of register r) or the column (axis "col": the column pair r/4 and r%2 of it) of register r."""
    j, r = as_term(j), as_term(r)
    return j * 2 + (r / 2) % 2 if axis == "row" else (r / 4) * 2 + r % 2


def _vector_length(vector: Buffer, call_name: str) -> Term:
    if len(vector.shape) != 1 or vector.space != "global":
        raise BuildError(f"{call_name} at {_call_site()}: {vector.name!r} ({vector.space}, shape {vector.shape}) "
                         "must be a one-dimensional global tensor")
    return vector.shape[0]


def _clamped(i: Term, extent: TermLike) -> Term:
    """``min(i, extent - 1)``: an index kept inside a tensor whose edge a ragged tile crosses."""
    return call("min", i, as_term(extent) - 1)


_PACKED = {"bfloat16": "bf16x2", "float16": "f16x2"}
# combine -> (identity, the kernel's binary op); the shuffles that combine the lanes sharing a row / a column
FRAGMENT_COMBINE = {"max": (float("-inf"), "max"), "min": (float("inf"), "min"), "sum": (0.0, "add")}
FRAGMENT_OPS = {op: c for c, (_, op) in FRAGMENT_COMBINE.items()}
ROW_SHUFFLES = (1, 2)  # lanes 4q .. 4q+3 hold one row
COL_SHUFFLES = (4, 8, 16)  # lanes l, l+4, ..., l+28 hold one column


@contextmanager
def _unrolled(k, prefix: str, loops) -> Iterator[dict]:
    """Nested unrolled loops ``prefix + name`` over (name, trip count) pairs; yields name -> variable."""
    if not loops:
        yield {}
        return
    (nm, trips), rest = loops[0], loops[1:]
    with k.loop(prefix + nm, trips, kind="unroll") as v:
        with _unrolled(k, prefix, rest) as more:
            yield {nm: v, **more}


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
        if a_name in self._operands:
            self._register_a_mma(where, acc, a, b, (bm, bn, groups), a_offset, b_offset, scale_d, b_layout)
            return
        for t, nm in ((a, "a"), (b, "b")):
            if t.space != "shared" or t.dtype not in MMA_DTYPES or len(t.shape) != 2:
                raise BuildError(f"{where}: operand {nm} ({t.name!r}, {t.space} {t.dtype} {t.shape}) must be a "
                                 f"two-dimensional shared tile of {', '.join(MMA_DTYPES)}")
        fp8 = a.dtype in FP8_DTYPES
        if a.dtype != b.dtype and not (fp8 and b.dtype in FP8_DTYPES):
            raise BuildError(f"{where}: operands of different types ({a.dtype}, {b.dtype}); give both one type "
                             "(only the FP8 types mix: e4m3 with e5m2)")
        if fp8 and b_layout != "nk":
            raise BuildError(f"{where}: an FP8 ({a.dtype}) mma with b_layout={b_layout!r}: the tensor cores read FP8 "
                             "operands K-major only (no transposed read); give B as [N, K] (b_layout='nk'), "
                             "transposing it beforehand")
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
            size = DTYPE_BYTES[a.dtype]
            raise BuildError(f"{where}: BK={bk} makes tile rows of {row_bytes} bytes; a row must be one swizzle "
                             f"span (32, 64 or 128 bytes): use BK = {32 // size}, {64 // size} or {128 // size} "
                             f"for {a.dtype}")
        extra = {}  # K-major B keeps the node as it was (unchanged graphs); MN-major names its layout and span
        if b.dtype != a.dtype:
            extra["b_dtype"] = b.dtype
        if b_layout == "kn":
            try:
                extra = {"b_major": B_LAYOUTS[b_layout], "b_swizzle": mn_major_span(bn)}
            except MmaLayoutError as e:
                raise BuildError(f"{where}: {e}") from None
        self._node("mma", acc=acc.name, a=a_name, b=b_name, shape=(bm, bn, bk), groups=groups, dtype=a.dtype,
                   swizzle=row_bytes, a_offset=as_term(a_offset), b_offset=as_term(b_offset),
                   scale_d=as_term(scale_d), **extra)

    def _register_a_mma(self, where: str, acc, a, b, fragment, a_offset, b_offset, scale_d, b_layout: str) -> None:
        """``acc += a @ b^T`` with ``a`` a register operand (:meth:`fragment_convert`): wgmma's register-A form.
        With ``b_layout="kn"`` b is a [BK, BN] tile read MN-major (``acc += a @ b``): its K rows are not
        swizzle spans, so K is any number of k16 steps (an attention's P @ V over a whole key tile)."""
        bm, bn, groups = fragment
        a_bm, bk, a_groups, dtype = self._operands[a.name]
        if (a_bm, a_groups) != (bm, groups):
            raise BuildError(f"{where}: register operand {a.name!r} holds a [{a_bm}, {bk}] tile on {a_groups} warp "
                             f"group(s), the accumulator a [{bm}, {bn}] tile on {groups}: the A fragment's rows are "
                             "the accumulator's (one thread holds the same rows of both); give them one tile height")
        want_b = (bn, bk) if b_layout == "nk" else (bk, bn)
        if b.space != "shared" or b.dtype != dtype or b.shape != want_b:
            given = "[N, K], K" if b_layout == "nk" else "[K, N] (b_layout='kn'), K"
            raise BuildError(f"{where}: operand b ({b.name!r}, {b.space} {b.dtype} {b.shape}) must be a shared "
                             f"{dtype} tile {list(want_b)} (B given as {given} = the register operand's columns)")
        extra = {}
        if b_layout == "nk":
            row_bytes = bk * DTYPE_BYTES[dtype]
            if row_bytes not in (32, 64, 128):
                raise BuildError(f"{where}: the register operand's {bk} columns make B tile rows of {row_bytes} bytes; "
                                 "a row must be one swizzle span (32, 64 or 128 bytes): convert a fragment of 16, 32 "
                                 "or 64 columns, or give B as [K, N] (b_layout='kn')")
        else:
            try:
                row_bytes = mn_major_span(bn)
            except MmaLayoutError as e:
                raise BuildError(f"{where}: {e}") from None
            extra = {"b_major": B_LAYOUTS[b_layout], "b_swizzle": row_bytes}
        self._node("mma", acc=acc.name, a=a.name, b=b.name, shape=(bm, bn, bk), groups=groups, dtype=dtype,
                   swizzle=row_bytes, a_offset=as_term(a_offset), b_offset=as_term(b_offset),
                   scale_d=as_term(scale_d), a_space="register", **extra)

    def mma_operand(self, acc, dtype: str = "bfloat16", dst: Optional[str] = None) -> Buffer:
        """A register A operand for a following :meth:`mma` with ``K`` = the columns of ``acc``'s tile:
        :meth:`fragment_convert` fills it from ``acc`` (allocate it where the accumulator is, before the
        loops that convert into it). It is a uint32 register array, BN/4 a thread for each 64-row block."""
        where = f"mma_operand at {_call_site()}"
        bm, bn, groups = self._mma_fragment(acc, "mma_operand")
        if dtype not in HALF_MMA_DTYPES:
            raise BuildError(f"{where}: dtype {dtype!r}: a register MMA operand is {' or '.join(HALF_MMA_DTYPES)}"
                             + (" (an FP8 A operand from registers is not supported: stage it in shared memory)"
                                if dtype in FP8_DTYPES else ""))
        if bn % MMA_K:
            raise BuildError(f"{where}: {acc.name!r} has {bn} columns; an A operand is whole k16 chunks: convert a "
                             f"fragment of a multiple of {MMA_K} columns")
        out = self.alloc(dst or f"{acc.name}_{_PACKED[dtype]}", "register", "uint32",
                         ((bm // groups // MMA_M) * (bn // 4),))
        self._operands[out.name] = (bm, bn, groups, dtype)
        return out

    def fragment_convert(self, acc, into: Buffer) -> None:
        """``acc`` (float32, [BM, BN]) rounded to the operand's dtype (nearest even) and packed in pairs into
        ``into`` (from :meth:`mma_operand`): the A of a following :meth:`mma`, with no trip through shared
        memory. The A fragment of a 64 x 16 wgmma chunk has the thread and row map of 16 accumulator
        columns (REFERENCE §8), so accumulator registers (2i, 2i+1) become packed register i
        (``cvt.rn.bf16x2.f32``, the lower column in the low half)."""
        where = f"fragment_convert at {_call_site()}"
        bm, bn, groups = self._mma_fragment(acc, "fragment_convert")
        target = self._operands.get(self._known(into, ("buffer",), "fragment_convert"))
        if target is None or target[:3] != (bm, bn, groups):
            raise BuildError(f"{where}: {into!r} is not a register operand of {acc.name!r}'s [{bm}, {bn}] tile; "
                             f"pass what mma_operand({acc.name}) returned")
        blocks, quarter = bm // groups // MMA_M, bn // 4
        with self.loop(f"{into.name}_j", blocks, kind="unroll") as j:
            with self.loop(f"{into.name}_i", quarter, kind="unroll") as i:
                lo, hi = self.load(acc, j * (bn // 2) + i * 2), self.load(acc, j * (bn // 2) + i * 2 + 1)
                packed = self._reg(None, "fragment_convert")
                self._node("cvt_pack", dst=packed, args=(lo, hi), dtype="uint32", to=target[3])
                self.store(into, j * quarter + i, name(packed))

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

    # ---------------------------------------------------------------- fragments as values
    @contextmanager
    def fragment_elements(self, acc, origin: Sequence[TermLike] = (0, 0)) -> Iterator[FragmentElement]:
        """Compute on an accumulator after its MMA: the body runs for every element this thread holds
        (loops over its 64-row blocks and registers, unrolled) with a :class:`FragmentElement` giving
        the element's value, its (row, col) in the output (``origin``, the tile's first element, plus
        its place in the tile) and ``set`` to write it back::

            with k.fragment_elements(acc, origin=(row0, col0)) as e:
                e.set(k.max(k.add(e.value, e.load_col(bias)), 0.0))   # relu(acc + bias[col])

        Read it after the MMA loop (the rules wait for the MMA groups there); write the result with
        :meth:`mma_store` or :meth:`fragment_store`."""
        bm, bn, groups = self._mma_fragment(acc, "fragment_elements")
        if not isinstance(origin, (tuple, list)) or len(origin) != 2:
            raise BuildError(f"fragment_elements at {_call_site()}: origin {origin!r} must be (row, column) of "
                             "the tile's first element")
        row0, col0 = (as_term(c) for c in origin)
        half = bn // 2
        with self.loop(f"{acc.name}_ej", bm // groups // MMA_M, kind="unroll") as j:
            with self.loop(f"{acc.name}_er", half, kind="unroll") as r:
                index = j * half + r
                row, col = fragment_coords(bn, bm // groups, j, r, name("threadIdx.x"))
                yield FragmentElement(self.load(acc, index), row0 + row, col0 + col, row, col, index, acc, self, j, r)

    def fragment_map(self, acc, fn: Callable[[FragmentElement], TermLike],
                     origin: Sequence[TermLike] = (0, 0)) -> None:
        """Replace every element of ``acc`` by ``fn(element)`` (a :class:`FragmentElement`; ``fn`` builds
        its value with the kernel's calls and returns it): :meth:`fragment_elements` in one call."""
        if not callable(fn):
            raise BuildError(f"fragment_map at {_call_site()}: fn {fn!r} must be a function of one element")
        with self.fragment_elements(acc, origin) as e:
            e.set(fn(e))

    def fragment_reduce(self, acc, axis: str = "row", combine: str = "max", dst: Optional[str] = None,
                        into: Optional[Buffer] = None) -> Buffer:
        """Reduce ``acc`` along the rows (``axis="row"``: each row of the tile over its BN columns) or the
        columns (``axis="col"``: each column over the BM rows) with ``combine`` (max, min, sum); returns a
        register array that :meth:`FragmentElement.reduced` reads per element (every thread holding an
        element of the row or column gets the result).

        A row's BN elements are held by the four lanes of one warp (lane / 4 equal): each thread combines
        its own (BN/4 a row), then two shuffles (xor 1, xor 2) combine the four lanes. A column's elements
        are held by the 8 lanes of each warp with the same lane % 4, in every warp of every warp group:
        each thread combines its own, three shuffles (xor 4, 8, 16) the warp's, and the warps' partials
        meet in a shared [warps, BN] scratch between two block syncs (the consumers' named barrier once
        warp-specialized: rules/warp_specialize.rules). Mask elements outside the output first (a
        ``select`` to the combine's identity in :meth:`fragment_map`).

        ``into``: a float32 register array allocated before (e.g. before a circular-buffered loop whose
        body reduces every iteration: the rules copy the body into several loops, and an allocation
        inside would be made twice) to hold the result instead of a new one."""
        where = f"fragment_reduce at {_call_site()}"
        bm, bn, groups = self._mma_fragment(acc, "fragment_reduce")
        if axis not in ("row", "col") or combine not in FRAGMENT_COMBINE:
            raise BuildError(f"{where}: axis {axis!r} / combine {combine!r}: give axis 'row' or 'col' and combine "
                             f"one of {', '.join(FRAGMENT_COMBINE)}")
        blocks, half = bm // groups // MMA_M, bn // 2
        size = (blocks * 2 if axis == "row" else bn // 4,)
        if into is None:
            out = self.alloc(dst or f"{acc.name}_{axis}_{combine}", "register", "float32", size)
        else:
            self._known(into, ("buffer",), "fragment_reduce")
            if into.space != "register" or into.dtype != "float32" or tuple(into.shape) != size:
                raise BuildError(f"{where}: into={into.name!r} ({into.space} {into.dtype} {into.shape}) must be a "
                                 f"float32 register array of shape {size} (one result a {axis} the thread holds)")
            out = into
        self._reductions[out.name] = (acc.name, axis)
        tmp = self._reg(None, "fragment_reduce")
        identity, op = FRAGMENT_COMBINE[combine]
        # register j * BN/2 + 4c + 2h + p holds row (j, h) and column pair (c, p): the outer loops walk the
        # results, the inner ones the thread's own registers of one result
        rows, cols = (("j", blocks), ("h", 2)), (("c", bn // 8), ("p", 2))
        outer, inner = (rows, cols) if axis == "row" else (cols, rows)
        with _unrolled(self, f"{out.name}_", outer) as o:
            self.assign(identity, dst=tmp)
            with _unrolled(self, f"{out.name}_", inner) as i:
                v = {**o, **i}
                self.reduce(self.load(acc, v["j"] * half + v["c"] * 4 + v["h"] * 2 + v["p"]), kind="serial",
                            combine=combine, dst=tmp)
            for lane in ROW_SHUFFLES if axis == "row" else COL_SHUFFLES:
                getattr(self, op)(tmp, self.shfl(tmp, lane, "xor"), dst=tmp)
            self.store(out, o["j"] * 2 + o["h"] if axis == "row" else o["c"] * 2 + o["p"], tmp)
        if axis == "col":  # 4 warps a group, each with its own rows
            self._columns_across_warps(out, bn, 4 * groups, identity, op, tmp)
        return out

    def _columns_across_warps(self, out: Buffer, bn: int, warps: int, identity: float, op: str, tmp: str) -> None:
        """Each warp's column partials (lanes 0..3 hold all BN columns) through shared memory to every thread."""
        scratch = self.alloc(f"{out.name}_warps", "shared", "float32", (warps, bn))
        tid = name("threadIdx.x")
        lane, warp = tid % 32, tid / 32
        with self.if_(lane.lt(4)):
            with _unrolled(self, f"{out.name}_", (("c", bn // 8), ("p", 2))) as v:
                self.store(scratch, warp * bn + v["c"] * 8 + lane * 2 + v["p"], self.load(out, v["c"] * 2 + v["p"]))
        self.syncthreads()
        with _unrolled(self, f"{out.name}_", (("c", bn // 8), ("p", 2))) as v:
            self.assign(identity, dst=tmp)
            with self.loop(f"{out.name}_w", warps, kind="unroll") as w:
                self.reduce(self.load(scratch, w * bn + v["c"] * 8 + (lane % 4) * 2 + v["p"]), kind="serial",
                            combine=FRAGMENT_OPS[op], dst=tmp)
            self.store(out, v["c"] * 2 + v["p"], tmp)
        self.syncthreads()  # every warp has read the scratch before a later reduction writes it again

    def fragment_store(self, acc, out: Buffer, origin: Sequence[TermLike]) -> None:
        """Every element of ``acc`` to the two-dimensional global tensor ``out`` at ``origin`` + its place
        in the tile, rounded to ``out``'s dtype, each thread storing its own elements (no staging; the
        elements outside ``out`` are not written). :meth:`mma_store` writes the tile by TMA instead."""
        where = f"fragment_store at {_call_site()}"
        self._known(out, ("tensor",), "fragment_store")
        if len(out.shape) != 2:
            raise BuildError(f"{where}: {out.name!r} has shape {out.shape}; store a fragment into a "
                             "two-dimensional tensor")
        rows, cols = out.shape
        with self.fragment_elements(acc, origin) as e:
            with self.if_(e.inside(rows, cols)):
                self.store(out, e.row * cols + e.col, e.value)

    def wgmma_fence(self) -> None:
        """``wgmma.fence``: earlier register and shared writes are seen by the next mma."""
        self._node("wgmma_fence")

    def wgmma_commit(self) -> None:
        """``wgmma.commit_group``: the mma issued since the last commit form one group."""
        self._node("wgmma_commit")

    def wgmma_wait(self, pending: int = 0) -> None:
        """``wgmma.wait_group pending``: all but the newest ``pending`` committed groups are complete."""
        self._node("wgmma_wait", pending=_int(pending, f"wgmma_wait at {_call_site()}", "pending", 0))
