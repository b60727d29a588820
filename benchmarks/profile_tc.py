"""What limits matmul_tc at 8192^3: timing variants of its generated CUDA that each leave one part out
or change one thing (an experiment harness, not a kernel source: the variants are text edits of the
default kernel's CUDA, each checked to apply exactly once), timed in interleaved rounds beside cuBLAS
and the Triton peer:

    python3 benchmarks/profile_tc.py --out DIR [--rounds 7]

Variants (see VARIANTS): the default kernel; ``no-epilogue`` (the mainloop alone: no staging, no TMA
store; the accumulators kept live, or ptxas drops the wgmma); ``no-mma`` (the producer and the
barriers alone: how fast TMA and L2 feed the slots); ``mma-only`` (the consumers issue every wgmma on
the first S resident slots, no barrier waits after them: the issue/wait ceiling, and no load traffic);
``warp-release`` (one empty-barrier arrival a consumer warp instead of one a thread);
``swizzled-store`` (the epilogue staged in the 128-byte swizzle by hand, two columns a 32-bit store);
``persistent``, ``group16``, ``store-swizzle`` (the rules' swizzled staging, matmul_tc(store_swizzle=True))
and ``store-swizzle-group16`` generated. With ``--cluster``: ``cluster-launch`` (clusters of two blocks
sharing nothing) and ``cluster2`` (two tile rows sharing the B tile: each block loads half of B and
multicasts it to both, the empty barriers count the consumers of both blocks; experimental: see
CLUSTER_VARIANTS). Only COMPUTES compute c (checked); the others are timed only. ``--sustain S`` runs
some implementations alone for S seconds each and samples the SM clock and board power; ``--once``
launches the named ones once (for ncu). Figures: benchmarks/results/matmul_tc/levers/profile/.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import cuda_edit  # noqa: E402

CLUSTER_HELPERS = r'''
__device__ __forceinline__ unsigned cb_cluster_rank() {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
__device__ __forceinline__ void cb_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// arrive on the barrier at the same shared address in block `cta` of the cluster (release at CTA scope:
// the slot's reads by the wgmma have completed; .release.cluster put a MEMBAR.ALL.GPU before each arrive)
__device__ __forceinline__ void cb_mbar_arrive_remote(unsigned bar, unsigned cta) {
  asm volatile("{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
               " mbarrier.arrive.shared::cluster.b64 _, [ra];\n}" :: "r"(bar), "r"(cta) : "memory");
}
// lane `lane` < 2 of the warp arrives on block `lane`'s barrier: predicated inside the asm, so no
// branch diverges the warp between wgmma (ptxas serializes wgmma around divergent code)
// (the predicate tests the lane itself: testing lane & 1, as a version that hung did, let all 32 lanes
// arrive, 16 times the count, so the barriers' phases ran ahead of the slots)
__device__ __forceinline__ void cb_mbar_arrive_pair(unsigned bar) {
  const unsigned lane = threadIdx.x % 32;
  asm volatile("{\n .reg .pred p;\n .reg .b32 ra;\n setp.lt.u32 p, %2, 2;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
               " @p mbarrier.arrive.shared::cluster.b64 _, [ra];\n}" :: "r"(bar), "r"(lane & 1), "r"(lane) : "memory");
}
__device__ __forceinline__ void cb_tma_load_multicast(unsigned dst, const CUtensorMap* m, unsigned bar, int c0, int c1,
                                                      unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%3, %4}], [%2], %5;"
               :: "r"(dst), "l"(m), "r"(bar), "r"(c0), "r"(c1), "h"(mask) : "memory");
}
'''


def _sub(text: str, old: str, new: str, count: int = 1) -> str:
    return cuda_edit.sub(text, old, new, count, who="profile_tc")


_between = cuda_edit.between


def no_epilogue(t: str) -> str:
    """No staging and no store; the accumulators stay live behind a test that never passes (M < 0),
    or ptxas would drop the wgmma."""
    return _between(t, "    #pragma unroll\n    for (int acc_q", "cb_bulk_wait<0>();\n    }\n",
                    "    if (M < 0) {\n      #pragma unroll\n"
                    "      for (int i = 0; i < 128; ++i) c[threadIdx.x * 128 + i] = acc[i];\n    }\n")


def swizzled_store(t: str) -> str:
    """Stage C in the 128-byte swizzle (the 16-byte chunk of a row XOR the row mod 8) into a
    1024-aligned slot and TMA-store it with a 128B-swizzled map: the staging stores go conflict-free
    (8 rows x 4 words a warp instruction, against all 8 rows on one bank set unswizzled)."""
    t = _sub(t, "cb_stage_10 = reinterpret_cast<cb_bf16*>(cb_smem + 128);",
             "cb_stage_10 = reinterpret_cast<cb_bf16*>(cb_smem + 1024);")
    old = t[t.index("          cb_stage_10[(("):]
    old = old[:old.index(";\n") + 2]
    new = ("          if (acc_r % 2 == 0) {  // two neighbouring columns as one 32-bit store\n"
           "            const int sr = (int)threadIdx.x / 128 * 64 + (int)threadIdx.x / 32 % 4 * 16\n"
           "                           + (int)threadIdx.x % 32 / 4 + acc_r / 2 % 2 * 8;\n"
           "            const int sc = acc_r / 4 * 8 + (int)threadIdx.x % 4 * 2;\n"
           "            const cb_bf16 lo(v0), hi(acc[acc_q * 32 + acc_r + 1]);\n"
           "            *reinterpret_cast<unsigned*>(\n"
           "                &cb_stage_10[acc_q % 2 * 8192 + sr * 64 + ((sc / 8) ^ (sr % 8)) * 8 + sc % 8]) =\n"
           "                (unsigned)lo.bits | (unsigned)hi.bits << 16; }\n")
    return _sub(t, old, new)


def no_mma(t: str) -> str:
    return _between(t, "      { const unsigned cb_a", "65536), 1); }\n", "")


def mma_only(t: str) -> str:
    t = _sub(t, "      cb_mbar_wait(cb_smem_addr(&cb_full_6[t % 4]), t / 4 % 2);",
             "      if (t < 4) cb_mbar_wait(cb_smem_addr(&cb_full_6[t % 4]), t / 4 % 2);")
    return _sub(t, "    for (int t = 0; t < cb_ceil_div(K, 64); t += 1) {  // producer",
                "    for (int t = 0; t < cb_min(cb_ceil_div(K, 64), 4); t += 1) {  // producer")


def warp_release(t: str) -> str:
    t = _sub(t, "cb_mbar_init(cb_smem_addr(&cb_empty_6[cb_s]), 256);",
             "cb_mbar_init(cb_smem_addr(&cb_empty_6[cb_s]), 8);")
    return _sub(t, "cb_mbar_arrive(cb_smem_addr(&cb_empty_6",
                "if (threadIdx.x % 32 == 0) cb_mbar_arrive(cb_smem_addr(&cb_empty_6",
                count=3)


def cluster2(t: str) -> str:
    """Two blocks (tile rows 2i and 2i+1 of one tile column, consecutive in the grouped order) share B."""
    t = _sub(cluster_launch(t), "__device__ __forceinline__ bool cb_elect_one()",
             CLUSTER_HELPERS + "__device__ __forceinline__ bool cb_elect_one()")
    # the empty barriers count lane 0 and lane 1 of every consumer warp of both blocks
    t = _sub(t, "cb_mbar_init(cb_smem_addr(&cb_empty_6[cb_s]), 256);",
             "cb_mbar_init(cb_smem_addr(&cb_empty_6[cb_s]), 16);")
    t = _sub(t, "    cb_fence_proxy_async();  // pre-prologue\n  }\n  __syncthreads();  // pre-prologue\n",
             "    cb_fence_proxy_async();  // pre-prologue\n    cb_fence_mbarrier_init();\n  }\n  cb_cluster_sync();\n")
    t = _sub(t, "cb_mbar_arrive(cb_smem_addr(&cb_empty_6", "cb_mbar_arrive_pair(cb_smem_addr(&cb_empty_6", count=3)
    # The post-mainloop invalidation stays where it is (moved after the closing cluster sync, ptxas
    # serializes every wgmma: C7514). So no block may arrive on its peer's barriers once its peer can
    # have finished the mainloop: the releases of the last 4 steps, which no producer waits for, are
    # left out (every earlier release was waited for by a producer before its block's last load).
    t = _sub(t, "      if (t > 0) {\n        cb_mbar_arrive_pair(",
             "      if (t > 0 && t + 3 < cb_ceil_div(K, 64)) {\n        cb_mbar_arrive_pair(")
    last = t.index("        cb_mbar_arrive_pair(cb_smem_addr(&cb_empty_6[t % 4]));\n")
    t = t[:last] + t[t.index("\n", last) + 1:]
    old_b = t[t.index("        cb_tma_load(cb_smem_addr(b_tile"):]
    old_b = old_b[:old_b.index(";\n") + 2]
    new_b = old_b.replace("cb_tma_load(cb_smem_addr(b_tile + t % 4 * 16384)",
                          "cb_tma_load_multicast(cb_smem_addr(b_tile + t % 4 * 16384 + cb_cluster_rank() * 8192)")
    new_b = new_b.replace(" * 256);\n", " * 256 + (int)cb_cluster_rank() * 128, (unsigned short)3);\n")
    t = _sub(t, old_b, new_b)
    t = _sub(t, "      }\n    }\n  }\n}\n", "      }\n    }\n  }\n  cb_cluster_sync();\n}\n")
    return t


def cluster_launch(t: str) -> str:
    """The default kernel launched in clusters of two blocks that share nothing (the launch's own cost)."""
    return _sub(t, 'extern "C" __global__ void __launch_bounds__',
                'extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__')


VARIANTS = {"default": None, "no-epilogue": no_epilogue, "no-mma": no_mma, "mma-only": mma_only,
            "warp-release": warp_release, "swizzled-store": swizzled_store}
# opt-in (--cluster): cluster2 hung in its runs of 2026-11-30 (results/matmul_tc/levers/profile and
# s5_levers: every lane arrived, see cb_mbar_arrive_pair); fixed since: s5_levers/run5_cluster ran it
CLUSTER_VARIANTS = {"cluster-launch": cluster_launch, "cluster2": cluster2}
COMPUTES = ("default", "warp-release", "cluster2", "persistent", "swizzled-store", "group16", "persistent-swizzled",
            "store-swizzle", "store-swizzle-group16", "cluster2-group16")


def _sustain(compiled: dict, seconds: float) -> list:
    """Each implementation alone, back to back for ``seconds`` at 8192^3, while a thread samples the SM
    clock and board power (nvidia-smi): under the power cap, the clock an implementation holds says
    how much energy a FLOP of it costs."""
    import statistics
    import threading
    import torch
    from benchmarks import triton_matmul
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(x)
    impls = {"cublas": lambda: torch.matmul(x, w.T, out=c), "triton": lambda: triton_matmul.matmul(x, w, c)}
    wanted = ("default", "store-swizzle-group16", "cluster2", "cluster2-group16", "mma-only")
    for name in [n for n in wanted if n in compiled]:
        impls[name] = compiled[name].bind(a=x, b=w, c=c).launch
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            q = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True).stdout.split(",")
            samples.append((time.time(), float(q[0]), float(q[1])))
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    rows = []
    for name, fn in impls.items():
        fn()
        torch.cuda.synchronize()
        t0, n = time.time(), 0
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        while time.time() - t0 < seconds:
            for _ in range(20):
                fn()
            n += 20
            torch.cuda.synchronize()
        e.record()
        e.synchronize()
        t1 = time.time()
        here = [(clk, pw) for t, clk, pw in samples if t0 + 0.3 * (t1 - t0) <= t <= t1]
        tf = 2.0 * 8192 ** 3 * n / (s.elapsed_time(e) / 1e3) / 1e12
        row = {"shape": [8192, 8192, 8192], "variant": f"{name} sustained", "tflops": tf,
               "sm_mhz": statistics.median(h[0] for h in here) if here else None,
               "watts": statistics.median(h[1] for h in here) if here else None}
        rows.append(row)
        print(f"sustained {name}: {tf:.1f} TFLOP/s, SM {row['sm_mhz']} MHz, {row['watts']} W "
              f"({len(here)} samples)", flush=True)
        time.sleep(1.0)
    stop.set()
    return rows


