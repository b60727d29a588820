"""Which lever closes matmul_tc's gap to the Triton peer: hand-edited variants of the generated CUDA
(each edit checked to apply exactly once, benchmarks/cuda_edit.py), timed in interleaved rounds beside
cuBLAS and the Triton peer at the three benchmark shapes:

    python3 benchmarks/pingpong_probe.py --out DIR [--rounds 7] [--cpu] [--cluster | --pp128]

Variants (see main): ``coop`` (the cooperative 128x256 tile of two consumer warp groups, group_m 16) and
``coop-pers`` (the same, persistent: one block an SM); ``coop-pers-noepi`` (no epilogue at all: the upper
bound of hiding it); ``*-pack32`` (the staging of C two columns a 32-bit shared store instead of one
16-bit store an element); ``pingpong`` (persistent; each of the two consumer warp groups owns whole
64x256 tiles, taking every other tile of the block's walk; an ordering barrier pair hands the tensor
core from one to the other after its last wgmma is issued, so one group's epilogue runs under the other's
mainloop); ``coop-pers-nowait`` / ``-nostore`` / ``-nowrite`` (the epilogue taken apart) and
``*-wgstore`` (each consumer warp group stores its own 64 rows); ``coop-g8`` / ``-g32`` and
``coop-pers-g8`` / ``-g32``: other raster group heights. With ``--cluster``, only ``coop``,
``coop-cluster2`` (benchmarks/profile_tc.py's cluster2 edit) and ``coop-cluster-arrive`` (the same
without the multicast). With ``--pp128``, only ``coop``, ``coop-pers`` and 128x128 tiles: ``coop128-pers``
(cooperative: two consumer warp groups of 64x128), ``one128-pers`` (one consumer warp group of 128x128:
two m64n128k16 wgmma a k step, 128 accumulators a thread) and ``pingpong128`` / ``pingpong128-s5``
(the latter made ping-pong as above, 4 / 5 stages of 32 KiB beside two 32 KiB staging regions), and
``pingpong`` beside ``pingpong-c7514`` (the 64x256 ping-pong as run1-run3 ran it: ptxas serialized its
wgmma, see pingpong's ``warp_wait``). The variants in TIMING_ONLY do not compute c; every other one is
checked against a float32 product. Figures: benchmarks/results/matmul_tc/s5_levers/ and the README.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import cuda_edit  # noqa: E402

TIMING_ONLY = ("noepi", "nowait", "nostore", "nowrite")  # variants that do not compute c
SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024))
PP_HELPERS = r'''
// the consumer warp group's own elected thread (cb_elect_one elects in warp 0 only)
__device__ __forceinline__ bool cb_elect_wg() { return threadIdx.x % 128 < 32 && cb_elect_sync(); }
__device__ __forceinline__ void cb_bar_arrive(unsigned id, unsigned count) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(count) : "memory");
}
'''


def _sub(text: str, old: str, new: str, count: int = 1) -> str:
    return cuda_edit.sub(text, old, new, count, who="pingpong_probe")


def no_epilogue(t: str) -> str:
    """The persistent kernel without staging or store; the accumulators kept live (M < 0 never holds)."""
    return cuda_edit.between(t, "      #pragma unroll\n      for (int acc_q", "        }\n      }\n",
                             "      if (M < 0) {\n        #pragma unroll\n        for (int i = 0; i < 128; ++i) "
                             "c[threadIdx.x * 128 + i] = acc[i];\n      }\n")


def pack32(t: str) -> str:
    """Stage two neighbouring columns (even fragment element r and r + 1) as one 32-bit shared store:
    the swizzle moves 16-byte chunks, so the pair stays adjacent."""
    j = t.index("] = v0;\n") + len("] = v0;\n")
    i = t.rindex("\n", 0, j - 1) + 1
    line = t[i:j]
    pad = line[:len(line) - len(line.lstrip())]
    if not line.lstrip().startswith("cb_stage_") or t.count("] = v0;\n") != 1:
        raise SystemExit(f"pingpong_probe: no single staging store in the generated CUDA: {line!r}")
    new = (f"{pad}if (acc_r % 2 == 0) {{\n{pad}  const cb_bf16 lo(v0), hi(acc[acc_j * 128 + (acc_q * 32 + acc_r) + 1]);\n"
           f"{pad}  *reinterpret_cast<unsigned*>(&{line.strip()[:-len(' = v0;')]}) = "
           f"(unsigned)lo.bits | (unsigned)hi.bits << 16;\n{pad}}}\n")
    return t[:i] + new + t[j:]


def _store_line(t: str) -> tuple[int, int]:
    i = t.index("cb_tma_store_async(&c_tmap, cb_smem_addr(cb_stage_")
    return i, t.index(";\n", i) + 2


def no_wait(t: str) -> str:
    """Timing only (racy): the elected thread no longer waits for the last store to have read its slot."""
    return _sub(t, "          cb_bulk_wait_read<0>();\n", "")


def no_store(t: str) -> str:
    """Timing only: the staging is written, fenced and synchronised, but no TMA store reads it."""
    i, j = _store_line(t)
    return t[:i] + ";\n" + t[j:]


def no_write(t: str) -> str:
    """Timing only: the TMA stores and their waits, but no staging writes (accumulators kept live)."""
    j = t.index("] = v0;\n") + len("] = v0;\n")
    i = t.rindex("\n", 0, j - 1) + 1
    pad = t[i:j][:len(t[i:j]) - len(t[i:j].lstrip())]
    return t[:i] + f"{pad}if (M < 0) c[threadIdx.x] = v0;\n" + t[j:]


def wg_store(t: str) -> str:
    """Each consumer warp group stores its own 64 rows of a column chunk: its own elected thread waits
    for its own stores, and a named barrier of its 128 threads (not of both groups) orders the
    staging writes before the store, so the groups no longer wait for each other in the epilogue
    (the c map's box becomes 64 x 64)."""
    t = _sub(t, "__device__ __forceinline__ bool cb_elect_one()", PP_HELPERS + "__device__ __forceinline__ bool cb_elect_one()")
    i, j = _store_line(t)
    line = t[i:j]
    line = cuda_edit.sub(line, "acc_q % 2 * 8192)", "acc_q % 2 * 8192 + (int)threadIdx.x / 128 * 4096)", who="wg_store")
    line = line[:-3] + " + (int)threadIdx.x / 128 * 64);\n"
    t = t[:i] + line + t[j:]
    t = _sub(t, "cb_bar_sync(2, 256);\n", "cb_bar_sync(5 + (int)threadIdx.x / 128, 128);\n")
    t, n = re.subn(r"if \(cb_elect_one\(\)\) \{(\n\s*cb_(?:bulk_wait|tma_store_async))", r"if (cb_elect_wg()) {\1", t)
    if n != 3:
        raise SystemExit(f"pingpong_probe: wg_store found {n} elected store waits / stores, expected 3")
    return t


def _one(t: str, pattern: str, new: str, who: str = "pingpong") -> str:
    """``t`` with the one match of regex ``pattern`` replaced by ``new`` (exits unless exactly one)."""
    t, n = re.subn(pattern, new, t)
    if n != 1:
        raise SystemExit(f"pingpong_probe: {who}: expected 1 match of {pattern!r} in the generated CUDA, found {n}")
    return t


def pingpong(t: str, blocks: int, bm: int = 64, bn: int = 256, warp_wait: bool = True) -> str:
    """The one-warp-group bm x bn persistent kernel made ping-pong: two consumer warp groups, group w
    taking tiles blockIdx.x + (2j + w) * P of the walk the producer loads in order. Group w waits on
    named barrier 3 + w before its mainloop (not on the block's first tile) and arrives on the other's,
    4 - w, once its last wgmma of the tile is issued, if the walk has a next tile. The slot and parity of
    a k step stay those of the walk's running count, so the empty barriers count one group (128). Each
    group stages C in its own region (a second one after the first: the tiles move up by its size).
    ``warp_wait``: every lane of the group's first warp waits for its stores to have read the staging
    (lanes that issued none return at once); the group's elected thread alone waiting there, as in
    run1-run3, makes ptxas serialize every wgmma (C7514)."""
    p = str(blocks)
    t = _sub(t, "__device__ __forceinline__ bool cb_elect_one()", PP_HELPERS + "__device__ __forceinline__ bool cb_elect_one()")
    t = _sub(t, "__launch_bounds__(256, 1)", "__launch_bounds__(384, 1)")
    stage = int(re.search(r"cb_stage_11 = reinterpret_cast<cb_bf16\*>\(cb_smem \+ (\d+)\);", t).group(1))
    for tile in ("a_tile", "b_tile"):
        at = int(re.search(rf"{tile} = reinterpret_cast<cb_bf16\*>\(cb_smem \+ (\d+)\);", t).group(1))
        if tile == "a_tile":
            region = at - stage  # one group's staging bytes
        t = _sub(t, f"{tile} = reinterpret_cast<cb_bf16*>(cb_smem + {at});", f"{tile} = reinterpret_cast<cb_bf16*>(cb_smem + {at + region});")
    t = _sub(t, "if ((int)threadIdx.x < 128) {\n    asm volatile(\"setmaxnreg.inc",
             "if ((int)threadIdx.x < 256) {\n    const int cb_wg = (int)threadIdx.x / 128;\n    asm volatile(\"setmaxnreg.inc")
    t = _one(t, r"\n    for \(int cb_k = 0; cb_k < (\d+); cb_k \+= 1\) \{  // pre-prologue\n",
             r"\n    if (cb_wg == 0) for (int cb_k = 0; cb_k < \1; cb_k += 1) {  // pre-prologue\n")
    tiles = f"cb_ceil_div(M, {bm}) * cb_ceil_div(N, {bn})"
    t = _sub(t, f"    for (int tile = (int)blockIdx.x; tile < {tiles}; tile += {p}) {{\n      for (int t = 0; t < cb_ceil_div(K, 64); t += 1) {{  // consumer",
             f"    for (int tile = (int)blockIdx.x + cb_wg * {p}; tile < {tiles}; tile += 2 * {p}) {{\n"
             f"      if (tile != (int)blockIdx.x) cb_bar_sync(3 + cb_wg, 256);  // the tensor core's turn\n"
             f"      for (int t = 0; t < cb_ceil_div(K, 64); t += 1) {{  // consumer")
    t = _sub(t, "          cb_wgmma_wait<0>(); cb_fence_acc<128>(acc);\n          cb_mbar_arrive",
             f"          if (tile + {p} < {tiles}) cb_bar_arrive(4 - cb_wg, 256);  // hand it over\n"
             "          cb_wgmma_wait<0>(); cb_fence_acc<128>(acc);\n          cb_mbar_arrive")
    # the generated kernel offsets A and the staging rows by the group (threadIdx.x / 128): here each
    # group owns a whole tile, so both start at its row 0 and the staging at the group's own region
    t = _one(t, r" \+ \(\(int\)threadIdx\.x / 128\) \* \d+;", ";")
    t = _one(t, r"\(int\)threadIdx\.x / 128 \* \d+ \+ acc_j \* 64", "acc_j * 64")
    t = _one(t, r"(acc_q(?: % 2)? \* \d+)\] = v0;", rf"\1 + cb_wg * {region // 2}] = v0;")
    t = _one(t, r"cb_smem_addr\(cb_stage_11 \+ (acc_q(?: % 2)? \* \d+)\)", rf"cb_smem_addr(cb_stage_11 + \1 + cb_wg * {region // 2})")
    wait = ("        if ((int)threadIdx.x % 128 < 32) cb_bulk_wait_read<0>();\n" if warp_wait else
            "        if (cb_elect_wg()) {\n          cb_bulk_wait_read<0>();\n        }\n")
    t = _sub(t, "        if (cb_elect_one()) {\n          cb_bulk_wait_read<0>();\n        }\n        cb_bar_sync(2, 128);\n"
                "        if (cb_elect_one()) {\n          cb_tma_store_async",
             f"{wait}        cb_bar_sync(5 + cb_wg, 128);\n"
             "        if (cb_elect_wg()) {\n          cb_tma_store_async")
    t = _sub(t, "    if (cb_elect_one()) {\n      cb_bulk_wait<0>();\n    }\n    cb_bar_sync(2, 128);  // post-epilogue",
             "    if (cb_elect_wg()) {\n      cb_bulk_wait<0>();\n    }\n    cb_bar_sync(2, 256);  // post-epilogue")
    return _sub(t, "cb_elect_warp(4)", "cb_elect_warp(8)", count=2)


def cluster_arrive_only(t: str) -> str:
    """profile_tc's cluster2 without the multicast: each block loads all of its B tile itself, but the
    empty barriers still count the consumer warps of both blocks (remote arrivals) and the blocks
    sync as a cluster at start and end: which half of cluster2 hangs (it computes c)."""
    from benchmarks import profile_tc
    full = profile_tc.cluster2(t)
    i = full.index("        cb_tma_load_multicast(")
    j = full.index(";\n", i) + 2
    k = t.index("        cb_tma_load(cb_smem_addr(b_tile")
    return full[:i] + t[k:t.index(";\n", k) + 2] + full[j:]


def _box(src, box):
    """``src`` with the c map's box changed."""
    return dataclasses.replace(src, params=tuple(dataclasses.replace(q, box=box) if q.name == "c_tmap" else q
                                                 for q in src.params))


def _pingpong_source(one, blocks: int, bm: int, bn: int, warp_wait: bool = True):
    """The ping-pong KernelSource of ``one`` (one consumer warp group, persistent, bm x bn tiles): three
    warp groups, and a second staging region of C (the bytes between the first and the A tiles)."""
    at = int(re.search(r"a_tile = reinterpret_cast<cb_bf16\*>\(cb_smem \+ (\d+)\);", one.text).group(1))
    st = int(re.search(r"cb_stage_11 = reinterpret_cast<cb_bf16\*>\(cb_smem \+ (\d+)\);", one.text).group(1))
    return dataclasses.replace(one, text=pingpong(one.text, blocks, bm, bn, warp_wait), block=(384, 1, 1),
                               shared_bytes=one.shared_bytes + at - st)


def sources(blocks: int, cluster: bool = False, pp128: bool = False) -> dict:
    """name -> KernelSource of every variant (``cluster`` / ``pp128``: only those sets)."""
    from cbrules import api
    from cbrules.kernels.matmul_tc import matmul_tc
    ws = {"stages": 4, "warp_specialize": True, "registers": (40, 232)}
    edit = lambda src, f: dataclasses.replace(src, text=f(src.text))  # noqa: E731
    out = {"coop": api.generate(matmul_tc(**ws, group_m=16)),
           "coop-pers": api.generate(matmul_tc(**ws, group_m=16, persistent=blocks))}
    if pp128:  # 128x128 tiles: cooperative (two groups of 64x128), one group alone, ping-pong (4 and 5 stages)
        out["coop128-pers"] = api.generate(matmul_tc(**ws, bm=128, bn=128, group_m=16, persistent=blocks))
        out["one128-pers"] = api.generate(matmul_tc(**ws, bm=128, bn=128, groups=1, group_m=16, persistent=blocks))
        out["pingpong128"] = _pingpong_source(out["one128-pers"], blocks, 128, 128)
        one5 = api.generate(matmul_tc(**{**ws, "stages": 5}, bm=128, bn=128, groups=1, group_m=16, persistent=blocks))
        out["pingpong128-s5"] = _pingpong_source(one5, blocks, 128, 128)
        one64 = api.generate(matmul_tc(**ws, bm=64, groups=1, group_m=32, persistent=blocks))
        out["pingpong"] = _pingpong_source(one64, blocks, 64, 256)
        out["pingpong-c7514"] = _pingpong_source(one64, blocks, 64, 256, warp_wait=False)
        return out
    out["coop-pack32"] = edit(out["coop"], pack32)
    out["coop-pers-pack32"] = edit(out["coop-pers"], pack32)
    out["coop-pers-noepi"] = edit(out["coop-pers"], no_epilogue)
    out["coop-pers-nowait"] = edit(out["coop-pers"], no_wait)
    out["coop-pers-nostore"] = edit(out["coop-pers"], no_store)
    out["coop-pers-nowrite"] = edit(out["coop-pers"], no_write)
    for name in ("coop", "coop-pers"):
        out[f"{name}-wgstore"] = _box(edit(out[name], wg_store), (64, 64))
    for g in (8, 32):  # the raster group's height (tile rows), against 16 above
        out[f"coop-g{g}"] = api.generate(matmul_tc(**ws, group_m=g))
        out[f"coop-pers-g{g}"] = api.generate(matmul_tc(**ws, group_m=g, persistent=blocks))
    if cluster:  # two tile rows of a column share B: each block loads half and multicasts it to both
        from benchmarks import profile_tc
        cl = edit(out["coop"], profile_tc.cluster2)
        out["coop-cluster2"] = dataclasses.replace(cl, params=tuple(
            dataclasses.replace(q, box=(128, 64)) if q.name == "b_tmap" else q for q in cl.params))
        out["coop-cluster-arrive"] = edit(out["coop"], cluster_arrive_only)
        return {k: out[k] for k in ("coop", "coop-cluster-arrive", "coop-cluster2")}
    one = api.generate(matmul_tc(**ws, bm=64, groups=1, group_m=32, persistent=blocks))
    pp = _pingpong_source(one, blocks, 64, 256)
    out["pingpong"] = pp
    out["pingpong-pack32"] = edit(pp, pack32)
    return out


def main(argv=None) -> int:
    from benchmarks.matmul_tc import probe_parser
    p = probe_parser(__doc__.splitlines()[0])
    p.add_argument("--cluster", action="store_true", help="only coop and its cluster-of-two B-multicast variant "
                   "(profile_tc.cluster2; one such version hung once: run it alone, under a timeout)")
    p.add_argument("--pp128", action="store_true", help="only coop, coop-pers and the 128x128 set: the cooperative "
                   "and one-warp-group persistent kernels and the ping-pong made of the latter (4 and 5 stages)")
    a = p.parse_args(argv)
    from cbrules.codegen.launch import CompiledKernel
    from cbrules.codegen.nvrtc import compile_cuda
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    compiled = {}
    for name, src in sources(a.blocks, a.cluster, a.pp128).items():
        cubin = compile_cuda(src.text, src.name)
        r = cubin.resources
        serial = ", wgmma serialized (C7514)" if "C7514" in cubin.log else ""
        print(f"{name}: {r.registers} registers, spills {r.spill_stores}/{r.spill_loads}{serial}", flush=True)
        compiled[name] = CompiledKernel(src, cubin)
        if name.startswith("pingpong"):
            (out / f"{name}.cu").write_text(src.text)
    if a.cpu:
        return 0
    import torch
    from benchmarks.matmul_tc import probe_rows, time_shape, write_rows
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in SHAPES:
        secs, errs, tol, _ = time_shape(torch, gen, shape, compiled, a.rounds, report=True)
        rows += probe_rows(shape, secs, errs, tol, lambda name: not any(w in name for w in TIMING_ONLY))
    write_rows(out / "probe.json", rows, a.rounds, torch.cuda.get_device_name())
    return 0


if __name__ == "__main__":
    sys.exit(main())
