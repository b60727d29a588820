"""Why the ``persistent`` normalize computes wrong rows under compute-sanitizer memcheck: hand-edited
variants of its generated CUDA (an experiment harness, not a kernel source: each edit is checked to
apply exactly as often as expected), run once each against numpy in one process, so that

    compute-sanitizer --tool memcheck python3 benchmarks/probe_memcheck.py --unfenced [--second] [--only NAME,...]

runs all of them under one tool, and the same command without the sanitizer is the control.
``--unfenced`` lowers without the rule ``cb-fence-refill`` (the kernels as they were when the probe
found the missing proxy fence, byte for byte; the edits assume it); without it the cases start from
today's fenced kernels. Results: benchmarks/results/memcheck/README.md.

For every variant it prints the wrong elements and rows and, for the wrong rows, the statistics the
kernel used, fitted from its output (out = (x - mean) * rstd is linear in x): how far the row sum
(mean * row) and rstd are from numpy's, and the largest residual of the fit (a large one means some
elements were read wrong, not only the statistics). The ``debug`` variant also dumps every thread's
registers (vals, s1, s2) and the two block-reduced values, so the tile reads, the per-thread sums
and the block reductions are checked separately.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import cuda_edit  # noqa: E402

SHAPE = (512, 2048)
ROW = SHAPE[1]
DEBUG_COLS = ROW + 4 * 256  # per row: vals (ROW), s1, s2, v1, v6 (one a thread each)


def _sub(text: str, old: str, new: str, count: int = 1) -> str:
    return cuda_edit.sub(text, old, new, count, who="probe_memcheck")


_between = cuda_edit.between


WAIT = "cb_mbar_wait(cb_smem_addr(&cb_full_4[j % 2]), j / 2 % 2);"


def sync_after_wait(t: str) -> str:
    """Every thread waits for the whole block after its barrier wait (main loop and epilogue)."""
    return _sub(t, WAIT, WAIT + " __syncthreads();", count=2)


def tid0_issues(t: str) -> str:
    """Thread 0 issues the loads instead of the lane elect.sync picks in warp 0."""
    return _sub(t, "bool cb_elect_one() { return threadIdx.x < 32 && cb_elect_sync(); }",
                "bool cb_elect_one() { return threadIdx.x == 0; }")


def fence_before_issue(t: str) -> str:
    """A generic->async proxy fence by the issuing thread before each refill of a slot the block has
    read (after the WAR sync or empty-barrier wait, before arrive_expect_tx and the TMA copies)."""
    t2, n = re.subn(r"(?m)^( *)(cb_mbar_arrive_expect_tx\(cb_smem_addr\(&cb_full_\d+\[\(j \+ \d+\) % \d+\]\))",
                    r"\1cb_fence_proxy_async();\n\1\2", t)
    if n != 1:
        raise SystemExit(f"probe_memcheck: expected one refill in the main loop, found {n}")
    return t2


def reader_fence(t: str) -> str:
    """Every thread fences its tile read to the async proxy before the end-of-iteration sync."""
    return _sub(t, "    s1 = CbSum()(s1, v0);\n    __syncthreads();\n",
                "    s1 = CbSum()(s1, v0);\n    cb_fence_proxy_async();\n    __syncthreads();\n")


def fence_init(t: str) -> str:
    """fence.mbarrier_init.release.cluster after the barriers' initialisation as well."""
    return _sub(t, "    cb_fence_proxy_async();  // pre-prologue\n",
                "    cb_fence_proxy_async();  // pre-prologue\n    cb_fence_mbarrier_init();\n")


def global_reads(t: str) -> str:
    """The pipeline (TMA, barriers, waits) kept, but each thread takes its values from global memory:
    exact means the tile reads were wrong, wrong means the rest (reductions, tail) is."""
    read = re.search(r"v0 = tile\[\(int\)threadIdx\.x \+ j % \d \* 256\];", t).group(0)
    return _sub(t, read, "v0 = x[(int)blockIdx.x * 2048 + j * 256 + (int)threadIdx.x];", count=2)


