"""matmul_tc (cbrules' tensor-core matmul) against torch.matmul (cuBLAS) and the Triton peer
(benchmarks/triton_matmul.py: persistent, TMA descriptors, autotuned) in bfloat16, in one run:

    python3 benchmarks/matmul_tc.py --out benchmarks/results/matmul_tc [--sweep]

Every implementation computes ``c = a @ b^T`` with a [M, K] and b [N, K] (K-major B; cuBLAS gets the
transposed view ``b.T``, which it reads as "TN" without a copy); every result is checked against a float32
product first. The figure is the steady-clock one (benchmarks/steady.py: each implementation alone, after
an idle gap and 2 s of sustained launches, the median of 100); the interleaved figure (5 launches of each
implementation in turn, a burst inheriting the clocks of the one before) stands beside it, labelled.
``--sweep`` also measures the matmul_tc tile / stage variants listed in VARIANTS (what helped and what
did not); without it, the default, the persistent and the ping-pong variant (``--levers`` adds the levers of LEVERS). Writes results.json, results.md and, where cuobjdump is on the PATH, the default variant's
SASS summary (HGMMA count, local-memory traffic, setmaxnreg) to --out.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import steady as steady_mod  # noqa: E402

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (6144, 6144, 6144))
WS = {"warp_specialize": True, "registers": (40, 232)}
PINGPONG = "128x128x64 S=4 pingpong persistent"
DEFAULT = {"stages": 4}  # the kernel's defaults: 128x256x64 tiles, two consumer warp groups, group_m 8, C staged swizzled
VARIANTS = {
    "128x256x64 S=4 (default)": DEFAULT,
    "128x256x64 S=4 persistent": {"stages": 4, "persistent": "sms"},  # one block an SM
    "128x256x64 S=4 persistent, no register sharing": {"stages": 4, "persistent": "sms", "registers": None},
    "128x256x64 S=3": {"stages": 3},
    "128x256x64 S=4 row order (group_m=1)": {"stages": 4, "group_m": 1},
    "128x256x64 S=4 registers 24/240": {"stages": 4, "registers": (24, 240)},
    "128x128x64 S=5": {"stages": 5, "bn": 128},
    "256x128x64 S=3": {"stages": 3, "bm": 256, "bn": 128},
    "128x256x32 S=6": {"stages": 6, "bk": 32},
    "128x256x64 S=4 no register sharing": {"stages": 4, "registers": None},
    # the levers of the epilogue and the tile order: measured on every run
    "128x256x64 S=4 dense store staging": {"stages": 4, "store_swizzle": False},
    "128x256x64 S=4 group_m=16": {"stages": 4, "group_m": 16},
    "128x256x64 S=4 swizzled store, group_m=16": {"stages": 4, "store_swizzle": True, "group_m": 16},
    "128x256x64 S=4 persistent, swizzled store, group_m=16": {"stages": 4, "persistent": "sms", "store_swizzle": True,
                                                             "group_m": 16},
    # two consumer warp groups on alternate tiles of the walk, taking turns on the tensor cores
    # (rules/ws_pingpong.rules): one group's epilogue under the other's MMAs; measured on every run
    PINGPONG: {"stages": 4, "persistent": "sms", "bm": 128, "bn": 128, "pingpong": True},
    "64x256x64 S=4 pingpong persistent": {"stages": 4, "persistent": "sms", "bm": 64, "bn": 256, "pingpong": True},
}
LEVERS = ("dense store", "swizzled store", "group_m=16")


def time_shape(torch, gen, shape: tuple, compiled: dict, rounds: int, peers=("cublas", "triton"),
               report: bool = False, every: dict | None = None, steady: dict | None = None
               ) -> tuple[dict, dict, float, dict]:
    """One (m, n, k): random bfloat16 operands, their float32 product as the reference, then cuBLAS and
    the Triton peer (labelled ``peers``) and every compiled matmul_tc in ``compiled`` (label -> kernel)
    each launched once into a NaN-poisoned output and checked, then timed in interleaved rounds.
    Returns (seconds a launch, max abs error, tolerance, seconds of the first launch) by label;
    ``every``, if given, receives each round's seconds a launch by label. ``steady``, if given (the
    keyword arguments of :func:`benchmarks.steady.time_each_alone`), times each implementation alone at
    steady clocks and the returned seconds are those; the interleaved figures then go to ``every``
    under the key ``"interleaved"``."""
    from benchmarks import triton_matmul
    m, n, k = shape
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    ref = x.float() @ w.float().T
    tol = 2e-2 * ref.abs().max().item()  # one bfloat16 rounding of the largest result, and then some
    # each implementation: output -> a launch that writes it
    impls = {peers[0]: lambda c: lambda: torch.matmul(x, w.T, out=c),
             peers[1]: lambda c: lambda: triton_matmul.matmul(x, w, c)}
    for label, ck in compiled.items():
        impls[label] = (lambda ck: lambda c: ck.bind(a=x, b=w, c=c).launch)(ck)
    launches, errs, first = {}, {}, {}
    for label, make in impls.items():
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        launches[label] = make(c)
        t0 = time.time()
        launches[label]()
        torch.cuda.synchronize()
        first[label] = round(time.time() - t0, 2)
        errs[label] = (c.float() - ref).abs().max().item()
        if report:
            print(f"{m}x{n}x{k} {label}: first launch done, max abs err {errs[label]:.3g}", flush=True)
    mixed = steady_mod.interleaved(launches, torch, rounds)
    if steady is None:
        return mixed, errs, tol, first
    alone = steady_mod.time_each_alone(launches, torch, report=print if report else None, **steady)
    if every is not None:
        every["interleaved"] = mixed
        every["alone"] = alone
    return {k: v["seconds"] for k, v in alone.items()}, errs, tol, first


def write_rows(path: Path, rows: list, rounds: int, device: str, **meta) -> dict:
    """``{"meta", "rows"}`` as JSON at ``path``: the device, the rounds, the date and ``meta``; returns the meta."""
    meta = {"device": device, "rounds": rounds,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **meta}
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return meta


def _sass_summary(ck, out: Path, stem: str) -> dict:
    from benchmarks.sass import _INSTR, loop_histograms
    tool = shutil.which("cuobjdump")
    r = ck.cubin.resources
    info = {"registers": r.registers, "spill_stores": r.spill_stores, "spill_loads": r.spill_loads,
            "stack_bytes": r.stack_bytes, "shared_bytes": ck.source.shared_bytes}
    if not tool:
        return info
    cubin = out / f"{stem}.cubin"
    cubin.write_bytes(ck.cubin.cubin)
    sass = subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    (out / f"{stem}.sass").write_text(sass)
    ops = collections.Counter(m.group(3) for m in map(_INSTR.match, sass.splitlines()) if m)
    loops = loop_histograms(sass)
    main = max(loops, key=lambda h: sum(v for o, v in h.items() if o.startswith("HGMMA")),
               default=collections.Counter())
    info.update(HGMMA=sum(n for op, n in ops.items() if op.startswith("HGMMA")), LDL=ops["LDL"], STL=ops["STL"],
                USETMAXREG=ops["USETMAXREG"], main_loop=dict(main.most_common(12)))
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sweep", action="store_true", help="also the matmul_tc variants of VARIANTS")
    p.add_argument("--rounds", type=int, default=9, help="interleaved: rounds of 5 launches of every implementation")
    p.add_argument("--sustain", type=float, default=2.0, help="steady clocks: seconds of sustained launches first")
    p.add_argument("--samples", type=int, default=100, help="steady clocks: launches whose median is the figure")
    p.add_argument("--idle", type=float, default=5.0, help="steady clocks: idle seconds before each implementation")
    p.add_argument("--levers", action="store_true", help="also the store and raster levers (LEVERS)")
    p.add_argument("--shapes", default=None, help="MxNxK,... (default: the four of SHAPES)")
    a = p.parse_args(argv)
    import torch
    import triton

    from benchmarks import triton_matmul
    from cbrules import api
    from cbrules.kernels.matmul_tc import matmul_tc

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = VARIANTS if a.sweep else {k: v for k, v in VARIANTS.items()
                                         if v is DEFAULT or k in ("128x256x64 S=4 persistent", PINGPONG)
                                         or (a.levers and ("persistent" in k or any(w in k for w in LEVERS)))}
    shapes = SHAPES if not a.shapes else tuple(tuple(int(d) for d in s.split("x")) for s in a.shapes.split(","))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    variants = {label: {k: sms if v == "sms" else v for k, v in kw.items()} for label, kw in variants.items()}
    compiled = {label: api.compile(matmul_tc(**{**WS, **kw})) for label, kw in variants.items()}
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    steady = {"sustain": a.sustain, "samples": a.samples, "idle": a.idle}
    for m, n, k in shapes:
        flop = 2.0 * m * n * k
        both: dict = {}
        secs, errs, tol, first = time_shape(torch, gen, (m, n, k), {f"matmul_tc {label}": ck for label, ck in
                                                                     compiled.items()}, a.rounds,
                                            peers=("torch.matmul (cuBLAS)", "triton (persistent, TMA, autotuned)"),
                                            report=True, every=both, steady=steady)
        for label in secs:
            err, ok = errs[label], errs[label] <= tol
            alone = both["alone"][label]
            row = {"shape": [m, n, k], "impl": label, "tflops": flop / secs[label] / 1e12, "ms": secs[label] * 1e3,
                   "tflops_interleaved": flop / both["interleaved"][label] / 1e12, "iqr": alone["spread"],
                   "clocks": alone["clocks"], "max_abs_err": err, "ok": ok, "first_call_s": first[label]}
            if label.startswith("triton"):
                row["config"] = triton_matmul.best_config()
            if label.startswith("matmul_tc"):
                row["params"] = {**WS, **variants[label[len("matmul_tc "):]]}
            rows.append(row)
            print(f"{m}x{n}x{k} {label}: {row['tflops']:.1f} TFLOP/s ({row['ms']:.3f} ms) err {err:.3g}"
                  f"{'' if ok else ' WRONG'}" + (f" [{row['config']}]" if 'config' in row else ''), flush=True)
    summarized = {"default": ("128x256x64 S=4 (default)", "matmul_tc_default"),
                  "persistent": ("128x256x64 S=4 persistent", "matmul_tc_persistent"),
                  "swizzled-store group_m=16": ("128x256x64 S=4 swizzled store, group_m=16", "matmul_tc_swizzled_store"),
                  "pingpong": (PINGPONG, "matmul_tc_pingpong")}
    sass = {which: _sass_summary(compiled[label], out, stem) for which, (label, stem) in summarized.items()
            if label in compiled}
    meta = write_rows(out / "results.json", rows, a.rounds, torch.cuda.get_device_name(), torch=torch.__version__,
                      triton=triton.__version__, sass=sass, steady=steady)
    (out / "results.md").write_text(_table(rows, meta))
    print(_table(rows, meta))
    return 0


def _table(rows: list, meta: dict) -> str:
    st = meta["steady"]
    lines = [f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}; {meta['date']}. Steady clocks: each "
             f"implementation alone, {st['idle']:g} s idle, {st['sustain']:g} s of sustained launches, then the median "
             f"of {st['samples']} launches (CUDA events). Interleaved (labelled): the median over {meta['rounds']} "
             "rounds of 5 launches of each implementation in turn.", "",
             "| shape | implementation | TFLOP/s (steady) | x cuBLAS | x Triton | MHz, W | TFLOP/s interleaved |",
             "|---|---|---|---|---|---|---|"]
    for shape in sorted({tuple(r["shape"]) for r in rows}, key=lambda s: SHAPES.index(s) if s in SHAPES else 9):
        here = [r for r in rows if tuple(r["shape"]) == shape]
        base = {r["impl"].split(" ")[0]: r["tflops"] for r in here}
        for r in here:
            name = r["impl"] + (f" [{r['config']}]" if "config" in r else "") + ("" if r["ok"] else " (WRONG)")
            clk = r.get("clocks") or {}
            lines.append(f"| {'x'.join(map(str, shape))} | {name} | {r['tflops']:.1f} | "
                         f"{r['tflops'] / base['torch.matmul']:.2f} | {r['tflops'] / base['triton']:.2f} | "
                         f"{clk.get('sm_mhz', '?')}, {clk.get('watts', '?')} | {r.get('tflops_interleaved', 0):.1f} |")
    for which, s in meta["sass"].items():
        lines += ["", f"SASS of the {which} matmul_tc: {s.get('HGMMA', '?')} HGMMA, {s.get('LDL', '?')} LDL / "
                  f"{s.get('STL', '?')} STL, {s.get('USETMAXREG', '?')} USETMAXREG; {s['registers']} registers, "
                  f"{s['spill_stores']}/{s['spill_loads']} B spill stores/loads, {s['shared_bytes']} B shared memory"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
