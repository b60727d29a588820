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
from .sexpr import Atom
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


def why_not(trace: Trace, rule: str, node: Optional[int] = None, step: Optional[int] = None,
            as_var: Optional[str] = None) -> WhyNot:
    """Why ``rule`` does not apply to ``node`` in the graph after ``step`` (default: the final graph).

    The node is bound to ``as_var`` (default: the variable of the first node pattern of the rule's
    :match whose op fits); the answer names the first pattern element or guard that no
    continuation got past, with what it wanted and what the graph has, and says where the graph
    stands with respect to the rule's phase. A node the graph does not hold is a
    :class:`TraceQueryError`. Without ``node`` it answers why the rule never fired: the closest
    candidate over the graphs its phase saw (:func:`why_never`). A rule a ``(disable ...)`` turned
    off says so, and where."""
    r = rule_named(trace, rule)
    if node is None:
        return _disabled_note(trace, why_never(trace, rule, step, as_var))
    return _disabled_note(trace, _why_not_node(trace, r, node, step, as_var))


def _disabled_note(trace: Trace, w: WhyNot) -> WhyNot:
    at = getattr(trace, "disabled", {}).get(w.rule)
    if at is None:
        return w
    w.text = (f"rule {w.rule} is disabled by (disable {w.rule}) at {at}, so it is never tried; remove that form to "
              f"enable it. Were it enabled: {w.text}")
    w.matches = False
    return w


def _why_not_node(trace: Trace, r: GraphRule, node: int, step: Optional[int], as_var: Optional[str]) -> WhyNot:
    rule = r.name
    if step is None and node not in final_graph(trace):  # no step to guess: the last graph of the rule's phase holding it
        step = next((s for s in reversed(_phase_steps(trace, r.phase)) if node in graph_at(trace, s)), None)
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
    detail = m.explain() + relation_facts(g, where, m.deepest_bindings)
    return WhyNot(rule, node, var, False, f"rule {rule} does not fire on {g.describe(node)} as {var} in {after}: "
                  f"{kind} {where} at {where.pos} -- {detail}{phase}", str(where), str(where.pos), detail)


def _phase_steps(trace: Trace, phase: str) -> list[int]:
    """The steps whose graphs a rule of ``phase`` was tried on: the graph entering the phase and
    the graph after each of its steps (each the last of a run of steps, at most a few dozen)."""
    mine = trace.phases.index(phase) if phase in trace.phases else len(trace.phases)
    earlier = [x.step for x in trace.records if x.phase in trace.phases and trace.phases.index(x.phase) < mine]
    inside = [x.step for x in trace.records if x.phase == phase]
    steps = [max(earlier, default=0), *inside]
    if len(steps) > 24:  # a long phase: its first graphs, and its last
        steps = steps[:12] + steps[-12:]
    return list(dict.fromkeys(steps))


MAX_CANDIDATES = 4000  # nodes tried per graph by why_never (a larger graph: the first of them)


def why_never(trace: Trace, rule: str, step: Optional[int] = None, as_var: Optional[str] = None) -> WhyNot:
    """Why ``rule`` never fired in its phase: every node of its first node pattern's op tried on
    each graph the phase saw (or the graph after ``step``), and the one that got furthest through
    the :match and :where named with its first failing element."""
    r = rule_named(trace, rule)
    fired = [x.step for x in trace.records if x.rule == rule]
    pattern = next(((el.head(), v) for el in r.match for v in _pattern_vars(el)
                    if el.head() not in RELATIONS and (as_var is None or v == as_var)), None)
    if pattern is None:
        raise TraceQueryError(f"rule {rule} has no node pattern" + (f" binding {as_var}" if as_var else "")
                              + " to start from; ask about one node with --node")
    op, var = pattern
    steps = [step] if step is not None else _phase_steps(trace, r.phase)
    best = None  # (depth, step, node, matcher)
    for s in steps:
        g = graph_at(trace, s)
        pool = [n for n in g.nodes() if op == "_" or g.op(n) == op][:MAX_CANDIDATES]
        for n in pool:
            m = Matcher(g)
            if next(iter(m.matches(r.match, r.where, {var: NodeRef(n)})), None) is not None:
                when = f"; it fired at step{'s' if len(fired) > 1 else ''} {', '.join(map(str, fired[:8]))}" \
                    if fired else "" if rule in getattr(trace, "disabled", {}) else \
                    ", yet it never fired there (an earlier rule of the phase changed the graph first?)"
                return WhyNot(rule, n, var, True, f"rule {rule} matches {g.describe(n)} as {var} in the graph after "
                              f"step {s}{when}")
            if best is None or m.deepest[0] > best[0]:
                best = (m.deepest[0], s, n, m)
    where = "" if step is not None else f" (tried on the graphs its phase {r.phase} saw: after steps " \
        f"{', '.join(map(str, steps))})"
    if best is None:
        return WhyNot(rule, -1, var, False, f"rule {rule} never fired: no graph its phase saw has a {op} node for "
                      f"{var}{where}")
    _, s, n, m = best
    idx, _, el = m.deepest
    g = graph_at(trace, s)
    if idx < 0 or el is None:
        return WhyNot(rule, n, var, False, f"rule {rule} never fired: no {op} node gets past its first pattern "
                      f"element{where}")
    kind = "guard" if idx >= len(r.match) else "pattern element"
    detail = m.explain() + relation_facts(g, el, m.deepest_bindings)
    return WhyNot(rule, n, var, False, f"rule {rule} never fired{where}; the closest candidate is {g.describe(n)} "
                  f"as {var} after step {s}: it fails {kind} {el} at {el.pos} -- {detail}", str(el), str(el.pos),
                  detail)


