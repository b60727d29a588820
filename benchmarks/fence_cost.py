"""What does the refill proxy fence (rule ``cb-fence-refill``) cost? Each benchmark kernel built with the
shipped rules and with that rule disabled, timed in interleaved rounds in one process on one Hopper GPU:

    python3 benchmarks/fence_cost.py [--shape 8192x8192] [--rounds 5] [--stages 3]

Prints, per op and dtype, the median ms of each variant and fenced / unfenced (above 1: the fence
costs). Figures: benchmarks/results/memcheck/fence_cost.txt.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OPS = ("exp", "add", "inner_sum", "outer_sum", "normalize")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8192x8192")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--stages", type=int, default=3)
    a = ap.parse_args(argv)
    from benchmarks.ops import OPS as OP_TABLE, build_generated
    from cbrules import api
    from cbrules.codegen import runtime
    from cbrules.kernels import KERNELS

    shape = tuple(int(s) for s in a.shape.split("x"))
    unfenced = tempfile.mkdtemp(prefix="fence_cost_")
    with open(os.path.join(unfenced, "unfenced.rules"), "w") as f:
        f.write("(disable cb-fence-refill)\n")
    for dtype in ("float32", "bfloat16"):
        for op in OPS:
            spec = KERNELS[OP_TABLE[op].generated(shape, dtype)[0]]
            kernel = build_generated(op, shape, a.stages, dtype)
            fenced = api.compile(kernel)
            plain = api.compile(build_generated(op, shape, a.stages, dtype), rules=[unfenced])
            assert "fence.proxy.async" in fenced.source.text
            args = spec.make_inputs(shape, np.random.default_rng(0), dtype)
            bound = {"fenced": fenced.bind(**args), "unfenced": plain.bind(**args)}
            times = {k: [] for k in bound}
            for r in range(a.rounds):
                order = list(bound) if r % 2 == 0 else list(reversed(bound))
                for k in order:
                    for _ in range(3):
                        bound[k].launch()
                    times[k].append(statistics.median(runtime.time_launch(bound[k].launch, a.reps)))
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{op:10s} {dtype:9s} {a.shape} S={a.stages}: fenced {med['fenced']:.4f} ms, unfenced "
                  f"{med['unfenced']:.4f} ms, fenced/unfenced {med['fenced'] / med['unfenced']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
