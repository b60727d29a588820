"""Tensor-core matmul ``c[M, N] = a[M, K] @ b[N, K]^T`` (bfloat16/float16 in, float32 accumulate).

B is given K-major, as ``[N, K]`` (``B^T`` row-major: what the tensor cores read without a transpose,
cuBLAS's "TN"); pass ``b.T.copy()`` for a row-major ``[K, N]`` B. A block computes a BM x BN tile of C on
``groups`` consumer warp groups (BM/groups rows each, in 64-row wgmma blocks); every K step TMA-loads a
BM x BK tile of A and a BN x BK tile of B, swizzled (a row is BK * 2 bytes: 128B swizzle at BK = 64),
under one expect-tx, and issues BK/16 wgmma per 64-row block. The rules circular-buffer the K loop and
release a slot once the wgmma reading it completed; the block's tile leaves through one TMA store,
rounded to the output dtype. Ragged M, N and K are zero-filled by the TMA loads and clipped by the store.
"""
from __future__ import annotations

from typing import Optional

from ..errors import CbrulesError
from ..ir.builder import Kernel, blockIdx, ceil_div, circular_buffer
from ..ir.builder_mma import MMA_DTYPES
from ..ir.limits import MAX_SHARED_BYTES, MAX_THREAD_REGISTERS, REGISTERS_PER_BLOCK
from ..ir.ops import DTYPE_BYTES
from ..ir.terms import Term, call

BM, BN, BK, GROUPS, GROUP_M = 128, 256, 64, 2, 8
OUT_DTYPES = MMA_DTYPES + ("float32",)
_SWIZZLE = {32: "32B", 64: "64B", 128: "128B"}


class MatmulTileError(CbrulesError, ValueError):
    """matmul_tc asked for a tile, dtype or stage count that cannot work on the tensor cores."""


def store_cols(bn: int, out_dtype: str) -> int:
    """Columns of C a TMA store writes: all bn if their row spans at most 128 bytes (64 half or 32
    float32 columns), else the widest box row up to 128 bytes that divides bn into whole boxes,
    preferring one that spans a swizzle (32, 64 or 128 bytes): bn=96 of bfloat16 in boxes of 32."""
    size = DTYPE_BYTES[out_dtype]
    widest = 128 // size
    if not isinstance(bn, int) or bn <= widest:
        return bn if isinstance(bn, int) else widest
    whole = [w for w in range(8, widest + 1, 8) if bn % w == 0]
    spans = [w for w in whole if w * size in _SWIZZLE]
    return max(spans or whole or [widest])


# ptxas needs this many registers past a thread's accumulator to issue a wgmma (NVRTC 13 asks for a
# target of 154 for a 64x256 block's 128 floats), and about 16 more for each further 64-row block a
# thread holds; calibrated with NVRTC 13 (ptxas reports): one block of 96 floats fits 128 registers,
# of 128 does not; two blocks of 96 fit 255 without spilling, of 112 spill 40 B, of 128 spill 3.8 KB
WGMMA_EXTRA_REGISTERS = 26
WGMMA_EXTRA_PER_BLOCK = 16


