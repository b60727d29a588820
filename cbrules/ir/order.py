"""Sibling order: the edge kinds of a kernel graph and the order among siblings they imply.

The graph stores no sibling lists; the ``depends`` edges order the children of a scope and ties
break by node id (creation order), so every reader (verifier, matcher, actions, scheduler) sees one
deterministic order. This module reads a graph only through ``children``, ``g`` and ``describe``,
so the graph, its verifier and the scheduler all import it and none imports another in a cycle.
"""
from __future__ import annotations

import bisect
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
            return list(kept.seq)
    kids = kg.children(scope)
    pairs = None if edges is None else [(a, b) for a, b, _ in edges.get(scope, ()) if a != b]
    alone: list[int] = []
    waiting, after = _sibling_adjacency(kg, kids) if pairs is None else _adjacency(kids, pairs)
    if edges is None:
        sources, sinks = {c for c, k in waiting.items() if not k}, {c for c in kids if c not in after}
    order = _smallest_first(waiting, after, alone)
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
        kg.remember_order(scope, KeptOrder(order, alone, sources, sinks))
        return list(order)
    return order


def order_among(kids: list[int], pairs: list[tuple[int, int]]) -> Optional[list[int]]:
    """``kids`` (in id order) in the order :func:`sibling_order` gives them when ``pairs`` are the
    depends edges among them; None when those form a cycle (:func:`sibling_order` names it)."""
    return _smallest_first(*_adjacency(kids, [(a, b) for a, b in pairs if a != b]))


def kept_order(kg: KernelGraph, scope: int) -> Optional["KeptOrder"]:
    """The kept sibling order of ``scope`` (sorted now when not kept), or None when the graph
    keeps no derived facts (see ``KernelGraph.keep_derived``)."""
    if kg.remembered_order(scope) is None:
        sibling_order(kg, scope)
    return kg.remembered_order(scope)


