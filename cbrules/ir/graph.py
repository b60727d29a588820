"""The kernel graph: a networkx DiGraph of scope, memory, compute and synchronisation nodes.

Edges are of two kinds: ``contains`` (scope -> child) and ``depends`` (a must run before b; always
between siblings). Sibling order is not stored as a list: :mod:`cbrules.ir.order` derives it
from the depends edges. Every node carries ``op``, its attributes (see :mod:`cbrules.ir.ops`) and ``origin``,
a record of who created it (the builder call site, or a rule and step) and from which node it was
cloned, so that debug queries can trace any node back to the kernel the user built.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Optional

import networkx as nx

from .names import BUILTINS  # noqa: F401  (the CUDA builtins a term may name; public here too)
from .ops import EFFECT_KEYS, OPS, SCOPES, DependenceTracker, effects
from .order import CONTAINS, DEPENDS, EDGE_DATA, KeptOrder
from .terms import const
from .resources import ScopeResources
from .touch_log import TouchLog


@dataclass(frozen=True)
class Param:
    """A kernel parameter: a global ``tensor``, a TMA ``tmap`` over a tensor, or an int ``symbol``.

    Shapes and boxes are outermost-first (numpy order); ``shape`` holds terms over symbols.
    ``written`` marks tensors the kernel stores to (the launcher copies those back).
    """

    name: str
    kind: str  # tensor | tmap | symbol
    dtype: str = "int32"
    shape: tuple = ()
    tensor: Optional[str] = None
    box: tuple = ()
    written: bool = False
    swizzle: str = "none"  # tmap: the shared-memory layout TMA writes (none, 32B, 64B, 128B)
    finite: bool = True  # a float symbol (k.scalar): the launcher refuses infinities and NaN
    split: tuple = ()  # tmap: (dimension, inner extent) pairs its view splits (cbrules.ir.tma_view)


_ABSENT_KEYS = itertools.repeat(object())  # the value map(d.get, keys, ...) gives for a key d lacks


class KernelGraph:
    """A kernel as a graph; the root node is the ``kernel`` scope."""

    _scope_effects: Optional[dict] = None  # a graph made by __new__ (trace files) keeps none
    _orders: Optional[dict] = None
    _resources: Optional[dict] = None
    _log: Optional[TouchLog] = None  # while lowering: what changed at which step (see log_touches)
    _ops_kept = False  # while True, by_op() reads a kept index (see keep_derived)
    _ops: Optional[dict] = None  # that index once built: op -> its node ids in id order
    _ops_gone: Any = frozenset()  # the ops whose lists may still hold removed nodes

    def __init__(self, name: str, params: tuple = (), block: tuple = (1, 1, 1), grid: Optional[tuple] = None,
                 symbols: tuple = ()):
        grid = tuple(const(g) if isinstance(g, int) else g for g in (grid or (1, 1, 1)))
        self.g = nx.DiGraph()
        self._next_id = 0
        self._effects: dict = {}  # node -> (its attribute items, reads, writes): see effects()
        self._scope_effects: Optional[dict] = None  # node -> (reads, writes) while kept: see keep_derived()
        self._orders: Optional[dict] = None  # scope -> its children's order.KeptOrder, while kept
        self._resources: Optional[dict] = None  # scope -> its resources.ScopeResources, while kept
        self._log: Optional[TouchLog] = None
        self._ops_kept = False
        self._ops: Optional[dict] = None
        self._ops_gone = set()
        self.trace = None  # set by lowering in debug mode
        self.root = self.add("kernel", None, origin={"by": "build"}, name=name, params=params,
                             block=block, grid=grid, symbols=symbols, requires=())

    # ---------------------------------------------------------------------------- building
    def add(self, op: str, parent: Optional[int], origin: Optional[Mapping[str, Any]] = None,
            **attrs: Any) -> int:
        """Create a node under ``parent`` and return its id (ids increase in creation order). An
        ``origin`` dict becomes the node's: never changed, only replaced (the nodes of one rule
        application share one, as copies of the graph do)."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}")
        spec = OPS[op]
        d = {"op": op, "origin": origin if type(origin) is dict else dict(origin or {}), **spec.defaults, **attrs}
        for k in spec.terms:  # plain numbers in term attributes become constant terms
            if isinstance(d.get(k), (int, float)):
                d[k] = const(d[k])
        nid = self._new_node(d)
        if parent is not None:
            self._edge(parent, nid, CONTAINS)
            self.touch(parent)
            self.touch(nid)
        return nid

    def remove_nodes(self, nodes: list[int]) -> None:
        """Remove ``nodes`` and their edges (the caller keeps the rest a tree with acyclic sibling order)."""
        if self._ops is not None:
            self._ops_gone.update(self.g._node[n]["op"] for n in nodes)
        self.g.remove_nodes_from(nodes)

    def _new_node(self, d: dict) -> int:
        """A node with attribute table ``d`` (``op`` and ``origin`` included), in no scope; its id."""
        nid = self._next_id
        self._next_id += 1
        # networkx's own tables, as add_node fills them (its keyword arguments would copy d twice)
        g = self.g
        g._succ[nid], g._pred[nid], g._node[nid] = {}, {}, d
        nx._clear_cache(g)
        if self._ops is not None:  # the largest id: the list stays in id order
            self._ops.setdefault(d["op"], []).append(nid)
        if self._log is not None:
            self._log.mark(nid)
        return nid

    def _edge(self, a: int, b: int, kind: str) -> None:
        """networkx's ``add_edge(a, b, kind=kind)`` for two nodes of the graph, written into its tables
        directly (lowering adds about three edges a node; the call and its checks cost more)."""
        g = self.g
        if a not in g._node or b not in g._node:
            g.add_edge(a, b, kind=kind)  # as networkx does it: the missing node is made
            return
        g._succ[a][b] = g._pred[b][a] = EDGE_DATA[kind]
        nx._clear_cache(g)

    def contain(self, scope: int, n: int) -> None:
        """Make ``n`` a child of ``scope`` (the contains edge alone: the caller then tells the graph,
        with :meth:`joined` or :meth:`touch`, unless ``scope`` is in no scope yet)."""
        self._edge(scope, n, CONTAINS)

    def add_depends(self, a: int, b: int, scope: Optional[int] = None) -> None:
        """Order ``a`` before ``b`` (siblings; ``scope``: their scope, when the caller knows it)."""
        self._edge(a, b, DEPENDS)
        if self._orders or self._log is not None:
            self._reordered(self.parent(a) if scope is None else scope)

    def remove_depends(self, a: int, b: int) -> None:
        self.g.remove_edge(a, b)
        if self._orders or self._log is not None:
            self._reordered(self.parent(a))

    def _reordered(self, scope: Optional[int]) -> None:
        """The depends edges among ``scope``'s children changed: its kept order goes, and the
        touch log marks it and its scopes (up to one this step marked already: those above it are)."""
        if self._orders:
            self._orders.pop(scope, None)
        log = self._log
        if log is not None:
            while scope is not None and not log.marked_now(scope):
                log.mark(scope)
                scope = self.parent(scope)

    def order_by_effects(self, seq: list[int]) -> None:
        """Add the depends edges that keep siblings ``seq`` (in program order) in that order
        wherever their effects conflict (RAW/WAR/WAW on registers, buffers, the sync token)."""
        if len(seq) < 2:
            return  # nothing to order
        tracker = DependenceTracker()
        scope = self.parent(seq[0])  # siblings: one scope
        for n in seq:
            for p in tracker.add(n, self.effects(n)):
                self.add_depends(p, n, scope)

    # ---------------------------------------------------------------------------- queries
    # queries read networkx's adjacency dicts directly (``_node``, ``_succ``, ``_pred``): its view
    # objects cost more than the lookups themselves, and the engine asks millions of them
    def __getitem__(self, n: int) -> dict:
        return self.g._node[n]

    def __contains__(self, n: int) -> bool:
        return n in self.g

    def __len__(self) -> int:
        return len(self.g._node)

    def op(self, n: int) -> str:
        return self.g._node[n]["op"]

    def attrs(self, n: int) -> dict:
        """The node's attributes without ``op`` and ``origin``."""
        return {k: v for k, v in self.g._node[n].items() if k not in ("op", "origin")}

    def nodes(self, op: Optional[str] = None) -> list[int]:
        if op is not None and self._ops_kept:
            return list(self._kept_ops().get(op, ()))
        if op is None:
            return sorted(self.g._node)
        return sorted(n for n, d in self.g._node.items() if op is None or d["op"] == op)

    def by_op(self) -> dict[str, list[int]]:
        """Node ids grouped by op, each list sorted (matchers index with it): one pass, or while the
        graph keeps derived facts its kept index (a lowering asks once per batch of applications)."""
        if self._ops_kept:
            return {op: list(ids) for op, ids in self._kept_ops().items() if ids}
        return self._by_op()

    def _kept_ops(self) -> dict[str, list[int]]:
        """The kept op index, built on first use and cleared of removed nodes."""
        if self._ops is None:
            self._ops = self._by_op()
        if self._ops_gone:
            nodes = self.g._node
            for op in self._ops_gone:
                self._ops[op] = [n for n in self._ops.get(op, ()) if n in nodes]
            self._ops_gone.clear()
        return self._ops

    def _by_op(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for n, d in self.g._node.items():  # ids mostly in order already: each list's sort is a pass
            if d["op"] in out:
                out[d["op"]].append(n)
            else:
                out[d["op"]] = [n]
        for ids in out.values():
            ids.sort()
        return out

    def parent(self, n: int) -> Optional[int]:
        for p, d in self.g._pred[n].items():
            if d["kind"] == CONTAINS:
                return p
        return None

    def children(self, n: int) -> list[int]:
        return sorted(c for c, d in self.g._succ[n].items() if d["kind"] == CONTAINS)

    def depends_edges(self) -> list[tuple[int, int]]:
        return sorted((a, b) for a, nbrs in self.g._succ.items() for b, d in nbrs.items() if d["kind"] == DEPENDS)

    def ancestors(self, n: int) -> Iterator[int]:
        """Enclosing scopes, innermost first."""
        p = self.parent(n)
        while p is not None:
            yield p
            p = self.parent(p)

    def descendants(self, n: int) -> list[int]:
        """Every node inside ``n``, in id order."""
        inside = self._inside(n)
        inside.sort()
        return inside

    def _inside(self, n: int) -> list[int]:
        """Every node inside ``n``, in no particular order (one sort, or none, for the caller). A
        list, not a generator: the matcher and the actions walk hundreds of thousands of nodes
        this way on a large kernel, and a yield per node cost a third of the walk."""
        succ, nodes, stack, out = self.g._succ, self.g._node, [n], []
        while stack:
            for c, d in succ[stack.pop()].items():
                if d["kind"] == CONTAINS:
                    out.append(c)
                    if nodes[c]["op"] in SCOPES:  # a leaf's successors are siblings it orders
                        stack.append(c)
        return out

    def inside_by_op(self, n: int) -> dict[str, list[int]]:
        """The nodes inside ``n`` by op, and under ``"_"`` all of them, each list in id order: one
        walk (a matcher asks for several ops inside the scope it is anchored at)."""
        nodes, every = self.g._node, self._inside(n)
        out: dict[str, list[int]] = {"_": every}
        for c in every:
            op = nodes[c]["op"]
            if op in out:
                out[op].append(c)
            else:
                out[op] = [c]
        for ids in out.values():
            ids.sort()
        return out

    def is_scope(self, n: int) -> bool:
        return self.g._node[n]["op"] in SCOPES

    def effects(self, n: int) -> tuple[set[str], set[str]]:
        """Reads and writes of a node, including everything inside it when it is a scope (callers
        must not change the sets)."""
        kept = self._scope_effects
        if kept is not None and n in kept:
            return kept[n]
        r, w = self._own_effects(n)
        if self.g._node[n]["op"] not in SCOPES:
            if kept is not None:
                kept[n] = (frozenset(r), frozenset(w))
                return kept[n]
            return set(r), set(w)
        reads, writes = set(r), set(w)
        succ, stack = self.g._succ, [n]
        while stack:  # a union: order does not matter; a kept inner scope is not walked again
            for c, d in succ[stack.pop()].items():
                if d["kind"] != CONTAINS:
                    continue
                if kept is not None and c in kept:
                    r, w = kept[c]
                else:
                    r, w = self._own_effects(c)
                    if self.g._node[c]["op"] in SCOPES:
                        stack.append(c)
                    elif kept is not None:  # a leaf's are its own: kept until touch() drops them
                        kept[c] = (r, w)
                reads |= r
                writes |= w
        if kept is not None:
            kept[n] = (frozenset(reads), frozenset(writes))
            return kept[n]
        return reads, writes

    def keep_derived(self, keep: bool = True) -> None:
        """Remember each node's effects (a scope's: with everything inside) and each scope's sibling
        order until it changes, and the nodes of each op. Placing a node asks for the order and the
        effects of every sibling; without this a scope of k children holding m nodes costs
        O(m + k log k) per placement. Only for a graph whose every change goes through :meth:`add`,
        :meth:`remove_nodes` and :meth:`add_depends` / :meth:`remove_depends` or is followed by
        :meth:`touch` (the rewrite engine's private copy); ``keep=False`` forgets."""
        self._scope_effects = {} if keep else None
        self._orders = {} if keep else None
        self._resources = {} if keep else None
        self._ops_kept, self._ops, self._ops_gone = keep, None, set()  # the index: built on first use

    def touch(self, n: int) -> None:
        """``n`` changed (its attributes, its children, the depends edges among them, or it joins or
        is about to leave its scope): the remembered effects of ``n`` and its scopes and the sibling
        order of ``n``'s children go, each scope's resource index rereads the child that holds ``n``,
        and the touch log marks ``n`` and its scopes."""
        if self._orders:
            self._orders.pop(n, None)
        kept, index, log = self._scope_effects, self._resources, self._log
        if not kept and not index and log is None:
            return
        while n is not None:
            if log is not None:
                log.mark(n)
            if kept:
                kept.pop(n, None)
            p = self.parent(n)
            if index and p in index:
                index[p].stale.add(n)
            n = p

    def joined(self, n: int) -> None:
        """``n`` (with what it holds) was just put into its scope, and nothing inside it changed after
        its effects were last read: what :meth:`touch` of ``n`` and of the scope does, except that
        the remembered effects of the scopes around ``n``, and the resource indexes that list those
        scopes, grow by ``n``'s effects instead of being read again (a scope's effects are the union
        of what it holds: adding a node adds exactly its own)."""
        if self._orders:
            self._orders.pop(n, None)
        kept, index, log = self._scope_effects, self._resources, self._log
        if not kept and not index and log is None:
            return
        reads, writes = self.effects(n)
        if self._orders:
            self._orders.pop(self.parent(n), None)
        x = n
        while x is not None:
            if log is not None:
                log.mark(x)
            p = self.parent(x)
            if x != n and kept:
                had = kept.get(x)
                if had is not None:
                    kept[x] = (had[0] | reads, had[1] | writes)
            if index and p in index:
                index[p].grow(x, reads, writes, new=x == n)
            x = p

    def log_touches(self, step: Optional[int]) -> None:
        """From now on mark each node that changes, or that holds a node that changes (as
        :meth:`touch` and :meth:`add` say), with ``step`` (:class:`cbrules.ir.touch_log.TouchLog`);
        None stops (and forgets). The rewrite engine sets the step before each application and asks
        :meth:`touched_since`."""
        if step is None or self._log is None:
            self._log = None if step is None else TouchLog(step)
        else:
            self._log.step = step

    def move_touch_log(self, other: "KernelGraph") -> None:
        """Hand the touch log to ``other`` (a copy that replaces this graph) and stop logging here."""
        other._log, self._log = self._log, None

    def touched_since(self, step: int) -> list[int]:
        """The nodes of the graph marked after ``step`` by the touch log, in no particular order."""
        return [] if self._log is None else self._log.since(step, self.g._node)

    def touched_at(self, step: int) -> list[int]:
        """The nodes the touch log marked with ``step`` (removed ones too), in no particular order."""
        return [] if self._log is None else self._log.at(step)

    def sibling_resources(self, scope: int) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
        """Each resource the children of ``scope`` read or write -> those children, and each one
        they write -> the writers (kept while the graph keeps derived facts, and updated for the
        children touched since)."""
        index = self._resources
        entry = None if index is None else index.get(scope)
        if entry is None:
            entry = ScopeResources(self.children(scope))
            if index is not None:
                index[scope] = entry
        nodes = self.g._node
        return entry.refresh(lambda c: self.effects(c) if c in nodes and self.parent(c) == scope else None)

    def remembered_order(self, scope: int) -> Optional[KeptOrder]:
        """The sibling order of ``scope``'s children while kept and unchanged (see :mod:`cbrules.ir.order`)."""
        return None if self._orders is None else self._orders.get(scope)

    def remember_order(self, scope: int, order: KeptOrder) -> None:
        if self._orders is not None:
            self._orders[scope] = order

    def _own_effects(self, n: int) -> tuple[set[str], set[str]]:
        """One node's own effects (callers must not change the sets), remembered: placing a node
        asks for the effects of every sibling, so a scope of k children costs O(k) per placement,
        not O(k) times the term walks. Attribute values are never changed in place (see copy()),
        so the same value objects under the same keys mean the same effects."""
        d = self.g._node[n]
        cache = vars(self).setdefault("_effects", {})  # a graph made by __new__ (trace files) starts one
        seen = cache.get(n)
        items = tuple(map(d.get, EFFECT_KEYS[d["op"]], _ABSENT_KEYS))  # what effects() reads, absent keys told apart
        if seen is not None and seen[0] == items:  # compared in C, the same objects at once
            return seen[1], seen[2]
        r, w = effects(d["op"], d)
        cache[n] = (items, r, w)
        return r, w

    def copy_node(self, src: int, origin: dict, changed: Optional[Mapping[str, Any]] = None) -> int:
        """A new node, in no scope yet, with ``src``'s op and attributes (``changed`` replacing some) and
        the dict ``origin``; return its id. With nothing changed it has ``src``'s own effects, remembered
        instead of read from its terms again (a clone copies every node of a loop)."""
        attrs = self.g._node[src]
        d = {**attrs, "origin": origin}  # "origin" keeps its place: the attributes read in the same order
        if changed:
            d.update(changed)
        nid = self._new_node(d)
        if not changed:
            cache = vars(self).setdefault("_effects", {})
            seen = cache.get(src)
            if seen is not None:  # the same values under every key effects() reads: the same effects
                cache[nid] = seen
        return nid

    def kernel(self) -> dict:
        return self.g.nodes[self.root]

    def params(self) -> dict[str, Param]:
        """Kernel parameters by name."""
        return {p.name: p for p in self.kernel()["params"]}

    def buffers(self) -> dict[str, int]:
        """Allocated buffer name -> alloc node."""
        return {self.g.nodes[n]["buf"]: n for n in self.nodes("alloc")}

    def describe(self, n: int) -> str:
        """Short human name of a node for error messages: ``#12 tma_load(dst=tile) [kernel.py:30]``,
        or ``[rule R @ file:line]`` for a node a rule made; odd text is shown escaped."""
        d = self.g.nodes[n]
        keys = [k for k in ("var", "buf", "dst", "src", "barrier", "name") if k in d]
        inner = ", ".join(f"{k}={_plain(d[k])}" for k in keys[:2])
        o = d.get("origin", {})
        where = o.get("where") or (f"rule {o['rule']} @ {o.get('at', '?')}" if o.get("rule") else None)
        return f"#{n} {d['op']}({inner})" + (f" [{_plain(where)}]" if where else "")

    # ---------------------------------------------------------------------------- whole graph
    def copy(self) -> "KernelGraph":
        """An independent deep copy (rules rewrite copies so failures leave the input untouched)."""
        new = KernelGraph.__new__(KernelGraph)
        # one level deep is enough: attribute values are immutable (terms, tuples, strings) or, like
        # annotation and origin dicts, replaced rather than changed in place by builder and rules
        new.g = self.g.copy()
        new._next_id, new.root, new.trace, new._effects = self._next_id, self.root, None, {}
        new._scope_effects = None if self._scope_effects is None else dict(self._scope_effects)
        # a kept order changes in place as nodes join it: each copy keeps its own
        new._orders = None if self._orders is None else {s: o.copy() for s, o in self._orders.items()}
        new._resources = None if self._resources is None else {}  # rebuilt on use
        new._ops_kept, new._ops, new._ops_gone = self._ops_kept, None, set()  # rebuilt on use
        new._log = None  # a copy starts without a touch log (see move_touch_log)
        return new

    def verify(self, ready: bool = False, structure_only: bool = False) -> None:
        """Check the graph's invariants; raise :class:`cbrules.ir.verify.GraphError` naming the node
        (levels: see :func:`cbrules.ir.verify.verify`)."""
        from .verify import verify
        verify(self, ready, structure_only)

    def walk(self, n: Optional[int] = None) -> Iterable[int]:
        """Every node of a subtree, parents before children, in id order."""
        stack = [self.root if n is None else n]
        nodes = self.g._node
        while stack:  # a stack, not recursion: a chain of generators costs its depth at every node
            n = stack.pop()
            yield n
            if nodes[n]["op"] in SCOPES:  # only a scope contains nodes
                stack.extend(reversed(self.children(n)))


def _plain(v: Any) -> str:
    """``v`` as text for a message: as is when printable, else escaped (a name holding a newline
    must not break the message into lines that look like something else)."""
    text = str(v)
    return text if text.isprintable() else repr(text)