def register_limit(threads: int, consumer_registers: Optional[int] = None) -> int:
    """Registers a consumer thread gets: its setmaxnreg count when registers are split, else what the
    block's ``threads`` leave each (the SM's 65,536 a block, in ptxas's units of 8, at most 255)."""
    if consumer_registers is not None:
        return consumer_registers
    return min(MAX_THREAD_REGISTERS, REGISTERS_PER_BLOCK // threads // 8 * 8)


def _accumulator_need(bm: int, bn: int, groups: int) -> int:
    blocks = bm // groups // 64
    return blocks * (bn // 2) + WGMMA_EXTRA_REGISTERS + WGMMA_EXTRA_PER_BLOCK * (blocks - 1)


def _check_registers(bm: int, bn: int, groups: int, warp_specialize: bool, registers) -> None:
    """Refuse, before NVRTC, a tile whose accumulator a consumer thread cannot hold (ptxas would end
    in C7602 "Insufficient registers", or spill the accumulator), naming what fits."""
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (bm, bn, groups)) or bm % (64 * groups):
        return  # the builder names a tile that does not split
    consumer = registers[1] if isinstance(registers, (tuple, list)) and len(registers) == 2 and \
        isinstance(registers[1], int) else None

    def limit(g: int) -> int:
        return register_limit(128 * (g + (1 if warp_specialize else 0)), consumer if warp_specialize else None)
    need, have = _accumulator_need(bm, bn, groups), limit(groups)
    if need <= have:
        return
    blocks = bm // groups // 64
    widest = max((n for n in range(8, 257, 8) if _accumulator_need(bm, n, groups) <= have), default=None)
    groups_ok = [g for g in range(1, 5) if bm % (64 * g) == 0 and _accumulator_need(bm, bn, g) <= limit(g)]
    fixes = ([f"bn <= {widest}"] if widest else []) + \
        ([f"groups={' or '.join(map(str, groups_ok))}"] if groups_ok else []) + ["a smaller bm"]
    raise MatmulTileError(
        f"matmul_tc: a {bm}x{bn} tile on {groups} consumer warp group(s){' (warp-specialized)' if warp_specialize else ''} "
        f"gives each consumer thread {blocks} x {bn // 2} accumulator floats, {need} registers with what a wgmma needs "
        f"besides, more than the {have} a thread gets ({'its setmaxnreg count' if consumer and warp_specialize else f'65536 / {128 * (groups + warp_specialize)} threads'}); "
        f"ptxas would fail (Insufficient registers) or spill the accumulator: use {' or '.join(fixes)}")


def shared_bytes(stages: int, bm: int, bn: int, bk: int, dtype: str, out_dtype: str) -> int:
    """Shared memory of one block: the stage slots of A and B and the staging of C (two slots of
    bm x store_cols when there are several column chunks, one otherwise)."""
    cols = store_cols(bn, out_dtype)
    return stages * (bm + bn) * bk * DTYPE_BYTES[dtype] + (1 if cols == bn else 2) * bm * cols * DTYPE_BYTES[out_dtype]


def _grouped_order(pid: Term, tiles_m: Term, tiles_n: Term, group_m: int) -> tuple[Term, Term]:
    """(tile row, tile column) of block ``pid``: groups of ``group_m`` tile rows, column-major inside."""
    per_group = tiles_n * group_m
    first = (pid / per_group) * group_m
    rows = call("min", tiles_m - first, group_m)
    return first + (pid % per_group) % rows, (pid % per_group) / rows


def matmul_tc(stages: int = 4, prefetch=None, war: Optional[str] = None, warp_specialize: bool = False,
              registers=None, dtype: str = "bfloat16", out_dtype: Optional[str] = None, bm: int = BM, bn: int = BN,
              bk: int = BK, groups: int = GROUPS, group_m: int = GROUP_M, persistent: int = 0,
              store_swizzle: Optional[bool] = None) -> Kernel:
    """``c = a @ b^T`` in ``bm`` x ``bn`` tiles on ``groups`` consumer warp groups, ``bk`` of K a stage;
    ``out_dtype`` (bfloat16, float16, float32; default ``dtype``) is c's type. Blocks take tiles in groups
    of ``group_m`` tile rows, column by column inside a group, so the blocks running at once share
    their A and B panels in L2 (``group_m=1``: row by row). ``persistent=P`` launches at most P blocks
    (e.g. the SM count) that each walk tiles blockIdx.x, blockIdx.x + P, ...; warp-specialized, the
    producer loads the next tile while the consumers store the last (otherwise each tile's K loop is
    pipelined on its own). ``store_swizzle=True`` stages C in the swizzle of its output box's rows (the
    TMA store's map swizzles), so the epilogue's shared writes go without bank conflicts (measured on
    the H200: +2 to +6 % against dense staging); ``None`` (the default) does so wherever a box row spans
    32, 64 or 128 bytes, ``False`` stages dense."""
    out_dtype = dtype if out_dtype is None else out_dtype
    if dtype not in MMA_DTYPES or out_dtype not in OUT_DTYPES:
        raise MatmulTileError(f"matmul_tc: dtype {dtype!r} / out_dtype {out_dtype!r}: the tensor cores take "
                              f"{' or '.join(MMA_DTYPES)} operands here and write {', '.join(OUT_DTYPES)}")
    row = bk * DTYPE_BYTES[dtype] if isinstance(bk, int) else None
    if row not in _SWIZZLE:
        raise MatmulTileError(f"matmul_tc: bk={bk!r}: a tile row of {dtype} must span one swizzle (32, 64 or "
                              "128 bytes): use bk = 16, 32 or 64")
    if isinstance(stages, int) and isinstance(bm, int) and isinstance(bn, int):
        need = shared_bytes(stages, bm, bn, bk, dtype, out_dtype)
        if need + 1024 > MAX_SHARED_BYTES:  # + the barriers and the 1024-byte alignment of the tiles
            raise MatmulTileError(f"matmul_tc: {stages} stages of {bm}x{bk} + {bn}x{bk} {dtype} tiles and a {bm}x{bn} "
                                  f"{out_dtype} output tile need {need} bytes of shared memory, more than the "
                                  f"{MAX_SHARED_BYTES} a block may have; use fewer stages or a smaller tile")
    if not isinstance(groups, int) or isinstance(groups, bool) or not 1 <= groups <= 4:
        raise MatmulTileError(f"matmul_tc: groups={groups!r}: use 1 to 4 consumer warp groups")
    _check_registers(bm, bn, groups, bool(warp_specialize), registers)
    if not isinstance(persistent, int) or isinstance(persistent, bool) or persistent < 0:
        raise MatmulTileError(f"matmul_tc: persistent={persistent!r}: give the number of blocks (0: one a tile)")
    if store_swizzle is not None and not isinstance(store_swizzle, bool):
        raise MatmulTileError(f"matmul_tc: store_swizzle={store_swizzle!r}: give True, False or None (where the box allows)")
    if not isinstance(group_m, int) or isinstance(group_m, bool) or group_m < 1:
        raise MatmulTileError(f"matmul_tc: group_m={group_m!r}: give the tile rows of a raster group, 1 or more")
    k = Kernel("matmul_tc", block=128 * groups)
    m, n, kk = k.symbol("M"), k.symbol("N"), k.symbol("K")
    a = k.tensor("a", (m, kk), dtype)
    b = k.tensor("b", (n, kk), dtype)
    c = k.tensor("c", (m, n), out_dtype)
    a_map = k.tensor_map(a, box=(bm, bk), swizzle=_SWIZZLE[row])
    b_map = k.tensor_map(b, box=(bn, bk), swizzle=_SWIZZLE[row])
    cols = store_cols(bn, out_dtype)
    c_swizzle = _SWIZZLE.get(cols * DTYPE_BYTES[out_dtype]) if store_swizzle is not False else None
    if store_swizzle and c_swizzle is None:
        raise MatmulTileError(f"matmul_tc: store_swizzle with bn={bn}: a row of the {bm}x{cols} {out_dtype} output "
                              "box must span one swizzle (32, 64 or 128 bytes)")
    c_map = k.tensor_map(c, box=(bm, cols), **({"swizzle": c_swizzle} if c_swizzle else {}))
    a_tile = k.alloc("a_tile", "shared", dtype, (bm, bk), align=1024)
    b_tile = k.alloc("b_tile", "shared", dtype, (bn, bk), align=1024)
    tiles_m, tiles_n = ceil_div(m, bm), ceil_div(n, bn)
    acc = k.mma_accumulator(bm, bn, groups=groups)
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)

    def tile_step(tile):
        tile_m, tile_n = _grouped_order(tile, tiles_m, tiles_n, group_m)
        row0, col0 = tile_m * bm, tile_n * bn
        with k.loop("t", ceil_div(kk, bk), circular_buffer=cb) as t:
            k.tma_load(a_map, (row0, t * bk), a_tile)  # past K: zeros on both sides, adding nothing
            k.tma_load(b_map, (col0, t * bk), b_tile)
            k.mma(acc, a_tile, b_tile)
        k.mma_store(acc, c_map, (row0, col0))  # staged and TMA-stored by the rules, a column chunk at a time

    if not persistent:
        k.grid(tiles_m * tiles_n)
        tile_step(blockIdx.x)
        return k
    k.grid(call("min", tiles_m * tiles_n, persistent))
    with k.loop("tile", blockIdx.x, tiles_m * tiles_n, persistent) as tile:
        tile_step(tile)
        k.mma_zero(acc)  # for the next tile (the last wgmma group has completed)
    return k
