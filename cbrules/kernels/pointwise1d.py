"""1-D pointwise kernels of the seed matrix: ``out = exp(x)`` in tiles of 256 elements.

Each block walks ``tiles_per_block`` consecutive tiles in a serial loop, which the rules
circular-buffer. The trip count is a constant, so blocks past the end of the tensor load boxes
that TMA fills with zeros and store nothing (the store is predicated).
"""
from __future__ import annotations

from typing import Optional

from ..ir.builder import Kernel, blockIdx, ceil_div, circular_buffer, threadIdx

TILE = 256


def single_dim(stages: int = 3, prefetch=None, war: Optional[str] = None, tiles_per_block: int = 8,
               dtype: str = "float32", tma_store: bool = False, warp_specialize: bool = False,
               registers=None) -> Kernel:
    """``out = exp(x)``; the serial loop over tiles is circular-buffered. ``tma_store``: each tile of
    ``out`` is written by one TMA store (rules/tma_store.rules) instead of a store per thread."""
    k = Kernel("single_dim", block=TILE)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,), dtype), k.tensor("out", (n,), dtype)
    x_map = k.tensor_map(x, box=(TILE,))
    out_map = k.tensor_map(out, box=(TILE,)) if tma_store else None
    k.grid(ceil_div(ceil_div(n, TILE), tiles_per_block))
    tile = k.alloc("tile", "shared", dtype, (TILE,))
    first = blockIdx.x * tiles_per_block
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    with k.loop("i", tiles_per_block, circular_buffer=cb) as i:
        base = (first + i) * TILE
        k.tma_load(x_map, (base,), tile)
        y = k.exp(k.load(tile, threadIdx.x))
        with k.if_((base + threadIdx.x).lt(n)):
            k.store(out, base + threadIdx.x, y, tile=(out_map, (base,), threadIdx.x) if tma_store else None)
    return k


def _staged(name: str, tiles_per_block: int, unroll: int, dtype: str):
    """The common part of the unrolled kernels (a stage holds ``unroll`` tiles): the kernel, N, the
    output, the tensor map, the tile buffer and the block's first tile."""
    if tiles_per_block % unroll:
        raise ValueError(f"{name}: tiles_per_block={tiles_per_block} must be a multiple of unroll={unroll} "
                         "(a stage holds unroll tiles; a remainder would never be loaded)")
    k = Kernel(name, block=TILE)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,), dtype), k.tensor("out", (n,), dtype)
    x_map = k.tensor_map(x, box=(TILE,))
    k.grid(ceil_div(ceil_div(n, TILE), tiles_per_block))
    tile = k.alloc("tile", "shared", dtype, (unroll, TILE))
    return k, n, out, x_map, tile, blockIdx.x * tiles_per_block


def _load_stage(k: Kernel, x_map, tile, first, i, unroll: int) -> None:
    with k.loop("u", unroll, kind="unroll") as u:
        k.tma_load(x_map, ((first + i * unroll + u) * TILE,), tile, offset=u * TILE)


def single_dim_unroll(stages: int = 3, prefetch=None, war: Optional[str] = None, tiles_per_block: int = 32,
                      unroll: int = 4, dtype: str = "float32", warp_specialize: bool = False, registers=None) -> Kernel:
    """The tile loop split by ``unroll``: the outer serial loop is circular-buffered, each stage
    holds ``unroll`` tiles loaded by an unrolled inner loop of TMA copies."""
    k, n, out, x_map, tile, first = _staged("single_dim_unroll", tiles_per_block, unroll, dtype)
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    with k.loop("i", tiles_per_block // unroll, circular_buffer=cb) as i:
        _load_stage(k, x_map, tile, first, i, unroll)
        with k.loop("w", unroll, kind="unroll") as w:
            base = (first + i * unroll + w) * TILE
            y = k.exp(k.load(tile, w * TILE + threadIdx.x))
            with k.if_((base + threadIdx.x).lt(n)):
                k.store(out, base + threadIdx.x, y)
    return k


def single_dim_unswitch(stages: int = 3, prefetch=None, war: Optional[str] = None, tiles_per_block: int = 32,
                        unroll: int = 4, dtype: str = "float32", warp_specialize: bool = False, registers=None) -> Kernel:
    """Like the unrolled kernel, with the store predicate hoisted out of the inner loop: a stage whose
    tiles are all in bounds stores without tests, the others test every element."""
    k, n, out, x_map, tile, first = _staged("single_dim_unswitch", tiles_per_block, unroll, dtype)
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    with k.loop("i", tiles_per_block // unroll, circular_buffer=cb) as i:
        _load_stage(k, x_map, tile, first, i, unroll)
        stage_end = (first + i * unroll + unroll) * TILE
        with k.if_(stage_end.le(n)):  # the unswitched fast path
            with k.loop("w", unroll, kind="unswitch") as w:
                base = (first + i * unroll + w) * TILE
                k.store(out, base + threadIdx.x, k.exp(k.load(tile, w * TILE + threadIdx.x, dst="fast")))
        with k.if_(stage_end.gt(n)):
            with k.loop("w2", unroll, kind="unroll") as w:
                base = (first + i * unroll + w) * TILE
                y = k.exp(k.load(tile, w * TILE + threadIdx.x, dst="slow"))
                with k.if_((base + threadIdx.x).lt(n)):
                    k.store(out, base + threadIdx.x, y)
    return k
