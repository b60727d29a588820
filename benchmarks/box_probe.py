"""Does the count of TMA boxes a row limit the bfloat16 normalize? A hand variant of ``persistent``
(not a built-in kernel) whose stage arrives as ONE 2-D box: the tensor viewed as [M * row / 256, 256],
box (width / 256, 256), against the built-in kernel's width / 256 one-row boxes of 256 elements,
Triton's row-in-registers kernel and torch, in one run on one Hopper GPU:

    python3 benchmarks/box_probe.py

Figures: benchmarks/results/bf16/sweeps.md.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from cbrules import api  # noqa: E402
from cbrules.ir.builder import Kernel, blockIdx, circular_buffer, threadIdx  # noqa: E402
from cbrules.kernels import reductions  # noqa: E402
from cbrules.codegen import runtime  # noqa: E402
from benchmarks.triton_kernels import _normalize_row  # noqa: E402

def persistent2d(stages, row, width, threads, dtype="bfloat16"):
    """``reductions.persistent`` (half-precision path) with the row as [row/256, 256] and one box a stage;
    its tensors are [B, 256] views, B = M * row / 256."""
    tiles, per, R = row // width, width // threads, row // 256
    k = Kernel("persistent", block=threads)
    b = k.symbol("B")  # rows of 256 elements: M * row / 256
    x, out = k.tensor("x", (b, 256), dtype), k.tensor("out", (b, 256), dtype)
    x_map = k.tensor_map(x, box=(width // 256, 256))
    tile = k.alloc("tile", "shared", dtype, (width // 256, 256))
    vals = k.alloc("vals", "register", "float32", (row // threads,))
    k.grid(b / R)
    k.assign(0.0, dst="s1")
    vec = reductions.vector_lanes(dtype, per)
    with k.loop("j", tiles, circular_buffer=circular_buffer(stages)) as j:
        k.tma_load(x_map, (blockIdx.x * R + j * (width // 256), 0), tile)
        for c in range(per // vec):
            with k.loop("u", vec, kind="vectorize") as u:
                v = k.load(tile, (threadIdx.x + c * threads) * vec + u)
                k.store(vals, j * per + c * vec + u, v)
                k.reduce(v, kind="serial", dst="s1")
    mean = k.div(k.reduce("s1", kind="block"), float(row))
    k.assign(0.0, dst="s2")
    with k.loop("q", row // threads, kind="unroll") as q:
        d = k.sub(k.load(vals, q), mean)
        k.reduce(k.mul(d, d), kind="serial", dst="s2")
    rstd = k.rsqrt(k.div(k.reduce("s2", kind="block"), float(row)))
    with k.loop("q2", row // threads // vec, kind="unroll") as g, k.loop("u", vec, kind="vectorize") as u:
        k.store(out, blockIdx.x * row + (g * threads + threadIdx.x) * vec + u,
                k.mul(k.sub(k.load(vals, g * vec + u), mean), rstd))
    return k

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
            variants = (("1-D boxes of 256", reductions.persistent(stages, row=n, width=width, threads=threads, box=256,
                                                                   dtype="bfloat16"), {"x": x, "out": out}),
                        ("one 2-D box a stage", persistent2d(stages, n, width, threads),
                         {"x": x.view(-1, 256), "out": out.view(-1, 256)}))
            for label, k, args in variants:
                ck = api.compile(k)
                bound = ck.bind(**args)
                out.fill_(float("nan"))
                bound.launch()
                runtime.synchronize()
                ok = torch.allclose(out.float(), want.float(), rtol=2e-2, atol=2e-2)
                t = ms(bound.launch)
                print(f"{m}x{n} width={width} threads={threads} S={stages} {label}: {gb / t:.0f} GB/s ok={ok} "
                      f"regs={ck.cubin.resources.registers}", flush=True)


if __name__ == "__main__":
    main()
