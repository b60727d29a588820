"""Tiled matmul ``C = A @ B`` with both operands TMA-loaded; the K loop is circular-buffered.

By default a block computes a 64 x 64 tile of C with 256 threads, each a 4 x 4 patch in
registers; every K step brings a 64 x 16 tile of A and a 16 x 64 tile of B. Larger tiles and
patches (128 x 128 with 8 x 8, for example) do more multiply-adds per shared-memory load.
"""
from __future__ import annotations

from typing import Optional

from ..ir.builder import Kernel, blockIdx, ceil_div, circular_buffer, threadIdx

BM, BN, BK, PATCH = 64, 64, 16, 4


def matmul(stages: int = 3, prefetch=None, war: Optional[str] = None, tile: int = BM, patch: int = PATCH,
           bk: int = BK, spread: bool = False, dtype: str = "float32", warp_specialize: bool = False,
           registers=None) -> Kernel:
    """``c[M, N] = a[M, K] @ b[K, N]`` in ``tile`` x ``tile`` blocks, ``patch`` x ``patch`` a thread,
    ``bk`` columns of A a K step. ``spread``: a thread's patch columns lie ``tile / patch`` apart
    instead of side by side, so the 16 column groups of a warp read 16 different shared-memory banks."""
    side = tile // patch  # threads along each side of the block tile
    if tile % patch or side * side > 1024:
        raise ValueError(f"matmul: tile {tile} must be a multiple of patch {patch}, with (tile/patch)^2 <= 1024 threads")
    k = Kernel("matmul", block=side * side)
    m, n, kk = k.symbol("M"), k.symbol("N"), k.symbol("K")
    a, b, c = k.tensor("a", (m, kk), dtype), k.tensor("b", (kk, n), dtype), k.tensor("c", (m, n), dtype)
    a_map, b_map = k.tensor_map(a, box=(tile, bk)), k.tensor_map(b, box=(bk, tile))
    a_tile = k.alloc("a_tile", "shared", dtype, (tile, bk))
    b_tile = k.alloc("b_tile", "shared", dtype, (bk, tile))
    k.grid(ceil_div(n, tile), ceil_div(m, tile))
    ty, tx = threadIdx.x / side, threadIdx.x % side
    row0 = blockIdx.y * tile + ty * patch

    def col(q):  # the q-th column of this thread's patch, within the block tile
        return tx + q * side if spread else tx * patch + q

    acc = [[k.assign(0.0, dst=f"acc{r}{q}") for q in range(patch)] for r in range(patch)]
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    with k.loop("t", ceil_div(kk, bk), circular_buffer=cb) as t:
        k.tma_load(a_map, (blockIdx.y * tile, t * bk), a_tile)  # out of range: zeros, adding nothing
        k.tma_load(b_map, (t * bk, blockIdx.x * tile), b_tile)
        with k.loop("e", bk, kind="unroll") as e:
            av = [k.load(a_tile, (ty * patch + r) * bk + e, dst=f"a{r}") for r in range(patch)]
            bv = [k.load(b_tile, e * tile + col(q), dst=f"b{q}") for q in range(patch)]
            for r in range(patch):
                for q in range(patch):
                    k.fma(av[r], bv[q], acc[r][q], dst=f"acc{r}{q}")
    for r in range(patch):
        for q in range(patch):
            cq = blockIdx.x * tile + col(q)
            with k.if_((row0 + r).lt(m).and_(cq.lt(n))):
                k.store(c, (row0 + r) * n + cq, acc[r][q])
    return k
