"""Scheduler: turn the kernel graph into a linear program (one ordered body per scope).

Order among siblings comes only from depends edges; ties break by node id (creation order), so
the schedule is deterministic. Depends edges between nodes in different scopes are lifted to the
sibling ancestors that contain them. The resulting :class:`Step` tree is the only thing codegen sees.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import networkx as nx

from .graph import KernelGraph


class ScheduleError(Exception):
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


def _sibling_pair(kg: KernelGraph, a: int, b: int) -> Optional[tuple[int, int]]:
    """The ancestors of a and b (inclusive) that are siblings, or None if one contains the other."""
    chain_a = [a, *kg.ancestors(a)]
    chain_b = [b, *kg.ancestors(b)]
    pos_b = {n: i for i, n in enumerate(chain_b)}
    for i, n in enumerate(chain_a):
        if n in pos_b:
            j = pos_b[n]
            if i == 0 or j == 0:
                return None
            return chain_a[i - 1], chain_b[j - 1]
    return None


def sibling_order(kg: KernelGraph, scope: int) -> list[int]:
    """The children of ``scope`` in a deterministic order that respects every depends edge."""
    kids = kg.children(scope)
    dag = nx.DiGraph()
    dag.add_nodes_from(kids)
    kid_set = set(kids)
    for a, b in kg.depends_edges():
        pair = _sibling_pair(kg, a, b)
        if pair and pair[0] in kid_set and pair[0] != pair[1]:
            dag.add_edge(*pair, via=(a, b))
    try:
        return list(nx.lexicographical_topological_sort(dag))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(dag)
        names = " -> ".join(kg.describe(u) for u, _ in cycle) + f" -> {kg.describe(cycle[0][0])}"
        raise ScheduleError(f"depends edges form a cycle inside {kg.describe(scope)}: {names}; "
                            "remove one of these edges (a rule or builder call ordered them both ways)")


def schedule(kg: KernelGraph, scope: Optional[int] = None) -> Step:
    """Linearise the graph (or the subtree at ``scope``) into a :class:`Step` tree."""
    n = kg.root if scope is None else scope
    body = tuple(schedule(kg, c) for c in sibling_order(kg, n)) if kg.is_scope(n) else ()
    d = kg[n]
    return Step(n, d["op"], kg.attrs(n), dict(d.get("origin", {})), body)


def linear_order(kg: KernelGraph) -> list[int]:
    """Every node in program order (pre-order of the schedule)."""
    return [s.node for s in schedule(kg).walk()]


def print_program(step: Step, indent: int = 0) -> str:
    """A readable listing of the linear program (for debugging and tests)."""
    keys = {k: v for k, v in step.attrs.items() if k not in ("params", "symbols")}
    line = "  " * indent + f"{step.op} " + " ".join(f"{k}={_fmt(v)}" for k, v in keys.items())
    return "\n".join([line.rstrip()] + [print_program(s, indent + 1) for s in step.body])


def _fmt(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    return str(v)
