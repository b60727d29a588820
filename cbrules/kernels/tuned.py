"""Tuned tile parameters of the built-in kernels for six operations (exp, add, inner_sum, outer_sum,
normalize, matmul) on large problems: which kernel computes each operation for a shape and dtype, and
with which build parameters. The benchmark harness (``benchmarks/``) measures exactly these
variants, and the CPU tests check them; they are ordinary built-in kernels with other tile sizes.
"""
from __future__ import annotations

from typing import Optional

from ..ir.limits import REGISTERS_PER_BLOCK
from ..ir.ops import DTYPE_BYTES
from . import KERNELS

# the problem shapes the tiles are tuned for: [M, N] (matmul: M, N, K)
MEMORY_SHAPES = ((16384, 16384), (65536, 4096), (4096, 65536), (32768, 32768))
MATMUL_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))
# op -> (built-in kernel, build parameters); normalize chooses per shape (normalize_tiles)
TILES: dict[str, tuple[str, Optional[dict]]] = {
    # one-row tiles, several a block: many short blocks spread evenly over the SMs
    "exp": ("multi_dim", {"rows": 1, "width": 1024, "per_block": 4}),
    "add": ("pointwise", {"rows": 1, "width": 512, "per_block": 4}),
    # 1024-wide tiles (4 boxes a stage) keep enough bytes in flight
    "inner_sum": ("inner_reduction", {"width": 1024}),
    # 32-column tiles of 128 rows: many blocks on narrow tensors
    "outer_sum": ("outer_reduction", {"cols": 32, "rows": 128}),
    "normalize": ("persistent", None),
    # 128x128 block tiles, 8x8 a thread, 32-deep K steps; patch columns side by side, so ptxas loads
    # them as 128-bit shared loads
    "matmul": ("matmul", {"tile": 128, "patch": 8, "bk": 32}),
}
# the TMA-store variant of the pointwise ops stores one 4 x 256 box a tile (a one-row tile wider than
# a box would need a store per box); the reductions' outputs are no tiles, normalize's rows are wider
TMA_STORE_OPS = ("exp", "add")
TMA_STORE_PARAMS = {"rows": 4, "width": 256, "per_block": 4}
PRODUCER_REGISTERS = 40
# the tile parameter that sets a stage's bytes, per kernel: in a 2-byte type it doubles, so a stage holds
# the bytes of the float32 tile; normalize's kernels choose their half-precision tiles themselves
_STAGE_EXTENT = {"multi_dim": "width", "pointwise": "width", "inner_reduction": "width", "outer_reduction": "cols"}
# an inner-sum block reads at least this many bytes: several short rows a block
HALF_BLOCK_BYTES = 32 * 1024