def no_pipeline(t: str) -> str:
    """No TMA, no barriers: a plain loop over global memory, then the same two-reduction tail."""
    return _between(t, "  if (cb_elect_one()) {  // pre-prologue", "cb_mbar_inval(cb_smem_addr(&cb_full_4[cb_s]));\n    }\n  }\n",
                    "  #pragma unroll\n  for (int j = 0; j < 8; j += 1) {\n"
                    "    v0 = x[(int)blockIdx.x * 2048 + j * 256 + (int)threadIdx.x];\n"
                    "    vals[j] = v0;\n    s1 = CbSum()(s1, v0);\n  }\n")


def split_scratch(t: str) -> str:
    """The second block reduction on its own scratch words (the first one's stay untouched)."""
    return _sub(t, "v6 = cb_block_reduce<float>(s2, (float)0, CbSum(), reinterpret_cast<float*>(cb_smem + 1152));",
                "v6 = cb_block_reduce<float>(s2, (float)0, CbSum(), reinterpret_cast<float*>(cb_smem + 1280));")


def no_inval(t: str) -> str:
    """The barriers are not invalidated after the loop."""
    return _sub(t, "      cb_mbar_inval(cb_smem_addr(&cb_full_4[cb_s]));\n", "")


def debug(t: str) -> str:
    """Dump vals, s1, s2, v1 and v6 of every thread after the output is stored."""
    t = _sub(t, "const __grid_constant__ CUtensorMap x_tmap) {",
             "const __grid_constant__ CUtensorMap x_tmap, float* __restrict__ cb_dbg) {")
    dump = ("  {\n    float* d = cb_dbg + (size_t)blockIdx.x * %d;\n" % DEBUG_COLS +
            "    #pragma unroll\n    for (int q = 0; q < 8; q += 1) d[q * 256 + threadIdx.x] = vals[q];\n"
            "    d[2048 + threadIdx.x] = s1;\n    d[2304 + threadIdx.x] = s2;\n"
            "    d[2560 + threadIdx.x] = v1;\n    d[2816 + threadIdx.x] = v6;\n  }\n}\n")
    assert t.endswith("  }\n}\n")
    return t[:-2] + dump


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    stages: int = 2
    dtype: str = "bfloat16"
    build: tuple = ()  # extra build parameters of the persistent kernel
    edit: object = None  # text -> text, on the generated CUDA of (stages, dtype, build)
    debug: bool = False
    repeat: int = 1  # launches, each on fresh inputs (another seed)


CASES = [
    Case("base"),
    Case("debug", edit=debug, debug=True),
    Case("global-reads", edit=global_reads),
    Case("no-pipeline", edit=no_pipeline),
    Case("base-again"),  # a second launch of the same kernel: are the same rows wrong?
    Case("sync-after-wait", edit=sync_after_wait),
    Case("tid0-issues", edit=tid0_issues),
    Case("fence-before-issue", edit=fence_before_issue),
    Case("fence-init", edit=fence_init),
    Case("split-scratch", edit=split_scratch),
    Case("no-inval", edit=no_inval),
    Case("S3", stages=3),
    Case("S4", stages=4),
    Case("war-mbarrier", build=(("war", "mbarrier"),)),
    Case("threads128", build=(("threads", 128),)),
    Case("f32-S3", stages=3, dtype="float32"),
    Case("f32-S3-global-reads", stages=3, dtype="float32", edit=global_reads),
]
# the second call: what the wrong reads hold, and each candidate fix launched several times
CASES_2 = [
    Case("debug", edit=debug, debug=True, repeat=3),
    Case("base", repeat=2),
    Case("fence-before-issue", edit=fence_before_issue, repeat=5),
    Case("reader-fence", edit=reader_fence, repeat=4),
    Case("tid0-issues", edit=tid0_issues, repeat=4),
    Case("war-mbarrier", build=(("war", "mbarrier"),), repeat=4),
    Case("war-mbarrier-fence", build=(("war", "mbarrier"),), edit=fence_before_issue, repeat=4),
    Case("S3-fence", stages=3, edit=fence_before_issue, repeat=3),
    Case("f32-S3-fence", stages=3, dtype="float32", edit=fence_before_issue, repeat=3),
    Case("threads128-fence", build=(("threads", 128),), edit=fence_before_issue, repeat=2),
    Case("debug-fence", edit=lambda t: debug(fence_before_issue(t)), debug=True, repeat=2),
]


