"""The tensor cores' fragment model that the builder's MMA calls (:class:`cbrules.ir.builder.Kernel`:
``mma_accumulator``, ``mma``, ``fragment_map``, ``fragment_reduce``, ...) are written with: where each
register of a wgmma accumulator sits in the tile (:func:`fragment_coords`), one element as the threads
see it (:class:`FragmentElement`), the shuffles that combine a row's or a column's lanes, and the nested
unrolled loops the fragment calls build.

A kernel author writes a tile step ``C[BM, BN] += A[BM, BK] @ B[BK, BN]`` as

    acc = k.mma_accumulator(bm=128, bn=256)           # zeroed float32 fragments, one warp group per 64 rows
    with k.loop("t", ceil_div(K, 64), circular_buffer=cb):
        k.tma_load(a_map, (row0, t * 64), a_tile)     # a_tile [BM, BK], B given as [N, K]: b_tile [BN, BK]
        k.tma_load(b_map, (col0, t * 64), b_tile)
        k.mma(acc, a_tile, b_tile)
    k.mma_store(acc, c_map, (row0, col0))            # c_map's box: [BM, W], BN / W chunks TMA-stored

(the operand layouts, FP8 and the transposed B are described at :meth:`cbrules.ir.builder.Kernel.mma`).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from .builder_values import Buffer, BuildError, call_site
from .terms import Term, TermLike, as_term, call

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
    # its index among the visited columns only (fragment_elements(columns=(first, count)): j * count/2 + r -
    # first/2, the element's place in a part accumulator count columns wide; ``index`` where all are visited)
    part_index: Term
    # the kernel's fragment reductions so far, reduction buffer -> (accumulator, axis), which reduced() reads
    reductions: Mapping[str, tuple[str, str]] = field(default_factory=dict, repr=False, compare=False)

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
            raise BuildError(f"load_tile at {call_site()}: {tile.name!r} has shape {tile.shape}; a tile in the "
                             "fragment's layout is two-dimensional, [rows, columns]")
        rows, cols = tile.shape
        if tile.space == "global":
            return self.kernel.load(tile, _clamped(self.row, rows) * cols + _clamped(self.col, cols))
        return self.kernel.load(tile, self.tile_row * cols + self.tile_col)

    def reduced(self, reduction: Buffer) -> Term:
        """The value of :meth:`MmaBuilder.fragment_reduce`'s ``reduction`` for this element: the reduction
        over its row (axis "row") or its column (axis "col") of the tile, as float32."""
        got = self.reductions.get(getattr(reduction, "name", None))
        if got is None or got[0] != self.fragment.name:
            raise BuildError(f"reduced at {call_site()}: {reduction!r} is not a reduction of fragment "
                             f"{self.fragment.name!r}; pass what fragment_reduce(...) of it returned")
        return self.kernel.load(reduction, _reduced_index(got[1], self.block, self.register))


def _reduced_index(axis: str, j: TermLike, r: TermLike) -> Term:
    """Where a thread keeps the reduction of the row (axis "row": 2 rows per 64-row block j, the half
    (r/2)%2 of register r) or the column (axis "col": the column pair r/4 and r%2 of it) of register r."""
    j, r = as_term(j), as_term(r)
    return j * 2 + (r / 2) % 2 if axis == "row" else (r / 4) * 2 + r % 2


def _vector_length(vector: Buffer, call_name: str) -> Term:
    if len(vector.shape) != 1 or vector.space != "global":
        raise BuildError(f"{call_name} at {call_site()}: {vector.name!r} ({vector.space}, shape {vector.shape}) "
                         "must be a one-dimensional global tensor")
    return vector.shape[0]


def _clamped(i: Term, extent: TermLike) -> Term:
    """``min(i, extent - 1)``: an index kept inside a tensor whose edge a ragged tile crosses."""
    return call("min", i, as_term(extent) - 1)


PACKED = {"bfloat16": "bf16x2", "float16": "f16x2", "float8_e4m3": "e4m3x4", "float8_e5m2": "e5m2x4"}
# combine -> (identity, the kernel's binary op); the shuffles that combine the lanes sharing a row / a column
FRAGMENT_COMBINE = {"max": (float("-inf"), "max"), "min": (float("inf"), "min"), "sum": (0.0, "add")}
FRAGMENT_OPS = {op: c for c, (_, op) in FRAGMENT_COMBINE.items()}
ROW_SHUFFLES = (1, 2)  # lanes 4q .. 4q+3 hold one row
COL_SHUFFLES = (4, 8, 16)  # lanes l, l+4, ..., l+28 hold one column


@contextmanager
def unrolled(k, prefix: str, loops) -> Iterator[dict]:
    """Nested unrolled loops ``prefix + name`` over (name, trip count) pairs; yields name -> variable."""
    if not loops:
        yield {}
        return
    (nm, trips), rest = loops[0], loops[1:]
    with k.loop(prefix + nm, trips, kind="unroll") as v:
        with unrolled(k, prefix, rest) as more:
            yield {nm: v, **more}
