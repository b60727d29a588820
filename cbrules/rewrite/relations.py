"""The relations a rule's ``:match`` may use besides node patterns (``inside``, ``child``, ``reads``,
``writes``, ``first-reader``, ``last-reader``, ``next``, ``before``, ``between``, ``distinct``, ``no``,
``nearest``, ``ordered``, ``independent``, ``count``, ``collect``, ``sum``: :data:`cbrules.rewrite.schema.RELATIONS`),
mixed into :class:`cbrules.rewrite.match.Matcher`, whose node search, scopes and order they use."""
from __future__ import annotations

from typing import Iterator, Optional

from ..ir.order import DEPENDS
from ..ir.terms import evaluate as eval_term
from .sexpr import Atom, Expr, Pos, RuleError, SList
from .schema import split_keys, split_keys_once
from .value_patterns import match_value
from .values import NodeRef, evaluate


class Relations:
    """``_rel_<name>`` for every relation; each yields the bindings that extend ``b``."""

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
        return list(self._inner_matches(e, pattern_at, b))

    def _inner_matches(self, e: SList, pattern_at: int, b: dict) -> Iterator[tuple[int, dict]]:
        _, keys = split_keys_once(e.items, pattern_at + 1)
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