_ORDER_RELATIONS = ("next", "before", "between", "ordered", "independent", "inside", "child", "distinct")


def relation_facts(g: KernelGraph, where, bindings: dict) -> str:
    """What the graph says about the nodes a failed relation was tried with: where each sits (its
    scope and place in schedule order) and, for ordered / independent, the depends paths between
    them. Empty for anything else."""
    head = where.head() if hasattr(where, "head") else None
    if head not in _ORDER_RELATIONS:
        return ""
    ids = [(x.value, bindings[x.value].id) for x in where.items[1:]
           if isinstance(x, Atom) and x.kind == "var" and isinstance(bindings.get(x.value), NodeRef)
           and bindings[x.value].id in g]
    if not ids:
        return ""
    place: dict[int, tuple[int, int]] = {}

    def visit(st) -> None:
        for i, c in enumerate(st.body):
            place[c.node] = (st.node, i)
            visit(c)
    visit(schedule(g))
    facts = []
    for v, n in ids:
        if n in place:
            p, i = place[n]
            facts.append(f"{v}=#{n} is statement {i + 1} of #{p} {g.op(p)}")
    parents = {place[n][0] for _, n in ids if n in place}
    if len(ids) > 1 and len(parents) > 1 and head not in ("inside", "child"):
        facts.append("they are not children of one scope (order relations relate siblings only: relate their "
                     "enclosing children and add (inside ...))")
    if head in ("ordered", "independent") and len(ids) >= 2:
        (va, a), (vb, b) = ids[:2]
        facts.append(f"depends path {va} -> {vb}: {'yes' if _depends_path(g, a, b) else 'no'}, "
                     f"{vb} -> {va}: {'yes' if _depends_path(g, b, a) else 'no'}")
    return " -- facts: " + "; ".join(facts) if facts else ""


def _depends_path(g: KernelGraph, a: int, b: int) -> bool:
    """A chain of depends edges from ``a`` to ``b``."""
    seen, todo = {a}, [a]
    while todo:
        n = todo.pop()
        for m in g.successors(n):
            if m not in seen:
                if m == b:
                    return True
                seen.add(m)
                todo.append(m)
    return False


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


def edges_at(trace: Trace, step: int) -> list[str]:
    """The depends edges of the graph after ``step``, labelled, one line per node with successors
    (the contains edges are the indentation of :func:`program_at`)."""
    succ: dict[int, list[int]] = defaultdict(list)
    for a, b in graph_at(trace, step).depends_edges():
        succ[a].append(b)
    return ["edges: contains = the indentation above; depends = the left node runs before each on the right "
            "(siblings of one scope)"] + [f"  #{a} depends-> {' '.join(f'#{b}' for b in bs)}"
                                          for a, bs in sorted(succ.items())]


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
        for a, b, kind in g.edges():
            style = "" if kind == "contains" else f' [style=dashed, color=blue, label="{_dot_text(kind)}", fontsize=8]'
            lines.append(f"    {tag}_{a} -> {tag}_{b}{style};")
        lines.append("  }")
    # what the arcs mean, and the colours
    lines.append('  legend [shape=note, label="solid arc: contains (scope -> child)\\ldashed blue arc: depends '
                 '(must run before, within one scope)\\lgreen: created  red: erased  yellow: changed\\l"];')
    lines.append("}")
    return "\n".join(lines)


def _dot_text(text: str) -> str:
    """``text`` safe inside a double-quoted DOT string."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
