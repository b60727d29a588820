"""Row-wise operations of a transformer on ``[M, D]`` tensors: RMSNorm, LayerNorm and softmax, each row
kept in registers.

A block of ``threads`` owns one row (``D`` fixed when the kernel is built: a model's hidden size). Each
thread loads its ``D / threads`` elements straight from global memory, ``vec`` side by side in one
16-byte access (the vectorize rules; 4 float32, 8 bfloat16 or float16), reduces them serially, the block
combines the partials (``reduce(kind="block")``), and the thread writes its elements back the same way.
The row is read from memory once: statistics and output come from the registers. Arithmetic is float32,
the output is rounded once to the input's type, as torch's fused kernels do. No TMA and no circular
buffer: a row is one wave of vector loads, and the next row's block runs beside it.

* ``rms_norm``: ``out = x * rsqrt(mean(x^2) + eps) * weight`` (``torch.nn.functional.rms_norm``);
* ``layer_norm``: ``out = (x - mean) * rsqrt(var + eps) * weight + bias``, var the biased variance
  about the mean taken first (two passes over the registers: nothing cancels);
* ``softmax``: ``out = exp(x - max) / sum(exp(x - max))`` along the row.

:func:`swiglu` is the elementwise step of a SwiGLU MLP between its two GEMMs (``silu(gate) * up`` of a
row's two halves), in the same 16-byte vectors.
"""
from __future__ import annotations

from typing import Optional

from ..errors import CbrulesError
from ..ir.builder import Kernel, blockIdx, threadIdx
from ..ir.ops import DTYPE_BYTES, HALF_DTYPES
from ..ir.terms import name

OPS = ("rms_norm", "layer_norm", "softmax")
DTYPES = ("float32",) + HALF_DTYPES
MAX_PER_THREAD = 64  # row elements a thread keeps in registers
NEG_INF = float("-inf")


class RowError(CbrulesError, ValueError):
    """A row operation asked for with parameters it is not built for."""


