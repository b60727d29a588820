"""out = log(1 + exp(x)) over an [M, N] tensor, one block a row, the row's tiles circular-buffered."""
import numpy as np

from cbrules.ir.builder import Kernel, blockIdx, ceil_div, circular_buffer, threadIdx

W = 256                   # a tile: 256 columns, one per thread
OUTPUTS = ("out",)        # what check and run compare with reference()
SHAPE = (512, 4096)       # the default problem


def build(stages=3, prefetch=None, war=None):
    k = Kernel("softplus_rows", block=W)
    m, n = k.symbol("M"), k.symbol("N")                 # extents known at launch
    x, out = k.tensor("x", (m, n)), k.tensor("out", (m, n))
    x_map = k.tensor_map(x, box=(1, W))                 # a TMA descriptor: boxes of 1 x 256
    tile = k.alloc("tile", "shared", "float32", (1, W))
    k.grid(m)
    cb = circular_buffer(stages=stages, prefetch=prefetch, war=war)
    with k.loop("j", ceil_div(n, W), circular_buffer=cb) as j:
        k.tma_load(x_map, (blockIdx.x, j * W), tile)    # no barriers: the rules write them
        col = j * W + threadIdx.x
        with k.if_(col.lt(n)):
            v = k.load(tile, threadIdx.x)
            k.store(out, blockIdx.x * n + col, k.log(k.add(k.exp(v), 1.0)))
    return k


def inputs(shape, rng):
    return {"x": rng.standard_normal(shape, dtype=np.float32), "out": np.full(shape, np.nan, np.float32)}


def reference(args):
    return {"out": np.log1p(np.exp(args["x"].astype(np.float64)))}


def shape_for_trips(trips):    # a small problem whose loop runs `trips` times (for check)
    return (3, W * trips - 64)
