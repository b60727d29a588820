"""FP8 matmul_tc against torch._scaled_mm (cuBLASLt, per-tensor scales, bfloat16 c) in one run:

    python3 benchmarks/fp8_matmul.py --out benchmarks/results/fp8_matmul

Every implementation computes ``c = (a @ b^T) * scale_a * scale_b`` with e4m3 a [M, K] and b [N, K] (K-major:
torch gets ``b.T``, which cuBLASLt reads as "TN"). Two accuracy classes are compared with their own peer:

* cbrules' default (``promote=True``: each 128 of K accumulated on the tensor cores, then added into a float32
  sum by the threads) beside ``_scaled_mm`` as torch calls it by default (``use_fast_accum=False``, which
  promotes too);
* ``promote=False`` (the tensor cores' accumulation over all of K) beside ``use_fast_accum=True``;

and the block-scaled kernel (one scale a 1x128 run of A, a 128x128 block of B: DeepGEMM's scheme) beside
both. Each result is checked against the float64 product of the dequantized inputs first. Figures at steady
clocks (benchmarks/steady.py: each implementation alone, idle gap, 2 s sustained, median of 100).
Writes results.json and results.md to --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (4096, 7168, 16384))
WS = dict(warp_specialize=True, registers=(40, 232), stages=4)
# label -> matmul_tc parameters (all e4m3); the default first
VARIANTS = {
    "cbrules promoted (default, bn=256: two column blocks)": dict(),
    "cbrules promoted bn=192 (two column blocks)": dict(bn=192),
    "cbrules promoted bn=128": dict(bn=128),
    "cbrules fast accumulation (promote=False)": dict(promote=False),
    "cbrules fast accumulation, persistent": dict(promote=False, persistent=132),
    "cbrules promoted, persistent": dict(persistent=132),
    "cbrules block-scaled (default, bn=256)": dict(scaling="block"),
    "cbrules block-scaled bn=128": dict(scaling="block", bn=128),
}


def _check(torch, c, want, label: str, k: int) -> float:
    # promoted kernels and cuBLASLt stay within 3e-3 sqrt(K); fast accumulation within 2**-10 sum|ab|
    err = (c.double() - want).abs().max().item()
    if err > 2.0 ** -10 * 0.8 * k + 0.05 * want.abs().max().item():
        raise SystemExit(f"{label}: max error {err:.3g} against the float64 product: refusing to time a wrong kernel")
    return err


def run_shape(torch, shape, idle: float, sustain: float, samples: int) -> dict:
    from benchmarks.steady import time_alone
    from cbrules import api
    from cbrules.kernels.matmul_tc import matmul_tc
    m, n, k = shape
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    sa, sb = 0.5, 1.5
    want = (a.double() @ b.double().T) * (sa * sb)
    ta, tb = torch.tensor(sa, device="cuda"), torch.tensor(sb, device="cuda")
    launches, errors = {}, {}
    for fast in (False, True):
        label = f"torch._scaled_mm use_fast_accum={fast}"

        def peer(fast=fast):
            return torch._scaled_mm(a, b.T, scale_a=ta, scale_b=tb, out_dtype=torch.bfloat16, use_fast_accum=fast)
        errors[label] = _check(torch, peer(), want, label, k)
        launches[label] = peer
    block_a = torch.full((m, -(-k // 128)), sa, device="cuda")
    block_b = torch.full((-(-n // 128), -(-k // 128)), sb, device="cuda")
    for label, params in VARIANTS.items():
        ck = api.compile(matmul_tc(dtype="float8_e4m3", **WS, **params))
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        scales = dict(scale_a=block_a, scale_b=block_b) if params.get("scaling") == "block" else dict(scale_a=sa,
                                                                                                        scale_b=sb)
        bound = ck.bind(a=a, b=b, c=c, **scales)
        bound.launch()
        torch.cuda.synchronize()
        errors[label] = _check(torch, c, want, label, k)
        launches[label] = bound.launch
    flops = 2.0 * m * n * k
    row = {"shape": list(shape), "tflops": {}, "max_error": errors, "clocks": {}}
    for label, launch in launches.items():
        r = time_alone(launch, torch, sustain=sustain, samples=samples, idle=idle)
        row["tflops"][label] = flops / r["seconds"] / 1e12
        row["clocks"][label] = r["clocks"]
        print(f"  {label}: {row['tflops'][label]:.0f} TFLOP/s", flush=True)
    return row


def table(rows: list) -> str:
    labels = list(rows[0]["tflops"])
    head = "| M x N x K | " + " | ".join(labels) + " |"
    lines = [head, "|" + "---|" * (len(labels) + 1)]
    for r in rows:
        lines.append(f"| {'x'.join(map(str, r['shape']))} | " + " | ".join(f"{r['tflops'][lb]:.0f}" for lb in labels) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--idle", type=float, default=5.0, help="idle seconds before each implementation")
    p.add_argument("--sustain", type=float, default=2.0, help="seconds of sustained launches first")
    p.add_argument("--samples", type=int, default=100, help="launches whose median is the figure")
    p.add_argument("--shapes", default=None, help="MxNxK,... (default: the four of SHAPES)")
    a = p.parse_args(argv)
    import torch
    shapes = SHAPES if not a.shapes else [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    rows = []
    for shape in shapes:
        print(f"{'x'.join(map(str, shape))}:", flush=True)
        rows.append(run_shape(torch, shape, a.idle, a.sustain, a.samples))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "torch": torch.__version__, "steady": {"idle": a.idle, "sustain": a.sustain, "samples": a.samples}}
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "results.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
