"""What limits matmul_tc at 8192^3: timing variants of its generated CUDA that each leave one part out
or change one thing (an experiment harness, not a kernel source: the variants are text edits of the
default kernel's CUDA, each checked to apply exactly once), timed in interleaved rounds beside cuBLAS
and the Triton peer:

    python3 benchmarks/profile_tc.py --out DIR [--rounds 7]

Variants (see VARIANTS): the default kernel; ``no-epilogue`` (the mainloop alone: no staging, no TMA
store); ``no-mma`` (the producer and the barriers alone: how fast TMA and L2 feed the slots);
``mma-only`` (the consumers issue every wgmma on the first S resident slots, no barrier waits after
them: the issue/wait ceiling); ``warp-release`` (one empty-barrier arrival a consumer warp instead of
one a thread); ``cluster2`` (thread-block clusters of two tile rows sharing the B tile: each block
loads half of B and multicasts it to both, the empty barriers count the consumers of both blocks);
``persistent`` (132 blocks walking the tiles). Only ``default``, ``warp-release``, ``cluster2`` and
``persistent`` compute c; the others are timed only. Also times the default kernel and cuBLAS at
8448x8192x8192 (2112 tiles: exactly 16 waves of 132 blocks, against 15.5 at 8192^3) for the tail.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CLUSTER_HELPERS = r'''
__device__ __forceinline__ unsigned cb_cluster_rank() {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
__device__ __forceinline__ void cb_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// arrive on the barrier at the same shared address in block `cta` of the cluster
__device__ __forceinline__ void cb_mbar_arrive_remote(unsigned bar, unsigned cta) {
  asm volatile("{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
               " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}" :: "r"(bar), "r"(cta) : "memory");
}
__device__ __forceinline__ void cb_tma_load_multicast(unsigned dst, const CUtensorMap* m, unsigned bar, int c0, int c1,
                                                      unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%3, %4}], [%2], %5;"
               :: "r"(dst), "l"(m), "r"(bar), "r"(c0), "r"(c1), "h"(mask) : "memory");
}
'''


def _sub(text: str, old: str, new: str, count: int = 1) -> str:
    n = text.count(old)
    if n != count:
        raise SystemExit(f"profile_tc: expected {count} of {old[:70]!r} in the generated CUDA, found {n}")
    return text.replace(old, new)


def _between(text: str, start: str, end: str, new: str) -> str:
    i = text.index(start)
    j = text.index(end, i) + len(end)
    return text[:i] + new + text[j:]


def no_epilogue(t: str) -> str:
    return _between(t, "    #pragma unroll\n    for (int acc_q", "cb_bulk_wait<0>();\n    }\n", "")


def no_mma(t: str) -> str:
    return _between(t, "      { const unsigned cb_a", "65536), 1); }\n", "")


def mma_only(t: str) -> str:
    t = _sub(t, "      cb_mbar_wait(cb_smem_addr(&cb_full_6[t % 4]), t / 4 % 2);",
             "      if (t < 4) cb_mbar_wait(cb_smem_addr(&cb_full_6[t % 4]), t / 4 % 2);")
    return _sub(t, "    for (int t = 0; t < cb_ceil_div(K, 64); t += 1) {  // producer",
                "    for (int t = 0; t < cb_min(cb_ceil_div(K, 64), 4); t += 1) {  // producer")


def warp_release(t: str) -> str:
    t = _sub(t, "cb_mbar_init(cb_smem_addr(&cb_empty_6[cb_s]), 256);", "cb_mbar_init(cb_smem_addr(&cb_empty_6[cb_s]), 8);")
    return _sub(t, "cb_mbar_arrive(cb_smem_addr(&cb_empty_6", "if (threadIdx.x % 32 == 0) cb_mbar_arrive(cb_smem_addr(&cb_empty_6",
                count=3)


def cluster2(t: str) -> str:
    """Two blocks (tile rows 2i and 2i+1 of one tile column, consecutive in the grouped order) share B."""
    t = _sub(t, "__device__ __forceinline__ bool cb_elect_one()", CLUSTER_HELPERS + "__device__ __forceinline__ bool cb_elect_one()")
    t = _sub(t, 'extern "C" __global__ void __launch_bounds__', 'extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__')
    # the empty barriers count lane 0 and lane 1 of every consumer warp of both blocks
    t = _sub(t, "cb_mbar_init(cb_smem_addr(&cb_empty_6[cb_s]), 256);", "cb_mbar_init(cb_smem_addr(&cb_empty_6[cb_s]), 16);")
    t = _sub(t, "    cb_fence_proxy_async();  // pre-prologue\n  }\n  __syncthreads();  // pre-prologue\n",
             "    cb_fence_proxy_async();  // pre-prologue\n    cb_fence_mbarrier_init();\n  }\n  cb_cluster_sync();\n")
    t = _sub(t, "cb_mbar_arrive(cb_smem_addr(&cb_empty_6", "if (threadIdx.x % 32 < 2) cb_mbar_arrive_remote(cb_smem_addr(&cb_empty_6",
             count=3)
    t = t.replace("cb_smem_addr(&cb_empty_6[cb_k]));", "cb_smem_addr(&cb_empty_6[cb_k]), threadIdx.x % 32);")
    t = t.replace("cb_smem_addr(&cb_empty_6[(t + 3) % 4]));", "cb_smem_addr(&cb_empty_6[(t + 3) % 4]), threadIdx.x % 32);")
    t = _sub(t, "cb_smem_addr(&cb_empty_6[t % 4]));", "cb_smem_addr(&cb_empty_6[t % 4]), threadIdx.x % 32);")
    # the barriers stay valid until both blocks are done with each other's (no invalidation)
    t = _between(t, "    cb_bar_sync(2, 256);  // post-epilogue\n", "      }\n    }\n", "")
    old_b = t[t.index("        cb_tma_load(cb_smem_addr(b_tile"):]
    old_b = old_b[:old_b.index(";\n") + 2]
    new_b = old_b.replace("cb_tma_load(cb_smem_addr(b_tile + t % 4 * 16384)",
                          "cb_tma_load_multicast(cb_smem_addr(b_tile + t % 4 * 16384 + cb_cluster_rank() * 8192)")
    new_b = new_b.replace(" * 256);\n", " * 256 + (int)cb_cluster_rank() * 128, (unsigned short)3);\n")
    t = _sub(t, old_b, new_b)
    t = _sub(t, "      }\n    }\n  }\n}\n", "      }\n    }\n  }\n  cb_cluster_sync();\n}\n")
    return t


VARIANTS = {"default": None, "no-epilogue": no_epilogue, "no-mma": no_mma, "mma-only": mma_only,
            "warp-release": warp_release, "cluster2": cluster2}
COMPUTES = ("default", "warp-release", "cluster2", "persistent")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--cpu", action="store_true", help="only generate and compile the variants (no GPU)")
    p.add_argument("--once", help="launch these variants (comma-separated) once each at 8192^3 and stop (for ncu)")
    a = p.parse_args(argv)
    from cbrules import api
    from cbrules.codegen.launch import CompiledKernel
    from cbrules.codegen.nvrtc import compile_cuda
    from cbrules.kernels.matmul_tc import matmul_tc
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ws = {"stages": 4, "warp_specialize": True, "registers": (40, 232)}
    base = api.generate(matmul_tc(**ws))
    sources = {}
    for name, edit in VARIANTS.items():
        src = base if edit is None else dataclasses.replace(base, text=edit(base.text))
        if name == "cluster2":  # each block loads 128 of the tile's 256 B rows
            src = dataclasses.replace(src, params=tuple(dataclasses.replace(q, box=(128, 64)) if q.name == "b_tmap" else q
                                                        for q in src.params))
        sources[name] = src
    sources["persistent"] = api.generate(matmul_tc(**ws, persistent=132))
    compiled = {}
    for name, src in sources.items():
        (out / f"{name}.cu").write_text(src.text) if name in ("cluster2",) else None
        cubin = compile_cuda(src.text, src.name)
        r = cubin.resources
        print(f"{name}: {r.registers} registers, spills {r.spill_stores}/{r.spill_loads}", flush=True)
        compiled[name] = CompiledKernel(src, cubin)
    if a.cpu:
        return 0
    import torch
    if a.once:
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(x)
        for name in a.once.split(","):
            compiled[name].bind(a=x, b=x, c=c).launch()
        torch.cuda.synchronize()
        return 0
    from benchmarks import triton_matmul
    from benchmarks.matmul_tc import _time_interleaved
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                            "--format=csv", "-lms", "250"], stdout=open(out / "smi.csv", "w"), stderr=subprocess.DEVNULL)
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in ((8192, 8192, 8192), (8448, 8192, 8192), (8192, 8192, 1024)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = x.float() @ w.float().T
        tol = 2e-2 * ref.abs().max().item()
        names = list(compiled) if m == 8192 else ["default", "cluster2", "persistent"]
        launches = {"cublas": (lambda c: lambda: torch.matmul(x, w.T, out=c)),
                    "triton": (lambda c: lambda: triton_matmul.matmul(x, w, c))}
        for name in names:
            launches[name] = (lambda ck: lambda c: ck.bind(a=x, b=w, c=c).launch)(compiled[name])
        fns, errs = {}, {}
        for name, make in launches.items():
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            fns[name] = make(c)
            fns[name]()
            torch.cuda.synchronize()
            errs[name] = (c.float() - ref).abs().max().item()
        secs = _time_interleaved(fns, torch, a.rounds)
        for name in launches:
            ok = errs[name] <= tol if name in COMPUTES + ("cublas", "triton") else None
            tf = 2.0 * m * n * k / secs[name] / 1e12
            rows.append({"shape": [m, n, k], "variant": name, "tflops": tf, "ms": secs[name] * 1e3, "ok": ok})
            print(f"{m}x{n}x{k} {name}: {tf:.1f} TFLOP/s ({secs[name] * 1e3:.3f} ms)"
                  f"{'' if ok is not False else ' WRONG err %.3g' % errs[name]}", flush=True)
    smi.terminate()
    meta = {"device": torch.cuda.get_device_name(), "rounds": a.rounds, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out / "profile.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
