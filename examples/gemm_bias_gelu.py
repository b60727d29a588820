"""out = gelu(a @ w^T + bias), exact (erf) GELU, bfloat16 in and out: a tensor-core kernel file whose epilogue
computes on the accumulator fragment in registers (docs/fragments.md).

    cbrules check examples/gemm_bias_gelu.py --stages 3      # CPU: trip counts 0..12, protocol checked
    cbrules run examples/gemm_bias_gelu.py --shape 4096,4096,4096 --warp-specialize --registers 40,232
    cbrules compile examples/gemm_bias_gelu.py --stages 4 --warp-specialize --registers 40,232

a [M, K] and w [N, K] (a linear layer's weight, K-major as the tensor cores read it) arrive by swizzled
TMA loads into a circular-buffered K loop of wgmma; then every accumulator element gets its column's
bias and the GELU, in float32, and the tile leaves through the TMA-staged store, rounded once to bf16.
"""
import math

import ml_dtypes
import numpy as np

from cbrules.ir.builder import Kernel, blockIdx, ceil_div, circular_buffer

BM, BN, BK = 128, 128, 64  # a 128 x 128 tile of out on two consumer warp groups, 64 of K a stage
SHAPE = (1024, 1024, 1024)  # (M, N, K), the default problem of `run`
OUTPUTS = ("out",)
TOLERANCE = (1e-2, 1e-2)  # bfloat16 output: the final rounding is 2**-9 relative


def gelu(k: Kernel, x):
    """0.5 x (1 + erf(x / sqrt 2)) of a float32 register, built of the kernel's ops."""
    return k.mul(k.mul(x, 0.5), k.add(k.erf(k.mul(x, 1 / math.sqrt(2.0))), 1.0))


def build(stages=3, prefetch=None, war=None, warp_specialize=False, registers=None):
    """The kernel; the command line passes --stages, --prefetch, --war, --warp-specialize and --registers."""
    k = Kernel("gemm_bias_gelu", block=256)
    m, n, kk = k.symbol("M"), k.symbol("N"), k.symbol("K")
    a, w = k.tensor("a", (m, kk), "bfloat16"), k.tensor("w", (n, kk), "bfloat16")
    bias, out = k.tensor("bias", (n,), "float32"), k.tensor("out", (m, n), "bfloat16")
    a_map = k.tensor_map(a, box=(BM, BK), swizzle="128B")
    w_map = k.tensor_map(w, box=(BN, BK), swizzle="128B")
    out_map = k.tensor_map(out, box=(BM, 64), swizzle="128B")  # the store: 128-byte rows, two column chunks
    a_tile = k.alloc("a_tile", "shared", "bfloat16", (BM, BK), align=1024)
    w_tile = k.alloc("w_tile", "shared", "bfloat16", (BN, BK), align=1024)
    tiles_n = ceil_div(n, BN)
    k.grid(ceil_div(m, BM) * tiles_n)
    row0, col0 = (blockIdx.x / tiles_n) * BM, (blockIdx.x % tiles_n) * BN
    acc = k.mma_accumulator(BM, BN)
    with k.loop("t", ceil_div(kk, BK), circular_buffer=circular_buffer(stages, prefetch, war, warp_specialize,
                                                                      registers)) as t:
        k.tma_load(a_map, (row0, t * BK), a_tile)  # past K: zeros on both sides, adding nothing
        k.tma_load(w_map, (col0, t * BK), w_tile)
        k.mma(acc, a_tile, w_tile)
    # the epilogue: each element's column picks its bias (clamped at a ragged N: such elements are
    # outside out, and the TMA store clips them)
    k.fragment_map(acc, lambda e: gelu(k, k.add(e.value, e.load_col(bias))), origin=(row0, col0))
    k.mma_store(acc, out_map, (row0, col0))
    return k


def inputs(shape, rng):
    """The arguments of one launch for ``shape`` (M, N, K)."""
    m, n, kk = shape
    bf16 = ml_dtypes.bfloat16
    return {"a": rng.standard_normal((m, kk), dtype=np.float32).astype(bf16),
            "w": (rng.standard_normal((n, kk), dtype=np.float32) / np.sqrt(kk)).astype(bf16),
            "bias": rng.standard_normal(n, dtype=np.float32), "out": np.full((m, n), np.nan, bf16)}


def reference(args):
    """numpy's answer (float64)."""
    x = args["a"].astype(np.float64) @ args["w"].astype(np.float64).T + args["bias"].astype(np.float64)
    erf = np.frompyfunc(math.erf, 1, 1)
    return {"out": 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)).astype(np.float64))}


def shape_for_trips(trips):
    """A small ragged problem whose K loop runs ``trips`` times (for `cbrules check`)."""
    return (150, 136, BK * trips - 8)
