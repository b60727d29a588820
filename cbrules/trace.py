"""Debug-mode queries over a lowering trace: which rule did what, to which node, and why not.

All functions take the :class:`cbrules.engine.Trace` that ``lower(..., debug=True)`` records.
"""
from __future__ import annotations

import fnmatch
from collections import defaultdict
from typing import Optional

from .engine import Application, Trace
from .errors import CbrulesError
from .graph import KernelGraph
from .match import Matcher, split_keys
from .rulefile import did_you_mean
from .schedule import print_program, schedule
from .sexpr import Atom
from .values import NodeRef


class TraceQueryError(CbrulesError, KeyError):
    """A trace query about a rule, node or step the trace does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


def counts(trace: Trace) -> list[tuple[str, int, float]]:
    """(rule, applications, total seconds), most applied first."""
    n: dict[str, int] = defaultdict(int)
    t: dict[str, float] = defaultdict(float)
    for r in trace.records:
        n[r.rule] += 1
        t[r.rule] += r.seconds
    return sorted(((k, n[k], t[k]) for k in n), key=lambda x: (-x[1], x[0]))


def select(trace: Trace, rule: Optional[str] = None, phase: Optional[str] = None,
           node: Optional[int] = None) -> list[Application]:
    """Records whose rule matches the glob ``rule``, in ``phase``, touching ``node``."""
    out = []
    for r in trace.records:
        if rule and not fnmatch.fnmatchcase(r.rule, rule):
            continue
        if phase and r.phase != phase:
            continue
        if node is not None and node not in r.created + r.erased + r.changed and \
                f"#{node}" not in r.bindings.values():
            continue
        out.append(r)
    return out


def describe(r: Application) -> str:
    """One line per application."""
    b = " ".join(f"{k}={v}" for k, v in r.bindings.items())
    parts = [f"step {r.step:3d} [{r.phase}] {r.rule} @ {r.at}"]
    if b:
        parts.append(b)
    for what, ns in (("created", r.created), ("erased", r.erased), ("changed", r.changed)):
        if ns:
            parts.append(f"{what} {','.join(f'#{n}' for n in ns)}")
    if r.egg:
        parts.append("egglog matches " + ", ".join(f"{k}:{v}" for k, v in sorted(r.egg.items()) if v))
    parts.append(f"{r.seconds * 1e3:.2f} ms")
    return " | ".join(parts)


def graph_at(trace: Trace, step: int) -> KernelGraph:
    """The graph after ``step`` (0: the kernel as built)."""
    if step == 0:
        return trace.initial
    earlier = [s for s in trace.graphs if s <= step]
    if not earlier or step > max(trace.graphs):
        raise TraceQueryError(f"no step {step}: the trace has steps 1..{max(trace.graphs, default=0)}")
    return trace.graphs[max(earlier)]


def final_graph(trace: Trace) -> KernelGraph:
    return trace.graphs[max(trace.graphs)] if trace.graphs else trace.initial


def history(trace: Trace, node: int) -> list[str]:
    """How ``node`` came to be: its creating rule, the node it was cloned from, back to the build."""
    lines = []
    seen = set()
    n: Optional[int] = node
    while n is not None and n not in seen:
        seen.add(n)
        g = next((gr for gr in [final_graph(trace), *reversed(list(trace.graphs.values())), trace.initial]
                  if n in gr), None)
        if g is None:
            lines.append(f"#{n}: not in any recorded graph")
            break
        o = g[n]["origin"]
        if o.get("by") == "rule":
            src = f", cloned from #{o['from']}" if "from" in o else ""
            lines.append(f"{g.describe(n)}: created by {o['rule']} @ {o['at']} at step {o['step']}{src}")
        else:
            lines.append(f"{g.describe(n)}: built by the user at {o.get('where', '?')}")
        for r in trace.records:
            if n in r.changed:
                lines.append(f"  changed at step {r.step} by {r.rule} @ {r.at}")
        n = o.get("from")
    return lines


def why_not(trace: Trace, rule: str, node: int, step: Optional[int] = None) -> str:
    """Why ``rule`` does not apply to ``node`` in the graph after ``step`` (default: the final graph).

    The node is bound to the first node pattern of the rule's :match whose op fits; the answer is
    the first pattern element or guard that no continuation got past.
    """
    if rule not in trace.rules:
        raise TraceQueryError(f"unknown rule {rule!r}" + did_you_mean(rule, trace.rules))
    r = trace.rules[rule]
    g = final_graph(trace) if step is None else graph_at(trace, step)
    if node not in g:
        gone = next((x for x in trace.records if node in x.erased and (step is None or x.step <= step)), None)
        if gone is not None:
            return (f"#{node} was erased at step {gone.step} by {gone.rule} @ {gone.at}; ask about the graph "
                    f"before that with step {gone.step - 1}")
        return f"#{node} does not exist in the graph{'' if step is None else f' after step {step}'}"
    op = g.op(node)
    for i, el in enumerate(r.match):
        pos, _ = split_keys(el.items, 1)
        if el.head() in (op, "_") and pos and isinstance(pos[0], Atom) and pos[0].kind == "var":
            var = pos[0].value
            break
    else:
        ops = sorted({str(el.head()) for el in r.match})
        return f"rule {rule} never binds a {op} node: its :match elements are {', '.join(ops)}"
    m = Matcher(g)
    for _ in m.matches(r.match, r.where, {var: NodeRef(node)}):
        return f"rule {rule} does match {g.describe(node)} as {var}" + \
            (" (it already fired on these nodes, or its phase was over)" if step is None else "")
    idx, why, where = m.deepest
    if idx < 0:
        return f"rule {rule}: {g.describe(node)} fails its first pattern element"
    kind = "guard" if idx >= len(r.match) else "pattern element"
    return f"rule {rule} does not fire on {g.describe(node)} as {var}: {kind} {where} at {where.pos} — {why}"


def program_at(trace: Trace, step: int) -> str:
    return print_program(schedule(graph_at(trace, step)))


def to_dot(trace: Trace, step: int) -> str:
    """DOT of the graph before and after ``step``: created nodes green, erased red, changed yellow."""
    rec = next((r for r in trace.records if r.step == step), None)
    if rec is None:
        raise TraceQueryError(f"no step {step}: the trace has steps 1..{max(trace.graphs, default=0)}")
    before, after = graph_at(trace, step - 1), graph_at(trace, step)
    lines = ["digraph step {", "  compound=true; node [shape=box, fontname=monospace, fontsize=10];"]
    for tag, g in (("before", before), ("after", after)):
        lines.append(f'  subgraph cluster_{tag} {{ label="{tag} step {step}: {_dot_text(rec.rule)}";')
        for n in g.nodes():
            color = ""
            if tag == "after" and n in rec.created:
                color = ', style=filled, fillcolor="#c8f7c5"'
            elif tag == "before" and n in rec.erased:
                color = ', style=filled, fillcolor="#f7c5c5"'
            elif n in rec.changed:
                color = ', style=filled, fillcolor="#f7f0c5"'
            lines.append(f'    {tag}_{n} [label="{_dot_text(g.describe(n).split(" [")[0])}"{color}];')
        for a, b, kind in g.g.edges(data="kind"):
            style = "" if kind == "contains" else " [style=dashed, color=blue]"
            lines.append(f"    {tag}_{a} -> {tag}_{b}{style};")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


def _dot_text(text: str) -> str:
    """``text`` safe inside a double-quoted DOT string."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
