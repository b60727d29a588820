"""The hand-built 1-D ``exp`` kernel: one TMA tile per iteration under one mbarrier, no rules.

Each block walks ``tiles_per_block`` consecutive 256-element tiles. The elected thread arms the
barrier with the tile's byte count and issues the TMA load; every thread waits on the barrier's
phase parity ``i % 2``, computes ``exp`` and stores; a block sync protects the tile before reuse.
"""
from __future__ import annotations

from ..ir.builder import Kernel, blockIdx, ceil_div, threadIdx
from ..ir.terms import call

TILE = 256


def exp1d_tma(tiles_per_block: int = 8) -> Kernel:
    """``out = exp(x)`` over a 1-D float32 tensor of symbolic length N."""
    k = Kernel("exp1d_tma", block=TILE)
    n = k.symbol("N")
    x = k.tensor("x", (n,))
    out = k.tensor("out", (n,))
    x_map = k.tensor_map(x, box=(TILE,))
    n_tiles = ceil_div(n, TILE)
    k.grid(ceil_div(n_tiles, tiles_per_block))

    tile = k.alloc("tile", "shared", "float32", (TILE,))
    full = k.alloc("full", "shared", "mbarrier", (1,))
    with k.elect_one():
        k.mbarrier_init(full, 0, count=1)
        k.fence_proxy_async()  # the TMA unit (async proxy) sees the init
    k.syncthreads()
    first = blockIdx.x * tiles_per_block
    with k.loop("i", call("min", tiles_per_block, n_tiles - first)) as i:
        base = (first + i) * TILE
        with k.elect_one():
            k.fence_proxy_async()  # the last iteration's plain reads of the tile come before the TMA refill
            k.mbarrier_arrive_expect_tx(full, 0, x_map.box_bytes)
            k.tma_load(x_map, (base,), tile, full, slot=0)
        k.mbarrier_wait(full, 0, parity=i % 2)
        v = k.load(tile, threadIdx.x)
        y = k.exp(v)
        with k.if_((base + threadIdx.x).lt(n)):
            k.store(out, base + threadIdx.x, y)
        k.syncthreads()  # every thread is done with the tile before the next load overwrites it
    with k.elect_one():
        k.mbarrier_inval(full, 0)
    return k