def _triton_fixed(a, b, c) -> None:
    """The Triton peer in the configuration its autotuner picks at 8192^3 (128x256x64, 3 stages, 8 warps)."""
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor
    from benchmarks import triton_matmul
    descs = [TensorDescriptor.from_tensor(t, blk) for t, blk in ((a, [128, 64]), (b, [256, 64]), (c, [128, 256]))]
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    tiles = triton.cdiv(m, 128) * triton.cdiv(n, 256)
    triton_matmul._matmul_persistent.fn[(min(132, tiles),)](*descs, m, n, k, BM=128, BN=256, BK=64, GROUP_M=8,
                                                             NUM_SMS=132, num_stages=3, num_warps=8)


def _param(src, name: str, **changes):
    """``src`` with parameter ``name`` changed (a tensor map's box or swizzle)."""
    return dataclasses.replace(src, params=tuple(dataclasses.replace(q, **changes) if q.name == name else q
                                                 for q in src.params))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--cpu", action="store_true", help="only generate and compile the variants (no GPU)")
    p.add_argument("--sustain", type=float, default=0.0,
                   help="also run some implementations alone for this many seconds each at 8192^3, "
                        "sampling SM clock and power")
    p.add_argument("--cluster", action="store_true",
                   help="also the cluster variants (experimental: see CLUSTER_VARIANTS)")
    p.add_argument("--once", help="launch these variants (comma-separated) once each at 8192^3 and stop (for ncu)")
    a = p.parse_args(argv)
    from cbrules import api
    from cbrules.codegen.launch import CompiledKernel
    from cbrules.codegen.nvrtc import compile_cuda
    from cbrules.kernels.matmul_tc import matmul_tc
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ws = {"stages": 4, "warp_specialize": True, "registers": (40, 232)}
    dense = {"store_swizzle": False}  # the variants below edit the dense-staging kernel (the default until 2026-11-30)
    base = api.generate(matmul_tc(**ws, **dense))
    sources = {}
    for name, edit in {**VARIANTS, **(CLUSTER_VARIANTS if a.cluster else {})}.items():
        src = base if edit is None else dataclasses.replace(base, text=edit(base.text))
        if name == "cluster2":  # each block loads 128 of the tile's 256 B rows
            src = _param(src, "b_tmap", box=(128, 64))
        if name == "swizzled-store":
            src = _param(src, "c_tmap", swizzle="128B")
        sources[name] = src
    sources["persistent"] = api.generate(matmul_tc(**ws, **dense, persistent=132))
    sources["group16"] = api.generate(matmul_tc(**ws, **dense, group_m=16))
    sources["store-swizzle"] = api.generate(matmul_tc(**ws, store_swizzle=True))
    sources["store-swizzle-group16"] = api.generate(matmul_tc(**ws, store_swizzle=True, group_m=16))
    if a.cluster:
        g16 = sources["group16"]
        sources["cluster2-group16"] = _param(dataclasses.replace(g16, text=cluster2(g16.text)), "b_tmap", box=(128, 64))
    ps = sources["persistent"]
    sources["persistent-swizzled"] = _param(dataclasses.replace(ps, text=swizzled_store(ps.text.replace("_11", "_10"))),
                                            "c_tmap", swizzle="128B")
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
            if name == "cublas":
                torch.matmul(x, x.T, out=c)
            elif name == "triton":  # the autotuner's pick at 8192^3, without the autotuning launches
                _triton_fixed(x, x, c)
            else:
                compiled[name].bind(a=x, b=x, c=c).launch()
        torch.cuda.synchronize()
        return 0
    from benchmarks.matmul_tc import probe_rows, time_shape, write_rows
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                            "--format=csv", "-lms", "250"], stdout=open(out / "smi.csv", "w"),
                           stderr=subprocess.DEVNULL)
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in ((8192, 8192, 8192), (8192, 8192, 1024)):
        names = list(compiled) if k == 8192 else [n for n in ("default", "swizzled-store", "store-swizzle",
                                                              "store-swizzle-group16", "persistent",
                                                              "persistent-swizzled", "cluster2") if n in compiled]
        secs, errs, tol, _ = time_shape(torch, gen, (m, n, k), {name: compiled[name] for name in names}, a.rounds)
        rows += probe_rows((m, n, k), secs, errs, tol, lambda name: name in COMPUTES + ("cublas", "triton"))
    smi.terminate()
    if a.sustain:
        rows += _sustain(compiled, a.sustain)
    write_rows(out / "profile.json", rows, a.rounds, torch.cuda.get_device_name())
    return 0


if __name__ == "__main__":
    sys.exit(main())
