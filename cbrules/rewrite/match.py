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
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from ..ir.graph import KernelGraph
from ..ir.order import sibling_order
from ..sexpr import Atom, Expr, Pos, RuleError, SList, derived, variables
from ..ir.terms import Term, evaluate as eval_term
from .schema import RELATIONS, STRUCTURAL_KEYS, VARIADIC_RELATIONS, split_keys, split_keys_once  # noqa: F401  (public here too)
from .plan import AttrIndex, join_order, joined, known_values, pattern_parts, read_once
from .value_patterns import MISSING, first_miss, short_text, compiled, match_value  # noqa: F401  (public here too)
from .values import Env, NodeRef, evaluate, holds

if TYPE_CHECKING:
    from .memory import Memory

# an op with at most this many nodes is looked up inside a scope through the op index (each node's
# scopes: the nesting depth) rather than by walking the scope's subtree (its size)
_FEW = 64


class _NodePattern:
    """A node pattern read once (the matcher tries it on every candidate node): its op, node
    variable, ``:key`` items and their checks (``None`` for the scope keys), and whether the node's
    variable can join the bindings after the checks (no check names it)."""

    __slots__ = ("op", "var", "keys", "late", "checks")

    def __init__(self, e: SList):
        self.op = e.head()
        self.var, self.keys = pattern_parts(e)
        named = {v for p in self.keys.values() for v in variables(p)}
        self.late = self.var is not None and self.var not in named
        self.checks = tuple((k, p, None if k in ("in", "child-of") else compiled(p)) for k, p in self.keys.items())


def _node_pattern(e: SList) -> _NodePattern:
    """The pattern's compiled form, kept on its text."""
    memo = derived(e)
    np = memo.get("node_pattern")
    if np is None:
        np = memo["node_pattern"] = _NodePattern(e)
    return np


def _step(e: SList) -> tuple:
    """A :match element's step, kept on its text: (its relation's method name, None) or (None, its
    _NodePattern)."""
    memo = derived(e)
    step = memo.get("step")
    if step is None:
        head = e.head()
        step = memo["step"] = ("_rel_" + head.replace("-", "_"), None) if head in RELATIONS else \
            (None, _node_pattern(e))
    return step


class MatchTimeout(Exception):
    """Matching ran past the matcher's deadline (the engine reports it as a LoweringError)."""


