"""Built-in kernels (the seed's test matrix, and the hand-built TMA demo).

:data:`CATALOG` names each with one line and loads nothing else, so listing kernels is fast; the
specifications (builders, inputs, numpy references, tolerances, trip counts) live in
:mod:`cbrules.kernels.specs`, which ``from cbrules.kernels import KERNELS, get, ...`` loads on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

CATALOG: dict[str, str] = {
    "exp1d_tma": "out = exp(x), 1-D, one TMA tile per iteration under one mbarrier (hand-built, no pipelining)",
    "single_dim": "out = exp(x), 1-D, tile 256, 256 threads; the serial loop over tiles is circular-buffered",
    "single_dim_unroll": "single_dim with the tile loop split by 4, inner part unrolled (4 TMA boxes per stage)",
    "single_dim_unswitch": "single_dim_unroll with the store predicate hoisted out of the inner loop",
    "multi_dim": "out = exp(x), 2-D [M,N], box 4x256, blocks over M; the loop over N-tiles is circular-buffered",
    "pointwise": "out = x + y, both [M,N] loaded by TMA (two buffers, one barrier per stage)",
    "inner_reduction": "out = sum(x, axis=1); the loop over N-tiles is circular-buffered",
    "outer_reduction": "out = sum(x, axis=0); the serial loop over M (8 rows a tile) is circular-buffered",
    "persistent": "out = (x - mean) / sqrt(var) per row, row kept in registers, two TMA boxes per stage; the loop "
                  "over N-tiles is circular-buffered",
    "two_pass": "out = (x - mean) / sqrt(var) per row for rows too long to keep on chip: two circular-buffered loops "
                "over the row (statistics, then the normalised row) sharing one buffer",
    "matmul": "c = a @ b, a [M,K], b [K,N] (K = N), 64x64 tiles, both operands TMA-loaded; the K loop is "
              "circular-buffered",
    "matmul_tc": "c = a @ b^T on the tensor cores (wgmma), a [M,K], b [N,K] bfloat16/float16, float32 accumulation; "
                 "128x256 tiles on two consumer warp groups, the K loop circular-buffered with swizzled TMA tiles",
    "attention": "FlashAttention forward o = softmax(scale q k^T) v, q/k/v [BH, L, D] bfloat16/float16 or FP8 "
                 "(V^T [BH, D, L], scales) (D 64, 128 or 256, --causal, --lse): Q loaded once, the key-tile loop "
                 "circular-buffered, softmax on the score fragment in registers, P as the register A of P @ V",
    "rms_norm": "out = x * rsqrt(mean(x^2) + eps) * weight per row of [M, D], the row in registers (16-byte vector "
                "loads, one block a row; no TMA)",
    "layer_norm": "out = (x - mean) * rsqrt(var + eps) * weight + bias per row of [M, D], the row in registers",
    "softmax": "out = exp(x - max) / sum(exp(x - max)) per row of [M, D], the row in registers",
}


def __getattr__(name: str) -> Any:
    # everything but the catalog comes from the specifications, loaded on first use (numpy, the builder)
    if name.startswith("__"):
        raise AttributeError(name)
    specs = importlib.import_module(".specs", __name__)
    try:
        return getattr(specs, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
