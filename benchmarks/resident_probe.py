"""Do resident blocks an SM (bytes in flight) limit the bfloat16 normalize at 16384x16384? Triton's
row-in-registers kernel against ``reductions.persistent`` with ops.py's tiles (256 threads, 80 registers:
three blocks an SM) and variants that change only how many blocks an SM holds: a register cap
(``__launch_bounds__`` minimum of resident blocks), 512 threads, blocks walking the rows, one TMA copy a
row (``--set resident``); or how the row arrives and is released: finer stages with the whole row still
in flight, empty barriers instead of the block sync that ends a main iteration (``--set stages``). One
process on one Hopper GPU, outputs poisoned and checked, timed in interleaved rounds (each variant's
median launch):

    python3 benchmarks/resident_probe.py [--set resident|stages|syncs|walk|path|reduce] [--triton-warps 16,8]
        [--rounds 7] [--reps 10] [--shape 16384x16384] [--cubins DIR]
    python3 benchmarks/resident_probe.py --set syncs --compile-only   # no GPU: build and NVRTC-compile the set

``--set syncs`` measures hand edits of ops.py's CUDA (benchmarks/cuda_edit.py) that drop block syncs a
row: the one ending the main iteration (no slot is refilled after it: the row is S tiles), the one before
the barriers' invalidation at the end of the loop (with the invalidation), and the third of each block
reduction (the two reductions then use scratch of their own). ``--set path`` measures the way a row comes
in, by hand edits as well: ``direct`` drops the TMA copies, their expect-tx and the barrier waits, and each
thread loads its elements from global memory (16-byte loads, as Triton's ``LDG.128``) where it read them from
the slot (with and without the syncs); ``shared`` drops the TMA the same way but keeps the round trip through
shared memory: each thread copies its elements into the slots itself, then reads them back as before.
``--set reduce`` measures hand edits of the statistics at 256 and 512 threads: one block reduction of
(sum, sum of squares) taken as the row arrives instead of two reductions and a variance pass, and the row
held in registers as bfloat16 instead of float.
``--set walk``: P blocks walk the rows
warp-specialized (512 consumers, one box a stage), the producer keeping S stages in flight across rows.
The edits of SETUP_EDITS and ROW_EDITS and "contiguous" serve benchmarks/scaling_probe.py.
"""
import argparse
import dataclasses
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cbrules import api  # noqa: E402
from cbrules.kernels import reductions  # noqa: E402
from benchmarks import cuda_edit  # noqa: E402
from benchmarks.ops import variant_params  # noqa: E402

