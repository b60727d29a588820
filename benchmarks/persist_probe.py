"""Why is the persistent matmul_tc's mainloop slower than the one-block-a-tile kernel's at 8192^3
(issue 13)? Hand edits of the generated CUDA (benchmarks/cuda_edit.py: each edit insists on finding
what it replaces), run beside cuBLAS and the Triton peer:

    python3 benchmarks/persist_probe.py --out DIR [--rounds 7]       # interleaved timing, 3 shapes
    python3 benchmarks/persist_probe.py --out DIR --timeline         # per-tile timestamps
    python3 benchmarks/persist_probe.py --out DIR --once coop,triton # one launch each (for ncu)
    python3 benchmarks/persist_probe.py --out DIR --only NAME --check # NAME's first launches, checked
    python3 benchmarks/persist_probe.py --out DIR --cpu              # compile only (no GPU)

Variants (see sources): ``coop`` (today's default: one block a 128x256 tile, group_m 8) and ``coop-pers``
(the same, persistent: 132 blocks, block b takes tiles b, b + 132, ...); ``coop-pers-ctr`` (persistent, the
slot and parity of a k step from a running tile count instead of ``(tile - blockIdx.x) / 132``: the per-step
arithmetic alone); ``coop-pers-dyn`` (persistent with a dynamic tile scheduler: after its first tile, a
block's producer warp takes the next tile from a global counter (atomicAdd) and hands its index to the
consumers through shared memory beside the slot's full barrier, so tiles start in index order on whichever
block is free, as the hardware scheduler hands out the one-block-a-tile kernel's blocks; the last block to
run out resets the counter; producer warps 9-11 return at once); ``coop-pers-pairA`` / ``-apart`` (static,
block b starting at tile pi(b), PERMUTATIONS: the two blocks of a TPC take tiles of one A panel / of no
common panel); ``coop-pers-exit`` (static; the producer warps that issue no load return before the tile
walk) and ``coop-pers-ctr-exit`` (the same with running counts); ``coop-pers-dynstatic`` (the dynamic
scheduler's code taking the static order); ``*-stm`` (the epilogue staged by stmatrix). ``*-tl`` are the
same kernels recording, for every tile, its SM, the global time at its start and end, and SM clocks at its
start, at its first full slot, at the end of its mainloop and at the end of its epilogue (``--timeline``
writes them to DIR/timeline.npz and summarises them). Every variant computes c and is checked against a
float32 product. Figures and the verdict (the idle producer warps' walk is what slows the persistent
mainloop): benchmarks/results/matmul_tc/s6/.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import cuda_edit  # noqa: E402

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024))
MAX_TILES = 2048  # the timeline's record count (tiles of the largest benchmark shape)
REC = 8  # u64 a tile record: smid, global start, global end, clock start, first full, mainloop end, end, block
TL_HELPERS = r'''
__device__ unsigned long long cb_tl[%d * %d];  // per-tile timeline records (persist_probe --timeline)
__device__ __forceinline__ unsigned long long cb_gtime() {
  unsigned long long t; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t)); return t;
}
__device__ __forceinline__ unsigned cb_smid() { unsigned s; asm volatile("mov.u32 %%0, %%%%smid;" : "=r"(s)); return s; }
''' % (MAX_TILES, REC)
DYN_HELPERS = r'''
__device__ int cb_sched[2];  // the next tile past the first wave, and the blocks that ran out (reset by the last)
// the producer warp's next tile (every lane gets it): past the first wave of `blocks` tiles, in index order
__device__ __forceinline__ int cb_fetch_tile(int blocks, int tiles) {
  int v = 0;
  if (threadIdx.x % 32 == 0) {
    v = blocks + atomicAdd(&cb_sched[0], 1);
    if (v >= tiles && atomicAdd(&cb_sched[1], 1) == (int)gridDim.x - 1) {  // every block has run out
      atomicExch(&cb_sched[0], 0);
      atomicExch(&cb_sched[1], 0);
    }
  }
  return __shfl_sync(0xffffffffu, v, 0);
}
'''


def _sub(t: str, old: str, new: str, count: int = 1) -> str:
    return cuda_edit.sub(t, old, new, count, who="persist_probe")


def _resub(t: str, pattern: str, new: str, count: int = 1) -> str:
    return cuda_edit.resub(t, pattern, new, count, who="persist_probe")


def _names(t: str) -> dict:
    """The generated names this probe edits around: the barriers, the tile count, the persistent stride."""
    full = re.search(r"cb_full_\d+", t).group(0)
    empty = re.search(r"cb_empty_\d+", t).group(0)
    out = {"full": full, "empty": empty}
    m = re.search(r"for \(int tile = \(int\)blockIdx\.x; tile < (.+?); tile \+= (\d+)\) \{", t)
    if m:
        out["tiles"], out["stride"] = m.group(1), m.group(2)
    return out


def timeline(t: str) -> str:
    """Record each tile's timeline (TL_HELPERS' cb_tl, indexed by tile) from the first consumer warp's
    elected thread; the records are written after the tile's last store is issued."""
    persistent = "for (int tile = " in t
    t = _sub(t, "__device__ __forceinline__ bool cb_elect_one()", TL_HELPERS + "__device__ __forceinline__ bool cb_elect_one()")
    t = _sub(t, "  extern __shared__ __align__(1024) unsigned char cb_smem[];\n",
             "  extern __shared__ __align__(1024) unsigned char cb_smem[];\n"
             "  unsigned long long cb_g0 = cb_gtime(); long long cb_c0 = clock64(), cb_c1 = 0, cb_c2 = 0;\n")
    full = _names(t)["full"]
    # the consumer's wait for a full slot (the producer waits on the empty barriers)
    t = _resub(t, r"(\n(\s*)cb_mbar_wait\(cb_smem_addr\(&" + full + r"\[[^\n]*\n)", r"\1\2if (t == 0) cb_c1 = clock64();\n")
    t = _resub(t, r"\n(\s*)cb_wgmma_wait<0>\(\); cb_fence_acc<128>\(acc\);\n(?=\s*(?:cb_bar_sync\(2, 256\);  // post-epilogue|#pragma unroll))",
               r"\n\1cb_wgmma_wait<0>(); cb_fence_acc<128>(acc);\n\1cb_c2 = clock64();\n")
    tile = "tile" if persistent else "(int)blockIdx.x"
    record = ("{pad}if (cb_elect_one()) {{  // the tile's timeline record\n"
              f"{{pad}}  unsigned long long* cb_r = cb_tl + (long long)({tile}) * {REC};\n"
              "{pad}  cb_r[0] = cb_smid(); cb_r[1] = cb_g0; cb_r[2] = cb_gtime(); cb_r[3] = cb_c0; cb_r[4] = cb_c1;\n"
              "{pad}  cb_r[5] = cb_c2; cb_r[6] = clock64(); cb_r[7] = blockIdx.x;\n"
              "{pad}}}\n{pad}cb_g0 = cb_gtime(); cb_c0 = clock64();\n")
    if persistent:  # before the accumulators are zeroed for the next tile
        anchor = "      #pragma unroll\n      for (int acc_zero = 0; acc_zero < 128; acc_zero += 1) {\n        acc[acc_zero] = 0.0f;\n      }\n    }\n"
        return _sub(t, anchor, record.format(pad="      ") + anchor)
    anchor = "    if (cb_elect_one()) {\n      cb_bulk_wait<0>();\n    }\n  } else {"
    return _sub(t, anchor, record.format(pad="    ") + anchor)


