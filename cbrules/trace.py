"""Debug-mode queries over a lowering trace: which rule did what, to which node, and why not.

All functions take the :class:`cbrules.rewrite.engine.Trace` that ``lower(..., debug=True)`` records.
"""
from __future__ import annotations

import fnmatch
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

from .rewrite.engine import Application, Trace
from .errors import CbrulesError
from .userio import printable
from .ir.graph import KernelGraph
from .rewrite.match import RELATIONS, Matcher, split_keys
from .rewrite.rulecheck import did_you_mean
from .rewrite.rulefile import GraphRule
from .schedule import print_program, schedule
from .rewrite.sexpr import Atom
from .rewrite.values import NodeRef


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
    """Records whose rule matches the glob ``rule``, in ``phase``, touching ``node``. A glob that
    names no rule, or an unknown phase, is a :class:`TraceQueryError` with a did-you-mean."""
    known = [*trace.rules, "egglog"]
    if rule and not any(fnmatch.fnmatchcase(k, rule) for k in known):
        raise TraceQueryError(f"no rule matches {rule!r}" + did_you_mean(rule, known))
    if phase and phase not in trace.phases:
        raise TraceQueryError(f"unknown phase {phase!r}" + did_you_mean(phase, trace.phases)
                              + f"; the phases are {', '.join(trace.phases)}")
    if node is not None and not any(node in g for g in [trace.initial, *trace.graphs.values()]):
        raise TraceQueryError(f"no node #{node} in any graph of the trace (ids 0..{_max_id(trace)})")
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
    b = " ".join(f"{k}={printable(v)}" for k, v in r.bindings.items())  # a rule's strings: one line
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
    """How ``node`` came to be: its creating rule, the node it was cloned from, back to the build.
    A node no recorded graph holds is a :class:`TraceQueryError`."""
    lines = []
    seen = set()
    n: Optional[int] = node
    while n is not None and n not in seen:
        seen.add(n)
        g = next((gr for gr in [final_graph(trace), *reversed(list(trace.graphs.values())), trace.initial]
                  if n in gr), None)
        if g is None:
            if n == node:
                raise TraceQueryError(f"no node #{n} in any graph of the trace (ids 0..{_max_id(trace)})")
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
        erased = next((r for r in trace.records if n in r.erased), None)
        if erased is not None:
            lines.append(f"  erased at step {erased.step} by {erased.rule} @ {erased.at}")
        n = o.get("from")
    return lines


def _max_id(trace: Trace) -> int:
    return max((max(g.nodes(), default=0) for g in [trace.initial, *trace.graphs.values()]), default=0)


def rule_named(trace: Trace, name: str) -> GraphRule:
    """The rule called ``name``; an unknown name is a :class:`TraceQueryError` with a did-you-mean."""
    if name not in trace.rules:
        raise TraceQueryError(f"unknown rule {name!r}" + did_you_mean(name, trace.rules)
                              + "; `cbrules rules list` lists them")
    return trace.rules[name]


def phase_at(trace: Trace, step: Optional[int]) -> Optional[str]:
    """The phase that made the graph after ``step`` (None: step 0, before any phase ran)."""
    if step is None:
        return trace.records[-1].phase if trace.records else None
    return next((r.phase for r in reversed(trace.records) if r.step <= step), None)


@dataclass
class WhyNot:
    """The answer of :func:`why_not`: whether the rule matches, and why (``str()`` reads it)."""

    rule: str
    node: int
    var: str
    matches: bool
    text: str
    element: Optional[str] = None  # the first pattern element or guard that failed ...
    at: Optional[str] = None  # ... and its file:line:col
    detail: Optional[str] = None  # expected vs actual

    def __str__(self) -> str:
        return self.text


