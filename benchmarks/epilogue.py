"""matmul_tc with a fused epilogue (bias + GELU) and with B row-major (``b_layout="kn"``) against torch, in one
run, at steady clocks (benchmarks/steady.py):

    python3 benchmarks/epilogue.py --out DIR [--shapes 4096x4096x4096,...]

Rows per shape (bfloat16 in, bfloat16 out, float32 accumulation):

- ``gelu(a @ w.T + bias)``: matmul_tc ``epilogue="bias_gelu"`` (exact erf GELU) and ``"bias_gelu_tanh"``
  against cuBLASLt's fused epilogue ``torch._addmm_activation(bias, a, w.T, use_gelu=True)`` and the unfused
  ``F.gelu(torch.addmm(bias, a, w.T))``;
- ``a @ b`` with b ``[K, N]``: matmul_tc ``b_layout="kn"`` against ``torch.matmul(a, b)``.

Every result is checked against a float32 reference first (outputs NaN-poisoned). The interleaved figure
(5 launches of each implementation in turn) is printed beside the steady one, labelled.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import steady  # noqa: E402

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (6144, 6144, 6144))
WS = {"warp_specialize": True, "registers": (40, 232), "stages": 4}


def _check(label: str, out, ref, tol: float) -> float:
    err = (out.float() - ref).abs().max().item()
    print(f"  {label}: max abs err {err:.3g} (tolerance {tol:.3g}){'' if err <= tol else '  WRONG'}", flush=True)
    return err


def _measure(group: str, shape, impls: dict, ref, torch, flop: float, a, rows: list) -> None:
    """Each ``label -> (output, launch)`` launched once and checked, then timed alone and interleaved. A peer's
    output is None: its launch returns the result (torch allocates it, as a model's call would)."""
    tol = 2e-2 * ref.abs().max().item() + 1e-2
    errs = {}
    for label, (out, launch) in impls.items():
        if out is not None:
            out.fill_(float("nan"))
        got = launch()
        torch.cuda.synchronize()
        errs[label] = _check(label, got if out is None else out, ref, tol)
    launches = {label: launch for label, (_, launch) in impls.items()}
    mixed = steady.interleaved(launches, torch)
    alone = steady.time_each_alone(launches, torch, sustain=a.sustain, samples=a.samples, idle=a.idle)
    for label in impls:
        r = alone[label]
        rows.append({"group": group, "shape": list(shape), "impl": label, "tflops": flop / r["seconds"] / 1e12,
                     "tflops_interleaved": flop / mixed[label] / 1e12, "ms": r["seconds"] * 1e3, "iqr": r["spread"],
                     "clocks": r["clocks"], "max_abs_err": errs[label], "ok": errs[label] <= tol})
        print(f"{group} {'x'.join(map(str, shape))} {label}: {rows[-1]['tflops']:.1f} TFLOP/s steady "
              f"({rows[-1]['tflops_interleaved']:.1f} interleaved)", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default=None, help="MxNxK,... (default: the four of SHAPES)")
    p.add_argument("--sustain", type=float, default=2.0)
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--idle", type=float, default=5.0)
    p.add_argument("--skip-kn", action="store_true", help="only the epilogue rows")
    a = p.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from cbrules import api
    from cbrules.kernels.matmul_tc import matmul_tc

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = SHAPES if not a.shapes else tuple(tuple(int(d) for d in s.split("x")) for s in a.shapes.split(","))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernels = {ep: api.compile(matmul_tc(**WS, persistent=sms, epilogue=ep)) for ep in ("bias_gelu", "bias_gelu_tanh")}
    if not a.skip_kn:
        kernels["kn"] = api.compile(matmul_tc(**WS, persistent=sms, b_layout="kn"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list = []
    for m, n, k in shapes:
        flop = 2.0 * m * n * k
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = F.gelu(x.float() @ w.float().T + bias.float())
        outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        impls = {
            "torch._addmm_activation (cuBLASLt fused, gelu)":
                (None, lambda: torch._addmm_activation(bias, x, w.T, use_gelu=True)),
            "F.gelu(torch.addmm)": (None, lambda: F.gelu(torch.addmm(bias, x, w.T))),
            "matmul_tc bias_gelu (erf)": (outs[2], kernels["bias_gelu"].bind(a=x, b=w, c=outs[2], bias=bias).launch),
            "matmul_tc bias_gelu_tanh": (outs[3],
                                         kernels["bias_gelu_tanh"].bind(a=x, b=w, c=outs[3], bias=bias).launch),
        }
        print(f"bias+gelu {m}x{n}x{k}", flush=True)
        _measure("bias+gelu", (m, n, k), impls, ref, torch, flop, a, rows)
        del impls, outs
        if a.skip_kn:
            continue
        bt = w.T.contiguous()  # [K, N]
        ref = x.float() @ bt.float()
        outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        impls = {"torch.matmul(a, b) (cuBLAS, b [K, N])": (outs[0], lambda: torch.matmul(x, bt, out=outs[0])),
                 "matmul_tc b_layout=kn": (outs[1], kernels["kn"].bind(a=x, b=bt, c=outs[1]).launch)}
        print(f"kn {m}x{n}x{k}", flush=True)
        _measure("a @ b (kn)", (m, n, k), impls, ref, torch, flop, a, rows)
        del impls, outs, bt
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "steady": {"sustain": a.sustain, "samples": a.samples, "idle": a.idle}}
    (out / "epilogue.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    table = _table(rows, meta)
    (out / "epilogue.md").write_text(table)
    print(table)
    return 0


def _table(rows: list, meta: dict) -> str:
    st = meta["steady"]
    lines = [f"{meta['device']}, torch {meta['torch']}; {meta['date']}. Steady clocks: each implementation alone, "
             f"{st['idle']:g} s idle, {st['sustain']:g} s sustained, median of {st['samples']} launches; "
             "interleaved (labelled) beside it.", "",
             "| computation | shape | implementation | TFLOP/s (steady) | x first peer | x second peer | "
             "TFLOP/s interleaved |", "|---|---|---|---|---|---|---|"]
    for group in dict.fromkeys(r["group"] for r in rows):
        for shape in dict.fromkeys(tuple(r["shape"]) for r in rows if r["group"] == group):
            here = [r for r in rows if r["group"] == group and tuple(r["shape"]) == shape]
            peers = [r["tflops"] for r in here if not r["impl"].startswith("matmul_tc")]
            for r in here:
                ratios = " | ".join(f"{r['tflops'] / p:.2f}" for p in peers) + " |" * (2 - len(peers))
                lines.append(f"| {group} | {'x'.join(map(str, shape))} | {r['impl']}{'' if r['ok'] else ' (WRONG)'} | "
                             f"{r['tflops']:.1f} | {ratios} | {r['tflops_interleaved']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