def _running_count(t: str, stride: str) -> str:
    """Both roles count their tiles (cb_j) instead of deriving the count from the tile index: every
    slot and parity of the consumer (5) and the producer (8: its wait, its expect-tx, two a load)."""
    return _sub(t, f"((tile - (int)blockIdx.x) / {stride} * ", "(cb_j * ", count=13)


def counters(t: str) -> str:
    """The persistent kernel with the slot / parity of a k step from a running tile count (cb_j)."""
    n = _names(t)
    head = f"for (int tile = (int)blockIdx.x; tile < {n['tiles']}; tile += {n['stride']}) {{"
    t = _sub(t, head, f"for (int tile = (int)blockIdx.x, cb_j = 0; tile < {n['tiles']}; tile += {n['stride']}, cb_j += 1) {{", count=2)
    return _running_count(t, n["stride"])


def dynamic(t: str) -> str:
    """The persistent kernel with a dynamic tile scheduler (see the module docstring). The producer
    warp writes a tile's index into cb_tile_of[slot] (64 bytes past the barriers, in the block's
    unused shared bytes before the staging) before the arrive on the full barrier of the tile's first
    k step; the consumers read it after that barrier's wait. Past the last tile the producer hands an
    end mark (the tile count) through the next slot with a plain arrive."""
    n = _names(t)
    tiles, stride, full, empty = n["tiles"], n["stride"], n["full"], n["empty"]
    kt = "cb_ceil_div(K, 64)"
    t = _sub(t, "__device__ __forceinline__ bool cb_elect_one()", DYN_HELPERS + "__device__ __forceinline__ bool cb_elect_one()")
    t = _sub(t, "  float v0 = 0;\n", "  volatile int* cb_tile_of = reinterpret_cast<volatile int*>(cb_smem + 64);\n  float v0 = 0;\n")
    t = _running_count(t, stride)
    head = f"    for (int tile = (int)blockIdx.x; tile < {tiles}; tile += {stride}) {{\n"
    consumer = (f"    int cb_j = 0;\n    for (int tile = (int)blockIdx.x; tile < {tiles}; "
                f"tile = cb_next_tile(cb_smem_addr(&{full}[((cb_j + 1) * {kt}) % 4]), ((cb_j + 1) * {kt}) / 4 % 2, "
                f"cb_tile_of[((cb_j + 1) * {kt}) % 4]), cb_j += 1) {{\n")
    producer = (f"    if ((int)threadIdx.x / 32 != 8) return;  // warp 8 alone takes tiles and loads them\n"
                f"    for (int tile = (int)blockIdx.x, cb_j = 0; ; tile = cb_fetch_tile({stride}, {tiles}), cb_j += 1) {{\n"
                f"      if (tile >= {tiles}) {{  // the end mark, through the next tile's first slot\n"
                f"        if (cb_elect_warp(8)) {{\n"
                f"          cb_mbar_wait(cb_smem_addr(&{empty}[(cb_j * {kt}) % 4]), (cb_j * {kt}) / 4 % 2);\n"
                f"          cb_tile_of[(cb_j * {kt}) % 4] = {tiles};\n"
                f"          cb_mbar_arrive(cb_smem_addr(&{full}[(cb_j * {kt}) % 4]));\n"
                f"        }}\n        break;\n      }}\n")
    i = t.index(head)
    j = t.index(head, i + 1)
    t = t[:i] + consumer + t[i + len(head):j] + producer + t[j + len(head):]
    t = _sub(t, f"        if (cb_elect_warp(8)) {{\n          cb_mbar_arrive_expect_tx(cb_smem_addr(&{full}[(cb_j * {kt} + t) % 4]), ",
             f"        if (cb_elect_warp(8)) {{\n          if (t == 0) cb_tile_of[(cb_j * {kt}) % 4] = tile;\n"
             f"          cb_mbar_arrive_expect_tx(cb_smem_addr(&{full}[(cb_j * {kt} + t) % 4]), ")
    # the consumers' next tile: wait for the full barrier of its first k step, then read its index
    helper = ("__device__ __forceinline__ int cb_next_tile(unsigned bar, unsigned parity, volatile int& tile_of) {\n"
              "  cb_mbar_wait(bar, parity);\n  return tile_of;\n}\n")
    return _sub(t, "__device__ __forceinline__ bool cb_elect_one()", helper + "__device__ __forceinline__ bool cb_elect_one()")