def why_not(trace: Trace, rule: str, node: int, step: Optional[int] = None, as_var: Optional[str] = None) -> WhyNot:
    """Why ``rule`` does not apply to ``node`` in the graph after ``step`` (default: the final graph).

    The node is bound to ``as_var`` (default: the variable of the first node pattern of the rule's
    :match whose op fits); the answer names the first pattern element or guard that no
    continuation got past, with what it wanted and what the graph has, and says where the graph
    stands with respect to the rule's phase. A node the graph does not hold is a
    :class:`TraceQueryError`."""
    r = rule_named(trace, rule)
    g = final_graph(trace) if step is None else graph_at(trace, step)
    after = "the final graph" if step is None else f"the graph after step {step}"
    if node not in g:
        gone = next((x for x in trace.records if node in x.erased and (step is None or x.step <= step)), None)
        if gone is not None:
            raise TraceQueryError(f"#{node} is not in {after}: it was erased at step {gone.step} by {gone.rule} "
                                  f"@ {gone.at}; ask about an earlier graph with --step {gone.step - 1}")
        raise TraceQueryError(f"#{node} is not in {after} (ids 0..{max(g.nodes(), default=0)}); "
                              "`cbrules trace KERNEL graph` shows every node with its #id")
    op = g.op(node)
    var = _binding_var(r, op, as_var)
    if var is None:
        ops = sorted({str(el.head()) for el in r.match})
        return WhyNot(rule, node, "", False, f"rule {rule} never binds a {op} node: its :match elements are "
                      f"{', '.join(ops)}")
    phase = _phase_note(trace, r, step)
    m = Matcher(g)
    for b in m.matches(r.match, r.where, {var: NodeRef(node)}):
        fired = [x.step for x in trace.records if x.rule == rule and x.bindings.get(var) == f"#{node}"]
        when = f"; it fired on it at step {fired[0]}" if fired else ""
        if phase.startswith(" (its phase") and "has not begun" in phase:
            return WhyNot(rule, node, var, False, f"rule {rule} is not tried on {after}{phase}; there it would "
                          f"match {g.describe(node)} as {var}")
        return WhyNot(rule, node, var, True, f"rule {rule} does match {g.describe(node)} as {var} in {after}"
                      f"{when}{phase}")
    idx, why, where = m.deepest
    if idx < 0:
        return WhyNot(rule, node, var, False, f"rule {rule}: {g.describe(node)} fails its first pattern element{phase}")
    kind = "guard" if idx >= len(r.match) else "pattern element"
    detail = m.explain()
    return WhyNot(rule, node, var, False, f"rule {rule} does not fire on {g.describe(node)} as {var} in {after}: "
                  f"{kind} {where} at {where.pos} -- {detail}{phase}", str(where), str(where.pos), detail)


def _binding_var(r: GraphRule, op: str, as_var: Optional[str]) -> Optional[str]:
    """The variable to bind a node of ``op`` to: ``as_var`` (checked), else the first node pattern's
    variable whose op fits."""
    for el in r.match:
        pos, _ = split_keys(el.items, 1)
        if pos and isinstance(pos[0], Atom) and pos[0].kind == "var" and el.head() not in RELATIONS:
            if as_var is None and el.head() in (op, "_"):
                return pos[0].value
            if as_var == pos[0].value:
                if el.head() not in (op, "_"):
                    raise TraceQueryError(f"rule {r.name} binds {as_var} to a {el.head()} node, not a {op}")
                return as_var
    if as_var is not None:
        names = sorted({v for el in r.match for v in _pattern_vars(el)})
        raise TraceQueryError(f"rule {r.name} has no node pattern binding {as_var}" + did_you_mean(as_var, names)
                              + f"; its variables: {', '.join(names)}")
    return None


def _pattern_vars(el) -> list[str]:
    pos, _ = split_keys(el.items, 1)
    return [p.value for p in pos[:1] if isinstance(p, Atom) and p.kind == "var"]


def _phase_note(trace: Trace, r: GraphRule, step: Optional[int]) -> str:
    """Where the graph asked about stands with respect to the rule's phase."""
    now = phase_at(trace, step)
    if r.phase not in trace.phases:
        return ""
    mine = trace.phases.index(r.phase)
    if now is None or trace.phases.index(now) < mine:
        return (f" (its phase {r.phase} has not begun at {'step 0' if now is None else f'this step, in phase {now}'}:"
                " the rule is only tried in its phase)")
    if trace.phases.index(now) > mine or (step is None and trace.complete):
        last = max((x.step for x in trace.records if x.phase == r.phase), default=None)
        return f" (its phase {r.phase} is over{f', it ended at step {last}' if last else ''})"
    return f" (in its phase {r.phase})"


def program_at(trace: Trace, step: int) -> str:
    """The program after ``step``, every line starting with its node's ``#id``."""
    return print_program(schedule(graph_at(trace, step)), ids=True)


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
