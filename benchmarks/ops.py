"""What the harness measures: the six ops, their shapes, byte/flop counts, tolerances and the
generated-kernel variants (S = 1 is the kernel built with its circular_buffer annotation cleared,
which the shipped rule tma-plain-load-single-stage lowers with one stage).

Nothing here needs a GPU, torch or Triton.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# the variants themselves (kernels and tile parameters) are the product's: cbrules.kernels.tuned
from cbrules.kernels.tuned import (MATMUL_SHAPES, MEMORY_SHAPES, PRODUCER_REGISTERS, TILES, TMA_STORE_OPS, TMA_STORE_PARAMS,  # noqa: F401
                                   build_generated, build_variant, tiles, variant_params,
                                   ws_params, ws_registers)

STAGES = (1, 2, 3, 4)
# warp-specialized variants beside them: (stages, register sharing), measured as impl "generated-ws"
WS_VARIANTS = ((2, False), (4, False), (2, True), (4, True))
TRITON_STAGES = (2, 3, 4)
F32 = 4
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# bfloat16 results are compared with torch's bfloat16 results: each is rounded once (2**-8 relative),
# so two correct answers may be an ulp (2**-7) apart
HALF_TOL = (1.6e-2, 1e-2)


@dataclass(frozen=True)
class Op:
    name: str            # harness name
    kernel: str          # cbrules.kernels name of the generated kernel
    what: str            # one line for the table
    shapes: tuple
    tolerance: tuple     # (rtol, atol-per-element-of-reduction or absolute); see tol()
    notes: dict = field(default_factory=dict)    # shape -> note printed in the table
    skips: dict = field(default_factory=dict)    # shape label -> reason (not run)
    params: dict = field(default_factory=dict)   # float32 build parameters (cbrules.kernels.tuned.TILES)

    def generated(self, shape: tuple, dtype: str = "float32") -> tuple[str, dict]:
        """The cbrules kernel and build parameters measured for ``shape`` (tensors of ``dtype``;
        see :func:`variant_params` for the half-precision tiles)."""
        return tiles(self.name, shape, dtype)

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

OPS: dict[str, Op] = {o.name: o for o in [
    Op("exp", TILES["exp"][0], "out = exp(x)", MEMORY_SHAPES, (1e-5, 1e-6), params=TILES["exp"][1]),
    Op("add", TILES["add"][0], "out = x + y", MEMORY_SHAPES, (1e-6, 1e-6), params=TILES["add"][1]),
    Op("inner_sum", TILES["inner_sum"][0], "out = x.sum(1)", MEMORY_SHAPES, (1e-4, 3e-6),
       params=TILES["inner_sum"][1]),
    Op("outer_sum", TILES["outer_sum"][0], "out = x.sum(0)", MEMORY_SHAPES, (1e-4, 3e-6),
       params=TILES["outer_sum"][1]),
    Op("normalize", TILES["normalize"][0], "out = (x - mean) / sqrt(var) per row", MEMORY_SHAPES, (1e-4, 1e-4),
       notes={(4096, 65536): "a row of 65536 floats fits neither registers nor shared memory: the generated "
                             "kernel is two_pass (reads the row twice, so at most ~2/3 of copy speed)"}),
    Op("matmul", TILES["matmul"][0], "c = a @ b (fp32, no TF32)", MATMUL_SHAPES, (1e-3, 2e-5),
       params=TILES["matmul"][1], skips={"16384x16384, 65536x4096, 4096x65536": _MM_SKIP}),
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


def ws_label(stages: int, registers: Optional[tuple]) -> str:
    return f"WS S={stages}" + (f" regs {registers[0]}/{registers[1]}" if registers else "")


def chosen_stages(op: str, shape: tuple, dtype: str = "float32") -> int:
    """The S the rules choose for ``op`` on ``shape`` in ``dtype`` with ``stages="auto"`` (the largest over its
    circular-buffered loops; the benchmark kernels have one, or two of the same size); 1 for a kernel
    with none (a row loaded directly)."""
    from cbrules import api
    g = api.lower(build_generated(op, shape, "auto", dtype))
    return max((g[n]["annotations"]["circular_buffer"]["stages"] for n in g.nodes("for")
                if g[n].get("part") == "main"), default=1)


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
            "block": list(ck.source.block),
            "tensor_dtypes": sorted({p.dtype for p in ck.source.params if p.kind == "tensor"})}