STM_HELPERS = r'''
__device__ __forceinline__ unsigned cb_pack_bf16x2(float lo, float hi) {  // lo at the lower address
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
// four 8x8 matrices of 16-bit elements from the mma fragment layout; lane l gives row l % 8 of matrix l / 8
__device__ __forceinline__ void cb_stmatrix_x4(unsigned addr, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
               :: "r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
'''
# TPC siblings (blocks 2k, 2k + 1: the H200 placed them on SMs 2m, 2m + 1 in run1's timelines) take
# tiles of one A panel (tiles 8 apart in a group of 8 tile rows) / of no common panel
PERMUTATIONS = {"pairA": "(b < 128 ? b / 16 * 16 + b % 2 * 8 + b % 16 / 2 : b)", "apart": "(b % 2 * 66 + b / 2)"}


def static_map(t: str, which: str) -> str:
    """The persistent kernel with block b starting at tile pi(b) (PERMUTATIONS[which], a permutation
    of 0..131) instead of b: every wave is still tiles 132 j .. 132 j + 131, placed differently on the SMs."""
    n = _names(t)
    if n["stride"] != "132":
        raise SystemExit("persist_probe: the permutations are of 132 blocks")
    t = _sub(t, "  float v0 = 0;\n", f"  float v0 = 0;\n  const int cb_pi = [](int b) {{ return {PERMUTATIONS[which]}; }}((int)blockIdx.x);\n")
    t = _sub(t, f"for (int tile = (int)blockIdx.x; tile < {n['tiles']};", f"for (int tile = cb_pi; tile < {n['tiles']};", count=2)
    return _sub(t, "((tile - (int)blockIdx.x) / 132 * ", "((tile - cb_pi) / 132 * ", count=13)


