"""Compile-time figures (CPU only): for each built-in kernel, the time of each pipeline stage, and
engine scaling on synthetic graphs.

    python3 benchmarks/compile_times.py [--out benchmarks/results] [--repeat 3] [--sizes 100,1000,10000]

Per kernel (default shape, default stages): rule application (``engine.lower(..., simplify=False)``),
the whole lowering with egglog, egglog saturation (the "egglog" records of a debug-mode trace),
scheduling, CUDA emission, NVRTC cold (a fresh cache folder) and warm (a cache hit). CPU stages
are the median of ``--repeat`` runs after one warm-up. Scaling: a kernel whose circular-buffered
loop holds a chain of elementwise ops ("long body"), and one with many circular-buffered loops
("many loops"), of about 100, 1,000 and 10,000 nodes as built; each size runs in its own process
under ``--scale-timeout`` seconds. Writes compile_times.json, compile_times.md and compile_times.svg
(time against nodes, log-log).
"""
from __future__ import annotations

import argparse
import gc
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
sys.path.insert(1, str(ROOT / "tests"))  # the synthetic kernels the engine-scaling tests build too

from synthetic import synthetic  # noqa: E402


def _median_time(fn, repeat: int, clock=time.perf_counter):
    times, result = [], None
    for _ in range(repeat):
        t0 = clock()
        result = fn()
        times.append(clock() - t0)
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

        def cold():  # egglog's result cache emptied: the first lowering of these terms
            engine.SIMPLIFIED.clear()
            return engine.lower(g, rules).graph
        t_lower, lowered = _median_time(cold, repeat)
        c_lower, _ = _median_time(cold, repeat, time.process_time)  # less stretched by other work on the machine
        t_cached, _ = _median_time(lambda: engine.lower(g, rules).graph, repeat)
        engine.SIMPLIFIED.clear()
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
                     "rules_s": t_rules, "lower_s": t_lower, "lower_cpu_s": c_lower, "lower_cached_s": t_cached, "egglog_s": t_egg, "rule_rewrites_s": t_apply,
                     "schedule_s": t_sched, "codegen_s": t_emit, "nvrtc_cold_s": t_cold, "nvrtc_warm_s": t_warm,
                     "source_lines": src.text.count("\n")})
        print(f"  {name:20s} rules {t_rules:.3f} s, lower {t_lower:.3f} s (cached {t_cached:.3f} s), "
              f"egglog {t_egg:.3f} s, "
              f"schedule {t_sched * 1e3:.1f} ms, codegen {t_emit * 1e3:.1f} ms, NVRTC cold {t_cold:.3f} s, "
              f"warm {t_warm * 1e3:.2f} ms", flush=True)
    return rows


def scale_case(family: str, nodes: int) -> dict:
    from cbrules import api
    from cbrules.rewrite import engine
    rules = api.load_rules()
    api.lower(synthetic(family, 100))  # warm-up
    t0 = time.perf_counter()
    k = synthetic(family, nodes)
    t_build = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    plain = engine.lower(k.graph, rules, simplify=False, time_limit=None)  # big graphs take minutes
    t_rules, c_rules = time.perf_counter() - t0, time.process_time() - c0
    steps, work = plain.steps, plain.match_work
    del plain  # the lowering below starts from the heap the one above did, not beside its graph
    gc.collect()
    t0 = time.perf_counter()
    lowered = api.lower(k, rules=rules, time_limit=None)
    t_lower = time.perf_counter() - t0
    return {"family": family, "target_nodes": nodes, "nodes_built": len(k.graph), "nodes_lowered": len(lowered),
            "rule_applications": steps, "match_work": work, "build_s": t_build, "rules_s": t_rules,
            "rules_cpu_s": c_rules,
            "lower_s": t_lower}


