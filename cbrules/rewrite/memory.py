"""What the rule engine remembers between applications: facts about the graph it lowers, kept instead
of read again, and which rules may have new matches where.

The engine lowers a private copy of the user's graph (:func:`cbrules.rewrite.engine.lower`). A
:class:`Memory` wraps that copy: every change an application makes goes through it (new nodes,
removed nodes, depends edges) or is told to it (:meth:`Memory.touch`, :meth:`Memory.joined`), so that
what it keeps stays what reading the graph afresh gives:

* each node's effects (a scope's with everything inside it), and each node's own effects by the
  attribute values they are read from;
* each scope's sibling order (:class:`KeptOrder`), which a new node joins without a sort;
* each scope's children by the resources they use (:class:`ScopeResources`);
* the nodes of each op;
* the touch log (:class:`TouchLog`): the nodes each application changed, or changed a node inside.

:class:`RuleNews` keeps which rules may have new matches, and at which nodes (what the engine's
incremental and anchored matching read, :mod:`cbrules.rewrite.anchors`).

Placing a node asks for the order and the effects of every sibling: without the memory a scope of
k children holding m nodes costs O(m + k log k) per placement. Off (``remember=False``, the switch
:data:`cbrules.rewrite.engine.REMEMBER`) nothing is kept and every question reads the graph afresh:
the same answers, so the same lowering (``tests/test_engine_memory.py``). The graph
(:class:`cbrules.ir.graph.KernelGraph`) keeps none of this: a user's graph, a trace's and a copy need
no memory, and the lowered graph is handed back without one.
"""
from __future__ import annotations

import bisect
import itertools
from typing import AbstractSet, Callable, Container, Iterable, Optional

from ..ir.graph import KernelGraph
from ..ir.ops import EFFECT_KEYS, SCOPES, effects
from ..ir.order import sibling_order, sibling_sort

Effects = tuple[frozenset, frozenset]  # (reads, writes)
_ABSENT_KEYS = itertools.repeat(object())  # the value map(d.get, keys, ...) gives for a key d lacks


