"""Join order and attribute index for the matcher: what keeps matching a rule linear in the graph.

A rule's ``:match`` reads left to right, and the matcher keeps that meaning: bindings come out in
the order the written text gives (node patterns enumerate candidates in id order, so that order is
the lexicographic order of the node ids they pick). Searching in the written order can be
quadratic: ``(for ?L ...) (alloc ?a :buf ?buf) (tma_load :dst ?buf :in ?L)`` tries every alloc
with every loop before the load ties them. :func:`join_order` picks, among the leading node
patterns, the next one that is tied to what is bound already (its node, an attribute equal to a
bound variable, its scope), and :class:`AttrIndex` finds the nodes of an op whose attribute has a
given value without a scan. The matcher then sorts what it found back into the written order.
From the same indexes, :func:`absent_requirement` rules out, before a whole-graph search, a rule
one of whose node patterns needs an op or attribute value that no node has.

A pattern whose meaning depends on what is bound before it (a variable under ``not`` or
``one-of``; a scope under ``:in``/``:child-of``) keeps the same variables bound before it, or
the rule is searched as written.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from ..ir.terms import Term
from .schema import RELATIONS, STRUCTURAL_KEYS, split_keys_once
from ..sexpr import Atom, Expr, SList, derived, variables

_UNINDEXED = object()


class _Bound:
    """Stands for a bound variable's value while planning (the value is not known yet)."""


_BOUND = _Bound()




def _guarded_vars(e: Expr) -> set[str]:
    """Variables whose being bound or not changes what ``e`` means (under ``not`` or ``one-of``)."""
    if not isinstance(e, SList):
        return set()
    if e.head() in ("not", "one-of"):
        return set(variables(e))
    return set().union(*(_guarded_vars(x) for x in e.items))


def literal(p: Expr) -> Any:
    """The value a literal value pattern stands for, or ``_UNINDEXED``."""
    if not isinstance(p, Atom) or p.kind in ("var", "kw") or p.kind == "sym" and p.value == "_":
        return _UNINDEXED
    return {"true": True, "false": False}.get(p.value, p.value) if p.kind == "sym" else p.value


def index_key(v: Any) -> Any:
    """A hashable key under which every value the matcher finds equal to ``v`` falls (numbers and
    constant terms by their float value: a shared key costs a candidate, a split one a match);
    ``_UNINDEXED`` when ``v`` cannot be hashed."""
    if isinstance(v, Term) and v.op == "const" and isinstance(v.value, (int, float)):
        v = v.value
    if isinstance(v, (bool, int, float)):
        try:
            return ("num", float(v))
        except OverflowError:
            return ("num", "big")
    try:
        hash(v)
    except TypeError:
        return _UNINDEXED
    return v


class AttrIndex:
    """Nodes of an op by the value of one attribute, built per (op, key) on first use from the
    matcher's op index (``by_op()``, so each list is in id order); the graph does not change
    meanwhile. ``tables``: where the tables go, which the caller may keep for later matchers while
    no node of their op changes (the engine, from one batch to the next)."""

    def __init__(self, kg, by_op: Callable[[], dict[str, list[int]]], tables: Optional[dict] = None):
        self.kg, self.by_op = kg, by_op
        self._tables: dict[tuple[str, tuple], Optional[dict]] = {} if tables is None else tables

    def lookup(self, op: str, path: tuple, value: Any) -> Optional[list[int]]:
        """The ``op`` nodes whose attribute at ``path`` (a key, then keys into dictionary values)
        may equal ``value`` (a superset, in id order), or None when the index cannot answer (an
        unhashable value)."""
        k = _UNINDEXED if value is _UNINDEXED else index_key(value)
        if k is _UNINDEXED:
            return None
        table = self._tables.get((op, path), _UNINDEXED)
        if table is _UNINDEXED:
            table = self._tables[(op, path)] = self._build(op, path)
        return None if table is None else table.get(k, [])

    def _build(self, op: str, path: tuple) -> Optional[dict]:
        table: dict = {}
        nodes = self.kg.node_table
        for n in self.by_op().get(op, ()):
            v = nodes[n]
            for key in path:
                v = v.get(key, _UNINDEXED) if isinstance(v, dict) else _UNINDEXED
            if v is _UNINDEXED:
                continue
            k = index_key(v)
            if k is _UNINDEXED:
                return None
            table.setdefault(k, []).append(n)
        return table


