"""Does the count of TMA boxes a row limit the bfloat16 normalize? ``reductions.persistent`` with its
stage as width / 256 one-row boxes of 256 elements against the same kernel with ``one_box=True`` (the
stage as ONE (width / 256, 256) box through the row split into stretches of 256; until the builder had
split tensor maps this was a hand variant over a reshaped [M * row / 256, 256] view), Triton's
row-in-registers kernel and torch, in one run on one Hopper GPU:

    python3 benchmarks/box_probe.py

Figures: benchmarks/results/bf16/sweeps.md.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from cbrules import api  # noqa: E402
from cbrules.kernels import reductions  # noqa: E402
from cbrules.codegen import runtime  # noqa: E402
from benchmarks.triton_kernels import _normalize_row  # noqa: E402


def ms(fn, reps=20):
    for _ in range(3):
        fn()
    return statistics.median(runtime.time_launch(fn, reps))


def main():
    for m, n in ((32768, 32768), (16384, 16384)):
        x = torch.randn(m, n, device="cuda").to(torch.bfloat16)
        out = torch.empty_like(x)
        want = torch.nn.functional.layer_norm(x, (n,), eps=0.0)
        gb = 4 * m * n / 1e6  # bytes read + written, per ms -> GB/s
        t = ms(lambda: _normalize_row[(m,)](x, out, m, n, BLOCK_N=n, num_warps=16))
        print(f"{m}x{n} triton row {gb / t:.0f} GB/s", flush=True)
        t = ms(lambda: torch.nn.functional.layer_norm(x, (n,), eps=0.0))
        print(f"{m}x{n} torch {gb / t:.0f} GB/s", flush=True)
        for width, threads, stages in ((8192, 512, 4), (16384, 512, 2), (4096, 256, 4), (8192, 256, 2)):
            if n // width < 2 or (threads == 256) != (n == 16384):
                continue
            for label, one_box in (("1-D boxes of 256", False), ("one 2-D box a stage", True)):
                ck = api.compile(reductions.persistent(stages, row=n, width=width, threads=threads, box=256,
                                                       dtype="bfloat16", one_box=one_box))
                bound = ck.bind(x=x, out=out)
                out.fill_(float("nan"))
                bound.launch()
                runtime.synchronize()
                ok = torch.allclose(out.float(), want.float(), rtol=2e-2, atol=2e-2)
                t = ms(bound.launch)
                print(f"{m}x{n} width={width} threads={threads} S={stages} {label}: {gb / t:.0f} GB/s ok={ok} "
                      f"regs={ck.cubin.resources.registers}", flush=True)


if __name__ == "__main__":
    main()