class KeptOrder:
    """A scope's sibling order kept while the graph changes, so that a new node joins it without
    sorting the scope again (the order stays the one :func:`sibling_order` sorts).

    ``seq``: the children in order; ``key``: a label per child that compares as its position does,
    spaced so that an insertion relabels nothing until a gap is used up; ``alone``: the children,
    in order, that were the only ready sibling when the sort took them; ``sources`` / ``sinks``:
    the children no sibling precedes / follows. The sort takes a new node (the largest id) only
    when nothing else is ready; so one whose first successor ``s`` is such a child, with every
    predecessor before ``s`` and every other successor after it, goes right before ``s`` and moves
    nothing else (:meth:`join`; anything else is sorted again)."""

    __slots__ = ("seq", "key", "alone", "top", "sources", "sinks")
    GAP = 1 << 20

    def __init__(self, seq: list[int], alone: list[int], sources: set[int], sinks: set[int]):
        self.seq, self.alone, self.top = seq, alone, max(seq, default=-1)
        self.sources, self.sinks = sources, sinks
        self.key = dict(zip(seq, range(0, self.GAP * len(seq), self.GAP)))

    def copy(self) -> "KeptOrder":
        new = KeptOrder.__new__(KeptOrder)
        new.seq, new.key, new.alone, new.top = list(self.seq), dict(self.key), list(self.alone), self.top
        new.sources, new.sinks = set(self.sources), set(self.sinks)
        return new

    def index(self, n: int) -> int:
        """The position of child ``n`` (a bisection over the labels)."""
        return bisect.bisect_left(self.seq, self.key[n], key=self.key.__getitem__)

    # as a mapping child -> position, read only for the children asked about
    __getitem__ = index

    def __contains__(self, n: int) -> bool:
        return n in self.key

    def preds(self, kg: KernelGraph, n: int) -> list[int]:
        """The children in this order that ``n`` waits for."""
        return [p for p, d in kg.g._pred[n].items() if d["kind"] == DEPENDS and p in self.key]

    def succs(self, kg: KernelGraph, n: int) -> list[int]:
        """The children in this order that wait for ``n``."""
        return [s for s, d in kg.g._succ[n].items() if d["kind"] == DEPENDS and s in self.key]

    def _is_alone(self, n: int) -> bool:
        i = bisect.bisect_left(self.alone, self.key[n], key=self.key.__getitem__)
        return i < len(self.alone) and self.alone[i] == n

    def join(self, n: int, at: int, preds: list[int], succs: list[int], anchor_preds: list[int]) -> bool:
        """Put new node ``n`` (``preds`` / ``succs``: its siblings before / after it) at position
        ``at`` when that is where the sort puts it and nothing else moves; False (and nothing
        changed) otherwise. ``anchor_preds``: the other predecessors of the child at ``at``."""
        seq, key = self.seq, self.key
        if n < self.top:  # the argument needs the largest id among the siblings
            return False
        head = seq[at] if at < len(seq) else None
        last_pred = max(preds, key=key.__getitem__) if preds else None
        if head is None:
            if succs:
                return False
        elif (head not in succs or any(key[s] < key[head] for s in succs) or not self._is_alone(head)
              or last_pred is not None and key[last_pred] > key[head]):
            return False
        # n waits beside the sibling taken at each step from the one after its last predecessor
        # until the one after the head's (from there the head, now blocked, waited instead); were
        # the head ready first, a step where it alone waited might now be alone: sort again
        until = max(anchor_preds, key=key.__getitem__) if anchor_preds else None
        if head is not None and last_pred is not None and (until is None or key[until] < key[last_pred]):
            return False
        if head is None or until is not None and (last_pred is None or key[until] > key[last_pred]):
            self._not_alone_after(last_pred, until)
        self._insert(n, at, preds, succs)
        return True

    def place(self, kg: KernelGraph, n: int, where: str, at: int, anchor_preds: list[int]) -> bool:
        """Put new node ``n`` (its ordering edges already in ``kg``) into the order: first (``where``
        "entry": it precedes every source), last ("exit": it follows every sink), or at position
        ``at`` when :meth:`join` can take it there. False when the scope must be sorted again."""
        mine = self.preds(kg, n), self.succs(kg, n)
        if where == "entry":
            self.first(n, *mine)
        elif where == "exit":
            self.last(n, *mine)
        else:
            return self.join(n, at, *mine, anchor_preds)
        return True

    def first(self, n: int, preds: list[int], succs: list[int]) -> None:
        """Put new node ``n``, which precedes every other source, first."""
        self._insert(n, 0, preds, succs)

    def last(self, n: int, preds: list[int], succs: list[int]) -> None:
        """Put new node ``n``, which follows every other sink, last."""
        self._insert(n, len(self.seq), preds, succs)

    def _insert(self, n: int, at: int, preds: list[int], succs: list[int]) -> None:
        self.sources.difference_update(succs)
        self.sinks.difference_update(preds)
        if not preds:
            self.sources.add(n)
        if not succs:
            self.sinks.add(n)
        seq, key = self.seq, self.key
        lo = key[seq[at - 1]] if at else (key[seq[0]] if seq else 0) - 2 * self.GAP
        hi = key[seq[at]] if at < len(seq) else lo + 2 * self.GAP
        if hi - lo < 2:  # the gap is used up: space every label again (same order)
            self.key = key = dict(zip(seq, range(0, self.GAP * len(seq), self.GAP)))
            lo = key[seq[at - 1]] if at else -2 * self.GAP
            hi = key[seq[at]] if at < len(seq) else lo + 2 * self.GAP
        key[n] = (lo + hi) // 2
        seq.insert(at, n)
        self.top = max(self.top, n)
        # n is the only ready sibling at its step: the others there wait for it or were taken
        self.alone.insert(bisect.bisect_left(self.alone, key[n], key=key.__getitem__), n)

    def _not_alone_after(self, first: Optional[int], last: Optional[int]) -> None:
        """The children after ``first`` up to ``last`` (None: from the start / to the end) now
        wait beside another ready sibling."""
        alone, key = self.alone, self.key.__getitem__
        lo = 0 if first is None else bisect.bisect_right(alone, self.key[first], key=key)
        hi = len(alone) if last is None else bisect.bisect_right(alone, self.key[last], key=key)
        del alone[lo:hi]


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
