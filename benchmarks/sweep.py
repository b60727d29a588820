"""Tuning sweep: time variants of one generated kernel (build parameters x S x WAR mode) beside
torch and the copy ceiling, on one Hopper GPU. Prints a markdown table; validates every output.

    python3 benchmarks/sweep.py --op exp --shape 16384x16384 --param rows=4,8,16 --war sync,mbarrier
    python3 benchmarks/sweep.py --op inner_sum --shape 65536x4096 --param width=256,512,1024,2048
    python3 benchmarks/sweep.py --op normalize --kernel two_pass --shape 4096x65536 --param width=1024,2048
    python3 benchmarks/sweep.py --op inner_sum --shape 65536x4096 --dtype bfloat16 --param rows=1,4
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.ops import OPS, io_bytes  # noqa: E402

_TORCH = {"exp": lambda t, torch: torch.exp(t["x"]), "add": lambda t, torch: t["x"] + t["y"],
          "inner_sum": lambda t, torch: t["x"].sum(1), "outer_sum": lambda t, torch: t["x"].sum(0),
          "normalize": lambda t, torch: torch.nn.functional.layer_norm(t["x"], t["x"].shape[1:], eps=0.0),
          "matmul": lambda t, torch: t["a"] @ t["b"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", required=True, choices=sorted(_TORCH))
    p.add_argument("--shape", required=True, help="MxN")
    p.add_argument("--kernel", help="a cbrules.kernels name other than the op's benchmark kernel")
    p.add_argument("--param", action="append", default=[], help="NAME=V1,V2 (a build parameter; repeatable)")
    p.add_argument("--stages", default="2,3,4")
    p.add_argument("--war", default="sync")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="element type of every tensor (torch runs in it too)")
    a = p.parse_args(argv)

    import torch
    from cbrules import api
    from cbrules.kernels import KERNELS
    from cbrules.codegen import runtime

    torch.backends.cuda.matmul.allow_tf32 = False
    m, n = (int(v) for v in a.shape.split("x")[:2])
    spec = KERNELS[a.kernel or OPS[a.op].kernel]
    gen = torch.Generator(device="cuda").manual_seed(0)
    half = a.dtype != "float32"
    if a.op == "matmul":  # MxN with K = N, rated in TFLOP/s (printed where the others print GB/s)
        t = {"a": torch.randn(m, n, device="cuda", generator=gen), "b": torch.randn(n, n, device="cuda", generator=gen)}
    else:
        t = {"x": torch.randn(m, n, device="cuda", generator=gen)}
    if a.op == "add":
        t["y"] = torch.randn(m, n, device="cuda", generator=gen)
    t = {k: v.to(getattr(torch, a.dtype)) for k, v in t.items()}
    want = _TORCH[a.op](t, torch)
    out_name = "c" if a.op == "matmul" else "out"
    t[out_name] = torch.empty_like(want)
    nbytes = io_bytes(a.op, (m, n), a.dtype) if a.op != "matmul" else 2 * m * n * n // 1000  # so "GB/s" reads TFLOP/s

    def median_ms(fn) -> float:
        for _ in range(3):
            fn()
        return statistics.median(runtime.time_launch(fn, a.reps))

    src = torch.empty(nbytes // 8, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: runtime.memcpy_dtod(runtime.as_device_array(dst), runtime.as_device_array(src)))
    torch_ms = median_ms(lambda: _TORCH[a.op](t, torch))
    print(f"{a.op} {a.shape}: copy {nbytes / copy_ms / 1e6:.0f} GB/s, torch {nbytes / torch_ms / 1e6:.0f} GB/s")
    print("| variant | S | war | GB/s | x copy | x torch | regs | smem |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    names = [kv.split("=")[0] for kv in a.param]
    values = [[int(v) for v in kv.split("=")[1].split(",")] for kv in a.param]
    for combo in itertools.product(*values):
        params = dict(zip(names, combo))
        for stages, war in itertools.product((int(s) for s in a.stages.split(",")), a.war.split(",")):
            label = " ".join(f"{k}={v}" for k, v in params.items()) or "default"
            try:
                dtype = {"dtype": a.dtype} if half else {}  # float32 kernels are built as before
                ck = api.compile(spec.factory(stages=stages, war=war, **spec.build_params((m, n)), **dtype, **params))
                bound = ck.bind(**t)
                t[out_name].fill_(float("nan"))
                bound.launch()
                runtime.synchronize()
                rtol, atol = OPS[a.op].tol((m, n, n), a.dtype)
                if not torch.allclose(t[out_name], want, rtol=rtol, atol=atol):
                    raise AssertionError("output differs from torch")
                ms = median_ms(bound.launch)
            except Exception as e:  # a variant that cannot run is reported, the sweep goes on
                print(f"| {label} | {stages} | {war} | {type(e).__name__}: {str(e)[:80]} | | | | |")
                continue
            gbs = nbytes / ms / 1e6
            print(f"| {label} | {stages} | {war} | {gbs:.0f} | {copy_ms / ms:.2f} | {torch_ms / ms:.2f} | "
                  f"{ck.cubin.resources.registers} | {ck.source.shared_bytes} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