class Memory:
    """The engine's private copy of a graph, ``kg``, and what the engine remembers about it.

    Only for a graph whose every change goes through :meth:`add`, :meth:`copy_node`,
    :meth:`remove_nodes`, :meth:`add_depends`, :meth:`remove_depends` and :meth:`order_by_effects`,
    or is followed by :meth:`touch` or :meth:`joined` (the actions of :mod:`cbrules.rewrite.actions`
    do so); a change made otherwise (egglog's simplification of the terms) comes after the last
    question."""

    def __init__(self, kg: KernelGraph, remember: bool = True):
        self.kg = kg
        self.remember = remember
        # node -> (reads, writes) with everything inside it, until a touch drops it
        self._effects: Optional[dict[int, Effects]] = {} if remember else None
        # node -> (the attribute values effects() reads, reads, writes): attribute values are never
        # changed in place (see KernelGraph.copy), so the same objects mean the same effects
        self._own: Optional[dict[int, tuple]] = {} if remember else None
        self._orders: Optional[dict[int, KeptOrder]] = {} if remember else None
        self._resources: Optional[dict[int, ScopeResources]] = {} if remember else None
        self._ops: Optional[dict[str, list[int]]] = None  # op -> its nodes in id order, built on first use
        self._ops_gone: set[str] = set()  # the ops whose lists may still hold removed nodes
        self.log: Optional[TouchLog] = TouchLog(0) if remember else None

    def moved_to(self, kg: KernelGraph) -> None:
        """The private copy is now ``kg``, a copy of the one before with nothing changed (debug mode
        keeps each step's graph in the trace and works on a copy): the same nodes, the same facts."""
        self.kg = kg

    def at_step(self, step: int) -> None:
        """The changes from now on are application ``step``'s: the touch log marks them with it."""
        if self.log is not None:
            self.log.step = step

    # ------------------------------------------------------------------ changes
    def add(self, op: str, parent: Optional[int], origin: dict, **attrs) -> int:
        """:meth:`KernelGraph.add`, remembered: a new node in ``parent`` (None: in no scope yet)."""
        n = self.kg.add(op, parent, origin=origin, **attrs)
        self._created(n)
        if parent is not None:
            self.touch(parent)
            self.touch(n)
        return n

    def copy_node(self, src: int, origin: dict, changed: Optional[dict] = None) -> int:
        """:meth:`KernelGraph.copy_node`, remembered. With nothing changed the copy has ``src``'s own
        effects, kept instead of read from its terms again (a clone copies every node of a loop)."""
        n = self.kg.copy_node(src, origin, changed)
        self._created(n)
        own = self._own
        if own is not None and not changed:
            seen = own.get(src)
            if seen is not None:  # the same values under every key effects() reads: the same effects
                own[n] = seen
        return n

    def _created(self, n: int) -> None:
        if self._ops is not None:  # the largest id: the list stays in id order
            self._ops.setdefault(self.kg.op(n), []).append(n)
        if self.log is not None:
            self.log.mark(n)

    def remove_nodes(self, nodes: list[int]) -> None:
        """:meth:`KernelGraph.remove_nodes`, remembered (the caller touched their scope)."""
        if self._ops is not None:
            op = self.kg.op
            self._ops_gone.update(op(n) for n in nodes)
        self.kg.remove_nodes(nodes)

    def add_depends(self, a: int, b: int, scope: Optional[int] = None) -> None:
        """Order sibling ``a`` before ``b`` (``scope``: their scope, when the caller knows it)."""
        self.kg.add_depends(a, b)
        if self._orders or self.log is not None:
            self._reordered(self.kg.parent(a) if scope is None else scope)

    def remove_depends(self, a: int, b: int) -> None:
        self.kg.remove_depends(a, b)
        if self._orders or self.log is not None:
            self._reordered(self.kg.parent(a))

    def order_by_effects(self, seq: list[int]) -> None:
        """:meth:`KernelGraph.order_by_effects` with the kept effects, remembered."""
        if self.kg.order_by_effects(seq, self.effects) and (self._orders or self.log is not None):
            self._reordered(self.kg.parent(seq[0]))

    def _reordered(self, scope: Optional[int]) -> None:
        """The depends edges among ``scope``'s children changed: its kept order goes, and the
        touch log marks it and its scopes (up to one this step marked already: those above it are)."""
        if self._orders:
            self._orders.pop(scope, None)
        log = self.log
        if log is not None:
            parent = self.kg.parent
            while scope is not None and not log.marked_now(scope):
                log.mark(scope)
                scope = parent(scope)

    def touch(self, n: int) -> None:
        """``n`` changed (its attributes, its children, the depends edges among them, or it joins or
        is about to leave its scope): the kept effects of ``n`` and its scopes and the sibling order
        of ``n``'s children go, each scope's resource index reads the child that holds ``n`` again,
        and the touch log marks ``n`` and its scopes."""
        if self._orders:
            self._orders.pop(n, None)
        kept, index, log = self._effects, self._resources, self.log
        if not kept and not index and log is None:
            return
        parent = self.kg.parent
        while n is not None:
            if log is not None:
                log.mark(n)
            if kept:
                kept.pop(n, None)
            p = parent(n)
            if index and p in index:
                index[p].stale.add(n)
            n = p

    def joined(self, n: int) -> None:
        """``n`` (with what it holds) was just put into its scope, and nothing inside it changed after
        its effects were last read: what :meth:`touch` of ``n`` and of the scope does, except that
        the kept effects of the scopes around ``n``, and the resource indexes that list those
        scopes, grow by ``n``'s effects instead of being read again (a scope's effects are the union
        of what it holds: adding a node adds exactly its own)."""
        if self._orders:
            self._orders.pop(n, None)
        kept, index, log = self._effects, self._resources, self.log
        if not kept and not index and log is None:
            return
        reads, writes = self.effects(n)
        parent = self.kg.parent
        if self._orders:
            self._orders.pop(parent(n), None)
        x = n
        while x is not None:
            if log is not None:
                log.mark(x)
            p = parent(x)
            if x != n and kept:
                had = kept.get(x)
                if had is not None:
                    kept[x] = (had[0] | reads, had[1] | writes)
            if index and p in index:
                index[p].grow(x, reads, writes, new=x == n)
            x = p

    # ------------------------------------------------------------------ questions
    def effects(self, n: int) -> tuple[AbstractSet[str], AbstractSet[str]]:
        """Reads and writes of a node, including everything inside it when it is a scope, as
        :meth:`KernelGraph.effects` reads them (callers must not change the sets)."""
        kept = self._effects
        if kept is None:
            return self.kg.effects(n)
        got = kept.get(n)
        if got is not None:
            return got
        kg = self.kg
        r, w = self._own_effects(n)
        if kg.op(n) not in SCOPES:
            got = kept[n] = (frozenset(r), frozenset(w))
            return got
        reads, writes = set(r), set(w)
        stack = [n]
        while stack:  # a union: order does not matter; a kept inner scope is not walked again
            for c in kg.children(stack.pop()):
                got = kept.get(c)
                if got is not None:
                    r, w = got
                else:
                    r, w = self._own_effects(c)
                    if kg.op(c) in SCOPES:
                        stack.append(c)
                    else:  # a leaf's are its own: kept until touch() drops them
                        kept[c] = (r, w)
                reads |= r
                writes |= w
        got = kept[n] = (frozenset(reads), frozenset(writes))
        return got

    def _own_effects(self, n: int) -> Effects:
        """One node's own effects, kept by the attribute values they are read from: placing a node
        asks for the effects of every sibling, so a scope of k children costs O(k) per placement,
        not O(k) times the term walks."""
        d = self.kg[n]
        seen = self._own.get(n)
        items = tuple(map(d.get, EFFECT_KEYS[d["op"]], _ABSENT_KEYS))  # absent keys told apart
        if seen is not None and seen[0] == items:  # compared in C, the same objects at once
            return seen[1], seen[2]
        r, w = effects(d["op"], d)
        self._own[n] = (items, r, w)
        return r, w

    def by_op(self) -> dict[str, list[int]]:
        """:meth:`KernelGraph.by_op` from the kept index (a lowering asks once per batch of applications)."""
        if not self.remember:
            return self.kg.by_op()
        if self._ops is None:
            self._ops = self.kg.by_op()
        if self._ops_gone:
            kg = self.kg
            for op in self._ops_gone:
                self._ops[op] = [n for n in self._ops.get(op, ()) if n in kg]
            self._ops_gone.clear()
        return {op: list(ids) for op, ids in self._ops.items() if ids}

    def sibling_order(self, scope: int) -> list[int]:
        """:func:`cbrules.ir.order.sibling_order` of ``scope``, kept until its children's order changes."""
        kept = self.kept_order(scope)
        return sibling_order(self.kg, scope) if kept is None else list(kept.seq)

    def kept_order(self, scope: int) -> Optional[KeptOrder]:
        """The kept sibling order of ``scope`` (sorted now when not kept); None when nothing is kept."""
        orders = self._orders
        if orders is None:
            return None
        kept = orders.get(scope)
        if kept is None:
            kept = orders[scope] = KeptOrder(*sibling_sort(self.kg, scope))
        return kept

    def remember_order(self, scope: int, order: KeptOrder) -> None:
        """``order`` is ``scope``'s sibling order again (a node joined it in place)."""
        if self._orders is not None:
            self._orders[scope] = order

    def sibling_resources(self, scope: int) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
        """Each resource the children of ``scope`` read or write -> those children, and each one
        they write -> the writers (kept, and updated for the children touched since)."""
        index = self._resources
        entry = None if index is None else index.get(scope)
        kg = self.kg
        if entry is None:
            entry = ScopeResources(kg.children(scope))
            if index is not None:
                index[scope] = entry
        return entry.refresh(lambda c: self.effects(c) if c in kg and kg.parent(c) == scope else None)

    def touched_since(self, step: int) -> list[int]:
        """The nodes of the graph the touch log marked after ``step``, in no particular order."""
        return [] if self.log is None else self.log.since(step, self.kg)

    def touched_at(self, step: int) -> list[int]:
        """The nodes the touch log marked with ``step`` (removed ones too), in no particular order."""
        return [] if self.log is None else self.log.at(step)


