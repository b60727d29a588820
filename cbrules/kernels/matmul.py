"""Tiled matmul ``C = A @ B`` with both operands TMA-loaded; the K loop is circular-buffered.

A block computes a 64 x 64 tile of C with 256 threads, each a 4 x 4 patch in registers; every
K step brings a 64 x 16 tile of A and a 16 x 64 tile of B.
"""
from __future__ import annotations

from ..builder import Kernel, blockIdx, ceil_div, circular_buffer, threadIdx

BM, BN, BK, PATCH = 64, 64, 16, 4


def matmul(stages: int = 3, prefetch=None, war: str = "sync") -> Kernel:
    """``c[M, N] = a[M, K] @ b[K, N]``."""
    k = Kernel("matmul", block=256)
    m, n, kk = k.symbol("M"), k.symbol("N"), k.symbol("K")
    a, b, c = k.tensor("a", (m, kk)), k.tensor("b", (kk, n)), k.tensor("c", (m, n))
    a_map, b_map = k.tensor_map(a, box=(BM, BK)), k.tensor_map(b, box=(BK, BN))
    a_tile = k.alloc("a_tile", "shared", "float32", (BM, BK))
    b_tile = k.alloc("b_tile", "shared", "float32", (BK, BN))
    k.grid(ceil_div(n, BN), ceil_div(m, BM))
    ty, tx = threadIdx.x / (BN // PATCH), threadIdx.x % (BN // PATCH)
    row0, col0 = blockIdx.y * BM + ty * PATCH, blockIdx.x * BN + tx * PATCH
    acc = [[k.assign(0.0, dst=f"acc{r}{q}") for q in range(PATCH)] for r in range(PATCH)]
    with k.loop("t", ceil_div(kk, BK), circular_buffer=circular_buffer(stages, prefetch, war)) as t:
        k.tma_load(a_map, (blockIdx.y * BM, t * BK), a_tile)  # out of range: zeros, adding nothing
        k.tma_load(b_map, (t * BK, blockIdx.x * BN), b_tile)
        with k.loop("e", BK, kind="unroll") as e:
            av = [k.load(a_tile, (ty * PATCH + r) * BK + e, dst=f"a{r}") for r in range(PATCH)]
            bv = [k.load(b_tile, e * BN + tx * PATCH + q, dst=f"b{q}") for q in range(PATCH)]
            for r in range(PATCH):
                for q in range(PATCH):
                    k.fma(av[r], bv[q], acc[r][q], dst=f"acc{r}{q}")
    for r in range(PATCH):
        for q in range(PATCH):
            with k.if_((row0 + r).lt(m).and_((col0 + q).lt(n))):
                k.store(c, (row0 + r) * n + col0 + q, acc[r][q])
    return k
