"""The attention kernel (cbrules' FlashAttention forward) against torch's SDPA with its cuDNN and flash
backends and a Triton FlashAttention (benchmarks/triton_attention.py), bfloat16, at steady clocks
(benchmarks/steady.py: each implementation alone, after 2 s of its own sustained load, median of 100
back-to-back launches, 5 s idle between implementations, ``--idle`` to change it):

    python3 benchmarks/attention.py [--out benchmarks/results/attention] [--quick] [--plain]

Grid: D in 64, 128, 256 x L in 1k, 4k, 16k x causal both; batch x 16 heads with batch * L = 32k tokens (the
GPU filled at every L). TFLOP/s = 4 * B * H * L^2 * D / time, halved when causal. Every implementation's
output is checked against cuDNN's first (max abs error printed). ``--plain`` also times the kernel
without warp specialization; ``--quick`` shortens the sustain and idle phases (for a first look only).
``--fp8`` also times the FP8 (e4m3) kernel on the same inputs quantized per tensor (x / scale, scale =
amax / 448; V transposed to [D, L] beforehand, outside the timing), its error against cuDNN's bfloat16
output printed, its ratio to the bfloat16 kernel in the table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HEADS, TOKENS = 16, 32768
DIMS, LENGTHS = (64, 128, 256), (1024, 4096, 16384)
OURS = {"ours": {"warp_specialize": True}}  # stages, tiles: the kernel's defaults for each D
PLAIN = {"ours (plain)": {}}
PERSISTENT = {"ours persistent": {"warp_specialize": True, "persistent": 132}}  # non-causal: a block an SM
FP8 = {"ours fp8": {"warp_specialize": True, "dtype": "float8_e4m3"}}


def tflops(b: int, length: int, d: int, causal: bool, seconds: float) -> float:
    flops = 4 * b * HEADS * length * length * d / (2 if causal else 1)
    return flops / seconds / 1e12


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="folder for results.json and results.md")
    p.add_argument("--quick", action="store_true", help="sustain 0.5 s, idle 1 s (not steady: a first look)")
    p.add_argument("--plain", action="store_true", help="also time the kernel without warp specialization")
    p.add_argument("--persistent", action="store_true", help="also time the persistent kernel (non-causal)")
    p.add_argument("--dims", default=",".join(map(str, DIMS)), help="head dims, e.g. 64,128")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="sequence lengths, e.g. 4096,16384")
    p.add_argument("--causal", choices=("both", "no", "yes"), default="both")
    p.add_argument("--samples", type=int, default=100, help="launches whose median is the figure")
    p.add_argument("--idle", type=float, default=5.0, help="seconds idle before each implementation")
    p.add_argument("--no-triton", action="store_true", help="leave the Triton peer out")
    p.add_argument("--fp8", action="store_true", help="also time the FP8 (e4m3) kernel")
    a = p.parse_args(argv)
    dims, lengths = (tuple(int(x) for x in t.split(",")) for t in (a.dims, a.lengths))
    causals = {"both": (False, True), "no": (False,), "yes": (True,)}[a.causal]
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.steady import time_each_alone
    from cbrules import api
    from cbrules.kernels.attention import attention
    timing = dict(sustain=0.5, idle=1.0, samples=a.samples) if a.quick else dict(samples=a.samples, idle=a.idle)
    triton_attention = None
    if not a.no_triton:
        try:
            from benchmarks.triton_attention import attention as triton_attention
        except ImportError as e:  # no Triton here: the other peers still run
            print(f"Triton peer left out: {e}", flush=True)
    ours = {**OURS, **(PLAIN if a.plain else {}), **(PERSISTENT if a.persistent else {}), **(FP8 if a.fp8 else {})}
    compiled = {}
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for d in dims:
        for causal in causals:
            for label, opts in ours.items():
                if causal and "persistent" in opts:
                    continue
                t0 = time.perf_counter()
                compiled[(d, causal, label)] = api.compile(attention(head_dim=d, causal=causal, **opts))
                print(f"compiled {label} D={d} causal={causal} in {time.perf_counter() - t0:.1f} s", flush=True)
            for length in lengths:
                b = max(1, TOKENS // length)
                q, k, v = (torch.randn(b, HEADS, length, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                           for _ in range(3))
                outs = {}

                def sdpa(backend, out_key):
                    def launch():
                        with sdpa_kernel(backend):
                            outs[out_key] = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    return launch
                launches = {"cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION, "cuDNN"),
                            "flash": sdpa(SDPBackend.FLASH_ATTENTION, "flash")}
                if triton_attention is not None:
                    def triton_launch():
                        outs["Triton"] = triton_attention(q, k, v, causal=causal)
                    launches["Triton"] = triton_launch
                for label in ours:
                    if (d, causal, label) not in compiled:
                        continue
                    o = torch.full_like(q, float("nan"))
                    tensors = dict(q=q, k=k, v=v)
                    if "dtype" in ours[label]:  # FP8: per-tensor scales, V as V^T [D, L]
                        tensors = {n: _quantized(x, torch) for n, x in tensors.items()}
                        scales = {f"scale_{n}": s for n, (_, s) in tensors.items()}
                        tensors = {n: x for n, (x, _) in tensors.items()}
                        tensors["vt"] = tensors.pop("v").transpose(-1, -2).contiguous().view(b * HEADS, d, length)
                    else:
                        scales = {}
                    bound = compiled[(d, causal, label)].bind(
                        **{n: x if n == "vt" else x.view(b * HEADS, length, d) for n, x in tensors.items()},
                        o=o.view(b * HEADS, length, d), **scales)
                    outs[label] = o
                    launches[label] = bound.launch
                for lb, fn in list(launches.items()):  # once each, then every output against cuDNN's
                    try:
                        fn()
                    except Exception as e:  # a peer that fails here is reported and left out, not fatal
                        if lb != "Triton":
                            raise
                        print(f"Triton peer failed and is left out: {type(e).__name__}: {e}", flush=True)
                        del launches[lb]
                        triton_attention = None
                torch.cuda.synchronize()
                errs = {lb: float((outs[lb].float() - outs["cuDNN"].float()).abs().max()) for lb in launches}
                res = time_each_alone(launches, torch, report=lambda s: print("  " + s, flush=True), **timing)
                row = {"d": d, "length": length, "batch": b, "heads": HEADS, "causal": causal,
                       **{f"{lb} tflops": tflops(b, length, d, causal, r["seconds"]) for lb, r in res.items()},
                       **{f"{lb} max_err": errs[lb] for lb in launches},
                       **{f"{lb} clocks": r["clocks"] for lb, r in res.items()}}
                rows.append(row)
                print(_line(row, list(launches)), flush=True)
    labels = [lb for lb in ("cuDNN", "flash", "Triton") if rows and f"{lb} tflops" in rows[0]] + list(ours)
    table = _table(rows, labels)
    print("\n" + table)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "steady": not a.quick,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (out / "results.md").write_text(f"{meta['device']}, torch {meta['torch']}, "
                                        f"{'steady clocks' if meta['steady'] else 'quick (not steady)'}; "
                                        f"{meta['date']}\n\n{table}\n")
    return 0


def _quantized(x, torch):
    """(x / s rounded to e4m3, s) with s = amax / 448 (e4m3's largest finite value)."""
    s = float(x.abs().amax().float()) / 448.0
    return (x.float() / s).to(torch.float8_e4m3fn), s


def _line(row: dict, labels: list) -> str:
    parts = [f"{lb} {row[f'{lb} tflops']:.0f} (err {row[f'{lb} max_err']:.3g})" for lb in labels
             if f"{lb} tflops" in row]
    return f"D={row['d']} L={row['length']} causal={row['causal']}: " + ", ".join(parts)


def _table(rows: list, labels: list) -> str:
    ours = [lb for lb in labels if lb.startswith("ours")]
    peers = [lb for lb in labels if not lb.startswith("ours")]
    fp8 = "ours fp8" in labels and "ours" in labels  # the FP8 kernel against the bfloat16 one too
    head = "| D | L | causal | " + " | ".join(f"{lb} TFLOP/s" for lb in labels) + " | " + \
        " | ".join(f"{lb} / {peer}" for lb in ours for peer in peers) + (" | ours fp8 / ours" if fp8 else "") + " |"
    lines = [head, "|" + "---|" * (3 + len(labels) + len(peers) * len(ours) + fp8)]
    for r in rows:
        cells = [str(r["d"]), str(r["length"]), "yes" if r["causal"] else "no"]
        cells += [f"{r[f'{lb} tflops']:.0f}" if f"{lb} tflops" in r else "-" for lb in labels]
        for lb in ours:  # "-": a variant not built for this row (persistent: non-causal only)
            cells += [f"{r[f'{lb} tflops'] / r[f'{peer} tflops']:.2f}" if f"{lb} tflops" in r else "-"
                      for peer in peers]
        if fp8:
            cells.append(f"{r['ours fp8 tflops'] / r['ours tflops']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