class RuleNews:
    """Which rules may have new matches, and where, as the applications so far tell it.

    ``quiet``: rule -> the step at which it last found nothing new to fire; ``known``: rule -> the
    step at which its every match was last known (found, or all fired already); ``touched``: op -> the
    last step that touched one of its nodes. Per node of an op some rule anchors on (``anchor_ops``),
    the step and the touched ops of each application that changed it or a node inside it: an anchored
    rule's matches at such a node read only the nodes inside it of the ops the rule watches
    (:func:`cbrules.rewrite.plan.watched_ops`), so the engine looks again at a changed node only when
    an application changed a node of one of those ops there. And the whole-graph searches' attribute
    tables, kept while no application touches a node of their op. Off (``remember=False``) every rule
    may always have news and no table is kept."""

    def __init__(self, anchor_ops: frozenset, remember: bool = True):
        self.remember = remember
        self.anchor_ops = anchor_ops
        self.quiet: dict[str, int] = {}
        self.known: dict[str, int] = {}
        self.touched: dict[str, int] = {}
        self._at: dict[int, list[tuple[int, frozenset]]] = {}  # node -> (step, touched ops) of each change
        self._tables: dict[tuple, Optional[dict]] = {}  # (op, path) -> the attribute index's table
        self._tables_step = 0

    def applied(self, memory: Memory, step: int, ops: Iterable[str]) -> None:
        """Application ``step`` touched nodes of ``ops`` (as
        :meth:`cbrules.rewrite.actions.Rewriter.touched_ops` gives them): note it per op, and on each
        node of an anchored op the touch log marked with ``step``."""
        ops = frozenset(ops)
        self.touched.update(dict.fromkeys(ops, step))
        if not self.anchor_ops:
            return
        kg, anchored = memory.kg, self.anchor_ops
        for n in memory.touched_at(step):  # an erased node too: a match bound to it is gone
            if n not in kg or kg.op(n) in anchored:
                self._at.setdefault(n, []).append((step, ops))

    def may_have_news(self, rule) -> bool:
        """Whether ``rule`` (a :class:`cbrules.rewrite.rulefile.GraphRule`) may match something it
        has not fired on: it never looked, or a node of an op it watches changed since it last found
        nothing new."""
        since = self.quiet.get(rule.name) if self.remember else None
        if since is None:
            return True
        ops = rule.watched
        return ops is None or any(self.touched.get(op, -1) > since for op in ops)

    def ops_touched_since(self, ops: Iterable[str], since: int) -> set[str]:
        """Those of ``ops`` an application touched a node of after step ``since``."""
        return {op for op in ops if self.touched.get(op, -1) > since}

    def changed(self, n: int, since: int, watched: Optional[frozenset]) -> bool:
        """Whether an application after step ``since`` changed node ``n`` (of an anchored op) or a
        node inside it of an op in ``watched`` (None: of any op)."""
        for step, touched in reversed(self._at.get(n, ())):
            if step <= since:
                return False
            if watched is None or not watched.isdisjoint(touched):
                return True
        return False

    def kept_tables(self, step: int) -> dict:
        """The attribute index's tables still true of the graph at ``step``: those of ops no
        application has touched since the last batch asked (a batch's whole-graph searches index the
        same few ops). The matcher fills it in place."""
        if not self.remember:
            return {}
        since, self._tables_step = self._tables_step, step
        for key in [key for key in self._tables if self.touched.get(key[0], -1) > since]:
            del self._tables[key]
        return self._tables