class Matcher:
    """Matches rules against one graph; remembers the deepest failure for "why not" queries."""

    def __init__(self, kg: KernelGraph, deadline: Optional[float] = None,
                 decide: Optional[Callable[[Term], bool]] = None, plan: bool = False,
                 attr_tables: Optional[dict] = None, memory: Optional["Memory"] = None):
        """``deadline`` (a ``time.monotonic()`` value): past it, matching raises :class:`MatchTimeout`
        (a rule with many node patterns can take time exponential in their number). ``decide``
        proves predicate terms for the ``provably-*`` guards (the engine's egglog oracle).
        ``plan``: search the leading node patterns in a joined order (:mod:`cbrules.rewrite.plan`);
        the bindings are the same, in the same order, but the deepest failure that :meth:`explain`
        reports is the written search's only without it. ``attr_tables``: the attribute index's
        tables (see :class:`cbrules.rewrite.plan.AttrIndex`), kept by the caller across matchers.
        ``memory``: the rewrite engine's memory of ``kg`` (its private copy), which answers the
        questions about effects, sibling order and nodes by op from what it keeps."""
        self.kg = kg
        self.memory = memory
        self.decide = decide
        self.plan = plan
        # the op index ("index") and the attribute index ("attrs"), built on first use and shared by
        # the fresh() matchers: an anchored search that needs neither builds neither
        self._shared: dict[str, Any] = {"tables": attr_tables}
        self._orders: dict[int, list[int]] = {}
        self._places: dict[int, dict[int, int]] = {}  # scope -> each child's place in its order
        self._within: dict[tuple[int, str], list[int]] = {}  # (scope, op) -> nodes inside, on first use
        self._grouped: dict[int, dict[str, list[int]]] = {}  # scope -> op -> nodes inside, one walk a scope
        self._kids: dict[tuple[int, str], list[int]] = {}  # (scope, op) -> children, on first use
        self.deepest: tuple[int, str, Any] = (-1, "", None)
        self.deepest_bindings: dict = {}  # the bindings the deepest failure was tried with
        self.deadline = deadline
        self.ticks = 0  # search steps so far: candidates and pattern elements tried

    def fresh(self) -> "Matcher":
        """A matcher over the same (unchanged) graph sharing this one's indexes, with its own
        failure record."""
        m = Matcher.__new__(Matcher)
        m.kg, m.memory, m._orders, m._shared, m._within = self.kg, self.memory, self._orders, self._shared, self._within
        m._grouped, m._kids = self._grouped, self._kids
        m._places = self._places
        m.decide, m.plan = self.decide, self.plan
        m.deepest, m.deadline, m.ticks = (-1, "", None), self.deadline, 0
        m.deepest_bindings = {}
        return m

    def by_op(self) -> dict[str, list[int]]:
        """Node ids by op (``"_"``: every node), each sorted; built once, on first use, so that a
        matcher for an anchored match (every node bound) costs nothing proportional to the graph."""
        index = self._shared.get("index")
        if index is None:
            index = self._shared["index"] = (self.kg if self.memory is None else self.memory).by_op()
            index["_"] = self.kg.nodes()
        return index

    def attr_index(self) -> AttrIndex:
        """Nodes by op and attribute value (:class:`cbrules.rewrite.plan.AttrIndex`), on first use."""
        attrs = self._shared.get("attrs")
        if attrs is None:
            attrs = self._shared["attrs"] = AttrIndex(self.kg, self.by_op, self._shared["tables"])
        return attrs

    def inside(self, scope: int, op: str) -> list[int]:
        """The nodes of ``op`` (``"_"``: any) inside ``scope``, in id order; remembered, as the graph
        does not change while a matcher is in use (a join over loops asks once per outer binding)."""
        key = (scope, op)
        got = self._within.get(key)
        if got is None:
            # a rare op (in an op index already built: an anchored match builds none): its nodes
            # whose scopes include ``scope``
            index = self._shared.get("index")
            few = index.get(op, ()) if op != "_" and index is not None else None
            if few is not None and len(few) <= _FEW:
                got = [n for n in few if n != scope and scope in self.kg.ancestors(n)]
            else:  # one walk of the scope answers every op (a rule asks for several in each loop)
                grouped = self._grouped.get(scope)
                if grouped is None:
                    grouped = self._grouped[scope] = self.kg.inside_by_op(scope)
                got = grouped.get(op, [])
            self._within[key] = got
        return got

    def children(self, scope: int, op: str) -> list[int]:
        """The children of ``op`` (``"_"``: any) of ``scope``, in id order; remembered like
        :meth:`inside` (the rules anchored at a loop ask for its children one after another)."""
        key = (scope, op)
        got = self._kids.get(key)
        if got is None:
            kids = self.kg.children(scope)
            nodes = self.kg.node_table
            got = self._kids[key] = kids if op == "_" else [n for n in kids if nodes[n]["op"] == op]
        return got

    def tick(self) -> None:
        """Count a step of the search; look at the clock every 1024 steps."""
        self.ticks += 1
        if self.deadline is not None and not self.ticks & 1023 and time.monotonic() >= self.deadline:
            raise MatchTimeout()

    def order(self, scope: int) -> list[int]:
        if scope not in self._orders:
            self._orders[scope] = sibling_order(self.kg, scope) if self.memory is None else \
                self.memory.sibling_order(scope)
        return self._orders[scope]

    def env(self, b: dict) -> Env:
        return Env(b, lambda n: self.kg[n], self.decide)

    def _fail(self, index: int, why: str, where: Any, b: Optional[dict] = None) -> None:
        if index > self.deepest[0]:
            self.deepest = (index, why, where)
            self.deepest_bindings = b or {}

    # ------------------------------------------------------------------ rules
    def matches(self, elements: tuple, guards: tuple, b: Optional[dict] = None, held: int = 0) -> Iterator[dict]:
        """Every binding of the pattern elements that also satisfies every guard. ``held``: the first
        that many elements hold with ``b`` already (an anchored search checked its anchor's pattern,
        see :meth:`attributes_hold`): the search as written starts after them (a planned one checks
        them again)."""
        if b and self.plan and not self._absences_hold(elements, b):
            return
        order = join_order(elements, frozenset(b or ())) if self.plan else None
        found = self.elements_from(elements, held, dict(b or {})) if order is None else \
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

    def _absences_hold(self, els: tuple, b: dict) -> bool:
        """Whether every ``(no ...)`` of ``els`` that names only variables bound in ``b`` holds.
        Such a relation binds nothing and reads only those variables, so it says the same here as
        where it is written: asked first, it spares a search from an anchor that already has what
        the rule would add (a rule matched again at every loop an application changed)."""
        absences = read_once(els, "absences", lambda els: [(i, e, frozenset(variables(e))) for i, e in enumerate(els)
                                                          if isinstance(e, SList) and e.head() == "no"])
        for i, e, names in absences:
            if names <= b.keys() and next(self._rel_no(e, b), None) is None:
                self._fail(i, "relation does not hold", e, b)
                return False
        return True

    def elements_from(self, els: tuple, i: int, b: dict) -> Iterator[dict]:
        """The bindings of pattern elements ``els[i:]`` extending ``b``, searched as written (a
        planned search joins its leading node patterns first: :func:`cbrules.rewrite.plan.joined`)."""
        self.tick()
        if i == len(els):
            yield b
            return
        found, last = False, i + 1 == len(els)
        for b2 in self.element(els[i], b):
            found = True
            if last:  # what the call for the end would do, without a generator per binding
                self.tick()
                yield b2
            else:
                yield from self.elements_from(els, i + 1, b2)
        if not found:
            self._fail(i, "no node matches" if els[i].head() not in RELATIONS else "relation does not hold", els[i], b)

    def element(self, e: SList, b: dict) -> Iterator[dict]:
        relation, np = _step(e)
        if relation is not None:  # every relation is a generator: nothing runs before the caller iterates
            return getattr(self, relation)(e, b)
        return self._pattern_matches(np, b, None, None, False)  # node_matches, its pattern read once

    def explain(self) -> str:
        """The deepest failure in words: for a node pattern the first attribute that no candidate
        got past (expected vs actual), for a relation or guard the values of its variables."""
        idx, why, where = self.deepest
        b = self.deepest_bindings
        if not isinstance(where, SList):
            return why
        if where.head() in RELATIONS or idx >= 0 and why == "guard is false":
            shown = [f"{v}={short_text(b[v])}" for v in dict.fromkeys(variables(where)) if v in b]
            return why + (f" with {', '.join(shown)}" if shown else "")
        return self._explain_pattern(where, b)

    def _explain_pattern(self, e: SList, b: dict) -> str:
        op = e.head()
        pos, keys = split_keys(e.items, 1)
        var = pos[0].value if pos and isinstance(pos[0], Atom) and pos[0].kind == "var" else None
        if var in b and isinstance(b[var], NodeRef) and b[var].id in self.kg:
            n = b[var].id
            if op != "_" and self.kg.op(n) != op:
                return f"{var}={short_text(b[var])} is a {self.kg.op(n)} node, the pattern wants a {op}"
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
                    miss = f"#{n} " + first_miss(f":{k}", p, got, b2)
                if not ok:
                    if i > best[0]:
                        best = (i, miss)
                    break
        return best[1] or "no node matches"

    # ------------------------------------------------------------------ node patterns
    def _scope_of(self, x: Expr, b: dict) -> int:
        # a bound variable (what scopes almost always are) read without evaluating an expression
        v = b.get(x.value, MISSING) if isinstance(x, Atom) and x.kind == "var" else MISSING
        if v is MISSING:
            v = evaluate(x, self.env(b))
        if not isinstance(v, NodeRef):
            raise RuleError(x.pos, f"{x} must be bound to a node, got {v!r}")
        return v.id

    def candidates(self, e: SList, b: dict, within: Optional[int] = None,
                   among: Optional[list[int]] = None) -> list[int]:
        return list(self._candidates(_node_pattern(e), b, within, among)[0])

    def _candidates(self, np: _NodePattern, b: dict, within: Optional[int],
                    among: Optional[list[int]]) -> tuple[Sequence[int], Optional[tuple[str, int]]]:
        """The candidate nodes, and the scope key (``in`` or ``child-of``) and scope that every
        one of them already satisfies (None when the pool is not taken from that scope)."""
        # the pools are the matcher's own lists (read only: the graph does not change while it looks)
        op, var, keys = np.op, np.var, np.keys
        if var is not None and var in b:
            ref = b[var]
            nodes = self.kg.node_table
            if isinstance(ref, NodeRef) and ref.id in nodes and (op == "_" or nodes[ref.id]["op"] == op):
                return (ref.id,), None
            return (), None
        elif among is not None:
            nodes = self.kg.node_table
            return [n for n in among if op == "_" or nodes[n]["op"] == op], None
        elif within is not None:
            return self.inside(within, op), None
        elif "child-of" in keys:
            scope = self._scope_of(keys["child-of"], b)
            return self.children(scope, op), ("child-of", scope)
        # inside a scope, or the whole graph (the op index, built once per matcher)
        scope = self._scope_of(keys["in"], b) if "in" in keys else None
        pool = self.inside(scope, op) if scope is not None else self.by_op().get(op, ())
        held = None if scope is None else ("in", scope)
        # an attribute that must equal a known value: its index, when shorter (and when the
        # pool is large, or is every node of the op in a matcher that has indexed the graph
        # already: the few nodes of one scope must not cost an index of the op's every node)
        if op != "_" and (len(pool) > _FEW or scope is None and "index" in self._shared):
            for path, v in known_values(keys, b):
                same = self.attr_index().lookup(op, path, v)
                if same is not None and len(same) < len(pool):
                    pool, held = same, None
        return pool, held

    def node_pattern(self, e: SList, b: dict, within: Optional[int] = None) -> Iterator[dict]:
        """Bindings for every node matching pattern ``e`` (inside ``within`` when given)."""
        return self.node_matches(e, b, within, pairs=False)

    def node_matches(self, e: SList, b: dict, within: Optional[int] = None,
                     among: Optional[list[int]] = None, pairs: bool = True) -> Iterator[Any]:
        """(node, bindings) for every node matching pattern ``e`` (inside ``within``, or among
        the given nodes in their order); the bindings alone when ``pairs`` is false."""
        return self._pattern_matches(_node_pattern(e), b, within, among, pairs)

    def _pattern_matches(self, np: _NodePattern, b: dict, within: Optional[int], among: Optional[list[int]],
                         pairs: bool) -> Iterator[Any]:
        if np.var is not None and np.var in b and within is None and among is None:
            return self._bound_matches(np, b, pairs)
        return self._pool_matches(np, b, within, among, pairs)

    def _bound_matches(self, np: _NodePattern, b: dict, pairs: bool) -> Iterator[Any]:
        """:meth:`node_matches` for a pattern whose node is bound already: its one candidate checked
        without a pool (an anchored search starts so, and rules name a bound node again to read more
        of its attributes)."""
        ref, nodes = b[np.var], self.kg.node_table
        if not (isinstance(ref, NodeRef) and ref.id in nodes and (np.op == "_" or nodes[ref.id]["op"] == np.op)):
            return
        self.ticks += 1  # tick, inline: once per candidate
        if not self.ticks & 1023 and self.deadline is not None and time.monotonic() >= self.deadline:
            raise MatchTimeout()
        n, attrs, kg, b2 = ref.id, nodes[ref.id], self.kg, b
        for k, p, check in np.checks:
            if check is not None:
                b2 = check(attrs.get(k, MISSING), b2)
            else:
                scope = self._scope_of(p, b2)
                if not (scope in kg.ancestors(n) if k == "in" else kg.parent(n) == scope):
                    b2 = None
            if b2 is None:
                return
        yield (n, b2) if pairs else b2

    def _pool_matches(self, np: _NodePattern, b: dict, within: Optional[int], among: Optional[list[int]],
                      pairs: bool) -> Iterator[Any]:
        """:meth:`node_matches` over a pool of candidates. The node's variable joins the bindings after
        the checks (most candidates fail one) unless a check names it; a scope named by a variable
        bound before the pattern is read once."""
        var, late, checks = np.var, np.late, np.checks
        scopes: dict[str, int] = {}
        kg, nodes = self.kg, self.kg.node_table
        pool, held = self._candidates(np, b, within, among)
        for n in pool:
            self.ticks += 1  # tick, inline: once per candidate
            if not self.ticks & 1023 and self.deadline is not None and time.monotonic() >= self.deadline:
                raise MatchTimeout()
            b2: Optional[dict] = b if var is None or late else {**b, var: NodeRef(n)}
            attrs = nodes[n]
            for k, p, check in checks:
                if check is not None:
                    b2 = check(attrs.get(k, MISSING), b2)
                else:
                    scope = scopes.get(k)
                    if scope is None:
                        scope = self._scope_of(p, b2)
                        if isinstance(p, Atom) and p.kind == "var" and p.value in b:
                            scopes[k] = scope
                    if held is not None and held[0] == k and held[1] == scope:
                        continue  # the pool holds only nodes of that scope
                    if not (scope in kg.ancestors(n) if k == "in" else kg.parent(n) == scope):
                        b2 = None
                if b2 is None:
                    break
            if b2 is not None:
                if late:  # the variable where binding it first puts it: right after ``b``'s
                    b2 = {**b, var: NodeRef(n)} if b2 is b else {**b, var: NodeRef(n), **b2}
                yield (n, b2) if pairs else b2

    def attributes_hold(self, e: SList, n: int) -> Optional[dict]:
        """The bindings node ``n`` gives node pattern ``e`` (its variable first, as the search binds
        it) when ``n`` has the pattern's op and passes its attribute checks (its scope keys aside),
        else None: what a search anchored at ``n`` asks first, without a search's set-up (half of the
        anchors an application leaves behind are new nodes of the op that match no rule's anchor: a
        barrier loop is a ``for`` too), and the bindings it then starts from."""
        np = _node_pattern(e)
        attrs = self.kg.node_table[n]
        if np.op != "_" and attrs["op"] != np.op:
            return None
        # no check names the node's variable (``late``): the checks start from no bindings
        b: Optional[dict] = {} if np.var is None or np.late else {np.var: NodeRef(n)}
        for k, p, check in np.checks:
            if check is not None:
                b = check(attrs.get(k, MISSING), b)
                if b is None:
                    return None
        return {np.var: NodeRef(n), **b} if np.late else b

    def select(self, pattern: SList, b: dict, scope: int) -> set[int]:
        """Nodes inside ``scope`` matching a filter: a node pattern, ``(not F)`` or ``(any-of F ...)``."""
        head = pattern.head()
        if head == "not":
            return set(self.kg.descendants(scope)) - self.select(pattern.items[1], b, scope)
        if head == "any-of":
            return set().union(*(self.select(p, b, scope) for p in pattern.items[1:]))
        return {n for n, _ in self.node_matches(pattern, b, within=scope)}

    # ------------------------------------------------------------------ relations: _rel_<name> for every one
    # (cbrules.rewrite.schema.RELATIONS); each yields the bindings that extend b
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
        reads, writes = (self.kg if self.memory is None else self.memory).effects(n)
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
        return list(self._inner_matches(e, pattern_at, b))

    def _inner_matches(self, e: SList, pattern_at: int, b: dict) -> Iterator[tuple[int, dict]]:
        _, keys = split_keys_once(e, pattern_at + 1)
        if "around" in keys:  # the node itself and its enclosing scopes, innermost first
            n = self._scope_of(keys["around"], b)
            return self.node_matches(e.items[pattern_at], b, among=[n, *self.kg.ancestors(n)])
        scope = self._scope_of(keys["in"], b)
        return self.node_matches(e.items[pattern_at], b, within=scope)

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
            self.tick()
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
            self.tick()
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
        if next(self._inner_matches(e, 1, b), None) is None:  # one match is enough to know
            yield b

    def _rel_nearest(self, e, b):
        found = next(self._inner_matches(e, 2, b), None)  # the nearest is the first
        if found is not None:
            r = self._bind_node(e.items[1], found[0], b)
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
        kids = set(self.children(scope, "_"))
        successors = self.kg.successors

        def reaches(x: int, y: int) -> bool:
            seen, todo = {x}, [x]
            while todo:
                for s in successors(todo.pop()):
                    if s in kids and s not in seen:
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
