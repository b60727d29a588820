"""Benchmark harness: generated kernels (S = 1..4) beside the device copy ceiling, torch eager and
Triton (tl.range num_stages) on one Hopper GPU, in one run.

    python3 benchmarks/run.py [--out benchmarks/results] [--ops exp,add,...] [--reps 25]
    python3 benchmarks/run.py --dry-run      # no GPU: build and NVRTC-compile every generated variant

Each op runs in its own worker process (benchmarks/worker.py) under a time limit, so a kernel that
faults or hangs costs its own op only; the whole run keeps inside ``--budget`` seconds. Writes
results.md (tables), results.png (plot) and results.json (raw records) under ``--out`` and prints
the tables.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from benchmarks.ops import (OPS, STAGES, TMA_STORE_OPS, TRITON_STAGES, WS_VARIANTS, chosen_stages,  # noqa: E402
                            compile_generated, describe, flops, io_bytes, resources, shape_label, ws_label,
                            ws_registers)

MIN_OP_SECONDS = 25  # kept back for each op still to run


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _skipped(ops: list[str]) -> list[dict]:
    return [{"op": o, "shape": sl, "reason": why} for o in ops for sl, why in OPS[o].skips.items()]


def dry_run(ops: list[str], shapes_arg, out: Path, meta: dict, dtype: str = "float32",
            stages: tuple = STAGES, tma_store: bool = False) -> int:
    """Build and compile every generated variant (no GPU needed) and write a report of fake numbers,
    to check the harness end to end."""
    rng = random.Random(0)
    records, cache, failed = [], {}, 0
    for name in ops:
        op = OPS[name]
        for shape in _shapes(op, shapes_arg):
            sl, nbytes, nflop = shape_label(shape), io_bytes(name, shape, dtype), flops(name, shape)
            base = {"op": name, "shape": sl, "bytes": nbytes, "flop": nflop}

            def fake(impl, variant, speed, **extra):
                ms = (nflop / (speed * 1e9)) if nflop else nbytes / (speed * 1e6)
                records.append(dict(base, impl=impl, variant=variant, ms=ms, reps=0, valid=True, max_abs_err=0.0,
                                    gbps=nbytes / ms / 1e6, tflops=None if nflop is None else nflop / ms / 1e9,
                                    **extra))
            peak = 40.0 if nflop else 4000.0
            if name != "matmul":
                fake("copy", "cuMemcpyDtoDAsync", peak)
            fake("torch", "torch", peak * rng.uniform(0.6, 0.95))
            for s in TRITON_STAGES:
                fake("triton", f"S={s}", peak * rng.uniform(0.4, 0.9), stages=s)
            stores = (False, True) if tma_store and name in TMA_STORE_OPS else (False,)
            for s, ts in ((s, ts) for ts in stores for s in stages):
                label = f"S={s}" + (" TMA store" if ts else "")
                try:
                    ck, secs = compile_generated(name, shape, s, cache, dtype, ts)
                except Exception as e:
                    failed += 1
                    records.append(dict(base, impl="generated", variant=label, stages=s, tma_store=ts,
                                        error=f"{type(e).__name__}: {str(e)[:300]}"))
                    print(f"  {name} {sl} {label}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                res = resources(ck)
                print(f"  {name} {sl} {label}: compiled in {secs:.2f} s, {res}", flush=True)
                fake("generated", label, peak * rng.uniform(0.3, 0.97), stages=s, resources=res, compile_s=secs,
                     kernel=describe(name, shape, dtype, ts), tma_store=ts)
            try:
                s = chosen_stages(name, shape, dtype)
                ck, secs = compile_generated(name, shape, "auto", cache, dtype)
                print(f"  {name} {sl} S=auto ({s}): compiled in {secs:.2f} s", flush=True)
                fake("generated-auto", f"S=auto ({s})", peak * rng.uniform(0.3, 0.97), stages=s,
                     resources=resources(ck), compile_s=secs, kernel=describe(name, shape, dtype))
            except Exception as e:
                failed += 1
                print(f"  {name} {sl} S=auto: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            for s, regs in (WS_VARIANTS if dtype == "float32" else ()):
                try:
                    ck, secs = compile_generated(name, shape, s, cache, ws=regs)
                except Exception as e:
                    failed += 1
                    records.append(dict(base, impl="generated-ws", variant=ws_label(s, None), stages=s,
                                        error=f"{type(e).__name__}: {str(e)[:300]}"))
                    print(f"  {name} {sl} {ws_label(s, None)}{' regs' if regs else ''}: FAILED {type(e).__name__}: "
                          f"{str(e)[:300]}", flush=True)
                    continue
                split = ws_registers(ck.source.block[0] - 128) if regs else None
                res = resources(ck)
                print(f"  {name} {sl} {ws_label(s, split)}: compiled in {secs:.2f} s, {res}", flush=True)
                fake("generated-ws", ws_label(s, split), peak * rng.uniform(0.3, 0.97), stages=s, registers=split,
                     resources=res, compile_s=secs, kernel=describe(name, shape, ws=regs))
    md = report.write(records, _skipped(ops), meta, out)
    print(md)
    print(f"dry run: {failed} generated variant(s) failed to compile; report of fake numbers in {out}")
    return 1 if failed else 0


def _shapes(op, shapes_arg) -> tuple:
    if not shapes_arg:
        return op.shapes
    want = set(shapes_arg.split(","))
    return tuple(s for s in op.shapes if shape_label(s) in want)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="results folder (default benchmarks/results; a temporary folder for --dry-run)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--shapes", help="only these shape labels, e.g. 16384x16384,4096x4096x4096")
    p.add_argument("--reps", type=int, default=25, help="timed launches per measurement (>= 20; default 25)")
    p.add_argument("--warmup", type=int, default=3, help="untimed launches before timing (default 3)")
    p.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run (default 420)")
    p.add_argument("--op-cap", type=float, default=100.0, help="seconds one op may take (matmul 1.5x; default 100)")
    p.add_argument("--impls", default="copy,torch,generated,generated-auto,generated-ws,triton",
                   help="implementations to measure (generated-auto: stages=\"auto\")")
    p.add_argument("--from-json", metavar="RESULTS_JSON", help="no measuring: rewrite results.md/.png/.json "
                   "under --out from an earlier run's results.json")
    p.add_argument("--dry-run", action="store_true", help="no GPU: compile every generated variant, fake numbers")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="element type of every tensor (torch and Triton run in it too)")
    p.add_argument("--stages", default=",".join(map(str, STAGES)), help="generated stage counts (default 1,2,3,4)")
    p.add_argument("--tma-store", action="store_true", help="also the generated TMA-store variant (exp, add)")
    a = p.parse_args(argv)
    ops = [o for o in a.ops.split(",") if o]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        p.error(f"unknown op(s) {unknown}; known: {list(OPS)}")
    if a.reps < 20 and not a.dry_run:
        print(f"note: --reps {a.reps} is below the 20 the issue asks for", file=sys.stderr)
    out = Path(a.out) if a.out else (Path(tempfile.gettempdir()) / "cbrules-bench-dry" if a.dry_run
                                     else ROOT / "benchmarks" / "results")
    meta = {"command": "python3 benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "reps": a.reps, "warmup": a.warmup, "dry_run": a.dry_run, "torch": _version("torch"),
            "triton": _version("triton"), "cuda_bindings": _version("cuda-bindings"),
            "nvrtc": _version("nvidia-cuda-nvrtc"), "dtype": a.dtype}
    if a.from_json:
        old = json.loads(Path(a.from_json).read_text())
        print(report.write(old["records"], old["skipped"], old["meta"], Path(a.out or ROOT / "benchmarks" / "results")))
        return 0
    if a.dry_run:
        meta["device"] = {"name": "none (dry run)"}
        return dry_run(ops, a.shapes, out, meta, a.dtype, [int(s) for s in a.stages.split(",")], a.tma_store)

    from cbrules.codegen import runtime
    if not runtime.gpu_available():
        print("no compute-capability 9.x GPU here; use --dry-run to check the harness", file=sys.stderr)
        return 2
    meta["device"] = runtime.device_info()
    print(f"device: {meta['device']}", flush=True)
    t_start = time.monotonic()
    records: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="cbrules-bench-"))
    for i, name in enumerate(ops):
        left = a.budget - (time.monotonic() - t_start)
        limit = min(left - MIN_OP_SECONDS * (len(ops) - i - 1), a.op_cap * (1.5 if name == "matmul" else 1.0))
        if limit < 10:
            records.append({"op": name, "shape": "-", "impl": "-", "variant": "-",
                            "error": f"not run: the run's {a.budget:.0f} s budget was spent"})
            continue
        jsonl = work / f"{name}.jsonl"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "worker.py"), "--op", name, "--jsonl", str(jsonl),
               "--reps", str(a.reps), "--warmup", str(a.warmup), "--impls", a.impls, "--dtype", a.dtype,
               "--stages", a.stages] + (["--tma-store"] if a.tma_store else [])
        if a.shapes:
            shapes = _shapes(OPS[name], a.shapes)
            if not shapes:
                continue
            cmd += ["--shapes", ",".join(shape_label(s) for s in shapes)]
        print(f"== {name} (limit {limit:.0f} s)", flush=True)
        t0 = time.monotonic()
        try:
            rc = subprocess.run(cmd, timeout=limit, env=dict(os.environ, PYTHONUNBUFFERED="1")).returncode
            why = None if rc == 0 else f"worker exited with status {rc}"
        except subprocess.TimeoutExpired:
            why = f"worker stopped at its {limit:.0f} s limit (hang or too slow); later shapes/impls missing"
        got = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
        records += got
        if why:
            records.append({"op": name, "shape": "-", "impl": "-", "variant": "-", "error": why})
            print(f"   {why}", flush=True)
        print(f"== {name}: {len(got)} measurements in {time.monotonic() - t0:.0f} s", flush=True)
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    md = report.write(records, _skipped(ops), meta, out)
    print(md)
    bad = [r for r in records if r.get("error") or not r.get("valid", True)]
    for r in bad:
        print(f"problem: {r['op']} {r['shape']} {r['impl']} {r.get('variant', '')}: "
              f"{r.get('error') or 'output does not match torch'}")
    print(f"wrote {out}/results.md, results.png, results.json in {meta['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