SYNC_EDITS = ("main sync", "epilogue sync", "reduction sync")
PATH_EDITS = ("direct", "shared")
# what a direct block does before its first load and a launch carries (benchmarks/scaling_probe.py):
# "no set-up" drops the barriers' init, fence and block sync and their invalidation, "no tensor map"
# the unused __grid_constant__ CUtensorMap parameter; "contiguous" gives a thread 16 adjacent elements a
# stage (two adjacent 16-byte vectors) instead of two vectors 2048 elements apart
SETUP_EDITS = ("no set-up", "no tensor map")
# what a row costs (benchmarks/scaling_probe.py --set row): "plain loads" drops __restrict__ from x, so a
# direct kernel loads with LDG.E.128 (as Triton's) instead of LDG.E.128.CONSTANT; "no block reductions"
# takes each thread's own partial sums as the row's (a timing probe only: the result is wrong); "two
# blocks an SM" pads the dynamic shared memory so that only two blocks fit an SM (Triton's rows in flight)
ROW_EDITS = ("plain loads", "no block reductions", "two blocks an SM")
REDUCE_EDITS = ("one reduction", "bf16 row")
# one block reduction of (sum, sum of squares): each warp's pair through scratch, then every warp sums the
# partials itself (one block sync a reduction, no broadcast round trip); the variance is E[x^2] - mean^2
SUM2 = """
__device__ __forceinline__ void cb_block_sum2(float& a, float& b, float* scratch) {
  const unsigned lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if (lane == 0) { scratch[threadIdx.x / 32] = a; scratch[16 + threadIdx.x / 32] = b; }
  __syncthreads();
  a = lane < nwarps ? scratch[lane] : 0.0f;
  b = lane < nwarps ? scratch[16 + lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
}
"""
# the statistics as ONE numerically stable block reduction (Chan et al.'s pairwise merge of (mean, M2)):
# each thread takes the mean of its own K registers and M2 = sum (x - mean_t)^2 over them (no sync), then
# the block merges the pairs by butterflies. Every merge joins two groups of equal count c (K elements a
# thread), so the weights are compile-time: mean = (ma + mb) / 2, M2 = M2a + M2b + d^2 * c / 2 with
# d = mb - ma; both partners compute the same bits (fp + is commutative, d^2 = (-d)^2). Each warp's pair
# through scratch, one block sync, then every warp merges the NW partials itself (lane l reads partial
# l % NW, so every lane ends with the whole block's pair).
CHAN = """
template <int K, int NW>
__device__ __forceinline__ void cb_block_chan(float& mean, float& m2, float* scratch) {
  const unsigned lane = threadIdx.x % 32;
  float c = 0.5f * K;
  #pragma unroll
  for (int o = 1; o < 32; o <<= 1, c *= 2.0f) {
    const float mb = __shfl_xor_sync(0xffffffffu, mean, o), m2b = __shfl_xor_sync(0xffffffffu, m2, o);
    const float d = mb - mean;
    mean = 0.5f * (mean + mb);
    m2 = (m2 + m2b) + d * d * c;
  }
  if (lane == 0) { scratch[threadIdx.x / 32] = mean; scratch[NW + threadIdx.x / 32] = m2; }
  __syncthreads();
  mean = scratch[lane % NW];
  m2 = scratch[NW + lane % NW];
  #pragma unroll
  for (int o = 1; o < NW; o <<= 1, c *= 2.0f) {
    const float mb = __shfl_xor_sync(0xffffffffu, mean, o), m2b = __shfl_xor_sync(0xffffffffu, m2, o);
    const float d = mb - mean;
    mean = 0.5f * (mean + mb);
    m2 = (m2 + m2b) + d * d * c;
  }
}
"""
STATS_EDITS = ("stable reduction",)
# a thread's read of its elements from the slot, the index captured (main loop and epilogue)
SLOT_READ = r"(cb_vcopy<16>\(&cb_vec_\d+\[0\], )&tile\[(.*?)\]\);"
SM_REGISTERS, SM_THREADS, SM_SHARED, BLOCK_RESERVED = 65536, 2048, 233472, 1024  # H200, per SM


