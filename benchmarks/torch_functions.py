"""cbrules.torch's drop-in functions beside their torch counterparts at the transformer block's shapes
(16,384 tokens, d_model 4096, 32 heads of 128, MLP 11008; bfloat16), each timed alone at steady clocks
(benchmarks/steady.py), every output checked against torch's first.

    python3 benchmarks/torch_functions.py --out benchmarks/results/torch_functions
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

T, D, H, HD, MLP = 16384, 4096, 32, 128, 11008


def cases(torch, cbt):
    F = torch.nn.functional
    g = torch.Generator("cuda").manual_seed(0)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()
    x, w = r(T, D), r(D)
    wqkv, w13, w2 = r(3 * D, D, scale=D ** -0.5), r(2 * MLP, D, scale=D ** -0.5), r(D, MLP, scale=MLP ** -0.5)
    res = r(T, D)
    q, k, v = (r(4, H, T // 4, HD) for _ in range(3))
    ab = r(T, 2 * MLP)
    m = r(T, MLP)
    return {
        "linear QKV [16384x4096] x [12288x4096]^T": (lambda: cbt.linear(x, wqkv), lambda: F.linear(x, wqkv)),
        "linear gate+up, silu": (lambda: cbt.linear(x, w13, activation="silu"), lambda: F.silu(F.linear(x, w13))),
        "linear down + residual": (lambda: cbt.linear(m, w2, residual=res), lambda: F.linear(m, w2) + res),
        "attention causal 4x32x4096x128": (lambda: cbt.attention(q, k, v, causal=True),
                                           lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "rms_norm [16384, 4096]": (lambda: cbt.rms_norm(x, (D,), w, 1e-5), lambda: F.rms_norm(x, (D,), w, 1e-5)),
        "layer_norm [16384, 4096]": (lambda: cbt.layer_norm(x, (D,), w, w), lambda: F.layer_norm(x, (D,), w, w)),
        "softmax [16384, 4096]": (lambda: cbt.softmax(x), lambda: torch.softmax(x, -1)),
        "swiglu [16384, 2x11008]": (lambda: cbt.swiglu(ab), lambda: F.silu(ab[:, :MLP]) * ab[:, MLP:]),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="folder for results.json and results.md")
    p.add_argument("--idle", type=float, default=2.0)
    p.add_argument("--sustain", type=float, default=1.5)
    p.add_argument("--samples", type=int, default=100)
    a = p.parse_args(argv)
    import torch

    import cbrules.torch as cbt
    from benchmarks.steady import time_each_alone
    rows = []
    for label, (ours, theirs) in cases(torch, cbt).items():
        got, want = ours(), theirs()
        torch.cuda.synchronize()
        err = float((got.float() - want.float()).abs().max())
        res = time_each_alone({"torch": theirs, "cbrules": ours}, torch, sustain=a.sustain, samples=a.samples,
                              idle=a.idle)
        row = {"case": label, "torch_ms": res["torch"]["seconds"] * 1e3, "cbrules_ms": res["cbrules"]["seconds"] * 1e3,
               "max_err": err, "clocks": {k: v["clocks"] for k, v in res.items()}}
        row["speedup"] = row["torch_ms"] / row["cbrules_ms"]
        rows.append(row)
        print(f"{label}: torch {row['torch_ms']:.3f} ms, cbrules {row['cbrules_ms']:.3f} ms "
              f"({row['speedup']:.2f}x), max |diff| {err:.3g}", flush=True)
    table = "| case | torch ms | cbrules ms | x torch | max \\|diff\\| |\n|---|---:|---:|---:|---:|\n" + "\n".join(
        f"| {r['case']} | {r['torch_ms']:.3f} | {r['cbrules_ms']:.3f} | {r['speedup']:.2f} | {r['max_err']:.3g} |"
        for r in rows)
    print("\n" + table)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (out / "results.md").write_text(f"{meta['device']}, torch {meta['torch']}, steady clocks; {meta['date']}\n\n"
                                        f"{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