def stmatrix(t: str) -> str:
    """The epilogue's staging written with stmatrix (four 8x8 bf16 matrices a thread instruction: 4 an
    accumulator chunk of 64 columns instead of 32 16-bit stores), into the same 128-byte-swizzled rows."""
    stage = re.search(r"cb_stage_\d+", t).group(0)
    t = _sub(t, "__device__ __forceinline__ bool cb_elect_one()", STM_HELPERS + "__device__ __forceinline__ bool cb_elect_one()")
    i = t.index("for (int acc_j = 0; acc_j < 1; acc_j += 1) {")
    i = t.rindex("#pragma unroll", 0, i)
    i = t.rindex("\n", 0, i) + 1
    pad = t[i:t.index("#", i)]
    j = t.rindex("\n", 0, t.index("cb_fence_proxy_async();", i)) + 1
    new = (f"{pad}{{ const int cb_m = (int)threadIdx.x % 32 / 8;  // this lane's matrix: row half, column block\n"
           f"{pad}  const int cb_row = (int)threadIdx.x / 128 * 64 + (int)threadIdx.x / 32 % 4 * 16 + cb_m % 2 * 8"
           " + (int)threadIdx.x % 8;\n"
           f"{pad}  #pragma unroll\n{pad}  for (int cb_p = 0; cb_p < 4; cb_p += 1) {{  // column blocks 2p, 2p + 1 of 8\n"
           f"{pad}    const float* cb_e = acc + acc_q * 32 + cb_p * 8;\n"
           f"{pad}    cb_stmatrix_x4(cb_smem_addr({stage} + acc_q % 2 * 8192) + cb_row * 128"
           " + (((2 * cb_p + cb_m / 2) ^ (cb_row % 8)) * 16),\n"
           f"{pad}                   cb_pack_bf16x2(cb_e[0], cb_e[1]), cb_pack_bf16x2(cb_e[2], cb_e[3]),"
           " cb_pack_bf16x2(cb_e[4], cb_e[5]), cb_pack_bf16x2(cb_e[6], cb_e[7]));\n"
           f"{pad}  }}\n{pad}}}\n")
    return t[:i] + new + t[j:]