def resident(registers: int, threads: int, shared: int) -> int:
    """Blocks an SM holds: registers (allocated 8 a thread at a time), threads and shared memory."""
    return min(SM_REGISTERS // (-(-registers // 8) * 8 * threads), SM_THREADS // threads,
               SM_SHARED // (shared + BLOCK_RESERVED))


def _sub_re(text: str, pattern: str, new: str, count: int = 1) -> str:
    return cuda_edit.resub(text, pattern, new, count, who="resident_probe")


def _no_tma(text: str, prologue: str) -> str:
    """ops.py's CUDA without the TMA: its prologue (S-1 stages issued) replaced by ``prologue``, the main
    iteration's refill issue and the barrier waits dropped (the barriers are still initialised and
    invalidated; the block syncs stay)."""
    text = _sub_re(text, r"(?s)  #pragma unroll\n  for \(int j = 0; j < \d+; j \+= 1\) \{  // prologue\n.*?\n  \}\n",
                   prologue.replace("\\", "\\\\"))
    text = _sub_re(text, r"(?s)    if \(cb_elect_one\(\)\) \{\n      cb_fence_proxy_async\(\);\n.*?\n    \}\n", "")
    return _sub_re(text, r"    cb_mbar_wait\(cb_smem_addr\(&cb_full_\d+\[j\]\), 0\);\n", "", count=2)


def _path(text: str, how: str, params: dict) -> str:
    """ops.py's CUDA with the row brought in ``how`` (of PATH_EDITS) instead of by the TMA."""
    row = f"(int)blockIdx.x * {params['row']}"  # one row a block: element k of the row is slot element k
    if how == "direct":  # each thread's 16-byte vector from global memory where it read the slot
        reads = 2 * (params["width"] // params["threads"] // 8)  # a thread's vectors a stage, main and epilogue
        return _sub_re(_no_tma(text, ""), SLOT_READ, rf"\1&x[{row} + \2]);", count=reads)
    # "shared": each thread copies the vectors it will read into the slots (LDG.128, STS.128) up front, the
    # whole row in flight as the TMA keeps it; __syncwarp keeps the compiler from forwarding the stores
    # to the reads (a thread reads back only what it wrote)
    index = list(dict.fromkeys(m.group(2) for m in re.finditer(SLOT_READ, text)))
    assert len(index) == params["width"] // params["threads"] // 8, index
    copy = "".join(f"    cb_vcopy<16>(&tile[{i}], &x[{row} + {i}]);\n" for i in index)
    return _no_tma(text, f"  #pragma unroll\n  for (int j = 0; j < {params['stages']}; j += 1) {{  // probe: "
                         f"the row into the slots without the TMA\n{copy}  }}\n  __syncwarp();\n")


def _reduce(text: str, how: str) -> str:
    """ops.py's CUDA with the statistics taken ``how`` (of REDUCE_EDITS): "one reduction" sums the squares
    beside the sum as the row arrives and reduces both at once (cb_block_sum2), dropping the variance pass
    over the row and the second block reduction; "bf16 row" keeps the row in registers as its bfloat16
    elements (Triton's ``x`` before ``.to(float32)``), converting at each use, instead of as float."""
    if how == "bf16 row":  # the vectors' elements into vals as they are; the sum converts them
        text = cuda_edit.sub(text, "  float vals[", "  cb_bf16 vals[", who="resident_probe")
        n = len(re.findall(r"      (v\d+) = cb_vec_\d+\[u\];\n      vals\[.*?\] = \1;\n", text))
        return _sub_re(text, r"      (v\d+) = (cb_vec_\d+\[u\]);\n      (vals\[.*?\]) = \1;\n",
                       r"      \3 = \2;\n      \1 = \2;\n", count=n)
    text = cuda_edit.sub(text, "struct CbSum ", SUM2 + "struct CbSum ", who="resident_probe")
    n = len(re.findall(r"      s1 = CbSum\(\)\(s1, v\d+\);\n", text))
    text = _sub_re(text, r"      s1 = CbSum\(\)\(s1, (v\d+)\);\n",
                   r"      s1 = CbSum()(s1, \1);\n      s2 = CbSum()(s2, \1 * \1);\n", count=n)
    # the two reductions and the variance pass between them become one reduction of both sums
    return _sub_re(text, r"(?s)  (v\d+) = cb_block_reduce<float>\(s1, \(float\)0, CbSum\(\), (.*?)\);\n"
                   r"  (v\d+) = \(\1\) / \((\d+\.0f)\);\n.*?  (v\d+) = cb_block_reduce<float>\(s2, [^\n]*\n"
                   r"  (v\d+) = \(\5\) / \(\4\);\n",
                   r"  cb_block_sum2(s1, s2, \2);  // probe: one reduction of both sums\n  \1 = s1;\n"
                   r"  \3 = (\1) / (\4);\n  \6 = (s2) / (\4) - (\3) * (\3);\n")


def _stable(text: str, params: dict) -> str:
    """ops.py's CUDA with the statistics as one stable block reduction (CHAN): the thread's own mean from
    the sum it took as the row arrived, the existing pass over its registers now around that mean (before
    the block reduction, not after it), then cb_block_chan merges (mean, M2) over the block; the variance
    is M2 / n. The second block reduction and the first's three syncs go (one sync in all)."""
    k, nw = params["row"] // params["threads"], params["threads"] // 32
    if nw & (nw - 1) or nw > 32:
        raise ValueError(f"{params['threads']} threads: the stable reduction's butterfly needs a power-of-two "
                         "count of warps, at most 32")
    text = cuda_edit.sub(text, "struct CbSum ", CHAN + "struct CbSum ", who="resident_probe")
    return _sub_re(text, r"(?s)  (v\d+) = cb_block_reduce<float>\(s1, \(float\)0, CbSum\(\), (.*?)\);\n"
                   r"  (v\d+) = \(\1\) / \((\d+\.0f)\);\n(.*?)  (v\d+) = cb_block_reduce<float>\(s2, [^\n]*\n"
                   r"  (v\d+) = \(\6\) / \(\4\);\n",
                   rf"  \3 = (s1) * (1.0f / {k});  // probe: the thread's own mean, then its M2 about it\n\5"
                   rf"  cb_block_chan<{k}, {nw}>(\3, s2, \2);  // probe: one stable reduction of (mean, M2)\n"
                   r"  \7 = (s2) / (\4);\n")


def _butterfly(mean, m2, count: float, levels: int):
    """CHAN's merges over ``levels`` butterfly levels of float32 arrays (one entry a lane), each side of the
    first level holding ``count`` elements: what every lane holds after them."""
    import numpy as np
    idx = np.arange(mean.size)
    c = np.float32(0.5 * count)
    for level in range(levels):
        partner = idx ^ (1 << level)
        d = mean[partner] - mean
        mean, m2 = np.float32(0.5) * (mean + mean[partner]), (m2 + m2[partner]) + d * d * c
        c = c * np.float32(2)
    return mean, m2


def statistics_as_built(row, threads: int, how: str) -> tuple[float, float]:
    """(mean, variance) of one ``row`` as the edited kernels compute them in float32, thread by thread and
    lane by lane (numpy, no GPU): ``how`` "stable reduction" (CHAN: each thread's mean and M2, the pairs
    merged by butterflies within each warp, then over the warps' partials) or "one reduction" (the sums of
    x and x^2, var = E[x^2] - mean^2). Which elements a thread holds does not change a statistic's
    meaning, only its rounding: thread t takes elements t*K .. t*K + K - 1 here."""
    import numpy as np
    v = np.asarray(row, dtype=np.float32).reshape(threads, -1)
    k, nw, n = v.shape[1], threads // 32, np.float32(v.size)
    s1 = np.zeros(threads, np.float32)
    for q in range(k):  # each thread's sum as its elements arrive
        s1 += v[:, q]
    if how == "one reduction":
        s2 = np.zeros(threads, np.float32)
        for q in range(k):
            s2 += v[:, q] * v[:, q]
        for part in (s1, s2):  # the block sums: butterflies in each warp, then over the warps' sums
            for level in range(5):
                part += part.reshape(nw, 32)[:, np.arange(32) ^ (1 << level)].reshape(-1)
        w1, w2 = s1[::32].copy(), s2[::32].copy()
        for level in range(nw.bit_length() - 1):
            w1, w2 = w1 + w1[np.arange(nw) ^ (1 << level)], w2 + w2[np.arange(nw) ^ (1 << level)]
        mean = w1[0] / n
        return float(mean), float(w2[0] / n - mean * mean)
    mean = s1 * np.float32(1.0 / k)
    m2 = np.zeros(threads, np.float32)
    for q in range(k):
        d = v[:, q] - mean
        m2 += d * d
    mean, m2 = _butterfly(mean, m2, k, 5)  # within each warp (lane partners never leave it)
    mean, m2 = _butterfly(mean[::32].copy(), m2[::32].copy(), 32 * k, nw.bit_length() - 1)
    return float(mean[0]), float(m2[0] / n)


def _contiguous(text: str, params: dict) -> str:
    """ops.py's CUDA (256 threads, stages of 4096) with thread t holding elements 16t..16t+15 of a stage
    (its two vectors adjacent) instead of 8t..8t+7 and 2048 further; the stores follow the elements."""
    assert params["threads"] == 256 and params["width"] == 4096, params
    text = cuda_edit.sub(text, "&tile[(int)threadIdx.x * 8 + j * 4096]", "&tile[(int)threadIdx.x * 16 + j * 4096]",
                         count=2, who="resident_probe")
    text = cuda_edit.sub(text, "&tile[((int)threadIdx.x + 256) * 8 + j * 4096]",
                         "&tile[(int)threadIdx.x * 16 + 8 + j * 4096]", count=2, who="resident_probe")
    # vals[8 q2 + u] is element 4096 (q2 / 2) + 16 t + 8 (q2 % 2) + u of the row
    return cuda_edit.sub(text, "(q2 * 256 + (int)threadIdx.x) * 8]",
                         "(q2 >> 1) * 4096 + (int)threadIdx.x * 16 + (q2 & 1) * 8]", who="resident_probe")


def _no_setup(text: str) -> str:
    """A direct kernel (no TMA, no barrier waits) without the barriers' init, fence and block sync before
    the first load, and without their invalidation (and the sync before it) at the end."""
    text = _sub_re(text, r"(?s)  if \(cb_elect_one\(\)\) \{  // pre-prologue\n.*?"
                   r"  __syncthreads\(\);  // pre-prologue\n", "")
    text = cuda_edit.between(text, "  __syncthreads();  // post-epilogue\n", "    }\n  }\n", "")
    assert "cb_mbar_" not in text[text.index('extern "C"'):], "a barrier is left"
    return text


def _edit(text: str, drop: tuple, params: dict) -> str:
    """ops.py's CUDA with the row brought in as the PATH_EDITS in ``drop`` say, the statistics taken as its
    REDUCE_EDITS say, without the block syncs named in it (of SYNC_EDITS), and with a thread's elements
    adjacent ("contiguous") or, for a direct kernel, without its set-up (SETUP_EDITS)."""
    if any(d in drop for d in SETUP_EDITS) and "direct" not in drop:
        raise ValueError(f"{drop}: the set-up and the tensor map go only where the row comes in directly")
    if "contiguous" in drop:
        text = _contiguous(text, params)
    for how in REDUCE_EDITS:
        if how in drop:
            text = _reduce(text, how)
    if "stable reduction" in drop:
        text = _stable(text, params)
    for how in PATH_EDITS:
        if how in drop:
            text = _path(text, how, params)
    if "main sync" in drop:
        text = cuda_edit.sub(text, "    }\n    __syncthreads();\n  }\n", "    }\n  }\n", who="resident_probe")
    if "epilogue sync" in drop:
        cuda_edit.sub(text, "  __syncthreads();  // post-epilogue\n", "", who="resident_probe")  # there once
        # and the invalidation it orders after every wait (the block ends; nothing reuses the barriers)
        text = cuda_edit.between(text, "  __syncthreads();  // post-epilogue\n", "    }\n  }\n", "")
    if "no set-up" in drop:
        text = _no_setup(text)
    if "plain loads" in drop:
        text = cuda_edit.sub(text, "const cb_bf16* __restrict__ x,", "const cb_bf16* x,", who="resident_probe")
    if "no block reductions" in drop:
        text = _sub_re(text, r"cb_block_reduce<float>\((s[12]), \(float\)0, CbSum\(\), [^;]*\);", r"\1;", count=2)
    if "no tensor map" in drop:  # the launch then carries the pointers and M only
        text = cuda_edit.sub(text, ", const __grid_constant__ CUtensorMap x_tmap)", ")", who="resident_probe")
        assert "x_tmap" not in text[text.index('extern "C"'):], "the tensor map is still used"
    if "reduction sync" in drop:
        text = cuda_edit.sub(text, "  __syncthreads();  // scratch may be reused by the next reduction\n", "",
                             who="resident_probe")
        text = cuda_edit.sub(text, "(s2, (float)0, CbSum(), reinterpret_cast<float*>(cb_smem + 32896))",
                             "(s2, (float)0, CbSum(), reinterpret_cast<float*>(cb_smem + 32896 + 128))",
                             who="resident_probe")
    return text


def _compile_edited(params: dict, drop: tuple):
    """The kernel of ``params`` compiled from its CUDA with ``drop``'s syncs removed."""
    from cbrules.codegen.launch import CompiledKernel
    from cbrules.codegen.nvrtc import compile_cuda
    src = api.generate(reductions.persistent(**params))
    src = dataclasses.replace(src, text=_edit(src.text, drop, params))
    if "no tensor map" in drop:
        src = dataclasses.replace(src, params=tuple(p for p in src.params if p.kind != "tmap"))
    if "two blocks an SM" in drop:
        src = dataclasses.replace(src, shared_bytes=SM_SHARED // 2 - BLOCK_RESERVED)
    return CompiledKernel(src, compile_cuda(src.text, src.name))


# ops.py's choice for a 16384 half-precision row loads it directly with the stable statistics (512
# threads); the hand edits apply to the kernel it chose before: TMA stages, two-pass statistics, 256 threads
EDIT_BASE_DROPS = ("direct", "stats")


def edit_base(params: dict) -> dict:
    """``params`` of ops.py's choice as the TMA, two-pass, 256-thread kernel the hand edits apply to."""
    return dict({k: v for k, v in params.items() if k not in EDIT_BASE_DROPS}, threads=256)


def variants(shape: tuple, which: str = "resident") -> list[tuple[str, dict, int]]:
    """(label, persistent's build parameters, __launch_bounds__ minimum of blocks or 0) of set ``which``."""
    name, chosen = variant_params("normalize", shape, "bfloat16")
    assert name == "persistent" and not chosen.get("walk"), (name, chosen)
    s = chosen["row"] // chosen["width"]  # the whole row in flight
    ours = [(f"ops.py choice S={s}", dict(chosen, stages=s), 0)]
    chosen = edit_base(chosen)
    if which == "syncs":  # hand edits: the third item names the syncs dropped
        return ours + [(f"S={s} no {d}", dict(chosen, stages=s), (d,)) for d in SYNC_EDITS] + [
            (f"S={s} none of the three", dict(chosen, stages=s), SYNC_EDITS)]
    if which == "path":  # hand edits: the third item names the path (and the syncs dropped)
        loop = ("main sync", "epilogue sync")
        return ours + [(f"S={s} direct (LDG.128, no TMA)", dict(chosen, stages=s), ("direct",)),
                       (f"S={s} direct, no loop syncs", dict(chosen, stages=s), ("direct", *loop)),
                       (f"S={s} direct, none of the syncs", dict(chosen, stages=s), ("direct", *SYNC_EDITS)),
                       (f"S={s} LDG.128+STS+LDS, no TMA", dict(chosen, stages=s), ("shared",)),
                       (f"S={s} LDG.128+STS+LDS, no loop syncs", dict(chosen, stages=s), ("shared", *loop))]
    if which == "reduce":  # hand edits of the statistics, at ops.py's 256 threads and Triton's 512
        out = []
        for threads in (256, 512):
            base = dict(chosen, stages=s, threads=threads)
            out += [(f"threads={threads} S={s}", base, ())] * (threads != 256) + [
                (f"threads={threads} S={s} {' + '.join(d)}", base, d)
                for d in (("one reduction",), ("bf16 row",), REDUCE_EDITS)]
        return ours + out
    if which == "walk":  # warp-specialized walks: the producer keeps S stages in flight across rows
        wide = dict(chosen, threads=512, one_box=True, warp_specialize=True)
        return ours + [(f"WS walk P={p} width={w} S={st} threads=512", dict(wide, stages=st, width=w, walk=p), 0)
                       for p, w, st in ((132, 16384, 2), (132, 16384, 3), (132, 16384, 4), (264, 16384, 2),
                                        (264, 16384, 3), (132, 8192, 4), (132, 8192, 8), (264, 8192, 4))]
    if which == "stages":  # every variant keeps the whole row in flight
        return ours + [(f"war=mbarrier S={s}", dict(chosen, stages=s, war="mbarrier"), 0),
                       ("width=row/8 S=8", dict(chosen, stages=8, width=chosen["row"] // 8), 0),
                       ("width=row/8 S=8 one_box", dict(chosen, stages=8, width=chosen["row"] // 8, one_box=True), 0),
                       ("width=row/16 S=16", dict(chosen, stages=16, width=chosen["row"] // 16), 0)]
    wide = dict(chosen, threads=512)
    return ours + [(f"ops.py choice S={s} min_blocks=4", dict(chosen, stages=s), 4),
                   (f"threads=512 S={s}", dict(wide, stages=s), 0),
                   (f"threads=512 S={s} min_blocks=3", dict(wide, stages=s), 3),
                   # walking costs registers (85: two blocks an SM), so the walks cap them to hold three or four
                   (f"walk P=396 no WS S={s} min_blocks=3", dict(chosen, stages=s, walk=396), 3),
                   (f"walk P=528 no WS S={s} min_blocks=4", dict(chosen, stages=s, walk=528), 4),
                   ("one box a row, width=row S=2", dict(chosen, stages=2, width=chosen["row"], one_box=True), 0)]


def build(params: dict, change):
    """The CompiledKernel of a variant: ``change`` is a __launch_bounds__ minimum of blocks (0: none) or the
    hand edits (of PATH_EDITS and SYNC_EDITS) of its CUDA."""
    if isinstance(change, tuple):
        return _compile_edited(params, change)
    k = reductions.persistent(**params)
    if change:
        k.graph.kernel()["min_blocks"] = change
    return api.compile(k)


def note(ck, params: dict) -> str:
    """Registers, spills, shared memory and the blocks an SM holds."""
    r = ck.cubin.resources
    threads = params["threads"] + (128 if params.get("warp_specialize") else 0)  # the producer warp group
    return (f"regs={r.registers} spills={r.spill_stores} smem={ck.source.shared_bytes} "
            f"blocks/SM={resident(r.registers, threads, ck.source.shared_bytes)}")


def _keep(folder, i: int, label: str, ck) -> None:
    """Write ``ck``'s cubin into ``folder`` (when given), named by its place in the set and its label."""
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:02d}_{re.sub(r'[^A-Za-z0-9]+', '_', label).strip('_')}.cubin"), "wb") as f:
            f.write(ck.cubin.cubin)


def check_then_time(launches: dict, out, want, notes: dict, rounds: int, reps: int) -> dict:
    """Each launch once into a NaN-poisoned ``out``, checked against ``want`` (its note starts with ok=...),
    three warm-up launches, then ``rounds`` interleaved rounds of ``reps`` timed launches of every one in
    turn: the times by label."""
    import torch
    from cbrules.codegen import runtime
    for label, fn in list(launches.items()):  # correctness first, outputs poisoned
        out.fill_(float("nan"))
        fn()
        runtime.synchronize()
        notes[label] = f"ok={bool(torch.allclose(out.float(), want, rtol=2e-2, atol=2e-2))} " + notes.get(label, "")
        for _ in range(3):
            fn()
    times = {label: [] for label in launches}
    for _ in range(rounds):
        for label, fn in launches.items():
            times[label] += runtime.time_launch(fn, reps)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (each variant once a round)")
    p.add_argument("--reps", type=int, default=10, help="timed launches of a variant a round")
    p.add_argument("--shape", default="16384x16384")
    p.add_argument("--set", default="resident", choices=("resident", "stages", "syncs", "walk", "path", "reduce"),
                   help="which variants")
    p.add_argument("--triton-warps", default=[16], type=lambda t: [int(w) for w in t.split(",")],
                   help="Triton row kernels of these num_warps (the first is the base of the ratios)")
    p.add_argument("--compile-only", action="store_true", help="no GPU: build and compile the set's variants")
    p.add_argument("--cubins", help="write each variant's cubin into this folder (for cuobjdump -sass)")
    a = p.parse_args()
    m, n = (int(s) for s in a.shape.split("x"))
    if a.compile_only:
        for i, (label, params, change) in enumerate(variants((m, n), a.set)):
            ck = build(params, change)
            _keep(a.cubins, i, label, ck)
            print(f"{m}x{n} {label}: {note(ck, params)}", flush=True)
        return
    import torch
    from benchmarks.triton_kernels import _normalize_row
    x = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(x)
    want = torch.nn.functional.layer_norm(x.float(), (n,), eps=0.0)
    gb = 4 * m * n / 1e6  # bytes read + written (2 bytes each), per ms -> GB/s
    launches, notes = {}, {}
    for warps in a.triton_warps:  # the first is the base of the ratios
        label = "triton row" + ("" if warps == 16 else f" num_warps={warps}")
        tri = _normalize_row[(m,)](x, out, m, n, BLOCK_N=n, num_warps=warps)
        launches[label] = lambda w=warps: _normalize_row[(m,)](x, out, m, n, BLOCK_N=n, num_warps=w)
        regs, spills = getattr(tri, "n_regs", 0), getattr(tri, "n_spills", "?")
        notes[label] = f"regs={regs} spills={spills} blocks/SM={resident(regs or 255, 32 * warps, 0)}"
        if a.cubins and "cubin" in getattr(tri, "asm", {}):  # Triton's SASS beside ours
            os.makedirs(a.cubins, exist_ok=True)
            with open(os.path.join(a.cubins, f"triton_w{warps}.cubin"), "wb") as f:
                f.write(tri.asm["cubin"])
    for i, (label, params, change) in enumerate(variants((m, n), a.set)):
        try:
            ck = build(params, change)
        except Exception as e:  # a variant that does not build or fit is reported, not fatal
            print(f"{m}x{n} {label}: not built: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        _keep(a.cubins, i, label, ck)
        launches[label] = ck.bind(x=x, out=out).launch
        notes[label] = note(ck, params)
    times = check_then_time(launches, out, want, notes, a.rounds, a.reps)
    base = statistics.median(next(iter(times.values())))
    for label, ts in times.items():
        t = statistics.median(ts)
        print(f"{m}x{n} {label:<34} {gb / t:6.0f} GB/s  {base / t:.3f}x triton  {notes[label]}", flush=True)


if __name__ == "__main__":
    main()