def scaling(sizes: list[int], loop_sizes: list[int], timeout: float) -> list[dict]:
    rows = []
    for family, ns in (("long body", sizes), ("many loops", loop_sizes)):
        for n in ns:
            cmd = [sys.executable, __file__, "--scale-case", f"{family}:{n}"]
            t0 = time.monotonic()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                if p.returncode:
                    row = {"family": family, "target_nodes": n, "error": p.stderr.strip().splitlines()[-1]}
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
             f"median of {meta['repeat']} runs (NVRTC cold: one run, fresh cache folder); load average at the "
             f"start (1 / 5 / 15 min): {meta.get('load', '?')}: on a shared machine wall times stretch with it. "
             f"Command: `{meta['command']}`.", "",
             "rules = `engine.lower(simplify=False)` (matching + rewriting, the `provably-*` guards' egglog "
             "questions included); lower = the whole `engine.lower` with egglog's result cache emptied before "
             "each run (egglog simplifies once, after the last phase; its rule file is loaded once per process); "
             "lower, cached = the same with the cache of simplified term sets warm (lowering the same kernel "
             "again: the checker, the CLI, the benchmarks); egglog = the egglog record's seconds in a debug-mode "
             "trace (cache emptied); lower, CPU = the process's CPU seconds of the cold lowering; schedule = `cbrules.schedule.schedule`; codegen = `cbrules.codegen.cuda.emit`.", "",
             "| kernel | nodes built → lowered | rule applications | rules | egglog | lower (rules + egglog) | "
             "lower, CPU | lower, cached | egglog / lower | schedule | codegen | NVRTC cold | NVRTC warm (cache hit) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in kernels:
        lines.append(f"| {r['kernel']} | {r['nodes_built']} → {r['nodes_lowered']} | {r['rule_applications']} | "
                     f"{_f(r['rules_s'])} | {_f(r['egglog_s'])} | {_f(r['lower_s'])} | {_f(r.get('lower_cpu_s'))} | "
                     f"{_f(r['lower_cached_s'])} | "
                     f"{r['egglog_s'] / r['lower_s']:.0%} | {_f(r['schedule_s'], 'ms')} | "
                     f"{_f(r['codegen_s'], 'ms')} | {_f(r['nvrtc_cold_s'])} | {_f(r['nvrtc_warm_s'], 'ms')} |")
    lines += ["", "## Engine scaling (synthetic kernels)", "",
              "long body: one circular-buffered loop whose body is a chain of elementwise ops; many loops: "
              "N/8 circular-buffered loops of 8 nodes each. build = the builder (`cbrules.ir.builder`) making the "
              "graph; rules = `engine.lower(simplify=False)`; lower = `api.lower` (with egglog); match work = "
              "the matcher's search steps (`Lowered.match_work`: candidates and pattern elements tried); rules CPU = "
              "the process's CPU seconds for rules (less stretched than wall time by other work on the machine; the "
              "plot shows it). Each size runs in its own process; its two lowerings run one after the other, the "
              "first one's graph freed before the second starts."
              + (f" These rows are from an earlier run: `{meta['scaling_command']}`." if meta.get("scaling_command")
                 else ""), "",
              "![time against nodes](compile_times.svg)", "",
              "| family | nodes built → lowered | rule applications | match work | build | rules | rules CPU | "
              "lower (with egglog) |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in scale:
        if "error" in r:
            e = r["error"]  # the exception's line: its head (what failed) and its tail (why)
            e = e if len(e) <= 300 else e[:90] + " … " + e[-200:]
            lines.append(f"| {r['family']} | ~{r['target_nodes']} | — | — | — | — | — | {e} |")
        else:
            lines.append(f"| {r['family']} | {r['nodes_built']} → {r['nodes_lowered']} | {r['rule_applications']} | "
                         f"{r.get('match_work', '—')} | {_f(r['build_s'])} | {_f(r['rules_s'])} | "
                         f"{_f(r.get('rules_cpu_s'))} | {_f(r['lower_s'])} |")
    return "\n".join(lines) + "\n"


def svg_plot(scale: list[dict]) -> str:
    """Seconds against nodes built, both axes logarithmic, one line per family and measure (matplotlib
    is not a dependency: the SVG is written by hand). Dotted grey: slope 1 (linear) from the first point."""
    import math
    series = {}
    for r in scale:
        if "error" not in r:
            for key, label in (("rules_cpu_s", "rules CPU"), ("lower_s", "lower, wall")):
                series.setdefault(f"{r['family']}, {label}", []).append((r["nodes_built"], r[key]))
    points = [p for ps in series.values() for p in ps]
    if not points:
        return ""
    w, h, m = 640, 420, 60
    xs = [math.log10(x) for x, _ in points]
    ys = [math.log10(max(y, 1e-3)) for _, y in points]
    x0, x1 = math.floor(min(xs)), math.ceil(max(xs))
    y0, y1 = math.floor(min(ys)), math.ceil(max(ys))
    x1, y1 = max(x1, x0 + 1), max(y1, y0 + 1)

    def px(x, y):
        return (m + (math.log10(x) - x0) / (x1 - x0) * (w - 2 * m),
                h - m - (math.log10(max(y, 1e-3)) - y0) / (y1 - y0) * (h - 2 * m))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
           'font-size="12">', f'<rect width="{w}" height="{h}" fill="white"/>']
    for e in range(x0, x1 + 1):
        x, _ = px(10 ** e, 10 ** y0)
        out.append(f'<line x1="{x:.1f}" y1="{m}" x2="{x:.1f}" y2="{h - m}" stroke="#ddd"/>'
                   f'<text x="{x:.1f}" y="{h - m + 16}" text-anchor="middle">{10 ** e:,}</text>')
    for e in range(y0, y1 + 1):
        _, y = px(10 ** x0, 10 ** e)
        out.append(f'<line x1="{m}" y1="{y:.1f}" x2="{w - m}" y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{m - 6}" y="{y + 4:.1f}" text-anchor="end">{10.0 ** e:g} s</text>')
    out.append(f'<text x="{w / 2}" y="{h - 16}" text-anchor="middle">nodes built</text>')
    colours = ["#1f77b4", "#aec7e8", "#d62728", "#ff9896"]
    for i, (name, ps) in enumerate(sorted(series.items())):
        ps = sorted(ps)
        (ax, ay), (bx, by) = px(*ps[0]), px(ps[-1][0], ps[0][1] * ps[-1][0] / ps[0][0])
        out.append(f'<line x1="{ax:.1f}" y1="{ay:.1f}" x2="{bx:.1f}" y2="{by:.1f}" stroke="#999" '
                   'stroke-dasharray="2,3"/>')
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (px(*p) for p in ps))
        c = colours[i % len(colours)]
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{c}"/>' for x, y in (px(*p) for p in ps)]
        out.append(f'<text x="{m + 10}" y="{m + 14 + 14 * i}" fill="{c}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sizes", default="100,1000,3000,10000")
    p.add_argument("--loop-sizes", default="100,300,1000,2000", help="sizes of the many-loops family")
    p.add_argument("--scale-timeout", type=float, default=1500.0)
    p.add_argument("--skip-kernels", action="store_true", help="only the scaling part")
    p.add_argument("--reuse-scaling", action="store_true", help="keep the scaling rows of OUT/compile_times.json "
                   "and measure only the kernels")
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
            "egglog": metadata.version("egglog"), "repeat": a.repeat,
            "load": " / ".join(f"{x:.1f}" for x in os.getloadavg())}
    kernels = [] if a.skip_kernels else kernel_times(a.repeat)
    out = Path(a.out)
    if a.reuse_scaling:
        old = json.loads((out / "compile_times.json").read_text())
        scale, meta["scaling_command"] = old["scaling"], old["meta"].get("scaling_command", old["meta"]["command"])
    else:
        scale = scaling([int(s) for s in a.sizes.split(",") if s], [int(s) for s in a.loop_sizes.split(",") if s],
                        a.scale_timeout)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(kernels, scale, meta)
    (out / "compile_times.md").write_text(md)
    (out / "compile_times.svg").write_text(svg_plot(scale))
    (out / "compile_times.json").write_text(json.dumps({"meta": meta, "kernels": kernels, "scaling": scale},
                                                       indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