RULES: list = []  # rule folders to lower with (--unfenced: one that disables cb-fence-refill)


def _source(case: Case):
    from cbrules import api
    from cbrules.kernels import KERNELS
    kernel = KERNELS["persistent"].build(SHAPE, stages=case.stages, dtype=case.dtype, **dict(case.build))
    src = api.generate(kernel, rules=list(RULES) or None)
    return src if case.edit is None else dataclasses.replace(src, text=case.edit(src.text))


def _fit(x: np.ndarray, out: np.ndarray) -> tuple[float, float, float]:
    """(mean, rstd, largest residual) of out = (x - mean) * rstd fitted by least squares."""
    a = np.vstack([x, np.ones_like(x)]).T
    (r, c), *_ = np.linalg.lstsq(a, out, rcond=None)
    return -c / r, r, float(np.abs(a @ np.array([r, c]) - out).max())


def _report_rows(x: np.ndarray, got: np.ndarray, bad: np.ndarray) -> None:
    rows = np.unique(np.nonzero(bad)[0])
    mean, rstd = x.mean(axis=1), 1.0 / x.std(axis=1)
    dsum, rr, res = [], [], []
    for i in rows:
        m, r, e = _fit(x[i], got[i])
        dsum.append((m - mean[i]) * ROW)
        rr.append(r / rstd[i])
        res.append(e)
    dsum, rr, res = np.array(dsum), np.array(rr), np.array(res)
    print(f"  rows ({len(rows)}): {rows[:16].tolist()}")
    print(f"  row sum - numpy's: median |.| {np.median(np.abs(dsum)):.3g}, max |.| {np.abs(dsum).max():.3g}; "
          f"rows with |.| > 0.5: {int((np.abs(dsum) > 0.5).sum())}")
    print(f"  rstd / numpy's - 1: median |.| {np.median(np.abs(rr - 1)):.3g}, max |.| {np.abs(rr - 1).max():.3g}; "
          f"rows with |.| > 1e-3: {int((np.abs(rr - 1) > 1e-3).sum())}")
    print(f"  fit residual: median {np.median(res):.3g}, max {res.max():.3g} (bf16 rounding alone: ~0.02)")
    for k in range(min(4, len(rows))):
        print(f"    row {rows[k]}: {int(bad[rows[k]].sum())} elements, sum off {dsum[k]:+.4g}, "
              f"rstd x {rr[k]:.6f}, residual {res[k]:.3g}")


def _report_debug(x: np.ndarray, dbg: np.ndarray) -> None:
    """Which stage of the computation first goes wrong, row by row."""
    xf = x.astype(np.float32)
    vals, s1, s2, v1, v6 = (dbg[:, :ROW], dbg[:, ROW:ROW + 256], dbg[:, ROW + 256:ROW + 512],
                            dbg[:, ROW + 512:ROW + 768], dbg[:, ROW + 768:])
    bad_vals = vals != xf  # element q of thread t is column q * 256 + t, where the dump puts it
    acc = np.zeros((SHAPE[0], 256), np.float32)
    for q in range(8):  # the kernel's order: s1 += vals[q], q = 0..7, in float32
        acc = acc + vals[:, q * 256:(q + 1) * 256]
    bad_s1 = (acc != s1).any(axis=1)
    split = v1.min(axis=1) != v1.max(axis=1)
    ref1 = s1.astype(np.float64).sum(axis=1)
    bad_v1 = np.abs(v1[:, 0] - ref1) > 1e-4 * np.abs(s1).sum(axis=1) + 1e-3
    ref6 = s2.astype(np.float64).sum(axis=1)
    bad_v6 = np.abs(v6[:, 0] - ref6) > 1e-4 * ref6 + 1e-3
    print(f"  debug: rows with a wrong tile read {int(bad_vals.any(axis=1).sum())} "
          f"({int(bad_vals.sum())} values), a wrong thread sum s1 {int(bad_s1.sum())}, "
          f"threads disagreeing on v1 {int(split.sum())}, v1 != sum of s1 {int(bad_v1.sum())}, "
          f"v6 != sum of s2 {int(bad_v6.sum())}")
    for i in np.nonzero(bad_v1 | bad_v6 | split)[0][:4]:
        d = v1[i, 0] - ref1[i]
        warps = s1[i].astype(np.float64).reshape(8, 32).sum(axis=1)
        near = int(np.argmin(np.abs(np.abs(warps) - abs(d))))
        print(f"    row {i}: v1 - sum(s1) = {d:+.4g} (nearest warp partial: warp {near}, {warps[near]:+.4g}); "
              f"v6 - sum(s2) = {v6[i, 0] - ref6[i]:+.4g}; distinct v1 values {len(np.unique(v1[i]))}")
    for i in np.nonzero(bad_vals.any(axis=1))[0][:4]:
        cols = np.nonzero(bad_vals[i])[0]
        print(f"    row {i}: wrong tile reads at columns {cols[:8].tolist()} (stages {np.unique(cols // 256).tolist()})")
    # what a wrong read holds: the same column of another stage (+k stages), the poison, or else
    kinds: dict = {}
    for i, c in zip(*np.nonzero(bad_vals)):
        hit = [k for k in (-3, -2, -1, 1, 2, 3) if 0 <= c + 256 * k < ROW and vals[i, c] == xf[i, c + 256 * k]]
        key = f"stage {hit[0]:+d}" if hit else ("nan (poison)" if np.isnan(vals[i, c]) else "other")
        kinds[key] = kinds.get(key, 0) + 1
    if kinds:
        print(f"  wrong reads hold: {kinds} (+2: the slot's next stage, a refill that overtook the read; "
              "-2: the slot's previous stage, a read before the data landed)")