def producer_exit(t: str) -> str:
    """The static persistent kernel whose producer warps other than warp 8 (which issues every load)
    return before the tile loop instead of running through it without work, as coop-pers-dyn's do."""
    n = _names(t)
    head = f"    for (int tile = (int)blockIdx.x; tile < {n['tiles']}; tile += {n['stride']}) {{\n      for (int t = 0; t < cb_ceil_div(K, 64); t += 1) {{  // producer\n"
    return _sub(t, head, "    if ((int)threadIdx.x / 32 != 8) return;  // warp 8 alone loads\n" + head)


def dynamic_static_order(t: str) -> str:
    """coop-pers-dyn's code (tile index handed through shared memory, one producer warp, end mark)
    taking the static order: block b's next tile is its last plus the stride, no atomic counter."""
    n = _names(t)
    return _sub(dynamic(t), f"tile = cb_fetch_tile({n['stride']}, {n['tiles']})", f"tile = tile + {n['stride']}")


def measured_rules():
    """The shipped rules as this probe measured them, before rule cb-ws-producer-warp (which came of its
    -exit variant): that rule disabled from a rule folder of one line, so that all four producer warps
    walk the producer's loops again."""
    import tempfile
    from cbrules import api
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "before_producer_warp.rules").write_text("(disable cb-ws-producer-warp)\n")
        return api.load_rules([folder])


def sources(blocks: int) -> dict:
    """name -> KernelSource of every variant (coop and coop-pers as measured, see measured_rules; the
    -rule ones as today's rules write them)."""
    from cbrules import api
    from cbrules.kernels.matmul_tc import matmul_tc
    ws = {"stages": 4, "warp_specialize": True, "registers": (40, 232)}
    edit = lambda src, f: dataclasses.replace(src, text=f(src.text))  # noqa: E731
    out = {}
    for suffix, rules in (("", measured_rules()), ("-rule", None)):
        out[f"coop{suffix}"] = api.generate(matmul_tc(**ws), rules=rules)
        out[f"coop-pers{suffix}"] = api.generate(matmul_tc(**ws, persistent=blocks), rules=rules)
    out["coop-pers-ctr"] = edit(out["coop-pers"], counters)
    out["coop-pers-dyn"] = edit(out["coop-pers"], dynamic)
    out["coop-pers-exit"] = edit(out["coop-pers"], producer_exit)
    out["coop-pers-dynstatic"] = edit(out["coop-pers"], dynamic_static_order)
    out["coop-pers-ctr-exit"] = edit(out["coop-pers-exit"], counters)
    for which in PERMUTATIONS:
        out[f"coop-pers-{which}"] = edit(out["coop-pers"], lambda t: static_map(t, which))
    for name in ("coop", "coop-pers", "coop-pers-dyn", "coop-pers-pairA"):
        out[f"{name}-stm"] = edit(out[name], stmatrix)
    for name in ("coop", "coop-pers", "coop-pers-dyn", "coop-pers-pairA", "coop-pers-apart", "coop-pers-exit",
                 "coop-pers-dynstatic", "coop-pers-ctr-exit", "coop-rule", "coop-pers-rule"):
        out[f"{name}-tl"] = edit(out[name], timeline)
    return out


def read_timeline(ck, tiles: int):
    """The (tiles, REC) uint64 records of ``ck``'s last launch (its module's cb_tl)."""
    import numpy as np
    from cuda.bindings import driver as cu
    err, ptr, size = cu.cuModuleGetGlobal(ck._module.handle, b"cb_tl")
    assert err == cu.CUresult.CUDA_SUCCESS, err
    host = np.zeros(MAX_TILES * REC, dtype=np.uint64)
    (err,) = cu.cuMemcpyDtoH(host.ctypes.data, ptr, size)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return host.reshape(MAX_TILES, REC)[:tiles]