class TouchLog:
    """Each node marked with the last step that changed it or a node inside it, and a trail of the
    marks in step order, so that the engine can ask what changed since a step (the anchored rules
    match again only there). Marks are made at the current ``step``; :meth:`since` and :meth:`at`
    read them back."""

    __slots__ = ("last", "trail", "step")

    def __init__(self, step: int):
        self.last: dict[int, int] = {}  # node -> the last step that marked it
        self.trail: list[tuple[int, int]] = []  # (step, node) for each new mark, in step order
        self.step = step

    def mark(self, n: int) -> None:
        if self.last.get(n) != self.step:
            self.last[n] = self.step
            self.trail.append((self.step, n))

    def marked_now(self, n: int) -> bool:
        """Whether ``n`` was marked at the current step."""
        return self.last.get(n) == self.step

    def since(self, step: int, present: Container[int]) -> list[int]:
        """The nodes of ``present`` marked after ``step``, in no particular order."""
        first = bisect.bisect_right(self.trail, step, key=lambda mark: mark[0])
        return list({n for _, n in self.trail[first:] if n in present})

    def at(self, step: int) -> list[int]:
        """The nodes marked with ``step`` (removed ones too), in no particular order."""
        trail = self.trail
        i = len(trail)
        while i and trail[i - 1][0] >= step:  # the last step's marks end the trail
            i -= 1
        return [n for st, n in trail[i:] if st == step]


