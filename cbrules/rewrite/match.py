"""Matcher: find every binding of a graph rule's ``:match`` and ``:where`` in a kernel graph.

A ``:match`` is a list of elements tried left to right with backtracking:

* node patterns ``(OP ?n :key VALUE-PATTERN ... :in ?scope | :child-of ?scope)``, ``OP`` an op
  name or ``_``; candidates are tried in node-id order, so matching is deterministic;
* relations from :data:`RELATIONS` (``inside``, ``first-reader``, ``no``, ``count`` ...).

Value patterns: ``?x`` (bind, or compare when bound), ``_``, a literal, ``(one-of a b)``,
``(not P)``, ``(absent)``, and ``(:key P ...)`` for dictionary attributes such as annotations.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

from ..ir.graph import KernelGraph
from ..ir.order import DEPENDS, sibling_order
from .sexpr import Atom, Expr, Pos, RuleError, SList
from ..ir.terms import evaluate as eval_term
from ..ir.terms import Term, as_term
from .schema import RELATIONS, STRUCTURAL_KEYS, VARIADIC_RELATIONS, split_keys  # noqa: F401  (public here too)
from .plan import AttrIndex, join_order, joined, known_values
from .values import Env, NodeRef, evaluate, holds

MISSING = object()
# an op with at most this many nodes is looked up inside a scope through the op index (each node's
# scopes: the nesting depth) rather than by walking the scope's subtree (its size)
_FEW = 64
def _vars(e: Expr) -> list[str]:
    if isinstance(e, Atom):
        return [e.value] if e.kind == "var" else []
    return [v for x in e.items for v in _vars(x)]


def _short(v: Any, limit: int = 80) -> str:
    if isinstance(v, str):
        text = f'"{v}"'
    elif isinstance(v, dict):
        text = "{" + ", ".join(f"{k}: {_short(x, limit)}" for k, x in v.items()) + "}"
    else:
        text = str(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _first_miss(path: str, p: Expr, value: Any, b: dict) -> str:
    """Expected vs actual at the innermost key of a (:key P ...) pattern that fails."""
    if isinstance(p, SList) and p.items and isinstance(p.items[0], Atom) and p.items[0].kind == "kw" \
            and isinstance(value, dict):
        _, keys = split_keys(p.items, 0)
        for k, sub in keys.items():
            got = value.get(k, MISSING)
            nb = match_value(sub, got, b)
            if nb is None:
                return _first_miss(f"{path} :{k}", sub, got, b)
            b = nb
    return f"{path}: wants {p}, has {'nothing' if value is MISSING else _short(value)}"


class MatchTimeout(Exception):
    """Matching ran past the matcher's deadline (the engine reports it as a LoweringError)."""


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, (Term, int)) and isinstance(b, (Term, int)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return as_term(a) == as_term(b)
    return a == b


def match_value(p: Expr, value: Any, b: dict) -> Optional[dict]:
    """Match one attribute value against a value pattern; returns extended bindings or None."""
    if isinstance(p, Atom):
        if p.kind == "var":
            if p.value in b:
                return b if value is not MISSING and _equal(b[p.value], value) else None
            return None if value is MISSING else {**b, p.value: value}
        if p.kind == "sym" and p.value == "_":
            return b if value is not MISSING else None
        lit = {"true": True, "false": False}.get(p.value, p.value) if p.kind == "sym" else p.value
        return b if value is not MISSING and _equal(lit, value) else None
    head = p.head()
    if head == "one-of":
        for alt in p.items[1:]:
            r = match_value(alt, value, b)
            if r is not None:
                return r
        return None
    if head == "not":
        return b if match_value(p.items[1], value, b) is None else None
    if head == "absent":
        return b if value is MISSING or value is None else None
    # (:key P ...) -- a dictionary attribute
    if not isinstance(value, dict):
        return None
    _, keys = split_keys(p.items, 0)
    for k, sub in keys.items():
        b = match_value(sub, value.get(k, MISSING), b)
        if b is None:
            return None
    return b


class Matcher:
    """Matches rules against one graph; remembers the deepest failure for "why not" queries."""

    def __init__(self, kg: KernelGraph, deadline: Optional[float] = None,
                 decide: Optional[Callable[[Term], bool]] = None, plan: bool = False):
        """``deadline`` (a ``time.monotonic()`` value): past it, matching raises :class:`MatchTimeout`
        (a rule with many node patterns can take time exponential in their number). ``decide``
        proves predicate terms for the ``provably-*`` guards (the engine's egglog oracle).
        ``plan``: search the leading node patterns in a joined order (:mod:`cbrules.rewrite.plan`);
        the bindings are the same, in the same order, but the deepest failure that :meth:`explain`
        reports is the written search's only without it."""
        self.kg = kg
        self.decide = decide
        self.plan = plan
        self._attrs: Optional[AttrIndex] = None
        self._orders: dict[int, list[int]] = {}
        self._places: dict[int, dict[int, int]] = {}  # scope -> each child's place in its order
        self._index: Optional[dict[str, list[int]]] = None  # op -> nodes, built on first use
        self._within: dict[tuple[int, str], list[int]] = {}  # (scope, op) -> nodes inside, on first use
        self.deepest: tuple[int, str, Any] = (-1, "", None)
        self.deepest_bindings: dict = {}  # the bindings the deepest failure was tried with
        self.deadline = deadline
        self.ticks = 0  # search steps so far: candidates and pattern elements tried

    def fresh(self) -> "Matcher":
        """A matcher over the same (unchanged) graph sharing this one's indexes, with its own
        failure record."""
        m = Matcher.__new__(Matcher)
        m.kg, m._orders, m._index, m._within = self.kg, self._orders, self.by_op(), self._within
        m._places = self._places
        m.decide, m.plan, m._attrs = self.decide, self.plan, self.attr_index()
        m.deepest, m.deadline, m.ticks = (-1, "", None), self.deadline, 0
        m.deepest_bindings = {}
        return m

    def by_op(self) -> dict[str, list[int]]:
        """Node ids by op (``"_"``: every node), each sorted; built once, on first use, so that a
        matcher for an anchored match (every node bound) costs nothing proportional to the graph."""
        if self._index is None:
            self._index = self.kg.by_op()
            self._index["_"] = sorted(self.kg.g.nodes)
        return self._index

    def attr_index(self) -> AttrIndex:
        """Nodes by op and attribute value (:class:`cbrules.rewrite.plan.AttrIndex`), on first use."""
        if self._attrs is None:
            self._attrs = AttrIndex(self.kg, self.by_op())
        return self._attrs

    def inside(self, scope: int, op: str) -> list[int]:
        """The nodes of ``op`` (``"_"``: any) inside ``scope``, in id order; remembered, as the graph
        does not change while a matcher is in use (a join over loops asks once per outer binding)."""
        key = (scope, op)
        got = self._within.get(key)
        if got is None:
            # a rare op (in an op index already built: an anchored match builds none): its nodes
            # whose scopes include ``scope``
            few = self._index.get(op, ()) if op != "_" and self._index is not None else None
            if few is not None and len(few) <= _FEW:
                got = [n for n in few if n != scope and scope in self.kg.ancestors(n)]
            else:
                pool = self.kg.descendants(scope)
                got = pool if op == "_" else [n for n in pool if self.kg.op(n) == op]
            self._within[key] = got
        return got

    def _tick(self) -> None:
        """Count a step of the search; look at the clock every 1024 steps."""
        self.ticks += 1
        if self.deadline is not None and not self.ticks & 1023 and time.monotonic() >= self.deadline:
            raise MatchTimeout()

    def order(self, scope: int) -> list[int]:
        if scope not in self._orders:
            self._orders[scope] = sibling_order(self.kg, scope)
        return self._orders[scope]

    def env(self, b: dict) -> Env:
        return Env(b, lambda n: self.kg[n], self.decide)

    def _fail(self, index: int, why: str, where: Any, b: Optional[dict] = None) -> None:
        if index > self.deepest[0]:
            self.deepest = (index, why, where)
            self.deepest_bindings = b or {}

    # ------------------------------------------------------------------ rules
    def matches(self, elements: tuple, guards: tuple, b: Optional[dict] = None) -> Iterator[dict]:
        """Every binding of the pattern elements that also satisfies every guard."""
        order = join_order(elements, frozenset(b or ())) if self.plan else None
        found = self._elements(elements, 0, dict(b or {})) if order is None else \
            joined(self, elements, order, dict(b or {}))
        for bound in found:
            ok = True
            for gi, g in enumerate(guards):
                if not holds(g, self.env(bound)):
                    self._fail(len(elements) + gi, "guard is false", g, bound)
                    ok = False
                    break
            if ok:
                yield bound

    def _elements(self, els: tuple, i: int, b: dict) -> Iterator[dict]:
        self._tick()
        if i == len(els):
            yield b
            return
        found = False
        for b2 in self.element(els[i], b):
            found = True
            yield from self._elements(els, i + 1, b2)
        if not found:
            self._fail(i, "no node matches" if els[i].head() not in RELATIONS else "relation does not hold", els[i], b)

    def element(self, e: SList, b: dict) -> Iterator[dict]:
        head = e.head()
        if head in RELATIONS:
            yield from getattr(self, "_rel_" + head.replace("-", "_"))(e, b)
        else:
            yield from self.node_pattern(e, b)

    def explain(self) -> str:
        """The deepest failure in words: for a node pattern the first attribute that no candidate
        got past (expected vs actual), for a relation or guard the values of its variables."""
        idx, why, where = self.deepest
        b = self.deepest_bindings
        if not isinstance(where, SList):
            return why
        if where.head() in RELATIONS or idx >= 0 and why == "guard is false":
            shown = [f"{v}={_short(b[v])}" for v in dict.fromkeys(_vars(where)) if v in b]
            return why + (f" with {', '.join(shown)}" if shown else "")
        return self._explain_pattern(where, b)

    def _explain_pattern(self, e: SList, b: dict) -> str:
        op = e.head()
        pos, keys = split_keys(e.items, 1)
        var = pos[0].value if pos and isinstance(pos[0], Atom) and pos[0].kind == "var" else None
        if var in b and isinstance(b[var], NodeRef) and b[var].id in self.kg:
            n = b[var].id
            if op != "_" and self.kg.op(n) != op:
                return f"{var}={_short(b[var])} is a {self.kg.op(n)} node, the pattern wants a {op}"
            pool = [n]
        else:
            pool = list(self.by_op().get(op, ()))
            if not pool:
                return f"the graph has no {op} node"
        best = (-1, "")
        for n in pool:
            b2: Optional[dict] = b if var is None else {**b, var: NodeRef(n)}
            for i, (k, p) in enumerate(keys.items()):
                if k in STRUCTURAL_KEYS:
                    scope = self._scope_of(p, b2)
                    ok = scope in self.kg.ancestors(n) if k == "in" else self.kg.parent(n) == scope
                    miss = f":{k} wants a node inside #{scope}, #{n} is not" if not ok else ""
                else:
                    got = self.kg[n].get(k, MISSING)
                    nb = match_value(p, got, b2)
                    ok, b2 = nb is not None, nb if nb is not None else b2
                    miss = f"#{n} " + _first_miss(f":{k}", p, got, b2)
                if not ok:
                    if i > best[0]:
                        best = (i, miss)
                    break
        return best[1] or "no node matches"

    # ------------------------------------------------------------------ node patterns
    def _scope_of(self, x: Expr, b: dict) -> int:
        v = evaluate(x, self.env(b))
        if not isinstance(v, NodeRef):
            raise RuleError(x.pos, f"{x} must be bound to a node, got {v!r}")
        return v.id

    def candidates(self, e: SList, b: dict, within: Optional[int] = None,
                   among: Optional[list[int]] = None) -> list[int]:
        op = e.head()
        pos, keys = split_keys(e.items, 1)
        if pos and isinstance(pos[0], Atom) and pos[0].kind == "var" and pos[0].value in b:
            ref = b[pos[0].value]
            pool = [ref.id] if isinstance(ref, NodeRef) and ref.id in self.kg else []
        elif among is not None:
            pool = among
        elif within is not None:
            return list(self.inside(within, op))
        elif "child-of" in keys:
            pool = self.kg.children(self._scope_of(keys["child-of"], b))
        else:  # inside a scope, or the whole graph (the op index, built once per matcher)
            pool = self.inside(self._scope_of(keys["in"], b), op) if "in" in keys else self.by_op().get(op, ())
            # an attribute that must equal a known value: its index, when shorter (and when this
            # matcher has indexed the graph already, or the scope is large: an anchored match of a
            # few nodes must not cost an index of the whole graph)
            if op != "_" and (self._index is not None or len(pool) > _FEW):
                for path, v in known_values(keys, b):
                    same = self.attr_index().lookup(op, path, v)
                    if same is not None and len(same) < len(pool):
                        pool = same
            return list(pool)
        return [n for n in pool if op == "_" or self.kg.op(n) == op]

    def node_pattern(self, e: SList, b: dict, within: Optional[int] = None) -> Iterator[dict]:
        """Bindings for every node matching pattern ``e`` (inside ``within`` when given)."""
        for _, b2 in self.node_matches(e, b, within):
            yield b2

    def node_matches(self, e: SList, b: dict, within: Optional[int] = None,
                     among: Optional[list[int]] = None) -> Iterator[tuple[int, dict]]:
        """(node, bindings) for every node matching pattern ``e`` (inside ``within``, or among
        the given nodes in their order)."""
        pos, keys = split_keys(e.items, 1)
        var = pos[0].value if pos and isinstance(pos[0], Atom) and pos[0].kind == "var" else None
        for n in self.candidates(e, b, within, among):
            self._tick()
            b2: Optional[dict] = b if var is None else {**b, var: NodeRef(n)}
            attrs = self.kg[n]
            for k, p in keys.items():
                if k == "in":
                    ok = self._scope_of(p, b2) in self.kg.ancestors(n)
                    b2 = b2 if ok else None
                elif k == "child-of":
                    b2 = b2 if self.kg.parent(n) == self._scope_of(p, b2) else None
                else:
                    b2 = match_value(p, attrs.get(k, MISSING), b2)
                if b2 is None:
                    break
            if b2 is not None:
                yield n, b2

    def select(self, pattern: SList, b: dict, scope: int) -> set[int]:
        """Nodes inside ``scope`` matching a filter: a node pattern, ``(not F)`` or ``(any-of F ...)``."""
        head = pattern.head()
        if head == "not":
            return set(self.kg.descendants(scope)) - self.select(pattern.items[1], b, scope)
        if head == "any-of":
            return set().union(*(self.select(p, b, scope) for p in pattern.items[1:]))
        return {n for n, _ in self.node_matches(pattern, b, within=scope)}

    # ------------------------------------------------------------------ relations
    def _bind_node(self, x: Expr, n: int, b: dict) -> Optional[dict]:
        if x.value in b:
            return b if b[x.value] == NodeRef(n) else None
        return {**b, x.value: NodeRef(n)}

    def _rel_inside(self, e, b, direct=False):
        scope = self._scope_of(e.items[2], b)
        pool = self.kg.children(scope) if direct else self.kg.descendants(scope)
        for n in pool:
            r = self._bind_node(e.items[1], n, b)
            if r is not None:
                yield r

    def _rel_child(self, e, b):
        yield from self._rel_inside(e, b, direct=True)

    def _touches(self, n: int, buf: str, write: bool) -> bool:
        reads, writes = self.kg.effects(n)
        return f"mem:{buf}" in (writes if write else reads)

    def _rel_reads(self, e, b, write=False):
        buf = evaluate(e.items[2], self.env(b))
        x = e.items[1]
        pool = [b[x.value].id] if x.value in b else self.kg.nodes()
        for n in pool:
            leaf = not self.kg.is_scope(n)
            r = self._bind_node(x, n, b) if leaf and self._touches(n, buf, write) else None
            if r is not None:
                yield r

    def _rel_writes(self, e, b):
        yield from self._rel_reads(e, b, write=True)

    def _reader(self, e, b, last: bool):
        _, keys = split_keys(e.items, 2)
        buf = evaluate(keys["of"], self.env(b))
        scope = self._scope_of(keys["in"], b)
        readers = [c for c in self.order(scope) if self._touches(c, buf, False)]
        if readers:
            r = self._bind_node(e.items[1], readers[-1 if last else 0], b)
            if r is not None:
                yield r

    def _rel_first_reader(self, e, b):
        yield from self._reader(e, b, last=False)

    def _rel_last_reader(self, e, b):
        yield from self._reader(e, b, last=True)

    def _inner(self, e: SList, pattern_at: int, b: dict) -> list[tuple[int, dict]]:
        _, keys = split_keys(e.items, pattern_at + 1)
        if "around" in keys:  # the node itself and its enclosing scopes, innermost first
            n = self._scope_of(keys["around"], b)
            return list(self.node_matches(e.items[pattern_at], b, among=[n, *self.kg.ancestors(n)]))
        scope = self._scope_of(keys["in"], b)
        return list(self.node_matches(e.items[pattern_at], b, within=scope))

    # ------------------------------------------------------------------ order
    def _position(self, n: int) -> tuple[list[int], int]:
        """The schedule order of ``n``'s scope and ``n``'s place in it (the kernel: alone)."""
        scope = self.kg.parent(n)
        if scope is None:
            return [n], 0
        order = self.order(scope)
        if scope not in self._places:
            self._places[scope] = {c: i for i, c in enumerate(order)}
        return order, self._places[scope][n]

    def _node(self, x: Expr, b: dict) -> Optional[int]:
        """The node ``x`` is bound to (None while unbound); a non-node value is a RuleError."""
        if not (isinstance(x, Atom) and x.kind == "var" and x.value in b):
            return None
        return self._scope_of(x, b)

    def _ordered_pairs(self, e, b, adjacent: bool) -> Iterator[dict]:
        x, y = e.items[1], e.items[2]
        nx_, ny = self._node(x, b), self._node(y, b)
        if nx_ is not None and ny is not None:  # both bound: compare their places, not every later sibling
            self._tick()
            order, i = self._position(nx_)
            j = self._position(ny)[1] if self.kg.parent(ny) == self.kg.parent(nx_) else -1
            if j == i + 1 or not adjacent and j > i:
                yield b
            return
        if nx_ is not None:
            order, i = self._position(nx_)
            pairs = [(nx_, m) for m in (order[i + 1:i + 2] if adjacent else order[i + 1:])]
        elif ny is not None:
            order, j = self._position(ny)
            pairs = [(m, ny) for m in (order[max(j - 1, 0):j] if adjacent else order[:j])]
        else:
            pairs = []
            for scope in self.by_op()["_"]:
                if self.kg.is_scope(scope):
                    order = self.order(scope)
                    pairs += [(order[i], order[k]) for i in range(len(order))
                              for k in (range(i + 1, min(i + 2, len(order))) if adjacent else range(i + 1, len(order)))]
        for m, n in pairs:
            self._tick()
            r = self._bind_node(x, m, b)
            r = self._bind_node(y, n, r) if r is not None else None
            if r is not None:
                yield r

    def _rel_next(self, e, b):
        yield from self._ordered_pairs(e, b, adjacent=True)

    def _rel_before(self, e, b):
        yield from self._ordered_pairs(e, b, adjacent=False)

    def _rel_between(self, e, b):
        first, last = self._scope_of(e.items[1], b), self._scope_of(e.items[2], b)
        if self.kg.parent(first) != self.kg.parent(last):
            return
        order, i = self._position(first)
        j = order.index(last)
        for n in order[i + 1:j]:
            r = self._bind_node(e.items[3], n, b)
            if r is not None:
                yield r

    def _rel_distinct(self, e, b):
        nodes = [self._scope_of(x, b) for x in e.items[1:]]
        if len(set(nodes)) == len(nodes):
            yield b

    def _rel_no(self, e, b):
        if not self._inner(e, 1, b):
            yield b

    def _rel_nearest(self, e, b):
        found = self._inner(e, 2, b)
        if found:
            r = self._bind_node(e.items[1], found[0][0], b)
            if r is not None:
                yield r

    def _iterations(self, n: int, scope: int) -> int:
        """How often ``n`` runs per iteration of ``scope``: the product of the constant trip counts
        of the loops between them."""
        count = 1
        for a in self.kg.ancestors(n):
            if a == scope:
                return count
            if self.kg.op(a) == "for":
                d = self.kg[a]
                try:
                    trips = -(-(eval_term(d["stop"] - d["start"], {})) // eval_term(d["step"], {}))
                except KeyError:
                    raise RuleError(Pos("<graph>", 0, 0), f"{self.kg.describe(a)} has a trip count unknown at "
                                    "lowering time, so per-iteration totals inside it cannot be counted")
                count *= max(trips, 0)
        return count

    def _dependent(self, e, b) -> Optional[bool]:
        """Whether a chain of depends edges orders the two bound siblings (None: not siblings)."""
        a, c = self._scope_of(e.items[1], b), self._scope_of(e.items[2], b)
        scope = self.kg.parent(a)
        if scope is None or scope != self.kg.parent(c) or a == c:
            return None
        kids = set(self.kg.children(scope))

        def reaches(x: int, y: int) -> bool:
            seen, todo = {x}, [x]
            while todo:
                for s, d in self.kg.g.succ[todo.pop()].items():
                    if d["kind"] == DEPENDS and s in kids and s not in seen:
                        if s == y:
                            return True
                        seen.add(s)
                        todo.append(s)
            return False
        return reaches(a, c) or reaches(c, a)

    def _rel_ordered(self, e, b):
        if self._dependent(e, b):
            yield b

    def _rel_independent(self, e, b):
        if self._dependent(e, b) is False:
            yield b

    def _rel_count(self, e, b):
        r = match_value(e.items[1], len({n for n, _ in self._inner(e, 2, b)}), b)
        if r is not None:
            yield r

    def _rel_collect(self, e, b):
        attr = e.items[2].value
        values = sorted({str(v) for n, _ in self._inner(e, 3, b) if (v := self.kg[n].get(attr)) is not None})
        r = match_value(e.items[1], tuple(values), b)
        if r is not None:
            yield r

    def _rel_sum(self, e, b):
        attr = e.items[2].value
        _, keys = split_keys(e.items, 4)
        scope = self._scope_of(keys["in"], b)
        nodes = sorted({n for n, _ in self._inner(e, 3, b)})
        total = sum(self.kg[n].get(attr, 0) * self._iterations(n, scope) for n in nodes)
        r = match_value(e.items[1], total, b)
        if r is not None:
            yield r
