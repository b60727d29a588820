"""Is the bfloat16 normalize's last 1-1.5 % against Triton at 16384 columns a cost a row or a cost a
launch? The same kernels over 1024..65536 rows of 16384 (and a few row counts of 32768): ours (ops.py's
choice, as run.py times it), Triton's row kernel (16 and 8 warps) and the copy engine as the bandwidth
reference, beside hand edits of ours (resident_probe's). ``--set setup``: what a block does besides its
row (no TMA; no barrier set-up; no tensor-map parameter) and two block shapes (a thread's elements
adjacent; the direct path at 512 threads); ``--set row``: what a row costs (two blocks an SM instead of
three; plain instead of read-only loads; one block reduction of both sums; no block reductions at all,
a timing-only variant); ``--set stats``: the statistics as one numerically stable block reduction
(Chan's pairwise merge of each thread's (mean, M2), resident_probe's CHAN) beside the one-pass (Σx, Σx²)
and the two-pass ones, direct and through the TMA, at 512 and 256 threads. Each implementation's median time is fitted as t = a + b * rows (least squares):
b is the time a row, a the fixed cost of a launch (launch latency, first wave's ramp, last wave's tail).
Beside the fit, not in it: launches over 1 and 396 rows (one block; one wave of ours: three blocks an SM)
and over whole waves of both ours and Triton's (15840 = 40 x 396 = 60 x 264 rows, 16632 = 42 x 396 =
63 x 264) and 16236 (41 x 396), around 16384 (41.4 waves of ours, 62.1 of Triton's): what the last
wave's fill costs.

    python3 benchmarks/scaling_probe.py [--set setup|row|stats] [--rows 1024,...,65536] [--wide-rows 2048,...]
        [--beside-rows 1,396] [--rounds 9] [--reps 20] [--json FILE] [--cubins DIR]
    python3 benchmarks/scaling_probe.py --compile-only   # no GPU: build and NVRTC-compile every variant
    python3 benchmarks/scaling_probe.py --from-json FILE  # no GPU: the report of an earlier run

One process on one Hopper GPU. Outputs poisoned (NaN) and checked against F.layer_norm in every buffer
pair first; small problems rotate over copies of their tensors (at least ROTATE_BYTES in all) so a launch
does not find its row in the 50 MB L2; every batch of timed launches is queued behind a sleeping kernel,
so the host's launch overhead (Triton's is tens of microseconds) never leaves the GPU waiting (``fed``
counts the batches where the host had queued every launch before the sleep ended): each launch's
CUDA-event time is the GPU's, as in run.py at 16384x16384. Interleaved rounds (each implementation once
a round, in turn); the fit is taken over the medians of all rounds and over each round's own medians
(the spread of the ratio a row). ``--json`` keeps the medians of all samples and of each round.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import resident_probe  # noqa: E402
from benchmarks.ops import compile_generated, variant_params  # noqa: E402

ROWS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
WIDE_ROWS = (2048, 4096, 8192, 16384, 32768)
BESIDE_ROWS = (1, 396, 15840, 16236, 16632)
ROTATE_BYTES = 512 << 20  # ten times the H200's L2
SLEEP_CYCLES = 6_000_000  # ~3 ms at 1.98 GHz: longer than queueing a batch of launches from Python
BASE = "triton row"  # the ratios' base
TIMING_ONLY = "(timing only)"  # a variant whose result is wrong by design: not checked
# hand edits of ours at 16384 columns (resident_probe's), per set: label -> (threads, edits)
SETS = {
    "setup": {  # what a launch and a block's set-up cost; the README's two untested block shapes
        "direct (no TMA)": (256, ("direct",)),
        "direct, no set-up": (256, ("direct", "no set-up")),
        "direct, no set-up, no tensor map": (256, ("direct", "no set-up", "no tensor map")),
        "contiguous (TMA)": (256, ("contiguous",)),
        "direct, contiguous": (256, ("direct", "contiguous")),
        "direct, 512 threads": (512, ("direct",)),
    },
    "row": {  # what a row costs: rows in flight an SM, the loads' flavour, the statistics
        "ours, two blocks an SM": (256, ("two blocks an SM",)),
        "direct, two blocks an SM": (256, ("direct", "two blocks an SM")),
        "direct, 512 threads": (512, ("direct",)),
        "direct, 512 threads, plain loads": (512, ("direct", "plain loads")),
        "direct, 512 threads, one reduction": (512, ("direct", "one reduction")),
        "direct, 512, plain, one reduction": (512, ("direct", "plain loads", "one reduction")),
        f"ours, no block reductions {TIMING_ONLY}": (256, ("no block reductions",)),
        # 40 registers would hold three blocks an SM: padded to the two of the others
        f"direct, 512, no block reductions {TIMING_ONLY}": (512, ("direct", "no block reductions",
                                                                 "two blocks an SM")),
    },
    "stats": {  # the statistics as ONE numerically stable block reduction (Chan's merge) beside the one-pass
        "direct, 512 threads, one reduction (one-pass)": (512, ("direct", "one reduction")),
        "direct, 512 threads (two-pass)": (512, ("direct",)),
        "direct, 512 threads, stable reduction": (512, ("direct", "stable reduction")),
        "direct, 512, no barriers or loop syncs, stable": (512, ("direct", "no set-up", "main sync",
                                                                  "stable reduction")),
        "direct, 512, plain loads, stable reduction": (512, ("direct", "plain loads", "stable reduction")),
        "TMA one box a stage, 512 threads, stable": (512, ("one box", "stable reduction")),
        "TMA (ops.py's), 256 threads, stable reduction": (256, ("stable reduction",)),
        # as the product builds them (persistent's parameters); ours above is ops.py's choice
        "product, the previous choice (TMA, 256, two-pass)": (256, {"direct": False, "stats": "two-pass"}),
        "product, TMA, 256 threads, stats=stable": (256, {"direct": False, "stats": "stable"}),
    },
}


def fit(rows: list, times: list) -> tuple[float, float, list]:
    """(a, b, residuals) of the least-squares line t = a + b * rows."""
    n = len(rows)
    mx, my = sum(rows) / n, sum(times) / n
    b = sum((x - mx) * (y - my) for x, y in zip(rows, times)) / sum((x - mx) ** 2 for x in rows)
    a = my - b * mx
    return a, b, [y - (a + b * x) for x, y in zip(rows, times)]


def kernels(cols: int, edits: dict) -> dict:
    """label -> (CompiledKernel, note) of ours at ``cols`` columns and of the hand ``edits`` (at 16384)."""
    name, chosen = variant_params("normalize", (cols, cols), "bfloat16")
    ck, _ = compile_generated("normalize", (cols, cols), 4, dtype="bfloat16")
    out = {"ours (ops.py S=4)": (ck, resident_probe.note(ck, chosen))}
    if edits:
        assert name == "persistent" and chosen["row"] // chosen["width"] == 4, chosen
        for label, (threads, drop) in edits.items():
            if isinstance(drop, dict):  # a kernel the product builds: persistent's own parameters
                params = dict(chosen, stages=4, threads=threads, **drop)
                ck = resident_probe.build(params, 0)
                out[label] = (ck, resident_probe.note(ck, params))
                continue
            params = dict(resident_probe.edit_base(chosen), stages=4, threads=threads, one_box="one box" in drop)
            drop = tuple(d for d in drop if d != "one box")  # a build parameter, not an edit
            ck = resident_probe.build(params, drop)
            out[label] = (ck, resident_probe.note(ck, params))
    return out


def _timed(fn, reps: int):
    """``reps`` launches of ``fn``, each between two CUDA events, queued behind a sleeping kernel: (times
    in ms, whether the host had queued them all before the sleep ended)."""
    import torch
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2 * reps + 1)]
    ev[0].record()
    torch.cuda._sleep(SLEEP_CYCLES)
    t0 = time.perf_counter()
    for i in range(reps):
        ev[2 * i + 1].record()
        fn()
        ev[2 * i + 2].record()
    queued_ms = (time.perf_counter() - t0) * 1e3
    ev[-1].synchronize()
    return [ev[2 * i + 1].elapsed_time(ev[2 * i + 2]) for i in range(reps)], queued_ms < ev[0].elapsed_time(ev[1])


def measure(rows: int, cols: int, ours: dict, warps: tuple, rounds: int, reps: int) -> dict:
    """label -> {"rounds": [[ms...] a round], "note": ..., "ok": ...} at ``rows`` x ``cols``."""
    import torch
    from cbrules.codegen import runtime
    from benchmarks.triton_kernels import _normalize_row
    pairs = max(1, math.ceil(ROTATE_BYTES / (4 * rows * cols)))
    x0 = torch.randn(rows, cols, device="cuda").to(torch.bfloat16)
    xs = [x0] + [x0.clone() for _ in range(pairs - 1)]
    outs = [torch.empty_like(x0) for _ in range(pairs)]
    want = torch.nn.functional.layer_norm(x0.float(), (cols,), eps=0.0)
    per_pair, notes = {}, {}
    per_pair["copy"] = [(lambda d=runtime.as_device_array(o), s=runtime.as_device_array(x): runtime.memcpy_dtod(d, s))
                        for x, o in zip(xs, outs)]
    notes["copy"] = "cuMemcpyDtoDAsync"
    for w in warps:
        label = BASE + ("" if w == 16 else f" num_warps={w}")
        per_pair[label] = [(lambda x=x, o=o, w=w: _normalize_row[(rows,)](x, o, rows, cols, BLOCK_N=cols,
                                                                          num_warps=w)) for x, o in zip(xs, outs)]
        notes[label] = f"{32 * w} threads"
    for label, (ck, note) in ours.items():
        per_pair[label] = [ck.bind(x=x, out=o).launch for x, o in zip(xs, outs)]
        notes[label] = note
    result = {}
    for label, fns in per_pair.items():  # every buffer pair checked, outputs poisoned
        ok = True
        for x, o, fn in zip(xs, outs, fns):
            o.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            if TIMING_ONLY in label:
                ok = "n/a"
            elif label == "copy":
                ok &= bool(torch.equal(o, x))
            else:
                ok &= bool(torch.allclose(o.float(), want, rtol=2e-2, atol=2e-2))
        for fn in fns * 2:
            fn()
        result[label] = {"ok": ok, "note": notes[label], "rounds": [], "fed": 0, "pairs": pairs}
    torch.cuda.synchronize()
    for _ in range(rounds):
        for label, fns in per_pair.items():
            turn = iter(fns * reps)  # the launches rotate over the buffer pairs
            ts, fed = _timed(lambda: next(turn)(), reps)
            result[label]["rounds"].append(ts)
            result[label]["fed"] += fed
    del xs, outs, want, per_pair
    torch.cuda.empty_cache()
    return result


def shifted_errors(cols: int, ours: dict, rows: int = 1024, shift: float = 1024.0, spread: float = 8.0) -> dict:
    """label -> the largest error of the output against a float64 normalisation of the same bfloat16 input,
    for rows whose mean (``shift``) is large against their spread: where a one-pass variance
    (E[x^2] - mean^2 in float32) cancels and a stable one does not. NaN-poisoned outputs."""
    import torch
    from benchmarks.triton_kernels import _normalize_row
    x = (shift + spread * torch.randn(rows, cols, device="cuda")).to(torch.bfloat16)
    want = torch.nn.functional.layer_norm(x.double(), (cols,), eps=0.0)
    out = torch.empty_like(x)
    launches = {BASE: lambda: _normalize_row[(rows,)](x, out, rows, cols, BLOCK_N=cols, num_warps=16)}
    launches.update({label: ck.bind(x=x, out=out).launch for label, (ck, _) in ours.items()
                     if TIMING_ONLY not in label})
    errors = {}
    for label, fn in launches.items():
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        errors[label] = float((out.double() - want).abs().max())  # NaN if anything was left unwritten
    return errors


def summarize(table: dict) -> dict:
    """``measure``'s results (rows -> label -> samples) as medians: of all samples and of each round's."""
    return {rows: {label: {"median": statistics.median(sum(r["rounds"], [])),
                           "round_medians": [statistics.median(ts) for ts in r["rounds"]],
                           **{k: r[k] for k in ("ok", "note", "fed", "pairs")}, "rounds_run": len(r["rounds"])}
                   for label, r in res.items()} for rows, res in table.items()}


def report(cols: int, table: dict, fit_rows: tuple) -> list[str]:
    """The medians a shape (``summarize``'s table) with the speed ratio to Triton's row kernel over all
    rounds and its range over the rounds, then the fit a implementation, as lines."""
    lines = []
    labels = list(next(iter(table.values())).keys())
    for rows, res in table.items():
        base = res[BASE]
        for label in labels:
            r = res[label]
            t = r["median"]
            per_round = [b / x for b, x in zip(base["round_medians"], r["round_medians"])]
            lines.append(f"{rows}x{cols} {label:<46} {t * 1e3:9.2f} us {4 * rows * cols / t / 1e6:6.0f} GB/s "
                         f"{base['median'] / t:.3f}x triton (rounds {min(per_round):.3f}-{max(per_round):.3f})  "
                         f"ok={r['ok']} fed={r['fed']}/{r['rounds_run']} pairs={r['pairs']} {r['note']}")
    rows = [m for m in fit_rows if m in table]
    if len(rows) < 3:
        return lines
    lines.append(f"fit over rows {rows} at {cols} columns: t = a + b * rows (medians of all rounds; "
                 f"b_triton / b also fitted on each round's medians)")
    a0, b0, _ = fit(rows, [table[m][BASE]["median"] for m in rows])
    per_round_base = [fit(rows, [table[m][BASE]["round_medians"][i] for m in rows])[1]
                      for i in range(len(table[rows[0]][BASE]["round_medians"]))]
    for label in labels:
        a, b, res = fit(rows, [table[m][label]["median"] for m in rows])
        ratios = [bb / fit(rows, [table[m][label]["round_medians"][i] for m in rows])[1]
                  for i, bb in enumerate(per_round_base)]  # speed ratios a row, as the x triton column
        lines.append(f"  {label:<46} a={a * 1e3:7.2f} us  b={b * 1e6:8.3f} ns/row "
                     f"({4 * cols / b / 1e6:5.0f} GB/s a row)"
                     f"  {b0 / b:.4f}x triton a row (rounds {min(ratios):.4f}-{max(ratios):.4f})  a-a_triton="
                     f"{(a - a0) * 1e3:+6.2f} us  residuals us: {' '.join(f'{e * 1e3:+.2f}' for e in res)}")
    return lines


def from_json(path: str) -> None:
    """Print the report of an earlier run's ``--json`` file (the fit over ROWS and WIDE_ROWS where measured)."""
    with open(path) as f:
        everything = json.load(f)
    for cols, table in everything.items():
        table = {int(rows): res for rows, res in table.items()}
        for line in report(int(cols), table, ROWS if int(cols) == 16384 else WIDE_ROWS):
            print(line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts of 16384 columns (fitted)")
    p.add_argument("--wide-rows", default=",".join(map(str, WIDE_ROWS)), help="row counts of 32768 columns")
    p.add_argument("--beside-rows", default=",".join(map(str, BESIDE_ROWS)),
                   help="row counts of 16384 columns timed beside the fit")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--reps", type=int, default=20, help="timed launches of an implementation a round")
    p.add_argument("--set", default="setup", choices=tuple(SETS), help="which hand edits of ours")
    p.add_argument("--json", help="write the medians (of all samples and of each round) here")
    p.add_argument("--from-json", help="no GPU: print the report of an earlier run's --json file")
    p.add_argument("--cubins", help="write each kernel's cubin into this folder (for cuobjdump -sass)")
    p.add_argument("--compile-only", action="store_true", help="no GPU: build and compile every variant")
    a = p.parse_args()
    if a.from_json:
        return from_json(a.from_json)
    ints = lambda s: tuple(int(v) for v in s.split(",") if v)  # noqa: E731
    plan = [(16384, tuple(sorted(set(ints(a.beside_rows) + ints(a.rows)))), ints(a.rows), SETS[a.set], (16, 8)),
            (32768, ints(a.wide_rows), ints(a.wide_rows), {}, (16,))]
    everything = {}
    for cols, rows_list, fit_rows, edits, warps in plan:
        if not rows_list:
            continue
        ours = kernels(cols, edits)
        for i, (label, (ck, note)) in enumerate(ours.items()):
            print(f"{cols} columns {label}: {note}", flush=True)
            resident_probe._keep(a.cubins, i, f"{cols} {label}", ck)
        if a.compile_only:
            continue
        if a.set == "stats" and edits:
            for label, err in shifted_errors(cols, ours).items():
                print(f"shifted rows (1024 + 8 randn, bfloat16) 1024x{cols} {label:<46} max |error| {err:.3g}",
                      flush=True)
        table = {}
        for rows in rows_list:
            table[rows] = measure(rows, cols, ours, warps, a.rounds, a.reps)
            print(f"  measured {rows}x{cols}", flush=True)
        everything[cols] = summarize(table)
        for line in report(cols, everything[cols], fit_rows):
            print(line, flush=True)
    if a.json and everything:
        with open(a.json, "w") as f:
            json.dump(everything, f, indent=0)


if __name__ == "__main__":
    main()
