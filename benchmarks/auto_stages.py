"""stages="auto" against the swept S = 2, 3, 4 on every benchmark shape, with the variants of a
shape interleaved so that clock drift cannot decide a few-percent question.

    python3 benchmarks/auto_stages.py [--rounds 9] [--reps 10] [--out benchmarks/results/auto_stages/interleaved]
    python3 benchmarks/auto_stages.py --dry-run      # no GPU: the S auto picks, every variant compiled

Per shape: each S variant is validated once (output poisoned with NaN, compared with torch), then
``--rounds`` rounds each time every variant (2 warm-up launches, ``--reps`` timed ones, CUDA events),
in an order rotated per round; a variant's figure is the median of its round medians, and the
spread of those round medians says how far apart two variants must be to differ. The auto
variant's CUDA is the swept variant's with the same S (checked here: same text), so auto is
read off that variant instead of being timed twice.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.ops import OPS, build_generated, chosen_stages, flops, io_bytes, shape_label  # noqa: E402

SWEPT = (2, 3, 4)


def shapes(op: str) -> list[tuple]:
    return [s for s in OPS[op].shapes if op != "matmul" or len(s) == 3]


def auto_choices() -> dict:
    """(op, shape label) -> (auto S, auto's CUDA is the swept S's): CPU only."""
    from cbrules import api
    out = {}
    for op in OPS:
        for shape in shapes(op):
            s = chosen_stages(op, shape)
            auto, swept = (api.generate(build_generated(op, shape, v)).text for v in ("auto", s))
            same = auto == swept
            out[(op, shape_label(shape))] = (s, same)
    return out


def measure(ops: list[str], rounds: int, reps: int, log) -> list[dict]:
    import torch

    from benchmarks.ops import compile_generated
    from benchmarks.worker import _inputs, _out_name, _torch_impls
    from cbrules.codegen import runtime
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    rows, cache = [], {}
    for op in ops:
        for shape in shapes(op):
            sl = shape_label(shape)
            t0 = time.perf_counter()
            gen = torch.Generator(device="cuda").manual_seed(0)
            t = _inputs(op, shape, torch, gen)
            out = t[_out_name(op)]
            _torch_impls(op, t, torch)[0][2]()
            ref = out.clone()
            rtol, atol = OPS[op].tol(shape)
            launch, valid = {}, {}
            for s in SWEPT:
                ck, _ = compile_generated(op, shape, s, cache)
                bound = ck.bind(**t)
                out.fill_(math.nan)
                bound.launch()
                torch.cuda.synchronize()
                valid[s] = bool(torch.allclose(out, ref, rtol=rtol, atol=atol))
                launch[s] = bound.launch
            per_round = {s: [] for s in SWEPT}
            reps_here = max(2, reps // 4) if op == "matmul" else reps  # 8192^3 is ~25 ms a launch
            for r in range(rounds):
                order = SWEPT[r % 3:] + SWEPT[:r % 3]
                for s in order:
                    for _ in range(2):
                        launch[s]()
                    per_round[s].append(statistics.median(runtime.time_launch(launch[s], reps_here)))
            for s in SWEPT:
                ms = statistics.median(per_round[s])
                row = {"op": op, "shape": sl, "stages": s, "ms": ms, "round_ms": per_round[s], "valid": valid[s],
                       "gbps": io_bytes(op, shape) / ms / 1e6,
                       "tflops": None if flops(op, shape) is None else flops(op, shape) / ms / 1e9}
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
            print(f"{op} {sl}: " + ", ".join(f"S={s} {statistics.median(per_round[s]):.4f} ms" for s in SWEPT)
                  + f" ({time.perf_counter() - t0:.1f} s)", flush=True)
            del t, out, ref, launch
            torch.cuda.empty_cache()
    return rows


def table(rows: list[dict], choices: dict) -> str:
    lines = ["| op | shape | auto S | S=2 | S=3 | S=4 | best S | auto / best | spread of round medians |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    by = {}
    for r in rows:
        by.setdefault((r["op"], r["shape"]), {})[r["stages"]] = r
    for (op, sl), rs in by.items():
        auto, same = choices[(op, sl)]
        best = min(rs, key=lambda s: rs[s]["ms"])
        unit = (lambda r: f"{r['tflops']:.1f}") if op == "matmul" else (lambda r: f"{r['gbps']:.0f}")
        spread = ", ".join(f"S={s} {100 * (max(r['round_ms']) - min(r['round_ms'])) / r['ms']:.1f}%"
                           for s, r in sorted(rs.items()))
        lines.append(f"| {op} | {sl} | {auto}{'' if same else ' (CUDA differs!)'} | "
                     + " | ".join(unit(rs[s]) + ("" if rs[s]["valid"] else " INVALID") for s in SWEPT)
                     + f" | {best} | {rs[best]['ms'] / rs[auto]['ms']:.3f} | {spread} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/auto_stages/interleaved"))
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    ops = a.ops.split(",")
    choices = auto_choices()
    for (op, sl), (s, same) in choices.items():
        print(f"auto {op} {sl}: S={s}{'' if same else ' (CUDA differs from the swept S!)'}")
    if a.dry_run:
        from benchmarks.ops import compile_generated
        cache: dict = {}
        for op in ops:
            for shape in shapes(op):
                for s in SWEPT:
                    compile_generated(op, shape, s, cache)
        print(f"{len(cache)} kernels compiled")
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "rows.jsonl", "w") as log:
        rows = measure(ops, a.rounds, a.reps, log)
    import torch
    head = (f"Device: {torch.cuda.get_device_name()}; {a.rounds} interleaved rounds of {a.reps} timed launches "
            f"(matmul {max(2, a.reps // 4)}) after 2 warm-up launches, per variant and round; figures are medians "
            f"of the round medians (GB/s, matmul TFLOP/s). Command: `python3 benchmarks/auto_stages.py "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}`.\n\n")
    text = head + table(rows, choices) + "\n"
    (out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
