"""RMSNorm of each row, out[m, :] = x[m, :] / sqrt(mean(x[m, :] ** 2) + eps): a complete kernel file.

    cbrules check examples/rms_norm.py --stages 4          # CPU: trip counts 0..16, protocol checked
    cbrules run examples/rms_norm.py --shape 512,1000       # H200: vs numpy, GB/s
    cbrules compile examples/rms_norm.py --war mbarrier --dtype bfloat16

Two circular-buffered passes over the row (sum of squares, then scale and store) through one
staged tile; eps is a float launch parameter (k.scalar), passed by inputs() like a tensor.
"""
import numpy as np

from cbrules.ir.builder import Kernel, blockIdx, ceil_div, circular_buffer, threadIdx

WIDTH = 256  # columns a tile (one box), one per thread
SHAPE = (512, 4096)  # the default problem (`--shape` changes it for run; build() does not need it)
OUTPUTS = ("out",)
TOLERANCE = (1e-4, 1e-5)  # (rtol, atol) against reference()


def build(stages=3, prefetch=None, war=None, warp_specialize=False, dtype="float32"):
    """The kernel; the command line passes --stages, --prefetch, --war, --warp-specialize and --dtype."""
    k = Kernel("rms_norm", block=WIDTH)
    m, n = k.symbol("M"), k.symbol("N")
    eps = k.scalar("eps", "float32")
    x, out = k.tensor("x", (m, n), dtype), k.tensor("out", (m, n), dtype)
    x_map = k.tensor_map(x, box=(1, WIDTH))
    tile = k.alloc("tile", "shared", dtype, (1, WIDTH))
    k.grid(m)
    cb = circular_buffer(stages, prefetch, war, warp_specialize)
    k.assign(0.0, dst="squares")
    with k.loop("j", ceil_div(n, WIDTH), circular_buffer=cb) as j:
        k.tma_load(x_map, (blockIdx.x, j * WIDTH), tile)  # columns past N arrive as zeros: they add nothing
        v = k.load(tile, threadIdx.x)
        k.fma(v, v, "squares", dst="squares")
    total = k.reduce("squares", kind="block")
    scale = k.rsqrt(k.add(k.div(total, n), eps))
    with k.loop("j", ceil_div(n, WIDTH), circular_buffer=cb) as j:
        k.tma_load(x_map, (blockIdx.x, j * WIDTH), tile)
        col = j * WIDTH + threadIdx.x
        with k.if_(col.lt(n)):
            k.store(out, blockIdx.x * n + col, k.mul(k.load(tile, threadIdx.x), scale))
    return k


def inputs(shape, rng):
    """The arguments of one launch for ``shape`` (M, N): tensors, and the scalar eps."""
    rows, cols = shape
    return {"x": rng.standard_normal((rows, cols), dtype=np.float32), "out": np.full((rows, cols), np.nan, np.float32),
            "eps": 1e-5}


def reference(args):
    """numpy's answer (float64)."""
    x = args["x"].astype(np.float64)
    return {"out": x / np.sqrt((x * x).mean(axis=1, keepdims=True) + args["eps"])}


def shape_for_trips(trips):
    """A small problem whose loops run ``trips`` times (for `cbrules check`): a ragged last tile."""
    return (3, WIDTH * trips - 120)
