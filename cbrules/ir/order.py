"""Sibling order: the edge kinds of a kernel graph and the order among siblings they imply.

The graph stores no sibling lists; the ``depends`` edges order the children of a scope and ties
break by node id (creation order), so every reader (verifier, matcher, actions, scheduler) sees one
deterministic order. This module reads a graph only through ``children``, ``g`` and ``describe``,
so the graph, its verifier and the scheduler all import it and none imports another in a cycle.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Optional

import networkx as nx

from ..errors import CbrulesError

if TYPE_CHECKING:
    from .graph import KernelGraph

CONTAINS, DEPENDS = "contains", "depends"


class ScheduleError(CbrulesError):
    """The depends edges among some siblings form a cycle."""


def _edges(kg: KernelGraph):
    """(a, b, kind) of every edge, in networkx's order, read from the adjacency dicts (its edge
    views cost several times the lookups on a large graph)."""
    return ((a, b, d["kind"]) for a, nbrs in kg.g._succ.items() for b, d in nbrs.items())


def sibling_edges(kg: KernelGraph) -> dict[int, list[tuple[int, int, tuple[int, int]]]]:
    """Depends edges grouped by the scope whose children they order: scope -> [(a', b', (a, b))].

    An edge between nodes of different scopes is lifted to the sibling ancestors that hold them;
    an edge between a scope and its own descendant orders nothing and is dropped.
    """
    parent = {c: p for p, c, k in _edges(kg) if k == CONTAINS}

    def chain(n: int) -> list[int]:
        out = [n]
        while out[-1] in parent:
            out.append(parent[out[-1]])
        return out

    grouped: dict[int, list] = {}
    for a, b, k in _edges(kg):
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
    if edges is None:
        kept = kg.remembered_order(scope)
        if kept is not None:
            return list(kept)
    kids = kg.children(scope)
    pairs = None if edges is None else [(a, b) for a, b, _ in edges.get(scope, ()) if a != b]
    order = _smallest_first(*(_sibling_adjacency(kg, kids) if pairs is None else _adjacency(kids, pairs)))
    if order is None:
        if pairs is None:  # the edges in adjacency order, so that the cycle reported is always the same
            kid_set = set(kids)
            pairs = [(c, s) for c in kids for s, d in kg.g._succ[c].items() if d["kind"] == DEPENDS and s in kid_set]
        dag = nx.DiGraph()
        dag.add_nodes_from(kids)
        dag.add_edges_from(pairs)
        cycle = nx.find_cycle(dag)
        names = " -> ".join(kg.describe(u) for u, _ in cycle) + f" -> {kg.describe(cycle[0][0])}"
        raise ScheduleError(f"depends edges form a cycle inside {kg.describe(scope)}: {names}; "
                            "remove one of these edges (a rule or builder call ordered them both ways)")
    if edges is None:
        kg.remember_order(scope, order)
        return list(order)
    return order


def order_from(kg: KernelGraph, rest: list[int]) -> list[int]:
    """The sibling order of ``rest``, the siblings still to run once the others have: the sort
    over the edges among them alone. A node placed with the largest id, its predecessors before
    position p and its successors from p on, leaves the first p siblings of the order as they
    were (the smallest ready id is never the new node while an older one is ready, and the
    successors it holds back were not due before p), so the order after p is this one."""
    order = _smallest_first(*_sibling_adjacency(kg, rest))
    if order is None:
        raise ScheduleError(f"depends edges form a cycle among {', '.join(kg.describe(n) for n in rest[:5])} ...")
    return order


def sibling_pairs(kg: KernelGraph, kids: list[int]) -> list[tuple[int, int]]:
    """The depends edges among ``kids`` (siblings), read from their predecessors: a scope's
    successors include everything it contains, its predecessors only its parent and siblings."""
    kid_set = set(kids)
    return [(p, c) for c in kids for p, d in kg.g._pred[c].items() if d["kind"] == DEPENDS and p in kid_set]


def _sibling_adjacency(kg: KernelGraph, kids: list[int]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """For each of ``kids`` the number of siblings it waits for, and the siblings waiting for it
    (read from predecessors, as in :func:`sibling_pairs`; a DiGraph holds each edge once)."""
    kid_set, pred = set(kids), kg.g._pred
    waiting: dict[int, int] = {}
    after: dict[int, list[int]] = {}
    for c in kids:
        k = 0
        for p, d in pred[c].items():
            if p in kid_set and d["kind"] == DEPENDS:
                k += 1
                if p in after:
                    after[p].append(c)
                else:
                    after[p] = [c]
        waiting[c] = k
    return waiting, after


def _adjacency(nodes: list[int], pairs: list[tuple[int, int]]) -> tuple[dict[int, int], dict[int, list[int]]]:
    waiting = dict.fromkeys(nodes, 0)
    after: dict[int, list[int]] = {}
    for a, b in set(pairs):
        waiting.setdefault(a, 0)
        waiting[b] = waiting.get(b, 0) + 1
        after.setdefault(a, []).append(b)
    return waiting, after


def _smallest_first(waiting: dict[int, int], after: dict[int, list[int]]) -> Optional[list[int]]:
    """Topological order taking the smallest ready id first (the lexicographic topological sort)
    of nodes that wait for ``waiting[n]`` others and release ``after[n]``; None when they form a
    cycle. Plain dicts and a heap: the scheduler, the verifier and every placement ask for it,
    and a networkx DiGraph per call cost several times the sort itself. ``waiting`` is used up."""
    ready = [n for n, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    out = []
    pop, push = heapq.heappop, heapq.heappush
    while ready:
        n = pop(ready)
        out.append(n)
        for m in after.get(n, ()):
            waiting[m] -= 1
            if not waiting[m]:
                push(ready, m)
    return out if len(out) == len(waiting) else None


def linear_order(kg: KernelGraph, edges: Optional[dict] = None) -> list[int]:
    """Every node in program order: the root, then each scope's children in sibling order, depth
    first (``edges``: :func:`sibling_edges` of ``kg``, when the caller has them)."""
    edges, out, todo = sibling_edges(kg) if edges is None else edges, [], [kg.root]
    while todo:  # an explicit stack: nesting depth is bounded by the graph, not by Python's recursion limit
        n = todo.pop()
        out.append(n)
        if kg.is_scope(n):
            todo.extend(reversed(sibling_order(kg, n, edges)))
    return out