class ScopeResources:
    """A scope's children by the resources they read or write (registers, buffers, the sync token),
    kept while the graph changes, so that placing a node reads only the siblings that share its
    resources (:func:`cbrules.ir.ops.nearest_conflicts_among`).

    ``users``: resource -> the children that read or write it; ``writers``: resource -> those that
    write it; ``seen``: child -> the effects the index lists it with; ``stale``: the children to read
    again (changed since, or new)."""

    __slots__ = ("users", "writers", "seen", "stale")

    def __init__(self, children: Iterable[int]):
        self.users: dict[str, set[int]] = {}
        self.writers: dict[str, set[int]] = {}
        self.seen: dict[int, Effects] = {}
        self.stale: set[int] = set(children)

    def refresh(self, now_of: Callable[[int], Optional[Effects]]) -> tuple[dict, dict]:
        """Read the stale children again (``now_of``: a child's effects, None when it is no longer a
        child) and return (users, writers)."""
        users, writers, seen = self.users, self.writers, self.seen
        for c in self.stale:
            old = seen.pop(c, None)
            now = now_of(c)
            if now is not None and now == old:  # most changes inside a child leave its effects as they were
                seen[c] = now
                continue
            if old is not None:
                for r in old[0] | old[1]:
                    users[r].discard(c)
                for r in old[1]:
                    writers[r].discard(c)
            if now is not None:
                seen[c] = reads, writes = now
                for r in reads | writes:
                    users.setdefault(r, set()).add(c)
                for r in writes:
                    writers.setdefault(r, set()).add(c)
        self.stale.clear()
        return users, writers

    def grow(self, child: int, reads: frozenset, writes: frozenset, new: bool) -> None:
        """``child`` now also reads ``reads`` and writes ``writes`` (a node joined it, or ``new``: it
        joined the scope itself): list it for them now, or read it again later if it is stale or was
        never read."""
        old = self.seen.get(child)
        if new and old is None and child not in self.stale:  # new to the index: listed now, not read again
            old = self.seen[child] = (frozenset(), frozenset())
        if child in self.stale or old is None:
            self.stale.add(child)
            return
        for r in (reads | writes) - old[0] - old[1]:
            self.users.setdefault(r, set()).add(child)
        for r in writes - old[1]:
            self.writers.setdefault(r, set()).add(child)
        self.seen[child] = (old[0] | reads, old[1] | writes)


class KeptOrder:
    """A scope's sibling order kept while the graph changes, so that a new node joins it without
    sorting the scope again (the order stays the one :func:`cbrules.ir.order.sibling_order` sorts).

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

    def index(self, n: int) -> int:
        """The position of child ``n`` (a bisection over the labels)."""
        return bisect.bisect_left(self.seq, self.key[n], key=self.key.__getitem__)

    # as a mapping child -> position, read only for the children asked about
    __getitem__ = index

    def __contains__(self, n: int) -> bool:
        return n in self.key

    def preds(self, kg: KernelGraph, n: int) -> list[int]:
        """The children in this order that ``n`` waits for."""
        key = self.key
        return [p for p in kg.predecessors(n) if p in key]

    def succs(self, kg: KernelGraph, n: int) -> list[int]:
        """The children in this order that wait for ``n``."""
        key = self.key
        return [s for s in kg.successors(n) if s in key]

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
