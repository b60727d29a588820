"""Does an L2 cache hint help? Each kernel with and without the rule folders of
``benchmarks/cache_hint_rules/`` (rule files only: :cache_hint on TMA loads, :l2_promotion on their maps),
timed alone at steady clocks (:mod:`benchmarks.steady`) and checked against numpy / a float32 product.

    python3 benchmarks/cache_hints.py --out benchmarks/results/cache_hints [--quick]
    python3 benchmarks/cache_hints.py --dry-run     # no GPU: lower and NVRTC-compile every variant

Streamed kernels (pointwise, single_dim) try evict_first and 256-byte promotion; matmul_tc tries B
evict_last (every block row reads it) and A evict_first as well. Writes results.json and results.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RULES = ROOT / "benchmarks" / "cache_hint_rules"
# kernel -> (shape, rule folders tried beside the plain kernel)
STREAMED = ("evict-first", "promote-256", "evict-first-promote-256")
CASES = {"pointwise": ((8192, 8192), STREAMED), "single_dim": ((1 << 26,), STREAMED),
         "matmul_tc": ((8192, 8192, 8192), ("mm-b-evict-last", "mm-a-first-b-last"))}
QUICK = {"pointwise": (4096, 4096), "single_dim": (1 << 24,), "matmul_tc": (4096, 4096, 4096)}


def variants(name: str) -> dict:
    """label -> the rule folders of one variant (the plain kernel: none)."""
    return {"plain": [], **{v: [RULES / v] for v in CASES[name][1]}}


def build(name: str, shape: tuple, rules: list):
    """The compiled kernel of ``name`` (stages 4; matmul_tc warp-specialized as benchmarked) with ``rules``."""
    from cbrules import api
    from cbrules.kernels import get
    if name == "matmul_tc":
        from cbrules.kernels.matmul_tc import matmul_tc
        return api.compile(matmul_tc(stages=4, warp_specialize=True, registers=(40, 232)), rules=rules)
    return api.compile(get(name).build(shape, stages=4), rules=rules)


def dry_run() -> int:
    """Lower and compile every variant (the CUDA must hold the hint it asks for)."""
    for name, (shape, _) in CASES.items():
        for label, rules in variants(name).items():
            ck = build(name, shape, rules)
            text = ck.source.text if hasattr(ck, "source") else ""
            hinted = "cb_tma_load_hint(" in text
            print(f"{name} {label}: compiled; hinted loads: {hinted}; l2 promotion: "
                  f"{getattr(ck.source, 'l2_promotion', ())}")
            if label != "plain" and "evict" in label and not hinted:
                print(f"{name} {label}: the rule folder set no :cache_hint", file=sys.stderr)
                return 1
    return 0


def measure(name: str, shape: tuple, steady: dict) -> list[dict]:
    import numpy as np
    import torch
    from benchmarks import steady as steady_mod
    from cbrules.kernels import get
    rows, launches, checks = [], {}, {}
    if name == "matmul_tc":
        m, n, k = shape
        gen = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = a.float() @ b.float().T
        tol = 2e-2 * ref.abs().max().item()
        for label, rules in variants(name).items():
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            launches[label] = build(name, shape, rules).bind(a=a, b=b, c=c).launch
            launches[label]()
            torch.cuda.synchronize()
            checks[label] = (c.float() - ref).abs().max().item() <= tol
        nbytes, flop = 2 * (m * k + n * k + m * n), 2.0 * m * n * k
    else:
        sp = get(name)
        args = sp.inputs(shape, np.random.default_rng(0))
        want = sp.reference(args)
        bound = {}
        for label, rules in variants(name).items():
            ck = build(name, shape, rules)
            bound[label] = ck.bind(**{k: v.copy() if isinstance(v, np.ndarray) else v for k, v in args.items()})
            for out in sp.outputs:
                bound[label].arrays[out].fill_bytes(0xFF)
            bound[label].launch()
            launches[label] = bound[label].launch
        nbytes = sum(v.nbytes for v in args.values() if isinstance(v, np.ndarray))
        flop = 0.0
    alone = steady_mod.time_each_alone(launches, torch, report=print, **steady)
    if name != "matmul_tc":
        for label, bl in bound.items():
            bl.finish()
            got = bl.copy_back  # the host copies bind made, updated by finish()
            rtol, atol = sp.tolerances(shape)
            checks[label] = all(np.allclose(got[o], want[o], rtol=rtol, atol=atol) for o in sp.outputs)
    base = alone["plain"]["seconds"]
    for label, r in alone.items():
        rows.append({"kernel": name, "shape": list(shape), "variant": label, "ms": r["seconds"] * 1e3,
                     "vs_plain": base / r["seconds"], "iqr": r["spread"], "clocks": r["clocks"],
                     "GBps": nbytes / r["seconds"] / 1e9, "TFLOPs": flop / r["seconds"] / 1e12 if flop else None,
                     "ok": checks[label]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cache_hints"))
    p.add_argument("--kernels", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    p.add_argument("--quick", action="store_true", help="smaller shapes, shorter steady phases")
    p.add_argument("--dry-run", action="store_true", help="no GPU: compile every variant")
    a = p.parse_args(argv)
    if a.dry_run:
        return dry_run()
    steady = {"sustain": 0.5, "samples": 30, "idle": 1.0} if a.quick else {"sustain": 2.0, "samples": 100, "idle": 5.0}
    rows = []
    for name in a.kernels.split(","):
        shape = QUICK[name] if a.quick else CASES[name][0]
        rows += measure(name, shape, steady)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    lines = ["| kernel | shape | variant | ms | vs plain | GB/s | ok |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {'x'.join(map(str, r['shape']))} | {r['variant']} | {r['ms']:.3f} | "
              f"{r['vs_plain']:.3f}x | {r['GBps']:.0f} | {'yes' if r['ok'] else 'WRONG'} |" for r in rows]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
