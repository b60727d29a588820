"""The kernel graph: a networkx DiGraph of scope, memory, compute and synchronisation nodes.

Edges are of two kinds: ``contains`` (scope -> child) and ``depends`` (a must run before b; always
between siblings). Sibling order is not stored as a list: :mod:`cbrules.ir.order` derives it
from the depends edges. Every node carries ``op``, its attributes (see :mod:`cbrules.ir.ops`) and ``origin``,
a record of who created it (the builder call site, or a rule and step) and from which node it was
cloned, so that debug queries can trace any node back to the kernel the user built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import networkx as nx

from .names import BUILTINS  # noqa: F401  (the CUDA builtins a term may name; public here too)
from .ops import OPS, SCOPES, DependenceTracker, effects
from .order import CONTAINS, DEPENDS, EDGE_DATA
from .terms import const


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


class KernelGraph:
    """A kernel as a graph; the root node is the ``kernel`` scope."""

    def __init__(self, name: str, params: tuple = (), block: tuple = (1, 1, 1), grid: Optional[tuple] = None,
                 symbols: tuple = ()):
        grid = tuple(const(g) if isinstance(g, int) else g for g in (grid or (1, 1, 1)))
        self.g = nx.DiGraph()
        self._next_id = 0
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
        return nid

    def remove_nodes(self, nodes: list[int]) -> None:
        """Remove ``nodes`` and their edges (the caller keeps the rest a tree with acyclic sibling order)."""
        self.g.remove_nodes_from(nodes)

    def _new_node(self, d: dict) -> int:
        """A node with attribute table ``d`` (``op`` and ``origin`` included), in no scope; its id."""
        nid = self._next_id
        self._next_id += 1
        # networkx's own tables, as add_node fills them (its keyword arguments would copy d twice)
        g = self.g
        g._succ[nid], g._pred[nid], g._node[nid] = {}, {}, d
        nx._clear_cache(g)
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
        """Make ``n`` a child of ``scope`` (the contains edge alone: its place among the siblings is
        for the caller to order)."""
        self._edge(scope, n, CONTAINS)

    def add_depends(self, a: int, b: int) -> None:
        """Order ``a`` before ``b`` (siblings)."""
        self._edge(a, b, DEPENDS)

    def remove_depends(self, a: int, b: int) -> None:
        """Drop the depends edge ``a`` -> ``b``."""
        self.g.remove_edge(a, b)

    def remove_contains(self, scope: int, n: int) -> None:
        """Take ``n`` out of ``scope`` (the contains edge alone: ``n``'s depends edges are the caller's
        to drop first, see :meth:`detach_order`), leaving it in no scope."""
        self.g.remove_edge(scope, n)

    def detach_order(self, n: int) -> tuple[list[int], list[int]]:
        """Drop ``n``'s depends edges; return its depends predecessors and successors, as
        :meth:`predecessors` and :meth:`successors` list them (whether any of them must stay ordered
        is the caller's to say: it knows their effects)."""
        preds, succs = self.predecessors(n), self.successors(n)
        g = self.g
        for p in preds:
            g.remove_edge(p, n)
        for s in succs:
            g.remove_edge(n, s)
        return preds, succs

    def take_place(self, new: int, n: int) -> None:
        """``new`` takes sibling ``n``'s place in its scope's order: ``n``'s depends edges become
        ``new``'s (``new`` already in ``n``'s scope; ``n`` stays there, unordered, for the caller to move)."""
        for p in self.predecessors(n):
            self.g.remove_edge(p, n)
            self._edge(p, new, DEPENDS)
        for s in self.successors(n):
            self.g.remove_edge(n, s)
            self._edge(new, s, DEPENDS)

    def order_by_effects(self, seq: list[int],
                         effects_of: Optional[Callable[[int], tuple[set[str], set[str]]]] = None) -> int:
        """Add the depends edges that keep siblings ``seq`` (in program order) in that order
        wherever their effects conflict (RAW/WAR/WAW on registers, buffers, the sync token);
        ``effects_of`` reads a node's effects (:meth:`effects` by default). Returns how many
        edges it added."""
        added = 0
        if len(seq) < 2:
            return added  # nothing to order
        tracker = DependenceTracker()
        effects_of = effects_of or self.effects
        for n in seq:
            for p in tracker.add(n, effects_of(n)):
                self.add_depends(p, n)
                added += 1
        return added

    # ---------------------------------------------------------------------------- queries
    # queries read networkx's adjacency dicts directly (``_node``, ``_succ``, ``_pred``): its view
    # objects cost more than the lookups themselves, and the engine asks millions of them
    def __getitem__(self, n: int) -> dict:
        return self.g._node[n]

    @property
    def node_table(self) -> Mapping[int, dict]:
        """Every node's attribute dict (``op`` and ``origin`` included) by id: the graph's own table,
        for loops over many nodes (a lookup in it costs about a fifth of ``kg[n]``, a method call, measured
        in a loop over the nodes). Read it, never change it (add and remove nodes through this class)."""
        return self.g._node

    def __contains__(self, n: int) -> bool:
        return n in self.g._node

    def __len__(self) -> int:
        return len(self.g._node)

    def op(self, n: int) -> str:
        return self.g._node[n]["op"]

    def attrs(self, n: int) -> dict:
        """The node's attributes without ``op`` and ``origin``."""
        return {k: v for k, v in self.g._node[n].items() if k not in ("op", "origin")}

    def nodes(self, op: Optional[str] = None) -> list[int]:
        if op is None:
            return sorted(self.g._node)
        return sorted(n for n, d in self.g._node.items() if op is None or d["op"] == op)

    def by_op(self) -> dict[str, list[int]]:
        """Node ids grouped by op, each list sorted (matchers index with it), in one pass."""
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

    def containers(self, n: int) -> list[int]:
        """Every scope holding ``n`` through a contains edge: one, or none for the root, in a graph
        the verifier accepts (which asks this, to name a node with several)."""
        return [p for p, d in self.g._pred[n].items() if d["kind"] == CONTAINS]

    def edges(self) -> Iterator[tuple[int, int, str]]:
        """``(a, b, kind)`` of every edge, contains and depends, in the graph's own order (read from its
        adjacency tables: networkx's edge views cost several times the lookups on a large graph)."""
        return ((a, b, d["kind"]) for a, nbrs in self.g._succ.items() for b, d in nbrs.items())

    def has_depends(self, a: int, b: int) -> bool:
        """Whether a depends edge orders ``a`` right before ``b``."""
        d = self.g._succ[a].get(b)
        return d is not None and d["kind"] == DEPENDS

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
        """Reads and writes of a node, including everything inside it when it is a scope, read from
        the attributes (the rewrite engine remembers them instead: :mod:`cbrules.rewrite.memory`)."""
        nodes = self.g._node
        reads, writes = effects(nodes[n]["op"], nodes[n])
        if nodes[n]["op"] not in SCOPES:
            return set(reads), set(writes)
        reads, writes = set(reads), set(writes)
        for c in self._inside(n):  # a union: order does not matter
            r, w = effects(nodes[c]["op"], nodes[c])
            reads |= r
            writes |= w
        return reads, writes

    def predecessors(self, n: int) -> list[int]:
        """The siblings ``n`` waits for (its depends predecessors), in no particular order."""
        return [p for p, d in self.g._pred[n].items() if d["kind"] == DEPENDS]

    def successors(self, n: int) -> list[int]:
        """The siblings that wait for ``n`` (its depends successors), in no particular order."""
        return [s for s, d in self.g._succ[n].items() if d["kind"] == DEPENDS]

    def copy_node(self, src: int, origin: dict, changed: Optional[Mapping[str, Any]] = None) -> int:
        """A new node, in no scope yet, with ``src``'s op and attributes (``changed`` replacing some) and
        the dict ``origin``; return its id."""
        attrs = self.g._node[src]
        d = {**attrs, "origin": origin}  # "origin" keeps its place: the attributes read in the same order
        if changed:
            d.update(changed)
        return self._new_node(d)

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

    @property
    def next_id(self) -> int:
        """The id the next new node gets (ids are never reused)."""
        return self._next_id

    # ---------------------------------------------------------------------------- whole graph
    @classmethod
    def restored(cls, root: int, next_id: int, nodes: Mapping[int, dict],
                 edges: Iterable[tuple[int, int, str]]) -> "KernelGraph":
        """A graph from its parts as :meth:`node_table`, :meth:`edges`, ``root`` and :attr:`next_id`
        gave them (a saved trace read back); the caller checked them (:func:`cbrules.ir.verify.verify_values`)."""
        kg = cls.__new__(cls)
        kg.g, kg.root, kg._next_id, kg.trace = nx.DiGraph(), root, next_id, None
        for n, attrs in nodes.items():
            kg.g.add_node(n, **attrs)
        for a, b, kind in edges:
            kg.g.add_edge(a, b, kind=kind)
        return kg

    def copy(self) -> "KernelGraph":
        """An independent deep copy (rules rewrite copies so failures leave the input untouched)."""
        new = KernelGraph.__new__(KernelGraph)
        # one level deep is enough: attribute values are immutable (terms, tuples, strings) or, like
        # annotation and origin dicts, replaced rather than changed in place by builder and rules
        new.g = self.g.copy()
        new._next_id, new.root, new.trace = self._next_id, self.root, None
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
