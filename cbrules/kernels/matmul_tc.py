"""Tensor-core matmul ``c[M, N] = a[M, K] @ b[N, K]^T`` (bfloat16/float16 in, float32 accumulate).

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
"""
from __future__ import annotations

from typing import Optional

from ..errors import CbrulesError
from ..ir.builder import Kernel, blockIdx, ceil_div, circular_buffer
from ..ir.builder_mma import MMA_DTYPES
from ..ir.limits import MAX_SHARED_BYTES
from ..ir.mma_layout import MmaLayoutError, mn_major_span
from ..ir.ops import DTYPE_BYTES
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
_SWIZZLE = {32: "32B", 64: "64B", 128: "128B"}


class MatmulTileError(CbrulesError, ValueError):
    """matmul_tc asked for a tile, dtype or stage count that cannot work on the tensor cores."""


def store_cols(bn: int, out_dtype: str) -> int:
    """Columns of C a TMA store writes: 128-byte rows (64 half or 32 float32 columns), or all bn if fewer."""
    return min(bn, 128 // DTYPE_BYTES[out_dtype])


def shared_bytes(stages: int, bm: int, bn: int, bk: int, dtype: str, out_dtype: str) -> int:
    """Shared memory of one block: the stage slots of A and B and the staging of C (two slots of
    bm x store_cols when there are several column chunks, one otherwise)."""
    cols = store_cols(bn, out_dtype)
    return stages * (bm + bn) * bk * DTYPE_BYTES[dtype] + (1 if cols == bn else 2) * bm * cols * DTYPE_BYTES[out_dtype]


def _b_span(bn) -> int:
    """The swizzle span of an MN-major B tile's panels (:func:`cbrules.ir.mma_layout.mn_major_span`)."""
    try:
        return mn_major_span(bn)
    except MmaLayoutError as e:
        raise MatmulTileError(f"matmul_tc: b_layout='kn' with bn={bn!r}: {e}") from None


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


def _epilogue(k: Kernel, epilogue: str, m: Term, n: Term, out_dtype: str):
    """The epilogue's parameters declared, and its element function (None for none)."""
    adds, act = EPILOGUES[epilogue]
    if not adds and act is None:
        return None
    bias = k.tensor("bias", (n,), out_dtype) if "bias" in adds else None
    residual = k.tensor("residual", (m, n), out_dtype) if "residual" in adds else None
    if "alpha_beta" in adds:
        alpha, beta = k.scalar("alpha"), k.scalar("beta")
        c_in = k.tensor("c_in", (m, n), out_dtype)

    def element(e) -> Term:
        x = e.value
        if bias is not None:
            x = k.add(x, e.load_col(bias))
        if residual is not None:
            x = k.add(x, e.load_tile(residual))
        if "alpha_beta" in adds:
            x = k.fma(alpha, x, k.mul(beta, e.load_tile(c_in)))
        return _activation(k, act, x)
    return element


def matmul_tc(stages: int = 4, prefetch=None, war: Optional[str] = None, warp_specialize: bool = False,
              registers=None, dtype: str = "bfloat16", out_dtype: Optional[str] = None, bm: int = BM, bn: int = BN,
              bk: int = BK, groups: int = GROUPS, group_m: int = GROUP_M, persistent: int = 0,
              store_swizzle: Optional[bool] = None, b_layout: str = "nk", epilogue: str = "none") -> Kernel:
    """``c = a @ b^T`` in ``bm`` x ``bn`` tiles on ``groups`` consumer warp groups, ``bk`` of K a stage;
    ``out_dtype`` (bfloat16, float16, float32; default ``dtype``) is c's type. Blocks take tiles in groups
    of ``group_m`` tile rows, column by column inside a group, so the blocks running at once share
    their A and B panels in L2 (``group_m=1``: row by row). ``persistent=P`` launches at most P blocks
    (e.g. the SM count) that each walk tiles blockIdx.x, blockIdx.x + P, ...; warp-specialized, the
    producer loads the next tile while the consumers store the last (otherwise each tile's K loop is
    pipelined on its own). ``store_swizzle=True`` stages C in the swizzle of its output box's rows (the
    TMA store's map swizzles), so the epilogue's shared writes go without bank conflicts (measured on
    the H200: +2 to +6 % against dense staging); ``None`` (the default) does so wherever a box row spans
    32, 64 or 128 bytes, ``False`` stages dense. ``b_layout="kn"`` takes b as ``[K, N]`` row-major and
    computes ``c = a @ b`` (no transpose): the B tile [bk, bn] arrives as bn / W panels [bk, W] (W = 64
    columns, 128-byte swizzle, where W divides bn), one TMA box each, read MN-major by the tensor cores.

    ``epilogue`` (:data:`EPILOGUES`) maps each accumulator element before the store: ``bias`` adds
    ``bias[col]`` (a tensor [N] of ``out_dtype``), ``bias_relu`` / ``bias_gelu`` (exact, erf) /
    ``bias_gelu_tanh`` / ``bias_silu`` then apply the activation, ``residual`` adds ``residual[row, col]``
    ([M, N]), ``alpha_beta`` computes ``alpha * acc + beta * c_in[row, col]`` (float32 scalars alpha and
    beta, ``c_in`` [M, N]); all in float32, rounded once at the store."""
    out_dtype = dtype if out_dtype is None else out_dtype
    if epilogue not in EPILOGUES:
        raise MatmulTileError(f"matmul_tc: epilogue={epilogue!r}: give one of {', '.join(EPILOGUES)}")
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
    if not isinstance(persistent, int) or isinstance(persistent, bool) or persistent < 0:
        raise MatmulTileError(f"matmul_tc: persistent={persistent!r}: give the number of blocks (0: one a tile)")
    if store_swizzle is not None and not isinstance(store_swizzle, bool):
        raise MatmulTileError(f"matmul_tc: store_swizzle={store_swizzle!r}: give True, False or None (where the box allows)")
    if b_layout not in ("nk", "kn"):
        raise MatmulTileError(f"matmul_tc: b_layout={b_layout!r}: give 'nk' (b is [N, K]: c = a @ b^T) or 'kn' "
                              "(b is [K, N]: c = a @ b)")
    if not isinstance(group_m, int) or isinstance(group_m, bool) or group_m < 1:
        raise MatmulTileError(f"matmul_tc: group_m={group_m!r}: give the tile rows of a raster group, 1 or more")
    k = Kernel("matmul_tc", block=128 * groups)
    m, n, kk = k.symbol("M"), k.symbol("N"), k.symbol("K")
    a = k.tensor("a", (m, kk), dtype)
    b = k.tensor("b", (n, kk) if b_layout == "nk" else (kk, n), dtype)
    c = k.tensor("c", (m, n), out_dtype)
    element = _epilogue(k, epilogue, m, n, out_dtype)
    a_map = k.tensor_map(a, box=(bm, bk), swizzle=_SWIZZLE[row])
    if b_layout == "nk":
        b_map = k.tensor_map(b, box=(bn, bk), swizzle=_SWIZZLE[row])
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
    b_tile = k.alloc("b_tile", "shared", dtype, (bn, bk) if b_layout == "nk" else (bk, bn), align=1024)
    tiles_m, tiles_n = ceil_div(m, bm), ceil_div(n, bn)
    acc = k.mma_accumulator(bm, bn, groups=groups)
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)

    def tile_step(tile):
        tile_m, tile_n = _grouped_order(tile, tiles_m, tiles_n, group_m)
        row0, col0 = tile_m * bm, tile_n * bn
        with k.loop("t", ceil_div(kk, bk), circular_buffer=cb) as t:
            k.tma_load(a_map, (row0, t * bk), a_tile)  # past K: zeros on both sides, adding nothing
            if b_layout == "nk":
                k.tma_load(b_map, (col0, t * bk), b_tile)
            else:
                for p in range(bn // w):
                    k.tma_load(b_map, (t * bk, col0 + p * w), b_tile, offset=p * bk * w)
            k.mma(acc, a_tile, b_tile, **({} if b_layout == "nk" else {"b_layout": "kn"}))
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