def known_values(keys: dict, b: dict, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, value) for each attribute a node pattern's ``keys`` require to equal a literal or a
    bound variable, looking into ``(:key P ...)`` dictionary patterns."""
    for k, p in keys.items():
        if not path and k in STRUCTURAL_KEYS:
            continue
        if isinstance(p, Atom):
            v = b.get(p.value, _UNINDEXED) if p.kind == "var" else literal(p)
            if v is not _UNINDEXED:
                yield path + (k,), v
        elif isinstance(p, SList) and p.items and isinstance(p.items[0], Atom) and p.items[0].kind == "kw":
            yield from known_values(split_keys_once(p, 0)[1], b, path + (k,))


def pattern_parts(e: SList) -> tuple[Optional[str], dict]:
    """A node pattern's node variable (None for none) and its ``:key`` items (remembered per
    pattern; the caller must not change the dict)."""
    pos, keys = split_keys_once(e, 1)
    var = pos[0].value if pos and isinstance(pos[0], Atom) and pos[0].kind == "var" else None
    return var, keys


def _tie(e: SList, bound: set[str]) -> Optional[int]:
    """How closely ``e`` is tied to the variables bound: 0 its node, 1 an attribute equal to a
    bound variable, 2 its scope (an op's nodes in it), 3 nothing; None while a scope it names is
    unbound."""
    var, keys = pattern_parts(e)
    scopes = [keys[k] for k in STRUCTURAL_KEYS if k in keys]
    if any(not set(variables(s)) <= bound for s in scopes):
        return None
    if var in bound:
        return 0
    if any(isinstance(v, _Bound) for _, v in known_values(keys, {x: _BOUND for x in bound})):
        return 1
    # a scope ties an op's nodes to a few; it ties "_" to every child or descendant, no better than
    # the written order
    return 2 if scopes and e.head() != "_" else 3


def _binds(e: SList) -> set[str]:
    return set(variables(e))


def join_order(els: tuple, bound: frozenset) -> Optional[list[int]]:
    """An order for the leading node patterns of ``els`` that searches fewer candidates, or None
    when the written order is the one to use (nothing to gain, or the meaning would change).
    Kept on the rule's elements per set of bound variables (the engine asks once per rule and batch)."""
    orders = derived(els).setdefault("join_orders", {})
    if bound not in orders:
        orders[bound] = _join_order(els, bound)
    return orders[bound]


def _join_order(els: tuple, bound: frozenset) -> Optional[list[int]]:
    run = 0
    while run < len(els) and isinstance(els[run], SList) and els[run].head() not in RELATIONS:
        run += 1
    if run < 2:
        return None
    written: list[set[str]] = []  # the variables bound before each pattern, as written
    have = set(bound)
    for i in range(run):
        if _tie(els[i], have) is None:
            return None  # a scope bound only later: the written search reports it
        written.append(set(have))
        have |= _binds(els[i])
    order: list[int] = []
    have, left = set(bound), list(range(run))
    while left:
        ties = [(t, i) for i in left for t in (_tie(els[i], have),) if t is not None]
        _, best = min(ties)
        if _guarded_vars(els[best]) & (have ^ written[best]):
            return None
        order.append(best)
        left.remove(best)
        have |= _binds(els[best])
    return None if order == list(range(run)) else order


def joined(m, els: tuple, order: list[int], b: dict) -> Iterator[dict]:
    """The bindings matcher ``m`` finds for ``els`` with its leading node patterns searched in
    ``order``, sorted back into the written search's order (by the node each pattern picked, in
    written order) with their variables listed as the written search lists them."""
    run, picked, found = len(order), [0] * len(order), []

    def search(k: int, b: dict) -> None:
        m.tick()
        if k == run:
            for tail in m.elements_from(els, run, b):
                found.append((tuple(picked), tail))
            return
        i = order[k]
        for n, b2 in m.node_matches(els[i], b):
            picked[i] = n
            search(k + 1, b2)
    search(0, b)
    found.sort(key=lambda f: f[0])
    rank = written_rank(els, b)
    for _, bound in found:
        yield {k: bound[k] for k in sorted(bound, key=rank.__getitem__)}


def written_rank(els: tuple, b: dict) -> dict[str, int]:
    """Each variable's place in the order the written search binds them (the given bindings first,
    then first appearance in the text), so planned bindings list their variables the same way."""
    rank = {k: i for i, k in enumerate(b)}
    for v in _text_vars(els):
        rank.setdefault(v, len(rank))
    return rank


def read_once(els: tuple, what: str, derive) -> Any:
    """``derive(els)`` for a rule's :match elements, kept on them under ``what`` (see
    :func:`cbrules.sexpr.derived`): the engine asks about the same rule text at every search."""
    memo = derived(els)
    if what not in memo:
        memo[what] = derive(els)
    return memo[what]


def _text_vars(els: tuple) -> list[str]:
    return read_once(els, "text_vars", lambda els: list(dict.fromkeys(v for e in els for v in variables(e))))


def _requirements(els: tuple) -> list[tuple[str, list]]:
    """Each node pattern's op and the literal attribute values it needs (see absent_requirement)."""
    return [(e.head(), list(known_values(pattern_parts(e)[1], {}))) for e in els
            if isinstance(e, SList) and e.head() not in RELATIONS and e.head() not in (None, "_")]


def absent_requirement(els: tuple, m) -> bool:
    """Whether matcher ``m``'s graph lacks what a match of ``els`` needs: every match binds a node to
    each node pattern of ``els`` itself (not one inside a relation), so a pattern whose op, or a
    literal value one of its attributes must have, no node of the graph has (by ``m``'s op and
    attribute indexes) rules out every match without a search."""
    index = m.by_op()
    for op, values in read_once(els, "requirements", _requirements):
        if not index.get(op):
            return True
        for path, v in values:
            if m.attr_index().lookup(op, path, v) == []:
                return True
    return False


# relations whose answer depends only on nodes their inner pattern names (plus what is bound):
# relation -> index of that pattern; the others read order, effects or any node ("_")
_INNER_PATTERN = {"no": 1, "nearest": 2, "count": 2, "sum": 3, "collect": 3}


def watched_ops(match: tuple, guards: tuple) -> Optional[frozenset]:
    """The ops whose nodes decide what ``match`` and ``guards`` find, or None when any change may
    (a ``_`` pattern, or a relation on sibling order or effects). A rule whose watched ops no
    application has touched since it last found nothing new finds nothing new again: the engine
    does not match it again (the incremental part of matching)."""
    ops: set[str] = set()
    for e in match:
        head = e.head()
        if head == "distinct":
            continue
        if head in RELATIONS:
            if head not in _INNER_PATTERN:
                return None
            e = e.items[_INNER_PATTERN[head]]
            if head == "sum":
                ops.add("for")  # trip counts of the loops between
            head = e.head() if isinstance(e, SList) else "_"
        if head is None or head == "_":
            return None
        ops.add(head)
    if "provably-" in " ".join(map(str, guards)):  # egglog decides under every loop's range
        ops |= {"for", "kernel"}
    return frozenset(ops)
