"""Scheduler: turn the kernel graph into a linear program (one ordered body per scope).

Order among siblings comes only from depends edges; ties break by node id (creation order), so
the schedule is deterministic. Depends edges between nodes in different scopes are lifted to the
sibling ancestors that contain them. The resulting :class:`Step` tree is the only thing codegen sees.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import networkx as nx

from .errors import CbrulesError
from .graph import CONTAINS, DEPENDS, KernelGraph


class ScheduleError(CbrulesError):
    """The depends edges among some siblings form a cycle."""


@dataclass(frozen=True)
class Step:
    """One statement of the linear program; scopes hold their ordered ``body``."""

    node: int
    op: str
    attrs: dict = field(hash=False, compare=False)
    origin: dict = field(hash=False, compare=False)
    body: tuple["Step", ...] = ()

    def walk(self):
        """This step and every step inside it, in program order."""
        yield self
        for s in self.body:
            yield from s.walk()


def sibling_edges(kg: KernelGraph) -> dict[int, list[tuple[int, int, tuple[int, int]]]]:
    """Depends edges grouped by the scope whose children they order: scope -> [(a', b', (a, b))].

    An edge between nodes of different scopes is lifted to the sibling ancestors that hold them;
    an edge between a scope and its own descendant orders nothing and is dropped.
    """
    parent = {c: p for p, c, k in kg.g.edges(data="kind") if k == CONTAINS}

    def chain(n: int) -> list[int]:
        out = [n]
        while out[-1] in parent:
            out.append(parent[out[-1]])
        return out

    grouped: dict[int, list] = {}
    for a, b, k in kg.g.edges(data="kind"):
        if k != DEPENDS:
            continue
        if parent.get(a) is not None and parent.get(a) == parent.get(b):
            grouped.setdefault(parent[a], []).append((a, b, (a, b)))
            continue
        ca, cb = chain(a), chain(b)
        pos_b = {n: i for i, n in enumerate(cb)}
        for i, n in enumerate(ca):
            if n in pos_b:
                j = pos_b[n]
                if i and j:
                    grouped.setdefault(n, []).append((ca[i - 1], cb[j - 1], (a, b)))
                break
    return grouped


def sibling_order(kg: KernelGraph, scope: int, edges: Optional[dict] = None) -> list[int]:
    """The children of ``scope`` in a deterministic order that respects every depends edge.

    Without ``edges`` (from :func:`sibling_edges`) only the edges between the children themselves
    count, which is all a verified graph has and costs only the scope's own adjacency."""
    kids = kg.children(scope)
    dag = nx.DiGraph()
    dag.add_nodes_from(kids)
    if edges is None:
        kid_set = set(kids)
        dag.add_edges_from((c, s) for c in kids for s, d in kg.g.succ[c].items()
                           if d["kind"] == DEPENDS and s in kid_set)
    else:
        dag.add_edges_from((a, b) for a, b, _ in edges.get(scope, ()) if a != b)
    try:
        return list(nx.lexicographical_topological_sort(dag))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(dag)
        names = " -> ".join(kg.describe(u) for u, _ in cycle) + f" -> {kg.describe(cycle[0][0])}"
        raise ScheduleError(f"depends edges form a cycle inside {kg.describe(scope)}: {names}; "
                            "remove one of these edges (a rule or builder call ordered them both ways)")


def schedule(kg: KernelGraph, scope: Optional[int] = None, edges: Optional[dict] = None) -> Step:
    """Linearise the graph (or the subtree at ``scope``) into a :class:`Step` tree."""
    edges = sibling_edges(kg) if edges is None else edges
    n = kg.root if scope is None else scope
    body = tuple(schedule(kg, c, edges) for c in sibling_order(kg, n, edges)) if kg.is_scope(n) else ()
    d = kg[n]
    return Step(n, d["op"], kg.attrs(n), dict(d.get("origin", {})), body)


def linear_order(kg: KernelGraph) -> list[int]:
    """Every node in program order (pre-order of the schedule)."""
    return [s.node for s in schedule(kg).walk()]


def print_program(step: Step, indent: int = 0, ids: bool = False) -> str:
    """A readable listing of the linear program (for debugging and tests); ``ids`` starts each
    line with its node's ``#id``."""
    keys = {k: v for k, v in step.attrs.items() if k not in ("params", "symbols")}
    line = "  " * indent + (f"#{step.node} " if ids else "") + f"{step.op} " + \
        " ".join(f"{k}={_fmt(v)}" for k, v in keys.items())
    return "\n".join([line.rstrip()] + [print_program(s, indent + 1, ids) for s in step.body])


def _fmt(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    return str(v)
