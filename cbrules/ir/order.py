"""Sibling order: the edge kinds of a kernel graph and the order among siblings they imply.

The graph stores no sibling lists; the ``depends`` edges order the children of a scope and ties
break by node id (creation order), so every reader (verifier, matcher, actions, scheduler) sees one
deterministic order. This module reads a graph only through ``children``, ``g`` and ``describe``,
so the graph, its verifier and the scheduler all import it and none imports another in a cycle.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Optional

import networkx as nx

from ..errors import CbrulesError

if TYPE_CHECKING:
    from .graph import KernelGraph

CONTAINS, DEPENDS = "contains", "depends"


class _EdgeData(dict):
    """The data of every edge of one kind: one shared dict, not one per edge (a lowered kernel has
    hundreds of thousands). Read only: an edge changes kind by getting the other kind's."""

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("an edge's data is shared by every edge of its kind: give the edge another, do not change it")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _read_only  # type: ignore[assignment]


EDGE_DATA = {CONTAINS: _EdgeData(kind=CONTAINS), DEPENDS: _EdgeData(kind=DEPENDS)}


class ScheduleError(CbrulesError):
    """The depends edges among some siblings form a cycle."""


def sibling_edges(kg: KernelGraph) -> dict[int, list[tuple[int, int, tuple[int, int]]]]:
    """Depends edges grouped by the scope whose children they order: scope -> [(a', b', (a, b))].

    An edge between nodes of different scopes is lifted to the sibling ancestors that hold them;
    an edge between a scope and its own descendant orders nothing and is dropped.
    """
    parent = {c: p for p, c, k in kg.edges() if k == CONTAINS}

    def chain(n: int) -> list[int]:
        out = [n]
        while out[-1] in parent:
            out.append(parent[out[-1]])
        return out

    grouped: dict[int, list] = {}
    for a, b, k in kg.edges():
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
        return sibling_sort(kg, scope)[0]
    kids = kg.children(scope)
    pairs = [(a, b) for a, b, _ in edges.get(scope, ()) if a != b]
    order = _smallest_first(*_adjacency(kids, pairs))
    if order is None:
        raise _cycle_error(kg, scope, kids, pairs)
    return order


def sibling_sort(kg: KernelGraph, scope: int) -> tuple[list[int], list[int], set[int], set[int]]:
    """:func:`sibling_order` of ``scope`` by the edges among its children, with what the sort saw on
    the way: (the order, the children taken while no other was ready, the children no sibling
    precedes, those no sibling follows). The rewrite engine keeps them to place a new node without
    sorting again (:class:`cbrules.rewrite.memory.KeptOrder`)."""
    kids = kg.children(scope)
    alone: list[int] = []
    waiting, after = _sibling_adjacency(kg, kids)
    sources, sinks = {c for c, k in waiting.items() if not k}, {c for c in kids if c not in after}
    order = _smallest_first(waiting, after, alone)
    if order is None:
        raise _cycle_error(kg, scope, kids, None)
    return order, alone, sources, sinks


def _cycle_error(kg: KernelGraph, scope: int, kids: list[int], pairs: Optional[list[tuple[int, int]]]) -> ScheduleError:
    """The cycle among ``scope``'s children (``pairs``: the edges sorted, None: those among ``kids``)."""
    if pairs is None:  # the edges in adjacency order, so that the cycle reported is always the same
        kid_set = set(kids)
        pairs = [(c, s) for c in kids for s in kg.successors(c) if s in kid_set]
    dag = nx.DiGraph()
    dag.add_nodes_from(kids)
    dag.add_edges_from(pairs)
    cycle = nx.find_cycle(dag)
    names = " -> ".join(kg.describe(u) for u, _ in cycle) + f" -> {kg.describe(cycle[0][0])}"
    return ScheduleError(f"depends edges form a cycle inside {kg.describe(scope)}: {names}; "
                         "remove one of these edges (a rule or builder call ordered them both ways)")


def order_among(kids: list[int], pairs: list[tuple[int, int]]) -> Optional[list[int]]:
    """``kids`` (in id order) in the order :func:`sibling_order` gives them when ``pairs`` are the
    depends edges among them; None when those form a cycle (:func:`sibling_order` names it)."""
    return _smallest_first(*_adjacency(kids, [(a, b) for a, b in pairs if a != b]))


def sibling_pairs(kg: KernelGraph, kids: list[int]) -> list[tuple[int, int]]:
    """The depends edges among ``kids`` (siblings), read from their predecessors: a scope's
    successors include everything it contains, its predecessors only its parent and siblings."""
    kid_set = set(kids)
    return [(p, c) for c in kids for p in kg.predecessors(c) if p in kid_set]


def _sibling_adjacency(kg: KernelGraph, kids: list[int]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """For each of ``kids`` the number of siblings it waits for, and the siblings waiting for it
    (read from predecessors, as in :func:`sibling_pairs`; a DiGraph holds each edge once)."""
    kid_set, predecessors = set(kids), kg.predecessors
    waiting: dict[int, int] = {}
    after: dict[int, list[int]] = {}
    for c in kids:
        k = 0
        for p in predecessors(c):
            if p in kid_set:
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


def _smallest_first(waiting: dict[int, int], after: dict[int, list[int]],
                    alone: Optional[list[int]] = None) -> Optional[list[int]]:
    """Topological order taking the smallest ready id first (the lexicographic topological sort)
    of nodes that wait for ``waiting[n]`` others and release ``after[n]``; None when they form a
    cycle. ``alone`` (when given) collects, in order, the nodes taken while no other was ready.
    Plain dicts and a heap: the scheduler, the verifier and every scope not kept ask for it, and a
    networkx DiGraph per call cost several times the sort itself. ``waiting`` is used up."""
    ready = [n for n, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    out = []
    pop, push = heapq.heappop, heapq.heappush
    while ready:
        n = pop(ready)
        out.append(n)
        if alone is not None and not ready:
            alone.append(n)
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