def summarise(rec, shape: tuple, bm: int = 128, bn: int = 256, bk: int = 64, group_m: int = 8) -> dict:
    """What a timeline says: the kernel's span, per-tile clock-cycle phases (wait for the first full
    slot, mainloop a k step, epilogue), the SM clock, how unevenly the SMs finish, and how many A / B
    panels the tiles running at once touch (the L2 working set)."""
    import numpy as np
    m, n, k = shape
    r = rec.astype(np.float64)
    g_start, g_end = r[:, 1], r[:, 2]
    t0 = g_start.min()
    steps = -(-k // bk)
    wait = r[:, 4] - r[:, 3]
    main = (r[:, 5] - r[:, 4]) / steps
    epi = r[:, 6] - r[:, 5]
    mhz = (r[:, 6] - r[:, 3]) / np.maximum(g_end - g_start, 1) * 1e3
    per_sm_end = {}
    for sm, e in zip(rec[:, 0], g_end):
        per_sm_end[int(sm)] = max(per_sm_end.get(int(sm), 0), e)
    ends = np.array(sorted(per_sm_end.values()))
    tiles_n = -(-n // bn)
    tiles_m = -(-m // bm)
    tile = np.arange(len(rec))
    per_group = tiles_n * group_m
    first = tile // per_group * group_m
    rows = np.minimum(tiles_m - first, group_m)
    tm = first + tile % per_group % rows
    tn = tile % per_group // rows
    panels, spans = [], []
    for frac in np.linspace(0.1, 0.9, 9):  # the tiles running at a few moments
        at = t0 + frac * (g_end.max() - t0)
        live = (g_start <= at) & (g_end > at)
        panels.append((len(set(tm[live])), len(set(tn[live]))))
        spans.append(int(tile[live].max() - tile[live].min()) if live.any() else 0)
    q = lambda a: [round(float(x), 1) for x in np.percentile(a, (10, 50, 90))]  # noqa: E731
    sms = rec[:, 0].astype(int)
    per_sm_main = [main[sms == sm].mean() for sm in set(sms)]
    per_sm_tiles = [int((sms == sm).sum()) for sm in set(sms)]
    return {"shape": list(shape), "span_us": round((g_end.max() - t0) / 1e3, 1),
            "sm_finish_spread_us": round((ends[-1] - ends[0]) / 1e3, 1), "sms": len(ends),
            "first_full_wait_cycles_p10_50_90": q(wait), "mainloop_cycles_a_kstep_p10_50_90": q(main),
            "epilogue_cycles_p10_50_90": q(epi), "sm_mhz_p10_50_90": q(mhz),
            "per_sm_mean_mainloop_a_kstep_p10_50_90": q(per_sm_main), "tiles_an_sm_min_max": [min(per_sm_tiles), max(per_sm_tiles)],
            "live_A_B_panels": panels, "live_tile_index_span": spans}


def main(argv=None) -> int:
    from benchmarks.matmul_tc import probe_parser
    p = probe_parser(__doc__.splitlines()[0])
    p.add_argument("--timeline", action="store_true", help="run the *-tl variants and write their per-tile records")
    p.add_argument("--once", help="launch these (comma-separated; 'triton': the autotuner's 128x256x64 S=3 pick) "
                   "once each at 8192^3, then once each at 8192x8192x1024, and stop (for ncu)")
    p.add_argument("--only", help="only these variants (comma-separated; timing, --timeline, --check)")
    p.add_argument("--check", action="store_true", help="launch the --only variants once at each shape, check c, stop")
    a = p.parse_args(argv)
    from cbrules.codegen.launch import CompiledKernel
    from cbrules.codegen.nvrtc import compile_cuda
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    srcs = sources(a.blocks)
    only = a.only.split(",") if a.only else None
    want = (a.once.split(",") if a.once else [n for n in srcs if n.endswith("-tl") and (not only or n in only)]
            if a.timeline else only if only else list(srcs) if a.cpu else [n for n in srcs if not n.endswith("-tl")])
    compiled = {}
    for name in [w for w in want if w in srcs]:
        src = srcs[name]
        cubin = compile_cuda(src.text, src.name)
        r = cubin.resources
        serial = ", wgmma serialized (C7514)" if "C7514" in cubin.log else ""
        print(f"{name}: {r.registers} registers, spills {r.spill_stores}/{r.spill_loads}{serial}", flush=True)
        compiled[name] = CompiledKernel(src, cubin)
        if a.cpu:
            (out / f"{name}.cu").write_text(src.text)
            (out / f"{name}.cubin").write_bytes(cubin.cubin)
    if a.cpu:
        return 0
    import torch
    if a.once:
        from benchmarks.profile_tc import _triton_fixed
        for m, n, k in SHAPES[1:]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            for name in want:
                _triton_fixed(x, w, c) if name == "triton" else compiled[name].bind(a=x, b=w, c=c).launch()
            torch.cuda.synchronize()
        return 0
    from benchmarks.matmul_tc import probe_rows, time_shape, write_rows
    gen = torch.Generator(device="cuda").manual_seed(0)
    if a.check:  # a new variant's first launches, before anything is timed (a hang stops here)
        bad = 0
        for m, n, k in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            ref = x.float() @ w.float().T
            for name, ck in compiled.items():
                for _ in range(2):  # twice: the dynamic scheduler's counter must have reset
                    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    ck.bind(a=x, b=w, c=c).launch()
                    torch.cuda.synchronize()
                    err = (c.float() - ref).abs().max().item()
                    ok = err <= 2e-2 * ref.abs().max().item()
                    bad += not ok
                    print(f"check {m}x{n}x{k} {name}: max abs err {err:.3g} {'ok' if ok else 'WRONG'}", flush=True)
        return 1 if bad else 0
    if a.timeline:
        import numpy as np
        summary, records = [], {}
        for shape in SHAPES[1:]:
            secs, errs, tol, _ = time_shape(torch, gen, shape, compiled, 3)
            probe_rows(shape, secs, errs, tol, lambda name: True)
            m, n, k = shape
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            tiles = -(-m // 128) * -(-n // 256)
            for launch in range(2):
                for name, ck in compiled.items():
                    ck.bind(a=x, b=w, c=c).launch()
                    torch.cuda.synchronize()
                    rec = read_timeline(ck, tiles)
                    records[f"{name}_{m}x{n}x{k}_{launch}"] = rec
                    s = {"variant": name, "launch": launch, **summarise(rec, shape)}
                    summary.append(s)
                    print(json.dumps(s), flush=True)
        np.savez_compressed(out / "timeline.npz", **records)
        (out / "timeline_summary.json").write_text(json.dumps(summary, indent=1))
        return 0
    rows = []
    for shape in SHAPES:
        every: dict = {}
        secs, errs, tol, _ = time_shape(torch, gen, shape, compiled, a.rounds, report=True, every=every)
        here = probe_rows(shape, secs, errs, tol, lambda name: True)
        for row in here:  # each round against the Triton peer's round (they ran back to back)
            row["round_ms"] = [round(x * 1e3, 4) for x in every[row["variant"]]]
            wins = sum(x < y for x, y in zip(every[row["variant"]], every["triton"]))
            print(f"  {row['variant']}: faster than Triton in {wins} of {len(every['triton'])} rounds", flush=True)
        rows += here
    write_rows(out / "probe.json", rows, a.rounds, torch.cuda.get_device_name())
    return 0


if __name__ == "__main__":
    sys.exit(main())
