"""What the harness measures: the six ops, their shapes, byte/flop counts, tolerances and the
generated-kernel variants (S = 1 is the kernel built with its circular_buffer annotation cleared,
which the shipped rule tma-plain-load-single-stage lowers with one stage).

Nothing here needs a GPU, torch or Triton.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from cbrules.ir.ops import DTYPE_BYTES
from cbrules.kernels import KERNELS

MEMORY_SHAPES = ((16384, 16384), (65536, 4096), (4096, 65536), (32768, 32768))
MATMUL_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))
STAGES = (1, 2, 3, 4)
# warp-specialized variants beside them: (stages, register sharing), measured as impl "generated-ws"
WS_VARIANTS = ((2, False), (4, False), (2, True), (4, True))
PRODUCER_REGISTERS = 40
TRITON_STAGES = (2, 3, 4)
F32 = 4
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# bfloat16 results are compared with torch's bfloat16 results: each is rounded once (2**-8 relative),
# so two correct answers may be an ulp (2**-7) apart
HALF_TOL = (1.6e-2, 1e-2)
# the TMA-store variant of the pointwise ops stores one 4 x 256 box a tile (a one-row tile wider than
# a box would need a store per box); the reductions' outputs are no tiles, normalize's rows are wider
TMA_STORE_OPS = ("exp", "add")
TMA_STORE_PARAMS = {"rows": 4, "width": 256, "per_block": 4}


@dataclass(frozen=True)
class Op:
    name: str            # harness name
    kernel: str          # cbrules.kernels name of the generated kernel
    what: str            # one line for the table
    shapes: tuple
    tolerance: tuple     # (rtol, atol-per-element-of-reduction or absolute); see tol()
    notes: dict = field(default_factory=dict)    # shape -> note printed in the table
    skips: dict = field(default_factory=dict)    # shape label -> reason (not run)
    params: dict = field(default_factory=dict)   # build parameters chosen by benchmarks/sweep.py
    # (shape, dtype) -> (kernel, params), overrides both
    choose: Optional[Callable[[tuple, str], tuple[str, dict]]] = None

    def generated(self, shape: tuple, dtype: str = "float32") -> tuple[str, dict]:
        """The cbrules kernel and build parameters measured for ``shape`` (tensors of ``dtype``;
        without ``choose``, see :func:`variant_params` for half precision)."""
        return self.choose(shape, dtype) if self.choose else (self.kernel, dict(self.params))

    def tol(self, shape: tuple, dtype: str = "float32") -> tuple[float, float]:
        if dtype != "float32":
            rtol, atol = self.tol(shape)
            return rtol + HALF_TOL[0], atol + HALF_TOL[1]
        rtol, atol = self.tolerance
        if self.name == "inner_sum":
            return rtol, atol * shape[1]
        if self.name == "outer_sum":
            return rtol, atol * shape[0]
        if self.name == "matmul":
            return rtol, atol * shape[2]
        return rtol, atol


def shape_label(shape: tuple) -> str:
    return "x".join(map(str, shape))


_MM_SKIP = ("matmul is compute-bound: a 16384^3 fp32 (non-tensor-core) product is 8.8 TFLOP, about 0.5 s a "
            "launch at these kernels' speed; 20+ timed launches of ~10 variants would blow the 8-minute "
            "budget, so M=N=K=4096 and 8192 are measured instead")

def _normalize_kernel(shape: tuple, dtype: str = "float32") -> tuple[str, dict]:
    """Rows up to 16384 floats stay in registers (256 threads, 4 KB stages); a row of 32768 too,
    over 512 threads with 32 KB stages (one block an SM, so it needs many bytes in flight: 16 KB
    stages gave 0.80x copy, 32 KB 0.92x); a row of 65536 floats (256 KB) fits neither the register
    file nor shared memory: two passes.

    Half precision (bfloat16 sweeps, ``benchmarks/results/bf16/sweeps.md``): boxes of 256 elements
    (512 bytes, as float32's 128; boxes of 256 bytes cost up to 13% at 32768 columns), and the whole row in flight at
    once: four stages a row up to 16384 (16384x16384: 3571 -> 4105 GB/s), two of 16384 for 32768
    (2849 -> 3264); two passes over 16384-wide tiles by 512 threads (2444 -> 2871). At 32768 a stage
    arrives as one (64, 256) box through the row split into stretches of 256 (``one_box``) instead of
    64 one-row boxes: 3259 -> 3619 GB/s in the probe (benchmarks/box_probe.py); at 16384 it was neutral.
    And at 32768 one block an SM walks rows (``walk``, one block an SM on the H200's 132), warp-specialized,
    so the producer loads the next row while the consumers normalize this one: 3645 -> 3911 GB/s, 0.95x ->
    1.02x Triton's row kernel (benchmarks/walk_probe.py; at 16384 walking lost up to half, so not there).
    At 16384 the last 1-1.5 % to Triton's row kernel moved with no occupancy, box, stage, sync or walk
    variant, nor without the TMA (benchmarks/resident_probe.py, ``benchmarks/results/bf16/resident/``),
    until the statistics became one stable block reduction: a row of 16384 loaded directly (no TMA) by
    512 threads, two blocks an SM, with ``stats="stable"`` (benchmarks/scaling_probe.py --set stats).
    float32 rows of 16384 and 32768 take the same statistics on directly loaded rows, 32 floats a thread
    (512 and 1024 threads): 0.952 -> 0.978x and 0.920 -> 0.976x Triton's row kernel in one H200 probe
    (7 interleaved rounds, ``benchmarks/results/f32_normalize/``); the TMA kernels with the stable
    statistics gained 0.2 % and 1.3 %."""
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
    if n in (16384, 32768):  # 32 floats a thread, loaded directly, one stable merge (session 7 probe)
        return "persistent", {"row": n, "width": n // 4, "threads": n // 32, "stats": "stable", "direct": True}
    if n <= 16384:
        return "persistent", {"row": n, "width": 1024, "threads": 256}
    if n <= 32768:
        return "persistent", {"row": n, "width": 8192, "threads": 512}
    return "two_pass", {"width": 4096, "threads": 1024}


OPS: dict[str, Op] = {o.name: o for o in [
    # one-row tiles of 1024 columns (4 boxes a stage), 4 tiles a block: many short blocks spread
    # evenly over the SMs (0.91-0.95x -> 0.98-0.99x copy in the sweep)
    Op("exp", "multi_dim", "out = exp(x)", MEMORY_SHAPES, (1e-5, 1e-6),
       params={"rows": 1, "width": 1024, "per_block": 4}),
    Op("add", "pointwise", "out = x + y", MEMORY_SHAPES, (1e-6, 1e-6),
       params={"rows": 1, "width": 512, "per_block": 4}),
    # 1024-wide tiles (4 boxes a stage) keep enough bytes in flight: 0.84x -> 1.08x copy in the sweep
    Op("inner_sum", "inner_reduction", "out = x.sum(1)", MEMORY_SHAPES, (1e-4, 3e-6), params={"width": 1024}),
    # 32-column tiles of 128 rows: 8x more blocks for narrow tensors (0.18x -> 1.09x copy at 65536x4096)
    Op("outer_sum", "outer_reduction", "out = x.sum(0)", MEMORY_SHAPES, (1e-4, 3e-6),
       params={"cols": 32, "rows": 128}),
    Op("normalize", "persistent", "out = (x - mean) / sqrt(var) per row", MEMORY_SHAPES, (1e-4, 1e-4),
       choose=_normalize_kernel,
       notes={(4096, 65536): "a row of 65536 floats fits neither registers nor shared memory: the generated "
                             "kernel is two_pass (reads the row twice, so at most ~2/3 of copy speed)"}),
    # 128x128 block tiles, 8x8 a thread, 32-deep K steps: 0.72x -> 0.89x torch in the sweep. Patch
    # columns side by side (not spread over banks) let ptxas load them as 128-bit LDS: faster.
    Op("matmul", "matmul", "c = a @ b (fp32, no TF32)", MATMUL_SHAPES, (1e-3, 2e-5),
       params={"tile": 128, "patch": 8, "bk": 32},
       skips={"16384x16384, 65536x4096, 4096x65536": _MM_SKIP}),
]}


def io_bytes(op: str, shape: tuple, dtype: str = "float32") -> int:
    """Bytes read + written by the algorithm (each input read once, each output written once)."""
    e = ELEMENT_BYTES[dtype]
    if op == "matmul":
        m, n, k = shape
        return e * (m * k + k * n + m * n)
    m, n = shape
    return e * {"exp": 2 * m * n, "add": 3 * m * n, "inner_sum": m * n + m, "outer_sum": m * n + n,
                  "normalize": 2 * m * n}[op]


def flops(op: str, shape: tuple) -> Optional[float]:
    if op != "matmul":
        return None
    m, n, k = shape
    return 2.0 * m * n * k


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
    pool = threads * (65536 // threads // 8 * 8)
    per = (pool - 128 * PRODUCER_REGISTERS) // consumers // 8 * 8
    return PRODUCER_REGISTERS, min(232, per)


def ws_label(stages: int, registers: Optional[tuple]) -> str:
    return f"WS S={stages}" + (f" regs {registers[0]}/{registers[1]}" if registers else "")


def chosen_stages(op: str, shape: tuple) -> int:
    """The S the rules choose for ``op`` on ``shape`` with ``stages="auto"`` (the largest over its
    circular-buffered loops; the benchmark kernels have one, or two of the same size); 1 for a kernel
    with none (a row loaded directly)."""
    from cbrules import api
    g = api.lower(build_generated(op, shape, "auto"))
    return max((g[n]["annotations"]["circular_buffer"]["stages"] for n in g.nodes("for")
                if g[n].get("part") == "main"), default=1)


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


# the tile parameter that sets a stage's bytes, per kernel: in a 2-byte type it doubles, so a stage holds
# the bytes the float32 sweep chose (half of them left too few bytes in flight: normalize 32768x32768
# 0.66x copy with the float32 tiles in bfloat16, where float32 had found 16 KB stages 0.80x, 32 KB 0.92x);
# normalize's kernels choose their half-precision tiles themselves (_normalize_kernel)
_STAGE_EXTENT = {"multi_dim": "width", "pointwise": "width", "inner_reduction": "width", "outer_reduction": "cols"}
# an inner-sum block reads at least this many bytes: several short rows a block
HALF_BLOCK_BYTES = 32 * 1024


def _half_blocks(name: str, shape: tuple, params: dict, dtype: str) -> dict:
    """What the bfloat16 sweeps (``benchmarks/results/bf16/sweeps.md``) chose beyond a stage of the
    float32 bytes: an inner-sum block takes HALF_BLOCK_BYTES of rows (4 rows of 4096: 0.84x -> 1.06x
    torch; a block of one 8 KB row pays its set-up, prologue and launch for 8 KB), an outer-sum stage
    twice the rows (at 4096 columns its 64 blocks leave half the SMs idle, so each needs twice the
    bytes in flight: 0.90x -> 1.10x torch; the other shapes within 4% of 128 rows)."""
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
    name, params = OPS[op].generated(shape, dtype)
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


def build_generated(op: str, shape: tuple, stages: int, dtype: str = "float32", tma_store: bool = False,
                    ws: Optional[bool] = None):
    """The cbrules Kernel of ``op`` for ``shape`` with ``stages`` S (1: not annotated); ``ws``
    None: pipelined, False: warp-specialized, True: warp-specialized with register sharing."""
    name, params = variant_params(op, shape, dtype, tma_store)
    if ws is None:
        return build_variant(name, stages, **params)
    return build_variant(name, stages, warp_specialize=True, registers=ws, **ws_params(params))


def compile_generated(op: str, shape: tuple, stages: int, cache: Optional[dict] = None, dtype: str = "float32",
                      tma_store: bool = False, ws: Optional[bool] = None):
    """(CompiledKernel, seconds) for a variant (``ws`` as in :func:`build_generated`); kernels whose
    source does not depend on the shape (all but normalize, whose row length is built in) are
    compiled once per variant."""
    import time

    from cbrules import api
    name, params = variant_params(op, shape, dtype, tma_store)
    key = (name, stages, ws, tuple(sorted(params.items())))
    if cache is not None and key in cache:
        return cache[key], 0.0
    t0 = time.perf_counter()
    ck = api.compile(build_generated(op, shape, stages, dtype, tma_store, ws))
    if cache is not None:
        cache[key] = ck
    return ck, time.perf_counter() - t0


def describe(op: str, shape: tuple, dtype: str = "float32", tma_store: bool = False, ws: Optional[bool] = None) -> str:
    """The generated kernel and its build parameters, e.g. ``multi_dim rows=1 width=1024``."""
    name, params = variant_params(op, shape, dtype, tma_store)
    params = params if ws is None else ws_params(params)
    return " ".join([name] + [f"{k}={v}" for k, v in params.items() if k != "row"])


def resources(ck) -> dict:
    r = ck.cubin.resources
    return {"registers": r.registers, "spill_stores": r.spill_stores, "spill_loads": r.spill_loads,
            "stack_bytes": r.stack_bytes, "dynamic_smem": ck.source.shared_bytes,
            "block": list(ck.source.block)}
