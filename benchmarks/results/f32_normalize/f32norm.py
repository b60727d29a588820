"""Probe (session 7, not committed as a benchmark): float32 normalize, ops.py's choice against the stable
block statistics (direct rows), Triton's row kernel beside, interleaved rounds, outputs checked."""
import os, statistics, sys
sys.path.insert(0, os.getcwd())
import torch
from cbrules import api
from cbrules.kernels import KERNELS
from cbrules.codegen import runtime
from benchmarks.worker import _inputs
from benchmarks.ops import variant_params
import benchmarks.triton_kernels as tk

sp = KERNELS["persistent"]
ROUNDS, REPS = int(os.environ.get("ROUNDS", 7)), 20
for shape in [(16384, 16384), (32768, 32768)]:
    m, n = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    t = _inputs("normalize", shape, torch, gen, "float32")
    x, out = t["x"], t["out"]
    ref = torch.nn.functional.layer_norm(x, (n,), eps=0.0)
    name, cur = variant_params("normalize", shape, "float32")
    variants = {f"ops.py ({name} {cur})": (name, cur, 2)}
    before = dict(row=n, width=1024, threads=256) if n == 16384 else dict(row=n, width=8192, threads=512)
    for s_ in (2, 3, 4):
        variants[f"before (TMA two-pass {before['width']}/{before['threads']}) S={s_}"] = ("persistent", before, s_)
    fns = {}
    for label, v in variants.items():
        if v is None:
            continue
        kname, params, s = v
        try:
            ck = api.compile(KERNELS[kname].factory(stages=s, dtype="float32", **params))
            b = ck.bind(x=x, out=out)
            fns[label] = b.launch
        except Exception as e:
            print(shape, label, "FAILED", type(e).__name__, str(e)[:200]); continue
    tri = [(lab, f) for lab, _, f in tk.variants("normalize", shape, t) if "row" in lab]
    for lab, f in tri:
        fns[f"triton {lab}"] = f
    for label, f in fns.items():
        out.fill_(float("nan")); f(); torch.cuda.synchronize()
        err = (out - ref).abs().max().item()
        print(shape, label, "max err", err, "ok" if err < 1e-3 else "WRONG")
    med = {k: [] for k in fns}
    for r in range(ROUNDS):
        for label, f in fns.items():
            for _ in range(3):
                f()
            runtime.synchronize()
            med[label].append(statistics.median(runtime.time_launch(f, REPS)))
    base = next(k for k in fns if k.startswith("triton"))
    nbytes = 2 * m * n * 4
    for label in fns:
        ms = statistics.median(med[label])
        ratios = [med[base][i] / med[label][i] for i in range(ROUNDS)]
        print(f"{shape} {label:70s} {ms:.4f} ms {nbytes / ms / 1e6:7.0f} GB/s  x Triton {med[base][0] and statistics.median(ratios):.4f} "
              f"(rounds {min(ratios):.4f}-{max(ratios):.4f})")
