"""Tables (markdown), plot (PNG) and raw JSON from the worker's records."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .ops import OPS, shape_label

IMPL_ORDER = {"copy": 0, "torch": 1, "generated": 3, "generated-ws": 3.5, "triton": 4}


def _ok(r: dict) -> bool:
    return r.get("ms") is not None and r.get("valid", True) and not r.get("error")


def groups(records: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """[(op, shape label, records)] in op order then shape order."""
    out = []
    for name, op in OPS.items():
        for shape in op.shapes:
            sl = shape_label(shape)
            rs = [r for r in records if r["op"] == name and r["shape"] == sl]
            if rs:
                rs.sort(key=lambda r: (IMPL_ORDER.get(r["impl"], 9), r.get("stages") or 0, r.get("variant", "")))
                out.append((name, sl, rs))
    return out


def _peers(rs: list[dict]) -> dict:
    def best(impl):
        c = [r for r in rs if r["impl"] == impl and _ok(r)]
        return min(c, key=lambda r: r["ms"]) if c else None
    return {"copy": best("copy"), "torch": best("torch"), "triton": best("triton"), "generated": best("generated")}


def _rate(r: Optional[dict], op: str) -> str:
    if r is None or not _ok(r):
        return "—"
    return f"{r['tflops']:.1f}" if op == "matmul" else f"{r['gbps']:.0f}"


def _ratio(num: Optional[float], den: Optional[float]) -> str:
    return "—" if not num or not den else f"{num / den:.2f}"


def _res(r: dict) -> str:
    q = r.get("resources")
    if not q:
        return ""
    s = f"{q['registers']} regs"
    if q.get("spill_stores") or q.get("stack_bytes"):
        s += f", {q['stack_bytes']} B stack, {q['spill_stores']}/{q['spill_loads']} B spill"
    return s


def summary_table(records: list[dict]) -> str:
    stores = any(r.get("tma_store") for r in records)  # a column for the TMA-store variants, if measured
    lines = ["| op | shape | unit | generated kernel | copy | torch | best Triton | gen S=1 | gen S=2 | gen S=3 | "
             "gen S=4 | " + ("gen TMA store | " if stores else "") + "best gen / copy | best gen / torch | "
             "best gen / Triton |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if stores else "") + "---:|---:|---:|"]
    for op, sl, rs in groups(records):
        pk = _peers(rs)
        unit = "TFLOP/s" if op == "matmul" else "GB/s"
        gens = {r.get("stages"): r for r in rs if r["impl"] == "generated" and not r.get("tma_store")}
        cells = []
        stored = [r for r in rs if r["impl"] == "generated" and r.get("tma_store")]
        best_stored = min((r for r in stored if _ok(r)), key=lambda r: r["ms"], default=stored[0] if stored else None)
        for r in [gens.get(s) for s in (1, 2, 3, 4)] + ([best_stored] if stores else []):
            cells.append("err" if r is not None and r.get("error") else
                         ("INVALID " + _rate(r, op) if r is not None and not r.get("valid", True) else _rate(r, op)))
        tri = pk["triton"]
        tri_s = "—" if tri is None else f"{_rate(tri, op)} ({tri['variant']})"
        g = pk["generated"]
        key = "tflops" if op == "matmul" else "gbps"
        gv = g[key] if g else None
        kernel = next((r["kernel"] for r in gens.values() if r.get("kernel")), "—")
        lines.append(f"| {op} | {sl} | {unit} | {kernel} | {_rate(pk['copy'], op)} | {_rate(pk['torch'], op)} | {tri_s} | "
                     + " | ".join(cells) + f" | {_ratio(gv, pk['copy'] and pk['copy'][key])}"
                     f" | {_ratio(gv, pk['torch'] and pk['torch'][key])} | {_ratio(gv, tri and tri[key])} |")
    return "\n".join(lines)


def full_table(records: list[dict]) -> str:
    lines = ["| op | shape | impl | variant | ms (median) | GB/s | TFLOP/s | × copy | × torch | × best Triton | "
             "valid (max abs err) | resources / error |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for op, sl, rs in groups(records):
        pk = _peers(rs)
        for r in rs:
            ok = _ok(r)
            ms = f"{r['ms']:.3f}" if r.get("ms") is not None else "—"
            gb = f"{r['gbps']:.0f}" if r.get("gbps") is not None else "—"
            tf = f"{r['tflops']:.2f}" if r.get("tflops") is not None else "—"
            xc = _ratio(r.get("gbps"), pk["copy"] and pk["copy"]["gbps"]) if op != "matmul" and ok else "—"
            xt = _ratio(pk["torch"] and pk["torch"]["ms"], r.get("ms")) if ok else "—"
            xr = _ratio(pk["triton"] and pk["triton"]["ms"], r.get("ms")) if ok else "—"
            if "valid" in r:
                v = ("yes" if r["valid"] else "**NO**") + f" ({r.get('max_abs_err', float('nan')):.2g})"
            else:
                v = "n/a"
            note = r.get("error") or _res(r)
            lines.append(f"| {op} | {sl} | {r['impl']} | {r.get('variant', '')} | {ms} | {gb} | {tf} | {xc} | {xt} | "
                         f"{xr} | {v} | {note.replace('|', '/')} |")
    return "\n".join(lines)


def auto_table(records: list[dict]) -> str:
    """stages="auto" (the S the rules choose) beside the best swept S = 2..4 of the same run."""
    lines = ["| op | shape | unit | auto: S | auto | best swept S | best swept | auto / best swept |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for op, sl, rs in groups(records):
        auto = next((r for r in rs if r["impl"] == "generated-auto" and _ok(r)), None)
        if auto is None:
            continue
        key = "tflops" if op == "matmul" else "gbps"
        swept = [r for r in rs if r["impl"] == "generated" and (r.get("stages") or 0) >= 2 and _ok(r)]
        best = max(swept, key=lambda r: r[key]) if swept else None
        lines.append(f"| {op} | {sl} | {'TFLOP/s' if op == 'matmul' else 'GB/s'} | {auto['stages']} | "
                     f"{_rate(auto, op)} | {best['stages'] if best else '—'} | {_rate(best, op) if best else '—'} | "
                     f"{auto[key] / best[key]:.3f} |" if best else "— |")
    return "\n".join(lines)


def ws_table(records: list[dict]) -> str:
    """Warp-specialized variants beside the best pipelined one (S >= 2), per op and shape."""
    lines = ["| op | shape | unit | best pipelined | " + " | ".join(f"WS S={s}{' regs' if r else ''}"
                                                                  for s, r in _WS_COLUMNS)
             + " | best WS / best pipelined | regs of the best WS (entry cap) |",
             "|---|---|---|---:|" + "---:|" * len(_WS_COLUMNS) + "---:|---|"]
    for op, sl, rs in groups(records):
        ws = [r for r in rs if r["impl"] == "generated-ws"]
        if not ws:
            continue
        key = "tflops" if op == "matmul" else "gbps"
        piped = [r for r in rs if r["impl"] == "generated" and (r.get("stages") or 0) >= 2 and _ok(r)]
        bp = max(piped, key=lambda r: r[key]) if piped else None
        cells = []
        for s, with_regs in _WS_COLUMNS:
            r = next((x for x in ws if x.get("stages") == s and bool(x.get("registers")) == with_regs), None)
            cells.append("—" if r is None else "err" if r.get("error") else
                         ("INVALID " if not r.get("valid", True) else "") + _rate(r, op))
        good = [r for r in ws if _ok(r)]
        bw = max(good, key=lambda r: r[key]) if good else None
        if bw is None:
            regs = "—"
        else:
            split = bw.get("registers")
            regs = (f"{split[0]}/{split[1]}" if split else "none") + (f" ({_res(bw)})" if _res(bw) else "")
        best_p = "—" if bp is None else f"{_rate(bp, op)} (S={bp['stages']})"
        lines.append(f"| {op} | {sl} | {'TFLOP/s' if op == 'matmul' else 'GB/s'} | {best_p} | " + " | ".join(cells)
                     + f" | {_ratio(bw and bw[key], bp and bp[key])} | {regs} |")
    return "\n".join(lines)


_WS_COLUMNS = ((2, False), (4, False), (2, True), (4, True))


def notes_section(records: list[dict], skipped: list[dict]) -> str:
    out = []
    for s in skipped:
        out.append(f"- skipped {s['op']} {s['shape']}: {s['reason']}")
    for r in records:
        if r.get("shape") == "-":
            out.append(f"- {r['op']}: {r.get('error')}")
    for name, op in OPS.items():
        for shape, note in op.notes.items():
            out.append(f"- {name} {shape_label(shape)}: {note}")
    return "\n".join(out)


def markdown(records: list[dict], skipped: list[dict], meta: dict) -> str:
    head = [f"# cbrules benchmarks{' (DRY RUN: fake numbers)' if meta.get('dry_run') else ''}", ""]
    dev = meta.get("device") or {}
    head.append(f"Device: {dev.get('name', '?')}; torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}; "
                f"median of {meta.get('reps')} launches after {meta.get('warmup')} warm-up launches, CUDA events; "
                f"{meta.get('date', '')}. Command: `{meta.get('command', '')}`.")
    head += ["", "GB/s counts bytes read + written once each by the algorithm; matmul in TFLOP/s (2MNK). "
             "copy = cuMemcpyDtoDAsync of half those bytes (so it moves the same read + write total). "
             "Ratios are speed ratios: × torch = torch time / this time (> 1: faster than torch). "
             "gen S=1 is the kernel built without its circular_buffer annotation (one stage). "
             "torch and best Triton are the fastest of their variants (normalize's torch: the eager var_mean, "
             "sub, sqrt, div chain or the fused F.layer_norm; its Triton may be the row-in-registers kernel, "
             "which has no loop). generated kernel: the cbrules kernel and tile parameters measured "
             "(chosen with benchmarks/sweep.py).", ""]
    ws = ws_table(records)
    ws_part = ["## Warp-specialized beside pipelined", "",
               "WS: a producer warp group of 128 threads issues the loads, the kernel's threads compute "
               "(`warp_specialize=True`); regs: register sharing by setmaxnreg (producer 40, consumers the rest). "
               "Best pipelined: the fastest generated S=2..4 of the same run.", "", ws, ""] \
        if ws.count("\n") > 1 else []
    auto = auto_table(records)
    auto_part = ["## stages=\"auto\" beside the swept stage counts", "",
                 "auto: the S the rules choose (`cb-auto-stages`: the fewest of S = 2..4 whose resident blocks "
                 "keep 128 KB in flight per SM, else the most in flight; at most the trip count, at least 2), "
                 "measured in the same run "
                 "as the swept S = 2..4.", "", auto, ""] if auto.count("\n") > 1 else []
    return "\n".join(head + ["## Summary", "", summary_table(records), "", *auto_part, *ws_part, "## Notes", "",
                             notes_section(records, skipped), "", "## Every measurement", "",
                             full_table(records), ""])


def plot(records: list[dict], path: Path) -> Optional[str]:
    """A PNG of bars per shape (copy, torch, best Triton, generated S=1..4); None or the reason skipped."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"no plot: {type(e).__name__}: {e}"
    series = ["copy", "torch", "best Triton", "gen S=1", "gen S=2", "gen S=3", "gen S=4"]
    colors = ["#888888", "#ee8822", "#3377bb", "#cce5cc", "#88cc88", "#33aa33", "#116611"]
    fig, axes = plt.subplots(2, 3, figsize=(18, 9))
    for ax, (name, op) in zip(axes.flat, OPS.items()):
        gs = [(sl, rs) for o, sl, rs in groups(records) if o == name]
        key = "tflops" if name == "matmul" else "gbps"
        width = 0.8 / len(series)
        for i, label in enumerate(series):
            vals = []
            for sl, rs in gs:
                pk = _peers(rs)
                if label == "copy":
                    r = pk["copy"]
                elif label == "torch":
                    r = pk["torch"]
                elif label == "best Triton":
                    r = pk["triton"]
                else:
                    s = int(label[-1])
                    r = next((x for x in rs if x["impl"] == "generated" and x.get("stages") == s and _ok(x)), None)
                vals.append(r[key] if r and r.get(key) else 0.0)
            ax.bar([j + i * width for j in range(len(gs))], vals, width, label=label, color=colors[i])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(gs))], [sl for sl, _ in gs], fontsize=8)
        ax.set_title(f"{name}: {op.what}", fontsize=10)
        ax.set_ylabel("TFLOP/s" if name == "matmul" else "GB/s (read + write)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(series), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write(records: list[dict], skipped: list[dict], meta: dict, out: Path) -> str:
    """Write results.json, results.md and results.png under ``out``; return the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(records, skipped, meta)
    (out / "results.md").write_text(md)
    why = plot(records, out / "results.png")
    if why:
        meta["plot"] = why
    (out / "results.json").write_text(json.dumps({"meta": meta, "skipped": skipped, "records": records}, indent=1))
    return md
