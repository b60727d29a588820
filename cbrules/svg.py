"""A kernel graph as SVG, laid out here (no graphviz): one row per node in schedule order.

The graph is a tree of scopes with ordering edges between siblings, so an outline reads best:
each node is a box indented by its depth, containment is drawn as elbow lines from the parent,
and depends edges as dashed arcs right of the boxes. Every node is a ``<g class="node"
data-node="ID">`` so a page can colour it (created, erased, changed) without redrawing.
"""
from __future__ import annotations

from html import escape

from .ir.graph import KernelGraph
from .schedule import Step, schedule

ROW = 20  # px per row
INDENT = 16  # px per nesting level
CHAR = 6.6  # px per character of the 11 px monospace font
KEYS = ("var", "buf", "dst", "src", "barrier", "part", "stage")  # attributes worth a glance


def label(step: Step) -> str:
    """``#id op key=value ...`` for one box (the full attributes are in the page's step panel)."""
    shown = " ".join(f"{k}={step.attrs[k]}" for k in KEYS if step.attrs.get(k) not in (None, ""))
    return f"#{step.node} {step.op}" + (f" {shown}" if shown else "")


def graph_svg(kg: KernelGraph) -> str:
    """The graph as one ``<svg>`` element (text escaped; no script, no external reference)."""
    rows: list[tuple[int, Step]] = []

    def visit(s: Step, depth: int) -> None:
        rows.append((depth, s))
        for c in s.body:
            visit(c, depth + 1)
    visit(schedule(kg), 0)
    where = {s.node: i for i, (_, s) in enumerate(rows)}
    texts = [label(s) for _, s in rows]
    right = max((8 + d * INDENT + len(t) * CHAR + 10 for (d, _), t in zip(rows, texts)), default=100)
    parts = []
    for i, ((depth, s), text) in enumerate(zip(rows, texts)):
        x, y = 8 + depth * INDENT, 4 + i * ROW
        width = len(text) * CHAR + 8
        if depth:  # elbow from the parent's box
            p = where[kg.parent(s.node)]
            px = 8 + (depth - 1) * INDENT + 4
            parts.append(f'<path class="contains" d="M{px} {4 + p * ROW + 16} V{y + 8} H{x}"/>')
        parts.append(f'<g class="node" data-node="{s.node}"><rect x="{x}" y="{y}" width="{width:.0f}" '
                     f'height="16" rx="3"/><text x="{x + 4}" y="{y + 12}">{escape(text)}</text></g>')
    arcs = 0
    for a, b in kg.depends_edges():
        if a in where and b in where:
            ya, yb = 4 + where[a] * ROW + 8, 4 + where[b] * ROW + 8
            bend = right + 12 + (arcs % 6) * 8
            arcs += 1
            parts.append(f'<path class="depends" data-from="{a}" data-to="{b}" '
                         f'd="M{right} {ya} C{bend} {ya} {bend} {yb} {right} {yb}"/>')
    width = right + 70
    height = 8 + len(rows) * ROW
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
            f'viewBox="0 0 {width:.0f} {height}">' + "".join(parts) + "</svg>")
