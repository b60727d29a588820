"""Where a kernel's warps wait: ncu's warp-state samples per SASS instruction (the source page,
``ncu -i REPORT --page source --csv --print-source sass > SOURCE.csv``), summed over the instructions
of a kind (the full- or empty-barrier try-wait, the wgmma wait, the named barrier, HGMMA, ...):

    python3 benchmarks/ncu_stalls.py SOURCE.csv [--labels coop,coop-pers,...] [--top 8]

Prints, for each kernel of the report in order, the share of all samples at each kind of
instruction and the stall reasons that dominate it, then the instructions with the most samples.
"""
from __future__ import annotations

import argparse
import collections
import csv
import re
import sys

KINDS = (  # (label, pattern on the SASS text): the first match names an instruction's kind
    ("mbarrier try-wait", r"SYNCS\.PHASECHK"),
    ("wgmma wait (WARPGROUP.DEPBAR)", r"WARPGROUP\.DEPBAR"),
    ("wgmma issue (HGMMA)", r"HGMMA"),
    ("wgmma fence (WARPGROUP.ARRIVE)", r"WARPGROUP\.ARRIVE"),
    ("named barrier (BAR.SYNC)", r"\bBAR\.(SYNC|ARV|RED)"),
    ("mbarrier arrive", r"SYNCS\.ARRIVE"),
    ("TMA (UTMALDG / UTMASTG / UBLKCP)", r"UTMA|UBLKCP|UTMACMDFLUSH"),
    ("bulk-store wait (DEPBAR)", r"^\s*(@!?U?P\w+\s+)?DEPBAR"),
    ("shared store (STS)", r"\bSTS\b"),
    ("branch / warpsync / elect", r"\bBRA\b|WARPSYNC|ELECT|BSSY|BSYNC"),
)


def kernels(path: str) -> list[tuple[str, list[dict]]]:
    """(kernel name, rows) for each kernel of the source-page CSV, in the report's order."""
    out, rows, header = [], None, None
    for rec in csv.reader(open(path, newline="")):
        if rec and rec[0] == "Kernel Name":
            rows = []
            out.append((rec[1], rows))
            header = None
        elif rec and rec[0] == "Address":
            header = rec
        elif header and rows is not None and rec:
            rows.append(dict(zip(header, rec)))
    return out


def kind(sass: str) -> str:
    for label, pat in KINDS:
        if re.search(pat, sass):
            return label
    return "other"


def summary(rows: list[dict], top: int) -> list[str]:
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    total = sum(int(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows) or 1
    by_kind = collections.defaultdict(collections.Counter)
    for r in rows:
        c = by_kind[kind(r["Source"])]
        c["all"] += int(r["Warp Stall Sampling (All Samples)"] or 0)
        for k in reasons:
            c[k] += int(r[k] or 0)
    lines = [f"  {total} samples"]
    for label, c in sorted(by_kind.items(), key=lambda kv: -kv[1]["all"]):
        main = ", ".join(f"{k[6:]} {100 * v / total:.1f}" for k, v in c.most_common(4) if k != "all" and v)
        lines.append(f"  {100 * c['all'] / total:5.1f} %  {label}  ({main})")
    lines.append("  top instructions:")
    for r in sorted(rows, key=lambda r: -int(r["Warp Stall Sampling (All Samples)"] or 0))[:top]:
        n = int(r["Warp Stall Sampling (All Samples)"] or 0)
        why = max(reasons, key=lambda k: int(r[k] or 0))
        lines.append(f"  {100 * n / total:5.1f} %  {r['Source'].strip()[:70]}  [{why[6:]}]")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--labels", help="comma-separated names for the report's kernels, in order")
    p.add_argument("--top", type=int, default=8)
    a = p.parse_args(argv)
    labels = a.labels.split(",") if a.labels else []
    for i, (name, rows) in enumerate(kernels(a.csv)):
        print(f"{labels[i] if i < len(labels) else i} ({name}):")
        print("\n".join(summary(rows, a.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
