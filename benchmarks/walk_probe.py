"""Does walking rows help the bfloat16 normalize? Triton's row-in-registers kernel, today's choice of
benchmarks/ops.py (one block a row) and ``reductions.persistent(walk=P)`` (P blocks walking the rows;
warp-specialized, the producer loads the next row while the consumers finish this one), in one run on
one Hopper GPU, timed in interleaved rounds (each variant's median launch):

    python3 benchmarks/walk_probe.py [--rounds 7] [--reps 10]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from cbrules import api  # noqa: E402
from cbrules.kernels import reductions  # noqa: E402
from benchmarks.ops import variant_params  # noqa: E402
from benchmarks.resident_probe import check_then_time  # noqa: E402
from benchmarks.triton_kernels import _normalize_row  # noqa: E402

SHAPES = ((32768, 32768), (16384, 16384))
BLOCKS = (132, 264)  # one and two a SM of an H200
STAGES = (2, 3, 4)


def variants(shape: tuple) -> list[tuple[str, dict]]:
    """(label, persistent's build parameters): ops.py's choice (S = its stages a row: the whole row in
    flight), then the walks over the same tiles."""
    name, params = variant_params("normalize", shape, "bfloat16")
    assert name == "persistent", name
    chosen = params["row"] // params["width"]
    out = [(f"ops.py choice S={chosen}", dict(params, stages=chosen))]
    for ws in (False, True):
        for blocks in BLOCKS:
            for s in STAGES:
                out.append((f"walk P={blocks} {'WS' if ws else 'no WS'} S={s}",
                            dict(params, stages=s, walk=blocks, warp_specialize=ws)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (each variant once a round)")
    p.add_argument("--reps", type=int, default=10, help="timed launches of a variant a round")
    a = p.parse_args()
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda").to(torch.bfloat16)
        out = torch.empty_like(x)
        want = torch.nn.functional.layer_norm(x.float(), (n,), eps=0.0)
        gb = 4 * m * n / 1e6  # bytes read + written (2 bytes each), per ms -> GB/s
        launches = {"triton row": lambda: _normalize_row[(m,)](x, out, m, n, BLOCK_N=n, num_warps=16)}
        notes = {}
        for label, params in variants((m, n)):
            try:
                ck = api.compile(reductions.persistent(**params))
            except Exception as e:  # a variant that does not build or fit is reported, not fatal
                print(f"{m}x{n} {label}: not built: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            launches[label] = ck.bind(x=x, out=out).launch
            r = ck.cubin.resources
            notes[label] = f"regs={r.registers} spills={r.spill_stores}"
        times = check_then_time(launches, out, want, notes, a.rounds, a.reps)
        base = statistics.median(times["triton row"])
        for label, ts in times.items():
            t = statistics.median(ts)
            print(f"{m}x{n} {label:<24} {gb / t:6.0f} GB/s  {base / t:.3f}x triton  {notes[label]}", flush=True)
        del x, out, want
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
