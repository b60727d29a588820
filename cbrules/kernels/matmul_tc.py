"""Tensor-core matmul ``c[M, N] = a[M, K] @ b[N, K]^T`` (bfloat16/float16 or FP8 in, float32 accumulate).

B is given K-major, as ``[N, K]`` (``B^T`` row-major: what the tensor cores read without a transpose,
cuBLAS's "TN"), or with ``b_layout="kn"`` as a row-major ``[K, N]`` (MN-major: ``c = a @ b``, read through
the instruction's transpose bit from panels of 64 columns, one TMA box each). A block computes a BM x BN tile of C on
``groups`` consumer warp groups (BM/groups rows each, in 64-row wgmma blocks); every K step TMA-loads a
BM x BK tile of A and a BN x BK tile of B, swizzled (a row is BK * 2 bytes: 128B swizzle at BK = 64),
under one expect-tx, and issues BK/16 wgmma per 64-row block. The rules circular-buffer the K loop and
release a slot once the wgmma reading it completed; the block's tile leaves through one TMA store,
rounded to the output dtype. Ragged M, N and K are zero-filled by the TMA loads and clipped by the store.

``epilogue=`` computes on the accumulator fragment before the store (:meth:`Kernel.fragment_map`, see
docs/fragments.md): a bias over N, an activation, a residual or ``alpha * acc + beta * c_in`` (:data:`EPILOGUES`).

FP8 (``dtype="float8_e4m3"`` or ``"float8_e5m2"``, ``b_dtype`` the other for a mixed pair): the same kernel
and the same rules with 128 elements of K a stage (one 128-byte swizzled row) and k32 instructions; the
operands' scales are applied to the accumulator before the epilogue (:data:`SCALINGS`): ``"tensor"`` two
float32 scalars ``scale_a`` and ``scale_b`` (and ``scale_c``, a multiplier, when c is FP8), ``"rowcol"``
float32 vectors ``scale_a[M]`` and ``scale_b[N]``.
"""
from __future__ import annotations

from typing import Optional

from ..errors import CbrulesError
from ..ir.builder import Kernel, blockIdx, ceil_div, circular_buffer, threadIdx
from ..ir.builder_mma import fragment_coords
from ..ir.limits import MAX_SHARED_BYTES, MAX_THREAD_REGISTERS, REGISTERS_PER_BLOCK
from ..ir.mma_layout import MMA_DTYPES, MmaLayoutError, mn_major_span
from ..ir.ops import DTYPE_BYTES, FP8_DTYPES
from ..ir.terms import Term, call

# epilogue -> what it adds to the product, then the activation applied to the sum (None: none)
EPILOGUES = {"none": ((), None), "bias": (("bias",), None), "bias_relu": (("bias",), "relu"),
             "bias_gelu": (("bias",), "gelu"), "bias_gelu_tanh": (("bias",), "gelu_tanh"),
             "bias_silu": (("bias",), "silu"), "residual": (("residual",), None),
             "alpha_beta": (("alpha_beta",), None)}
_SQRT1_2 = 0.7071067811865476  # 1 / sqrt(2)
_GELU_TANH_C0, _GELU_TANH_C1 = 0.7978845608028654, 0.7978845608028654 * 0.044715  # sqrt(2/pi), * 0.044715

BM, BN, BK, GROUPS, GROUP_M = 128, 256, 64, 2, 8
OUT_DTYPES = MMA_DTYPES + ("float32",)
# How the operands' scales reach the product (applied to the float32 accumulator, before the epilogue):
# none; "tensor": c = acc * scale_a * scale_b (float32 scalars; an FP8 c also * scale_c); "rowcol":
# c[i, j] = acc[i, j] * scale_a[i] * scale_b[j] (float32 vectors [M] and [N], torch's row-wise scaling)
# "block" (DeepGEMM's): scale_a [M, ceil(K/128)] one a 1x128 run of A, scale_b [ceil(N/128), ceil(K/128)]
# one a 128x128 block of B, applied as each K stage's part is promoted into the sum (needs promote)
SCALINGS = ("none", "tensor", "rowcol", "block")
SCALE_BLOCK = 128  # K (and N) elements of one block scale
# where the K stages are promoted, the part accumulator spans at most PART_COLS columns: a wider tile is
# promoted a column block at a time (each block its own B tile, sum and wgmma group), so a 128 x 256 tile
# takes 128 + 64 registers a consumer thread instead of 2 x 128 (benchmarks/FINDINGS.md: the wider tile
# runs 8-17 % faster than 192 columns promoted whole)
PART_COLS = 128
# the default bn where the K stages are promoted (block scales too: each column block of 128 takes its own
# scale of B), where the consumers' registers hold it (split registers: --registers 40,232), else 128
PROMOTED_BN, PROMOTED_FALLBACK_BN = 256, 128
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