def normalize_tiles(shape: tuple, dtype: str = "float32") -> tuple[str, dict]:
    """(kernel, parameters) of the row normalization of ``shape``: rows up to 32768 elements stay on
    chip (in registers, or loaded directly with one stable block reduction of the statistics); a
    longer row fits neither the register file nor shared memory, so ``two_pass`` reads it twice. In
    half precision, boxes of 256 elements and the whole row in flight at once; at 32768 columns one
    block an SM walks the rows warp-specialized, each stage one box through the row split into
    stretches of 256."""
    n = shape[1]
    if dtype != "float32":
        if n == 16384:
            return "persistent", {"row": n, "width": 4096, "threads": 512, "box": 256, "stats": "stable",
                                  "direct": True}
        if n <= 16384:
            return "persistent", {"row": n, "width": max(n // 4, 1024), "threads": 256, "box": 256}
        if n <= 32768:
            return "persistent", {"row": n, "width": 16384, "threads": 512, "box": 256, "one_box": True,
                                  "walk": 132, "warp_specialize": True}
        return "two_pass", {"width": 16384, "threads": 512}
    if n in (16384, 32768):  # 32 floats a thread, loaded directly, one stable merge
        return "persistent", {"row": n, "width": n // 4, "threads": n // 32, "stats": "stable", "direct": True}
    if n <= 16384:
        return "persistent", {"row": n, "width": 1024, "threads": 256}
    if n <= 32768:
        return "persistent", {"row": n, "width": 8192, "threads": 512}
    return "two_pass", {"width": 4096, "threads": 1024}


def tiles(op: str, shape: tuple, dtype: str = "float32") -> tuple[str, dict]:
    """The built-in kernel and its float32 tile parameters for ``op`` on ``shape`` (normalize also
    looks at ``dtype``; see :func:`variant_params` for the half-precision tiles of the others)."""
    kernel, params = TILES[op]
    return normalize_tiles(shape, dtype) if params is None else (kernel, dict(params))


def shapes(op: str) -> tuple:
    """The problem shapes ``op``'s tiles are tuned for."""
    return MATMUL_SHAPES if op == "matmul" else MEMORY_SHAPES


def ws_params(params: dict) -> dict:
    """Build parameters of the warp-specialized variant: a block of 1024 threads (two_pass) has no
    room for the producer warp group, so it runs on 512 consumers; a row loaded directly has no stages
    for a producer to fill, so its variant loads the same tiles through the TMA."""
    params = {k: v for k, v in params.items() if k not in ("warp_specialize", "direct")}  # the caller says it
    return dict(params, threads=512) if params.get("threads", 0) > 896 else params


def ws_registers(consumers: int) -> tuple[int, int]:
    """(producer, consumer) registers: the producer keeps 40, the consumers share the rest of what
    the block is launched with, its threads times the registers a thread may have at one block an
    SM (65536 / threads, rounded down to ptxas's 8; at most 232 each, a multiple of 8). More would
    leave the consumers' setmaxnreg.inc waiting forever (codegen.registers refuses such a kernel)."""
    threads = consumers + 128
    pool = threads * (REGISTERS_PER_BLOCK // threads // 8 * 8)
    per = (pool - 128 * PRODUCER_REGISTERS) // consumers // 8 * 8
    return PRODUCER_REGISTERS, min(232, per)


def build_variant(kernel: str, stages, warp_specialize: bool = False, registers=None, **params):
    """The built-in ``kernel`` with ``stages`` S; S = 1 builds it without its circular_buffer
    annotation (the shipped single-stage rule lowers it). ``registers=True`` picks the split with
    :func:`ws_registers`. S = 1 is the unpipelined baseline, so it drops warp specialization too."""
    if warp_specialize and stages != 1:
        k = KERNELS[kernel].factory(stages=stages, warp_specialize=True, **params)
        if registers is True:
            registers = ws_registers(k.graph.kernel()["block"][0])
        return KERNELS[kernel].factory(stages=stages, warp_specialize=True, registers=registers or None, **params)
    k = KERNELS[kernel].factory(stages=stages if stages == "auto" else max(stages, 2), **params)
    if stages == 1:
        for n in k.graph.nodes("for"):
            k.graph[n]["annotations"].pop("circular_buffer", None)
    return k


def _half_blocks(name: str, shape: tuple, params: dict, dtype: str) -> dict:
    """Beyond a stage of the float32 bytes, in half precision: an inner-sum block takes
    HALF_BLOCK_BYTES of rows (a block of one short row pays its set-up, prologue and launch for a few
    KB), an outer-sum stage twice the rows (narrow tensors leave SMs idle, so each block needs more
    bytes in flight)."""
    if name == "inner_reduction":
        rows = HALF_BLOCK_BYTES // (shape[1] * DTYPE_BYTES[dtype])
        return {"rows": rows} if rows > 1 else {}
    if name == "outer_reduction":
        return {"rows": params["rows"] * 2}
    return {}


def variant_params(op: str, shape: tuple, dtype: str = "float32", tma_store: bool = False) -> tuple[str, dict]:
    """(kernel, build parameters) of a variant: float32 and no TMA store are the kernel's defaults
    (left out, so those kernels are built exactly as before); a half-precision variant's stages hold
    the bytes of the float32 one (twice the elements)."""
    name, params = tiles(op, shape, dtype)
    if tma_store:
        if op not in TMA_STORE_OPS:
            raise ValueError(f"{op}: no TMA-store variant (only {', '.join(TMA_STORE_OPS)})")
        params = {**params, **TMA_STORE_PARAMS, "tma_store": True}
    if dtype != "float32" and (tma_store or name in _STAGE_EXTENT):
        key = "rows" if tma_store else _STAGE_EXTENT[name]  # a TMA-stored tile is one 256-wide box
        wider = {**params, key: params[key] * 4 // DTYPE_BYTES[dtype]}
        # a loop along a row keeps at least 4 tiles (a 4096-wide row: 1024 columns a stage), enough for S <= 4
        along_row = name == "inner_reduction" and shape[1] // wider["width"] < 4
        params = params if along_row else wider
        params = {**params, **({} if tma_store else _half_blocks(name, shape, params, dtype))}
    return name, params if dtype == "float32" else {**params, "dtype": dtype}


def build_generated(op: str, shape: tuple, stages, dtype: str = "float32", tma_store: bool = False,
                    ws: Optional[bool] = None):
    """The cbrules Kernel of ``op`` for ``shape`` with ``stages`` S (1: not annotated; "auto": the
    rules choose); ``ws`` None: pipelined, False: warp-specialized, True: warp-specialized with
    register sharing."""
    name, params = variant_params(op, shape, dtype, tma_store)
    if ws is None:
        return build_variant(name, stages, **params)
    return build_variant(name, stages, warp_specialize=True, registers=ws, **ws_params(params))


def tune_space(kernel: str, sms: int) -> list[dict]:
    """The configurations ``cbrules tune`` and :func:`cbrules.autotune.autotune` measure for a built-in
    tensor-core kernel (build parameters; ``sms`` the device's SM count for the persistent walks). A
    configuration a variant cannot take (persistent causal attention, a tile past the shared memory) is
    refused by its builder by name and left out of the measurement."""
    ws = {"warp_specialize": True}
    if kernel == "matmul_tc":
        split = {**ws, "registers": [PRODUCER_REGISTERS, 232]}
        return [{"stages": 4, **split}, {"stages": 4, **split, "persistent": sms},
                {"stages": 4, **split, "bn": 128}, {"stages": 5, **split, "bn": 128, "persistent": sms},
                {"stages": 4, **ws, "persistent": sms, "bm": 128, "bn": 128, "pingpong": True}]
    if kernel == "attention":
        return [dict(ws), {**ws, "stages": 2}, {**ws, "persistent": sms}, {**ws, "stages": 2, "persistent": sms}]
    raise KeyError(kernel)


TUNED_KERNELS = ("matmul_tc", "attention")  # the kernels tune_space declares configurations for


def tune_build(factory, dtype: str, **config):
    """A built-in kernel's factory in ``dtype`` with one configuration. It lives in a module (not in the
    command that uses it, which may run as ``__main__``) so that the tuner's worker processes can import
    it by name."""
    return factory(dtype=dtype, **config)