def row_threads(row: int, dtype: str) -> int:
    """Threads a block for a row of ``row`` elements: one 16-byte vector a thread where that makes whole
    warps up to 1024 threads, else more vectors a thread (up to :data:`MAX_PER_THREAD` elements); 0 when
    no such split exists."""
    vec = 16 // DTYPE_BYTES[dtype]
    for per in range(vec, MAX_PER_THREAD + 1, vec):
        if row % per == 0 and (row // per) % 32 == 0 and row // per <= 1024:
            return row // per
    return 0


def row_op(op: str = "rms_norm", row: int = 4096, dtype: str = "float32", eps: float = 1e-6,
           threads: Optional[int] = None) -> Kernel:
    """The row operation ``op`` (:data:`OPS`) over ``x [M, row]`` into ``out [M, row]``; RMSNorm takes
    ``weight [row]``, LayerNorm ``weight`` and ``bias [row]`` (all of ``dtype``), both add ``eps`` to the
    mean square or the variance. ``threads`` defaults to :func:`row_threads`. See the module doc."""
    if op not in OPS:
        raise RowError(f"row_op: op={op!r}: one of {', '.join(OPS)}")
    if dtype not in DTYPES:
        raise RowError(f"row_op: dtype {dtype!r}: one of {', '.join(DTYPES)}")
    if not isinstance(row, int) or isinstance(row, bool) or row < 1:
        raise RowError(f"row_op: row={row!r}: give the row length, a positive integer")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 <= eps < float("inf"):
        raise RowError(f"row_op: eps={eps!r}: give a finite non-negative number")
    vec = 16 // DTYPE_BYTES[dtype]
    threads = row_threads(row, dtype) if threads is None else threads
    if not threads or not isinstance(threads, int) or threads % 32 or not 32 <= threads <= 1024 \
            or row % (threads * vec) or row // threads > MAX_PER_THREAD:
        raise RowError(f"row_op: a row of {row} {dtype} elements over {threads or 'any count of'} threads: each "
                       f"thread takes whole {vec}-element vectors (16 bytes), at most {MAX_PER_THREAD} elements, "
                       "from whole warps of at most 1024 threads; give a row that is a multiple of "
                       f"{32 * vec} up to {1024 * MAX_PER_THREAD}")
    per = row // threads
    k = Kernel(op, block=threads)
    m = k.symbol("M")
    x, out = k.tensor("x", (m, row), dtype), k.tensor("out", (m, row), dtype)
    weight = k.tensor("weight", (row,), dtype) if op != "softmax" else None
    bias = k.tensor("bias", (row,), dtype) if op == "layer_norm" else None
    vals = k.alloc("vals", "register", "float32", (per,))
    k.grid(m)
    base = blockIdx.x * row

    def col(g, u):  # element g * vec + u of a thread: vector g of the row's every `threads`
        return (g * threads + threadIdx.x) * vec + u

    first = {"rms_norm": (0.0, "sum"), "layer_norm": (0.0, "sum"), "softmax": (NEG_INF, "max")}[op]
    k.assign(first[0], dst="part")
    with k.loop("g", per // vec, kind="unroll") as g, k.loop("u", vec, kind="vectorize") as u:
        v = k.load(x, base + col(g, u))
        k.store(vals, g * vec + u, v)
        k.reduce(k.mul(v, v) if op == "rms_norm" else v, kind="serial", combine=first[1], dst="part")
    whole = k.reduce("part", kind="block", combine=first[1])
    if op == "rms_norm":
        scale = k.rsqrt(k.add(k.div(whole, float(row)), float(eps)))
        shift = None
    elif op == "layer_norm":
        shift = k.div(whole, float(row))
        k.assign(0.0, dst="sq")
        with k.loop("q", per, kind="unroll") as q:
            d = k.sub(k.load(vals, q), shift)
            k.reduce(k.mul(d, d), kind="serial", dst="sq")
        scale = k.rsqrt(k.add(k.div(k.reduce("sq", kind="block"), float(row)), float(eps)))
    else:  # softmax: the exponentials in place, then their sum
        k.assign(0.0, dst="sq")
        with k.loop("q", per, kind="unroll") as q:
            e = k.exp(k.sub(k.load(vals, q), whole))
            k.store(vals, q, e)
            k.reduce(e, kind="serial", dst="sq")
        scale, shift = k.div(1.0, k.reduce("sq", kind="block")), None
    with k.loop("g2", per // vec, kind="unroll") as g, k.loop("u", vec, kind="vectorize") as u:
        v = k.load(vals, g * vec + u)
        y = k.mul(k.sub(v, shift) if shift is not None else v, scale)
        if weight is not None:
            y = k.mul(y, k.load(weight, col(g, u)))
        if bias is not None:
            y = k.add(y, k.load(bias, col(g, u)))
        k.store(out, base + col(g, u), y)
    return k


SWIGLU_THREADS = 256


def swiglu(hidden: int = 11008, dtype: str = "float32") -> Kernel:
    """``out[t, f] = silu(ab[t, f]) * ab[t, hidden + f]`` for ``ab [M, 2 * hidden]`` (the gate and up
    projections of a SwiGLU MLP side by side, one GEMM's output) into ``out [M, hidden]``: float32
    arithmetic, ``silu(a) = a / (1 + exp(-a))``. A block of 256 threads takes 256 16-byte vectors of one
    row (blocks over the row's vectors and over the rows); ``hidden`` a multiple of the vector."""
    if dtype not in DTYPES:
        raise RowError(f"swiglu: dtype {dtype!r}: one of {', '.join(DTYPES)}")
    vec = 16 // DTYPE_BYTES[dtype]
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1 or hidden % vec:
        raise RowError(f"swiglu: hidden={hidden!r}: a positive multiple of {vec} ({dtype} elements a 16-byte "
                       "vector)")
    k = Kernel("swiglu", block=SWIGLU_THREADS)
    m = k.symbol("M")
    ab, out = k.tensor("ab", (m, 2 * hidden), dtype), k.tensor("out", (m, hidden), dtype)
    vectors = hidden // vec
    k.grid((vectors + SWIGLU_THREADS - 1) // SWIGLU_THREADS, m)
    v = blockIdx.x * SWIGLU_THREADS + threadIdx.x  # the thread's vector of the row
    t = name("blockIdx.y")  # the row
    with k.if_(v.lt(vectors)):
        with k.loop("u", vec, kind="vectorize") as u:
            a = k.load(ab, t * (2 * hidden) + v * vec + u)
            b = k.load(ab, t * (2 * hidden) + hidden + v * vec + u)
            k.store(out, t * hidden + v * vec + u, k.mul(k.div(a, k.add(k.exp(k.neg(a)), 1.0)), b))
    return k