def column_blocks(bn: int, promote: bool) -> int:
    """How many column blocks a tile's K stages are promoted in: one where it spans at most
    :data:`PART_COLS` columns (or nothing is promoted), else ceil(bn / PART_COLS)."""
    return 1 if not promote or not isinstance(bn, int) or bn <= PART_COLS else -(-bn // PART_COLS)


def _accumulator_need(bm: int, bn: int, groups: int, promote: bool = False) -> int:
    """Registers a consumer thread needs for a bm x bn tile's accumulator (and, promoted, the part of one
    column block) on ``groups`` consumer warp groups."""
    blocks = bm // groups // 64
    part = bn // column_blocks(bn, True) if promote else 0
    return blocks * (bn // 2 + part // 2) + WGMMA_EXTRA_REGISTERS + WGMMA_EXTRA_PER_BLOCK * (blocks - 1)


def _consumer_count(registers) -> Optional[int]:
    return registers[1] if isinstance(registers, (tuple, list)) and len(registers) == 2 and \
        isinstance(registers[1], int) else None


def _consumer_limit(groups: int, warp_specialize: bool, registers) -> int:
    """Registers a consumer thread of ``groups`` consumer warp groups gets (see :func:`register_limit`)."""
    return register_limit(128 * (groups + (1 if warp_specialize else 0)),
                          _consumer_count(registers) if warp_specialize else None)


def _check_registers(bm: int, bn: int, groups: int, warp_specialize: bool, registers, promote: bool = False) -> None:
    """Refuse, before NVRTC, a tile whose accumulator a consumer thread cannot hold (ptxas would end
    in C7602 "Insufficient registers", or spill the accumulator), naming what fits."""
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (bm, bn, groups)) or bm % (64 * groups):
        return  # the builder names a tile that does not split
    consumer = _consumer_count(registers)

    def limit(g: int) -> int:
        return _consumer_limit(g, warp_specialize, registers)
    need, have = _accumulator_need(bm, bn, groups, promote), limit(groups)
    if need <= have:
        return
    blocks = bm // groups // 64
    widest = max((n for n in range(8, 257, 8) if _accumulator_need(bm, n, groups, promote) <= have), default=None)
    groups_ok = [g for g in range(1, 5) if bm % (64 * g) == 0 and _accumulator_need(bm, bn, g, promote) <= limit(g)]
    fixes = ([f"bn <= {widest}"] if widest else []) + \
        ([f"groups={' or '.join(map(str, groups_ok))}"] if groups_ok else []) + ["a smaller bm"]
    raise MatmulTileError(
        f"matmul_tc: a {bm}x{bn} tile on {groups} consumer warp group(s){' (warp-specialized)' if warp_specialize else ''} "
        f"gives each consumer thread {blocks} x {bn // 2} accumulator floats"
        f"{f' and {blocks} x {bn // column_blocks(bn, True) // 2} of the k-step part' if promote else ''}, {need} registers with what a wgmma needs "
        f"besides, more than the {have} a thread gets ({'its setmaxnreg count' if consumer and warp_specialize else f'{REGISTERS_PER_BLOCK} / {128 * (groups + warp_specialize)} threads'}); "
        f"ptxas would fail (Insufficient registers) or spill the accumulator: use {' or '.join(fixes)}")


def shared_bytes(stages: int, bm: int, bn: int, bk: int, dtype: str, out_dtype: str, copies: int = 1) -> int:
    """Shared memory of one block: the stage slots of A and B and the staging of C (two slots of
    bm x store_cols when there are several column chunks, one otherwise), one staging for each of
    ``copies`` consumer groups (ping-pong: 2)."""
    cols = store_cols(bn, out_dtype)
    return stages * (bm + bn) * bk * DTYPE_BYTES[dtype] \
        + copies * (1 if cols == bn else 2) * bm * cols * DTYPE_BYTES[out_dtype]


def _b_span(bn) -> int:
    """The swizzle span of an MN-major B tile's panels (:func:`cbrules.ir.mma_layout.mn_major_span`)."""
    try:
        return mn_major_span(bn)
    except MmaLayoutError as e:
        raise MatmulTileError(f"matmul_tc: b_layout='kn' with bn={bn!r}: {e}") from None


def _promote(k: Kernel, acc, part, factor, columns: Optional[tuple[int, int]] = None) -> None:
    """``acc += part`` (times the stage's block scale of each element where ``factor`` is given), in float32
    registers: the K stage's MMAs, summed on the tensor cores, promoted into the full-precision sum (into its
    ``columns`` (first, count) only where the part is one column block of it). The rules wait for the stage's
    MMA group before its part is read (rules/mma.rules)."""
    if factor is None:
        k.fragment_map(acc, lambda e: k.add(e.value, k.load(part, e.part_index)), columns=columns)
    else:
        k.fragment_map(acc, lambda e: k.fma(k.load(part, e.part_index), factor(e), e.value), columns=columns)


def _grouped_order(pid: Term, tiles_m: Term, tiles_n: Term, group_m: int) -> tuple[Term, Term]:
    """(tile row, tile column) of block ``pid``: groups of ``group_m`` tile rows, column-major inside."""
    per_group = tiles_n * group_m
    first = (pid / per_group) * group_m
    rows = call("min", tiles_m - first, group_m)
    return first + (pid % per_group) % rows, (pid % per_group) / rows


def _activation(k: Kernel, fn: Optional[str], x: Term) -> Term:
    """``fn(x)`` built of the kernel's elementwise ops (float32)."""
    if fn is None:
        return x
    if fn == "relu":
        return k.max(x, 0.0)
    if fn == "gelu":  # 0.5 x (1 + erf(x / sqrt 2)), the exact GELU
        return k.mul(k.mul(x, 0.5), k.add(k.erf(k.mul(x, _SQRT1_2)), 1.0))
    if fn == "gelu_tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        inner = k.mul(x, k.fma(k.mul(x, x), _GELU_TANH_C1, _GELU_TANH_C0))
        return k.mul(k.mul(x, 0.5), k.add(k.tanh(inner), 1.0))
    assert fn == "silu", fn  # x * sigmoid(x)
    return k.mul(x, k.sigmoid(x))


def epilogue_inputs(epilogue: str) -> tuple[str, ...]:
    """The tensor and scalar parameters ``epilogue`` adds after a, b and c, in order."""
    adds, _ = EPILOGUES[epilogue]
    return {(): (), ("bias",): ("bias",), ("residual",): ("residual",),
            ("alpha_beta",): ("alpha", "beta", "c_in")}[adds]


def _block_scales(k: Kernel, m: Term, n: Term, kk: Term, bm: int, bn: int, groups: int):
    """The block scales declared, and ``load(row0, col0, t)``, which loads K stage ``t``'s factors
    scale_a[row, t] * scale_b[col0 / 128, t] once for each of the thread's accumulator rows (two a 64-row
    block; the columns promoted at once, a width dividing 128, lie in one column block) and returns the
    factor of a fragment element. Rows and columns past the tensor read its last row's or column block's
    scale (their elements are not stored)."""
    kt, nt = ceil_div(kk, SCALE_BLOCK), ceil_div(n, SCALE_BLOCK)
    sa, sb = k.tensor("scale_a", (m, kt), "float32"), k.tensor("scale_b", (nt, kt), "float32")
    rows = (bm // groups // 64) * 2
    factors = k.alloc("block_scale", "register", "float32", (rows,))

    def load(row0: Term, col0: Term, t: Term):
        col_scale = k.load(sb, call("min", col0 / SCALE_BLOCK, nt - 1) * kt + t)
        with k.loop("block_scale_r", rows, kind="unroll") as r:
            row, _ = fragment_coords(bn, bm // groups, r / 2, (r % 2) * 2, threadIdx.x)
            k.store(factors, r, k.mul(k.load(sa, call("min", row0 + row, m - 1) * kt + t), col_scale))
        return lambda e: k.load(factors, e.block * 2 + (e.register / 2) % 2)  # the element's row slot
    return load


def _epilogue_dtype(out_dtype: str) -> str:
    """The type of an epilogue's tensors (bias, residual, c_in): c's, or bfloat16 where c is FP8."""
    return "bfloat16" if out_dtype in FP8_DTYPES else out_dtype


def _scales(k: Kernel, scaling: str, m: Term, n: Term, out_dtype: str):
    """The scales' parameters declared, and (function of a fragment element -> the factor before the
    epilogue, or None; the factor after it, or None). Block scales apply inside the K loop instead."""
    if scaling in ("none", "block"):
        return None, None
    if scaling == "rowcol":
        sa, sb = k.tensor("scale_a", (m,), "float32"), k.tensor("scale_b", (n,), "float32")
        return (lambda e: k.mul(e.load_row(sa), e.load_col(sb))), None
    sa, sb = k.scalar("scale_a"), k.scalar("scale_b")
    sc = k.scalar("scale_c") if out_dtype in FP8_DTYPES else None
    return (lambda e: k.mul(sa, sb)), (None if sc is None else (lambda e: sc))


def _epilogue(k: Kernel, epilogue: str, m: Term, n: Term, out_dtype: str, scaling: str = "none"):
    """The scales' and epilogue's parameters declared, and the element function (None for none)."""
    before, after = _scales(k, scaling, m, n, out_dtype)
    adds, act = EPILOGUES[epilogue]
    if not adds and act is None and before is None:
        return None
    dtype = _epilogue_dtype(out_dtype)
    bias = k.tensor("bias", (n,), dtype) if "bias" in adds else None
    residual = k.tensor("residual", (m, n), dtype) if "residual" in adds else None
    if "alpha_beta" in adds:
        alpha, beta = k.scalar("alpha"), k.scalar("beta")
        c_in = k.tensor("c_in", (m, n), dtype)

    def element(e) -> Term:
        x = e.value if before is None else k.mul(e.value, before(e))
        if bias is not None:
            x = k.add(x, e.load_col(bias))
        if residual is not None:
            x = k.add(x, e.load_tile(residual))
        if "alpha_beta" in adds:
            x = k.fma(alpha, x, k.mul(beta, e.load_tile(c_in)))
        x = _activation(k, act, x)
        return x if after is None else k.mul(x, after(e))
    return element


def matmul_tc(stages: int = 4, prefetch=None, war: Optional[str] = None, warp_specialize: bool = False,
              registers=None, dtype: str = "bfloat16", out_dtype: Optional[str] = None, bm: int = BM,
              bn: Optional[int] = None,
              bk: Optional[int] = None, groups: int = GROUPS, group_m: int = GROUP_M, persistent: int = 0,
              store_swizzle: Optional[bool] = None, b_layout: str = "nk", epilogue: str = "none",
              pingpong: bool = False, b_dtype: Optional[str] = None, scaling: Optional[str] = None,
              promote: Optional[bool] = None) -> Kernel:
    """``c = a @ b^T`` in ``bm`` x ``bn`` tiles on ``groups`` consumer warp groups, ``bk`` of K a stage;
    ``out_dtype`` (bfloat16, float16, float32, or an FP8 type; default ``dtype``, bfloat16 for FP8) is c's type;
    ``bk`` defaults to one 128-byte row (64 of a 2-byte type, 128 of FP8). Blocks take tiles in groups
    of ``group_m`` tile rows, column by column inside a group, so the blocks running at once share
    their A and B panels in L2 (``group_m=1``: row by row). ``persistent=P`` launches at most P blocks
    (e.g. the SM count) that each walk tiles blockIdx.x, blockIdx.x + P, ...; warp-specialized, the
    producer loads the next tile while the consumers store the last (otherwise each tile's K loop is
    pipelined on its own). ``store_swizzle=True`` stages C in the swizzle of its output box's rows (the
    TMA store's map swizzles), so the epilogue's shared writes go without bank conflicts; ``None`` (the
    default) does so wherever a box row spans 32, 64 or 128 bytes, ``False`` stages dense. ``b_layout="kn"`` takes b as ``[K, N]`` row-major and
    computes ``c = a @ b`` (no transpose): the B tile [bk, bn] arrives as bn / W panels [bk, W] (W = 64
    columns, 128-byte swizzle, where W divides bn), one TMA box each, read MN-major by the tensor cores.

    ``epilogue`` (:data:`EPILOGUES`) maps each accumulator element before the store: ``bias`` adds
    ``bias[col]`` (a tensor [N] of ``out_dtype``), ``bias_relu`` / ``bias_gelu`` (exact, erf) /
    ``bias_gelu_tanh`` / ``bias_silu`` then apply the activation, ``residual`` adds ``residual[row, col]``
    ([M, N]), ``alpha_beta`` computes ``alpha * acc + beta * c_in[row, col]`` (float32 scalars alpha and
    beta, ``c_in`` [M, N]); all in float32, rounded once at the store (an FP8 c: saturated too; the
    epilogue's tensors are then bfloat16).

    FP8: ``dtype`` float8_e4m3 or float8_e5m2 is A's type and B's, or ``b_dtype`` the other FP8 type for B
    (a mixed pair). ``scaling`` (:data:`SCALINGS`; default "tensor" for FP8, "none" otherwise) multiplies
    the accumulator by the operands' scales before the epilogue; "block" applies one scale a 1x128 run of A
    and a 128x128 block of B to each K stage's product as it is promoted (see ``promote``).

    ``promote`` (default: True for FP8, where the tensor cores add each k32 step into the accumulator keeping
    fewer bits than float32): each K stage's MMAs go into a zeroed part accumulator, which the threads then
    add into the float32 sum (``acc += part``, with the block scales where ``scaling="block"``), so rounding
    does not build up over K. A tile wider than :data:`PART_COLS` columns is promoted in column blocks (each
    its own B tile, MMAs and part, one part accumulator of the block's width), so a thread holds the sum and
    one block's part: bn defaults to 256 then where the consumer's registers hold them (else 128).
    ``promote=False`` is the fast accumulation of cuBLASLt's ``use_fast_accum``.

    ``pingpong=True`` (persistent and warp-specialized only): the kernel is written for ONE consumer warp
    group that computes whole bm x bn tiles (``groups`` does not apply; bm=128 is two 64-row blocks), and
    the rules run two such groups on alternate tiles of the block's walk, handing the tensor cores from
    one to the other once its K loop is issued, so one group's epilogue runs under the other's MMAs
    (rules/ws_pingpong.rules)."""
    if not isinstance(pingpong, bool):
        raise MatmulTileError(f"matmul_tc: pingpong={pingpong!r}: give True or False")
    if pingpong and not (persistent and warp_specialize):
        raise MatmulTileError("matmul_tc: pingpong=True needs persistent=P and warp_specialize=True: the two "
                              "consumer warp groups take alternate tiles of a persistent block's walk, fed by the "
                              "producer warp group")
    if dtype not in MMA_DTYPES:
        raise MatmulTileError(f"matmul_tc: dtype {dtype!r}: the tensor cores take {', '.join(MMA_DTYPES)} operands")
    fp8 = dtype in FP8_DTYPES
    out_dtype = ("bfloat16" if fp8 else dtype) if out_dtype is None else out_dtype
    b_dtype = dtype if b_dtype is None else b_dtype
    scaling = ("tensor" if fp8 else "none") if scaling is None else scaling
    if epilogue not in EPILOGUES:
        raise MatmulTileError(f"matmul_tc: epilogue={epilogue!r}: give one of {', '.join(EPILOGUES)}")
    if out_dtype not in OUT_DTYPES:
        raise MatmulTileError(f"matmul_tc: out_dtype {out_dtype!r}: the tensor cores' product is written as one of "
                              f"{', '.join(OUT_DTYPES)}")
    if b_dtype != dtype and not (fp8 and b_dtype in FP8_DTYPES):
        raise MatmulTileError(f"matmul_tc: b_dtype {b_dtype!r} with dtype {dtype!r}: only the FP8 types mix (e4m3 "
                              "with e5m2); give B A's type")
    if scaling not in SCALINGS:
        raise MatmulTileError(f"matmul_tc: scaling={scaling!r}: give one of {', '.join(SCALINGS)}")
    if fp8 and b_layout != "nk":
        raise MatmulTileError(f"matmul_tc: {dtype} with b_layout={b_layout!r}: the tensor cores read FP8 operands "
                              "K-major only; give b as [N, K] (b_layout='nk'), transposed beforehand")
    promote = fp8 if promote is None else promote
    if not isinstance(promote, bool):
        raise MatmulTileError(f"matmul_tc: promote={promote!r}: give True or False")
    if scaling == "block" and not promote:
        raise MatmulTileError("matmul_tc: scaling='block' applies each K stage's scales as its part is promoted; "
                              "give promote=True (or leave it to the FP8 default)")
    bk = 128 // DTYPE_BYTES[dtype] if bk is None else bk
    if bn is None and promote:  # 256 where its sum and part fit, else 128
        fits = isinstance(groups, int) and isinstance(bm, int) and groups >= 1 and bm % (64 * groups) == 0 and \
            _accumulator_need(bm, PROMOTED_BN, groups, True) <= _consumer_limit(groups, bool(warp_specialize), registers)
        bn = PROMOTED_BN if fits else PROMOTED_FALLBACK_BN
    if bn is None:
        bn = BN
    if scaling == "block" and bk != SCALE_BLOCK:
        raise MatmulTileError(f"matmul_tc: scaling='block' with bk={bk}: a K stage must be one scale block of "
                              f"{SCALE_BLOCK} elements (FP8's 128-byte row); use bk={SCALE_BLOCK}")
    blocks = column_blocks(bn, promote)
    width = bn // blocks if isinstance(bn, int) else bn  # of a column block (the whole tile unless promoted in blocks)
    if scaling == "block" and (pingpong or not isinstance(bn, int) or SCALE_BLOCK % width):
        raise MatmulTileError(f"matmul_tc: scaling='block' with bn={bn}{' and pingpong' if pingpong else ''}: each "
                              f"column block the tile is promoted in takes one scale of B, so its width ({width}) "
                              f"must divide {SCALE_BLOCK} (e.g. bn=128 or 256), and the ping-pong kernel does not "
                              "take block scales; drop pingpong")
    row = bk * DTYPE_BYTES[dtype] if isinstance(bk, int) and not isinstance(bk, bool) else None
    if row not in _SWIZZLE:
        size = DTYPE_BYTES[dtype]
        raise MatmulTileError(f"matmul_tc: bk={bk!r}: a tile row of {dtype} must span one swizzle (32, 64 or "
                              f"128 bytes): use bk = {32 // size}, {64 // size} or {128 // size}")
    if isinstance(stages, int) and isinstance(bm, int) and isinstance(bn, int):
        need = shared_bytes(stages, bm, bn, bk, dtype, out_dtype, 2 if pingpong is True else 1)
        if need + 1024 > MAX_SHARED_BYTES:  # + the barriers and the 1024-byte alignment of the tiles
            raise MatmulTileError(f"matmul_tc: {stages} stages of {bm}x{bk} + {bn}x{bk} {dtype} tiles and a {bm}x{bn} "
                                  f"{out_dtype} output tile need {need} bytes of shared memory, more than the "
                                  f"{MAX_SHARED_BYTES} a block may have; use fewer stages or a smaller tile"
                                  + (" (ping-pong stages one output tile per consumer group: e.g. bm=bn=128)"
                                     if pingpong is True else ""))
    if not isinstance(groups, int) or isinstance(groups, bool) or not 1 <= groups <= 4:
        raise MatmulTileError(f"matmul_tc: groups={groups!r}: use 1 to 4 consumer warp groups")
    _check_registers(bm, bn, groups, bool(warp_specialize), registers, promote)
    if blocks > 1 and (bn % (8 * blocks) or b_layout != "nk"):
        raise MatmulTileError(f"matmul_tc: promote with bn={bn}{' and b_layout=' + repr(b_layout) if b_layout != 'nk' else ''}: "
                              f"a tile wider than {PART_COLS} columns is promoted in {blocks} column blocks of equal "
                              "width, a multiple of 8, each its own [N, K] B tile: use a bn that divides so (e.g. 192 "
                              f"or 256){', b_layout=' + repr('nk') if b_layout != 'nk' else ''}, or bn <= {PART_COLS}")
    if not isinstance(persistent, int) or isinstance(persistent, bool) or persistent < 0:
        raise MatmulTileError(f"matmul_tc: persistent={persistent!r}: give the number of blocks (0: one a tile)")
    if store_swizzle is not None and not isinstance(store_swizzle, bool):
        raise MatmulTileError(f"matmul_tc: store_swizzle={store_swizzle!r}: give True, False or None (where the box allows)")
    if b_layout not in ("nk", "kn"):
        raise MatmulTileError(f"matmul_tc: b_layout={b_layout!r}: give 'nk' (b is [N, K]: c = a @ b^T) or 'kn' "
                              "(b is [K, N]: c = a @ b)")
    if not isinstance(group_m, int) or isinstance(group_m, bool) or group_m < 1:
        raise MatmulTileError(f"matmul_tc: group_m={group_m!r}: give the tile rows of a raster group, 1 or more")
    if pingpong:
        groups = 1  # one warp group a tile; the rules add the second
    k = Kernel("matmul_tc", block=128 * groups)
    m, n, kk = k.symbol("M"), k.symbol("N"), k.symbol("K")
    a = k.tensor("a", (m, kk), dtype)
    b = k.tensor("b", (n, kk) if b_layout == "nk" else (kk, n), b_dtype)
    c = k.tensor("c", (m, n), out_dtype)
    element = _epilogue(k, epilogue, m, n, out_dtype, scaling)
    a_map = k.tensor_map(a, box=(bm, bk), swizzle=_SWIZZLE[row])
    if b_layout == "nk":
        b_map = k.tensor_map(b, box=(width, bk), swizzle=_SWIZZLE[row])
    else:  # MN-major panels [bk, w], one box each, in the swizzle of a panel row
        b_span = _b_span(bn)
        w = b_span // DTYPE_BYTES[dtype]
        b_map = k.tensor_map(b, box=(bk, w), swizzle=_SWIZZLE[b_span])
    cols = store_cols(bn, out_dtype)
    c_swizzle = _SWIZZLE.get(cols * DTYPE_BYTES[out_dtype]) if store_swizzle is not False else None
    if store_swizzle and c_swizzle is None:
        raise MatmulTileError(f"matmul_tc: store_swizzle with bn={bn}: a row of the {bm}x{cols} {out_dtype} output "
                              "box must span one swizzle (32, 64 or 128 bytes)")
    c_map = k.tensor_map(c, box=(bm, cols), **({"swizzle": c_swizzle} if c_swizzle else {}))
    a_tile = k.alloc("a_tile", "shared", dtype, (bm, bk), align=1024)
    # one B tile a column block (where promoted in blocks: each block's MMAs have their own tile)
    b_tiles = [k.alloc(f"b_tile{j if blocks > 1 else ''}", "shared", b_dtype,
                       (width, bk) if b_layout == "nk" else (bk, bn), align=1024) for j in range(blocks)]
    tiles_m, tiles_n = ceil_div(m, bm), ceil_div(n, bn)
    acc = k.mma_accumulator(bm, bn, groups=groups)
    # promote: each K stage's MMAs of a column block overwrite this part (scale_d 0), then the threads add it
    # into the block's columns of acc
    part = k.mma_accumulator(bm, width, acc="part", groups=groups) if promote else None
    block_scales = _block_scales(k, m, n, kk, bm, bn, groups) if scaling == "block" else None
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers, pingpong=pingpong)

    def tile_step(tile):
        tile_m, tile_n = _grouped_order(tile, tiles_m, tiles_n, group_m)
        row0, col0 = tile_m * bm, tile_n * bn
        with k.loop("t", ceil_div(kk, bk), circular_buffer=cb) as t:
            k.tma_load(a_map, (row0, t * bk), a_tile)  # past K: zeros on both sides, adding nothing
            if b_layout == "nk":
                for j, b_tile in enumerate(b_tiles):
                    k.tma_load(b_map, (col0 + j * width, t * bk), b_tile)
            else:
                for p in range(bn // w):
                    k.tma_load(b_map, (t * bk, col0 + p * w), b_tiles[0], offset=p * bk * w)
            layout = {} if b_layout == "nk" else {"b_layout": "kn"}
            for j, b_tile in enumerate(b_tiles):
                if part is None:
                    k.mma(acc, a_tile, b_tile, **layout)
                else:
                    k.mma(part, a_tile, b_tile, scale_d=0, **layout)
                    _promote(k, acc, part, None if block_scales is None else block_scales(row0, col0 + j * width, t),
                             None if blocks == 1 else (j * width, width))
        if element is not None:  # computed on the fragment in registers, then stored as the product is
            k.fragment_map(acc, element, origin=(row0, col0))
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