def run_case(case: Case) -> bool:
    return any([_run_once(case, seed) for seed in range(case.repeat)])


def _run_once(case: Case, rng_seed: int) -> bool:
    from cbrules.codegen.launch import CompiledKernel
    from cbrules.codegen.nvrtc import compile_cuda
    from cbrules.codegen.runtime import DeviceArray
    from cbrules.kernels import KERNELS

    spec = KERNELS["persistent"]
    src = _source(case)
    ck = CompiledKernel(src, compile_cuda(src.text, src.name))
    args = spec.make_inputs(SHAPE, np.random.default_rng(rng_seed), case.dtype)
    want = spec.expected(args)["out"]
    bound = ck.bind(**args)
    bound.arrays["out"].fill_bytes(0xFF)  # poisoned: an element nobody writes shows up
    dbg = None
    if case.debug:
        dbg = DeviceArray.empty((SHAPE[0], DEBUG_COLS), np.float32)
        dbg.fill_bytes(0xFF)
        bound.args.append(("ptr", dbg.ptr))
    bound.launch()
    bound.finish()
    rtol, atol = spec.tolerances(SHAPE, case.dtype)
    got = args["out"].astype(np.float64)
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol)
    print(f"{case.name} #{rng_seed}: S={case.stages} {case.dtype} {dict(case.build)}: {int(bad.sum())} of {bad.size} "
          f"elements differ", flush=True)
    if bad.any():
        _report_rows(args["x"].astype(np.float64), got, bad)
    if dbg is not None:
        _report_debug(args["x"], dbg.to_numpy())
    sys.stdout.flush()
    return bool(bad.any())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--second", action="store_true", help="the second call's cases (CASES_2)")
    ap.add_argument("--compile-only", action="store_true", help="generate and compile every case, run nothing")
    ap.add_argument("--unfenced", action="store_true", help="lower without cb-fence-refill (the kernels before the fix)")
    a = ap.parse_args(argv)
    if a.unfenced:
        folder = tempfile.mkdtemp(prefix="probe_memcheck_")
        with open(os.path.join(folder, "unfenced.rules"), "w") as f:
            f.write("(disable cb-fence-refill)\n")
        RULES.append(folder)
    cases = [c for c in (CASES_2 if a.second else CASES) if not a.only or c.name in a.only.split(",")]
    if a.compile_only:
        from cbrules.codegen.nvrtc import compile_cuda
        for c in cases:
            src = _source(c)
            cubin = compile_cuda(src.text, src.name)
            print(f"{c.name}: {cubin.resources}")
        return 0
    wrong = [c.name for c in cases if run_case(c)]
    print(f"wrong: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
