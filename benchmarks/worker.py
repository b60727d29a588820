"""Measure one op on the GPU: every shape, every implementation; one JSON line per measurement,
appended (and flushed) to ``--jsonl`` as it is made, so that a run stopped by its time limit
still leaves what it measured.

    python3 benchmarks/worker.py --op exp --jsonl /tmp/exp.jsonl [--reps 25] [--shapes 16384x16384]

Each implementation is validated (output poisoned with NaN, one launch, ``torch.allclose``
against the torch result on the device) before it is timed: ``warmup`` launches, then ``reps``
launches each between two CUDA events (``cbrules.codegen.runtime.time_launch``), median reported.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.ops import (OPS, STAGES, TMA_STORE_OPS, WS_VARIANTS, chosen_stages, compile_generated,  # noqa: E402
                            describe, flops, io_bytes, resources, shape_label, ws_label, ws_registers)


def _inputs(op: str, shape: tuple, torch, gen, dtype: str = "float32") -> dict:
    dt = getattr(torch, dtype)
    f = dict(device="cuda", dtype=dt, generator=gen)
    if op == "matmul":
        m, n, k = shape
        return {"a": torch.randn(m, k, **f), "b": torch.randn(k, n, **f),
                "c": torch.empty(m, n, device="cuda", dtype=dt)}
    m, n = shape
    t = {"x": torch.randn(m, n, **f)}
    if op == "add":
        t["y"] = torch.randn(m, n, **f)
    out_shape = {"inner_sum": (m,), "outer_sum": (n,)}.get(op, (m, n))
    t["out"] = torch.empty(out_shape, device="cuda", dtype=dt)
    return t


def _torch_impls(op: str, t: dict, torch) -> list:
    """[(impl, label, fn)]: the torch versions (for normalize, the eager chain and the fused
    layer_norm; the report compares with the faster)."""
    x, out = t.get("x"), t.get("out")
    if op == "exp":
        return [("torch", "torch.exp(x, out=)", lambda: torch.exp(x, out=out))]
    if op == "add":
        return [("torch", "torch.add(x, y, out=)", lambda: torch.add(x, t["y"], out=out))]
    if op == "inner_sum":
        return [("torch", "torch.sum(x, 1, out=)", lambda: torch.sum(x, 1, out=out))]
    if op == "outer_sum":
        return [("torch", "torch.sum(x, 0, out=)", lambda: torch.sum(x, 0, out=out))]
    if op == "normalize":
        def eager():
            var, mean = torch.var_mean(x, dim=1, correction=0, keepdim=True)
            torch.div(x - mean, var.sqrt(), out=out)
        n = x.shape[1]
        return [("torch", "var_mean, sub, sqrt, div", eager),
                ("torch", "F.layer_norm(eps=0)",
                 lambda: torch.nn.functional.layer_norm(x, (n,), eps=0.0))]  # returns its output
    if op == "matmul":
        return [("torch", "torch.matmul (cuBLAS, TF32 off)", lambda: torch.matmul(t["a"], t["b"], out=t["c"]))]
    raise KeyError(op)


def _out_name(op: str) -> str:
    return "c" if op == "matmul" else "out"


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--op", required=True, choices=list(OPS))
    p.add_argument("--jsonl", required=True)
    p.add_argument("--reps", type=int, default=25)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--shapes", help="comma-separated AxB[xC] labels (default: the op's shapes)")
    p.add_argument("--impls", default="copy,torch,generated,generated-ws,triton", help="which implementations "
                   "(generated-ws: float32 only)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--stages", default=",".join(map(str, STAGES)), help="generated stage counts (default 1,2,3,4)")
    p.add_argument("--tma-store", action="store_true", help="also measure the TMA-store variant where the "
                   "generated kernel has a tile output")
    a = p.parse_args(argv)
    stages = [int(s) for s in a.stages.split(",")]

    import torch

    from cbrules.codegen import runtime
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.cuda.init()
    op = OPS[a.op]
    impls = set(a.impls.split(","))
    shapes = op.shapes if not a.shapes else tuple(tuple(int(v) for v in s.split("x")) for s in a.shapes.split(","))
    log = open(a.jsonl, "a")
    ck_cache: dict = {}
    try:
        import benchmarks.triton_kernels as tk
        triton_error = None
    except Exception as e:  # no Triton: record it, measure the rest
        tk, triton_error = None, f"{type(e).__name__}: {e}"

    def emit(rec: dict) -> None:
        log.write(json.dumps(rec) + "\n")
        log.flush()
        status = rec.get("error") or ("ok" if rec.get("valid", True) else "INVALID")
        ms = rec.get("ms")
        print(f"  {a.op} {rec['shape']} {rec['impl']:11s} {rec.get('variant', ''):32s} "
              f"{'' if ms is None else f'{ms:9.3f} ms'} {status}", flush=True)

    for shape in shapes:
        sl = shape_label(shape)
        nbytes, nflop = io_bytes(a.op, shape, a.dtype), flops(a.op, shape)
        base = {"op": a.op, "shape": sl, "bytes": nbytes, "flop": nflop, "dtype": a.dtype}
        gen = torch.Generator(device="cuda").manual_seed(0)
        t = _inputs(a.op, shape, torch, gen, a.dtype)
        out = t[_out_name(a.op)]
        ref = torch.empty_like(out)
        ref_fn = _torch_impls(a.op, t, torch)[0][2]
        ref_fn()
        ref.copy_(out)
        torch.cuda.synchronize()
        rtol, atol = op.tol(shape, a.dtype)

        def measure(impl: str, variant: str, fn, validate: bool = True, **extra) -> None:
            rec = dict(base, impl=impl, variant=variant, **extra)
            try:
                if validate:
                    out.fill_(math.nan)
                    res = fn()
                    got = res if isinstance(res, torch.Tensor) and res.shape == out.shape and res is not out else out
                    torch.cuda.synchronize()
                    rec["max_abs_err"] = (got.float() - ref.float()).abs().max().item()
                    rec["valid"] = bool(torch.allclose(got.float(), ref.float(), rtol=rtol, atol=atol))
                    del res, got
                for _ in range(a.warmup):
                    fn()
                runtime.synchronize()
                times = runtime.time_launch(fn, a.reps)
                ms = statistics.median(times)
                rec.update(ms=ms, reps=len(times), ms_min=min(times), ms_max=max(times),
                           gbps=nbytes / ms / 1e6, tflops=None if nflop is None else nflop / ms / 1e9)
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                rec["traceback"] = traceback.format_exc()[-2000:]
                try:
                    torch.cuda.synchronize()
                except Exception:  # a faulted context: every later launch fails too, and says so
                    pass
            emit(rec)

        if "copy" in impls and a.op != "matmul":
            half = (nbytes // 2 + 15) // 16 * 16  # copying half the bytes moves them all (read + write)
            src = torch.empty(half, dtype=torch.uint8, device="cuda")
            dst = torch.empty(half, dtype=torch.uint8, device="cuda")
            s_arr, d_arr = runtime.as_device_array(src), runtime.as_device_array(dst)
            measure("copy", f"cuMemcpyDtoDAsync {half / 2**30:.2f} GiB", lambda: runtime.memcpy_dtod(d_arr, s_arr),
                    validate=False, copy_bytes=half)
            del src, dst, s_arr, d_arr
            torch.cuda.empty_cache()
        if "torch" in impls:
            for impl, label, fn in _torch_impls(a.op, t, torch):
                measure(impl, label, fn)
        if "generated" in impls:
            stores = (False, True) if a.tma_store and a.op in TMA_STORE_OPS else (False,)
            for s, tma_store in ((s, ts) for ts in stores for s in stages):
                label = f"S={s}" + (" (no annotation)" if s == 1 else "") + (" TMA store" if tma_store else "")
                try:
                    ck, secs = compile_generated(a.op, shape, s, ck_cache, a.dtype, tma_store)
                    bound = ck.bind(**t)
                except Exception as e:
                    emit(dict(base, impl="generated", variant=label, stages=s, tma_store=tma_store,
                              error=f"{type(e).__name__}: {str(e)[:300]}", traceback=traceback.format_exc()[-2000:]))
                    continue
                extra = {"stages": s, "resources": resources(ck), "compile_s": secs, "tma_store": tma_store,
                         "grid": list(bound.grid), "kernel": describe(a.op, shape, a.dtype, tma_store)}
                measure("generated", label, bound.launch, **extra)
                del bound
        if "generated-auto" in impls:  # stages="auto": the S the rules choose, beside the swept ones
            try:
                s = chosen_stages(a.op, shape, a.dtype)
                ck, secs = compile_generated(a.op, shape, "auto", ck_cache, a.dtype)
                bound = ck.bind(**t)
            except Exception as e:
                emit(dict(base, impl="generated-auto", variant="S=auto", error=f"{type(e).__name__}: {str(e)[:300]}",
                          traceback=traceback.format_exc()[-2000:]))
            else:
                measure("generated-auto", f"S=auto ({s})", bound.launch, stages=s, resources=resources(ck),
                        compile_s=secs, grid=list(bound.grid), kernel=describe(a.op, shape, a.dtype))
                del bound
        if "generated-ws" in impls and a.dtype == "float32":
            for s, regs in WS_VARIANTS:
                try:
                    ck, secs = compile_generated(a.op, shape, s, ck_cache, ws=regs)
                    bound = ck.bind(**t)
                    split = ws_registers(ck.source.block[0] - 128) if regs else None
                except Exception as e:
                    emit(dict(base, impl="generated-ws", variant=ws_label(s, None) + (" regs" if regs else ""),
                              stages=s, error=f"{type(e).__name__}: {str(e)[:300]}",
                              traceback=traceback.format_exc()[-2000:]))
                    continue
                extra = {"stages": s, "registers": split, "resources": resources(ck), "compile_s": secs,
                         "grid": list(bound.grid), "kernel": describe(a.op, shape, ws=regs)}
                measure("generated-ws", ws_label(s, split), bound.launch, **extra)
                del bound
        if "triton" in impls:
            if tk is None:
                emit(dict(base, impl="triton", variant="-", error=triton_error))
            else:
                for label, s, fn in tk.variants(a.op, shape, t):
                    measure("triton", label, fn, stages=s)  # the validating launch compiles it
        del t, out, ref
        torch.cuda.empty_cache()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
