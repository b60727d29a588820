"""Compile-time figures (CPU only): for each built-in kernel, the time of each pipeline stage, and
engine scaling on synthetic graphs.

    python3 benchmarks/compile_times.py [--out benchmarks/results] [--repeat 3] [--sizes 100,1000,10000]

Per kernel (default shape, default stages): rule application (``engine.lower(..., simplify=False)``),
the whole lowering with egglog, egglog saturation (the "egglog" records of a debug-mode trace),
scheduling, CUDA emission, NVRTC cold (a fresh cache folder) and warm (a cache hit). CPU stages
are the median of ``--repeat`` runs after one warm-up. Scaling: a kernel whose circular-buffered
loop holds a chain of elementwise ops ("long body"), and one with many circular-buffered loops
("many loops"), of about 100, 1,000 and 10,000 nodes as built; each size runs in its own process
under ``--scale-timeout`` seconds. Writes compile_times.json and compile_times.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _median_time(fn, repeat: int):
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def kernel_times(repeat: int) -> list[dict]:
    from cbrules import api
    from cbrules.rewrite import engine
    from cbrules.kernels import KERNELS
    from cbrules.schedule import schedule
    from cbrules.codegen.cuda import emit
    from cbrules.codegen.nvrtc import compile_cuda

    rules = api.load_rules()
    api.lower(KERNELS["single_dim"].build(stages=3))  # warm-up: imports, egglog start-up
    rows = []
    for name, spec in KERNELS.items():
        k = spec.build(spec.default_shape)
        g = k.graph
        t_rules, _ = _median_time(lambda: engine.lower(g, rules, simplify=False), repeat)
        t_lower, lowered = _median_time(lambda: engine.lower(g, rules).graph, repeat)
        recs = api.lower(k, rules=rules, debug=True).trace.records
        t_egg = sum(r.seconds for r in recs if r.rule == "egglog")
        t_apply = sum(r.seconds for r in recs if r.rule != "egglog")
        t_sched, prog = _median_time(lambda: schedule(lowered), repeat)
        t_emit, src = _median_time(lambda: emit(prog), repeat)
        with tempfile.TemporaryDirectory() as cache:
            t0 = time.perf_counter()
            cold = compile_cuda(src.text, src.name, cache_dir=cache)
            t_cold = time.perf_counter() - t0
            t_warm, warm = _median_time(lambda: compile_cuda(src.text, src.name, cache_dir=cache), repeat)
        assert not cold.cached and warm.cached
        rows.append({"kernel": name, "nodes_built": len(g), "nodes_lowered": len(lowered),
                     "rule_applications": sum(1 for r in recs if r.rule != "egglog"),
                     "rules_s": t_rules, "lower_s": t_lower, "egglog_s": t_egg, "rule_rewrites_s": t_apply,
                     "schedule_s": t_sched, "codegen_s": t_emit, "nvrtc_cold_s": t_cold, "nvrtc_warm_s": t_warm,
                     "source_lines": src.text.count("\n")})
        print(f"  {name:20s} rules {t_rules:.3f} s, lower {t_lower:.3f} s, egglog {t_egg:.3f} s, "
              f"schedule {t_sched * 1e3:.1f} ms, codegen {t_emit * 1e3:.1f} ms, NVRTC cold {t_cold:.3f} s, "
              f"warm {t_warm * 1e3:.2f} ms", flush=True)
    return rows


def synthetic(family: str, nodes: int):
    """A kernel of about ``nodes`` nodes as built."""
    from cbrules.ir.builder import Kernel, ceil_div, circular_buffer, threadIdx
    k = Kernel(f"synthetic_{family.replace(' ', '_')}", block=256)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    xm = k.tensor_map(x, box=(256,))
    k.grid(1)
    if family == "long body":  # 6 fixed nodes + the chain
        tile = k.alloc("tile", "shared", "float32", (256,))
        with k.loop("j", ceil_div(n, 256), circular_buffer=circular_buffer(3)) as j:
            k.tma_load(xm, (j * 256,), tile)
            v = k.load(tile, threadIdx.x)
            for i in range(max(nodes - 6, 1)):
                v = k.add(v, float(i % 7 + 1)) if i % 2 else k.mul(v, 1.0001)
            k.store(out, j * 256 + threadIdx.x, v)
    else:  # many loops: 8 nodes each (alloc, for, tma_load, load, 3 ops, store)
        for q in range(max(nodes // 8, 1)):
            tile = k.alloc(f"tile{q}", "shared", "float32", (256,))
            with k.loop(f"j{q}", ceil_div(n, 256), circular_buffer=circular_buffer(3)) as j:
                k.tma_load(xm, (j * 256,), tile)
                v = k.load(tile, threadIdx.x)
                v = k.exp(k.add(k.mul(v, 2.0), float(q)))
                k.store(out, j * 256 + threadIdx.x, v)
    return k


def scale_case(family: str, nodes: int) -> dict:
    from cbrules import api
    from cbrules.rewrite import engine
    rules = api.load_rules()
    api.lower(synthetic(family, 100))  # warm-up
    t0 = time.perf_counter()
    k = synthetic(family, nodes)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    plain = engine.lower(k.graph, rules, simplify=False, time_limit=None)  # big graphs take minutes
    t_rules = time.perf_counter() - t0
    t0 = time.perf_counter()
    lowered = api.lower(k, rules=rules, time_limit=None)
    t_lower = time.perf_counter() - t0
    return {"family": family, "target_nodes": nodes, "nodes_built": len(k.graph), "nodes_lowered": len(lowered),
            "rule_applications": plain.steps, "build_s": t_build, "rules_s": t_rules, "lower_s": t_lower}


def scaling(sizes: list[int], loop_sizes: list[int], timeout: float) -> list[dict]:
    rows = []
    for family, ns in (("long body", sizes), ("many loops", loop_sizes)):
        for n in ns:
            cmd = [sys.executable, __file__, "--scale-case", f"{family}:{n}"]
            t0 = time.monotonic()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                if p.returncode:
                    row = {"family": family, "target_nodes": n, "error": p.stderr.strip().splitlines()[-1][:300]}
                else:
                    row = json.loads(p.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                row = {"family": family, "target_nodes": n, "error": f"did not finish in {timeout:.0f} s"}
            row["wall_s"] = time.monotonic() - t0
            print(f"  {family:10s} {n:6d}: {row}", flush=True)
            rows.append(row)
    return rows


def _f(v, unit="s") -> str:
    if v is None:
        return "—"
    return f"{v * 1e3:.1f} ms" if unit == "ms" or v < 0.1 else f"{v:.2f} s"


def markdown(kernels: list[dict], scale: list[dict], meta: dict) -> str:
    lines = ["# cbrules compile times", "",
             f"{meta['cpu']}; Python {meta['python']}; NVRTC {meta['nvrtc']}; egglog {meta['egglog']}; "
             f"median of {meta['repeat']} runs (NVRTC cold: one run, fresh cache folder). "
             f"Command: `{meta['command']}`.", "",
             "rules = `engine.lower(simplify=False)` (matching + rewriting); lower = the whole `engine.lower` with "
             "egglog; egglog = the egglog records' seconds in a debug-mode trace; schedule = "
             "`cbrules.schedule.schedule`; codegen = `cbrules.codegen.cuda.emit`.", "",
             "| kernel | nodes built → lowered | rule applications | rules | egglog | lower (rules + egglog) | "
             "schedule | codegen | NVRTC cold | NVRTC warm (cache hit) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in kernels:
        lines.append(f"| {r['kernel']} | {r['nodes_built']} → {r['nodes_lowered']} | {r['rule_applications']} | "
                     f"{_f(r['rules_s'])} | {_f(r['egglog_s'])} | {_f(r['lower_s'])} | {_f(r['schedule_s'], 'ms')} | "
                     f"{_f(r['codegen_s'], 'ms')} | {_f(r['nvrtc_cold_s'])} | {_f(r['nvrtc_warm_s'], 'ms')} |")
    lines += ["", "## Engine scaling (synthetic kernels)", "",
              "long body: one circular-buffered loop whose body is a chain of elementwise ops; many loops: "
              "N/8 circular-buffered loops of 8 nodes each. build = the builder (`cbrules.ir.builder`) making the "
              "graph; rules = `engine.lower(simplify=False)`; lower = `api.lower` (with egglog). Many loops at "
              "10,000 nodes (1,250 circular-buffered loops) is not attempted: it takes minutes (the engine re-matches the "
              "whole graph after each application).", "",
              "| family | nodes built → lowered | rule applications | build | rules | lower (with egglog) |",
              "|---|---|---:|---:|---:|---:|"]
    for r in scale:
        if "error" in r:
            lines.append(f"| {r['family']} | ~{r['target_nodes']} | — | — | — | {r['error']} |")
        else:
            lines.append(f"| {r['family']} | {r['nodes_built']} → {r['nodes_lowered']} | {r['rule_applications']} | "
                         f"{_f(r['build_s'])} | {_f(r['rules_s'])} | {_f(r['lower_s'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sizes", default="100,1000,10000")
    p.add_argument("--loop-sizes", default="100,1000", help="sizes of the many-loops family (10,000 nodes is "
                   "1,250 circular-buffered loops: minutes of lowering)")
    p.add_argument("--scale-timeout", type=float, default=1500.0)
    p.add_argument("--skip-kernels", action="store_true", help="only the scaling part")
    p.add_argument("--scale-case", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.scale_case:
        family, n = a.scale_case.rsplit(":", 1)
        print(json.dumps(scale_case(family, int(n))))
        return 0
    import platform
    from importlib import metadata
    from cbrules.codegen.nvrtc import nvrtc_version
    meta = {"command": "python3 benchmarks/compile_times.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            "python": platform.python_version(), "nvrtc": ".".join(map(str, nvrtc_version())),
            "egglog": metadata.version("egglog"), "repeat": a.repeat}
    kernels = [] if a.skip_kernels else kernel_times(a.repeat)
    scale = scaling([int(s) for s in a.sizes.split(",") if s], [int(s) for s in a.loop_sizes.split(",") if s],
                    a.scale_timeout)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(kernels, scale, meta)
    (out / "compile_times.md").write_text(md)
    (out / "compile_times.json").write_text(json.dumps({"meta": meta, "kernels": kernels, "scaling": scale},
                                                       indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
