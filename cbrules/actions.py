"""Rewrite actions: the small, generic vocabulary of a graph rule's ``:rewrite``.

| action | effect |
|---|---|
| ``(insert-before ?n T...)`` / ``(insert-after ?n T...)`` | new nodes from templates right before/after ?n |
| ``(insert-at-entry ?s T...)`` / ``(insert-at-exit ?s T...)`` | new nodes first/last in scope ?s |
| ``(erase ?n)`` | remove ?n and its subtree, keeping the order of what ran around it |
| ``(set ?n :key V ...)`` | set attributes (term attributes take terms) |
| ``(replace ?n T)`` | a new node where ?n was; ?n is erased |
| ``(wrap ?n T)`` | a new scope from template T where ?n was, with ?n moved inside it |
| ``(wrap-body ?s T)`` | a new scope from template T (no children) becomes ?s's only child, holding ?s's former body |
| ``(move ?n :into ?s [:at entry|exit])`` | re-parent ?n |
| ``(clone ?L [:as ?M] [:set (:k V ...)] [:keep P] [:substitute (P NAME TERM)])`` | copy scope ?L right before it, keeping the leaves matching P, substituting NAME by TERM in the kept nodes matching P |
| ``(add-edge ?a ?b)`` / ``(remove-edge ?a ?b)`` | depends edges between siblings |
| ``(let ?x V)`` | bind a value for later actions |
| ``(fail "message {?x}")`` | refuse the kernel with a named error |

A template is ``(OP :key V ... [:as ?x] CHILD-TEMPLATE ...)``; children only for ``for``/``if``.
Placement: at entry a new node precedes every sibling, at exit it follows every sibling; before ?n
it follows ?n's predecessors and precedes ?n, after ?n it follows ?n and precedes ?n's successors.
Against the other siblings it keeps memory order: conflicting effects (RAW/WAR/WAW on registers,
buffers and the sync token) order it by its position in the scope's current schedule.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from .graph import KernelGraph
from .match import Matcher, split_keys
from .ops import OPS, conflicts, nearest_conflicts
from .schedule import sibling_order
from .sexpr import RuleError, SList
from .terms import Term, as_term, substitute
from .values import Env, NodeRef, evaluate

# action -> (min positional, max positional, allowed keywords, index of the first template argument or None)
ACTIONS: dict[str, tuple[int, Optional[int], tuple[str, ...], Optional[int]]] = {
    "insert-before": (2, None, (), 1), "insert-after": (2, None, (), 1),
    "insert-at-entry": (2, None, (), 1), "insert-at-exit": (2, None, (), 1),
    "erase": (1, 1, (), None), "set": (1, 1, None, None), "replace": (2, 2, (), 1), "wrap": (2, 2, (), 1),
    "wrap-body": (2, 2, (), 1),
    "move": (1, 1, ("into", "at"), None), "clone": (1, 1, ("as", "set", "keep", "substitute"), None),
    "add-edge": (2, 2, (), None), "remove-edge": (2, 2, (), None), "let": (2, 2, (), None),
    "fail": (1, None, (), None),
}


class RuleFailure(Exception):
    """A rule's ``(fail ...)``: the kernel asks for something the rules refuse."""


class Rewriter:
    """Applies one rule application's actions to a graph (the engine hands it a copy)."""

    def __init__(self, kg: KernelGraph, bindings: dict, origin: dict):
        self.kg = kg
        self.b = dict(bindings)
        self.origin = origin
        self.created: list[int] = []
        self.erased: list[int] = []
        self.changed: list[int] = []

    def env(self) -> Env:
        return Env(self.b, lambda n: self.kg[n])

    def value(self, e) -> Any:
        return evaluate(e, self.env())

    def node(self, e) -> int:
        v = self.value(e)
        if not isinstance(v, NodeRef) or v.id not in self.kg:
            raise RuleError(e.pos, f"{e} is not a node of the graph (got {v!r})")
        return v.id

    # ------------------------------------------------------------------ driver
    def run(self, actions: tuple) -> None:
        for a in actions:
            head = a.head()
            getattr(self, "_" + head.replace("-", "_"))(a, *a.items[1:])

    # ------------------------------------------------------------------ placement
    def place(self, n: int, scope: int, where: str, anchor: Optional[int] = None) -> None:
        """Put new node ``n`` into ``scope`` at entry/exit, or right before/after ``anchor``.

        entry: before every child; exit: after every child; before / after: next to the anchor.
        Against the other siblings, memory order follows from conflicting effects at that position.
        """
        kg = self.kg
        seq = [c for c in sibling_order(kg, scope) if c != n]
        if n not in kg.children(scope):
            kg.g.add_edge(scope, n, kind="contains")
        # entry/exit: before the siblings nothing precedes / after those nothing follows; the rest
        # is ordered through them (edges stay linear in the number of siblings)
        sibs = set(seq)

        def first(c: int) -> bool:  # no sibling precedes c
            return not any(p in sibs and d["kind"] == "depends" for p, d in kg.g.pred[c].items())

        def last(c: int) -> bool:  # no sibling follows c
            return not any(q in sibs and d["kind"] == "depends" for q, d in kg.g.succ[c].items())

        if where == "entry":
            at, before, after = 0, [], [c for c in seq if first(c)]
        elif where == "exit":
            at, before, after = len(seq), [c for c in seq if last(c)], []
        elif where == "before":
            at, before, after = seq.index(anchor), [], [anchor]
        else:
            at, before, after = seq.index(anchor) + 1, [anchor], []
        for s in before:
            kg.add_depends(s, n)
        for s in after:
            kg.add_depends(n, s)
        preds, succs = nearest_conflicts([kg.effects(s) for s in seq], at, kg.effects(n))
        for i in preds:
            kg.add_depends(seq[i], n)
        for i in succs:
            kg.add_depends(n, seq[i])

    def instantiate(self, t: SList, parent: Optional[int]) -> int:
        """Create the nodes of a template under ``parent`` (not yet ordered among its siblings)."""
        op = t.head()
        pos, keys = split_keys(t.items, 1)
        spec = OPS[op]
        attrs = {}
        for k, v in keys.items():
            if k != "as":
                attrs[k] = _coerce(spec, k, self.value(v))
        n = self.kg.add(op, parent, origin=self.origin, **attrs)
        self.created.append(n)
        if "as" in keys:
            self.b[keys["as"].value] = NodeRef(n)
        kids = [self.instantiate(child, n) for child in pos]  # body of a scope, in program order
        self.kg.order_by_effects(kids)
        return n

    def _insert(self, where: str, target, templates) -> None:
        ref = self.node(target)
        scope = ref if where in ("entry", "exit") else self.kg.parent(ref)
        anchor = None if where in ("entry", "exit") else ref
        if where in ("entry", "after"):
            templates = reversed(templates)  # each new node goes right at the anchor: keep written order
        for t in templates:
            n = self.instantiate(t, None)
            self.place(n, scope, where, anchor)

    def _insert_before(self, a, target, *ts): self._insert("before", target, ts)
    def _insert_after(self, a, target, *ts): self._insert("after", target, ts)
    def _insert_at_entry(self, a, target, *ts): self._insert("entry", target, ts)
    def _insert_at_exit(self, a, target, *ts): self._insert("exit", target, ts)

    # ------------------------------------------------------------------ removal and change
    def detach(self, n: int) -> None:
        """Take ``n`` out of its scope; a predecessor and a successor that conflict stay ordered."""
        preds = [p for p in self.kg.g.predecessors(n) if self.kg.g.edges[p, n]["kind"] == "depends"]
        succs = [s for s in self.kg.g.successors(n) if self.kg.g.edges[n, s]["kind"] == "depends"]
        succ_effects = {s: self.kg.effects(s) for s in succs}
        needed = {(p, s) for p in preds for s in succs if conflicts(self.kg.effects(p), succ_effects[s])}
        g = self.kg.g
        for p in preds:
            g.remove_edge(p, n)
        # skip p -> s where p already precedes another predecessor that will precede s
        for p, s in needed:
            if not any((q, s) in needed and g.has_edge(p, q) and g.edges[p, q]["kind"] == "depends"
                       for q in preds if q != p):
                self.kg.add_depends(p, s)
        for s in succs:
            self.kg.g.remove_edge(n, s)
        parent = self.kg.parent(n)
        if parent is not None:
            self.kg.g.remove_edge(parent, n)

    def _erase(self, a, target) -> None:
        n = self.node(target)
        if n == self.kg.root:
            raise RuleError(a.pos, "cannot erase the kernel node")
        gone = [n, *self.kg.descendants(n)]
        self.detach(n)
        self.kg.g.remove_nodes_from(gone)
        self.erased.extend(gone)

    def _set(self, a, target, *kv) -> None:
        self._set_attrs(self.node(target), kv)

    def _set_attrs(self, n: int, kv) -> None:
        spec = OPS[self.kg.op(n)]
        _, keys = split_keys(kv, 0)
        for k, v in keys.items():
            self.kg[n][k] = _coerce(spec, k, self.value(v))
        if n not in self.created:
            self.changed.append(n)

    def _replace(self, a, target, t) -> None:
        self._insert("before", target, (t,))
        self._erase(a, target)

    def _wrap(self, a, target, t) -> None:
        n = self.node(target)
        kg, g = self.kg, self.kg.g
        parent = kg.parent(n)
        s = self.instantiate(t, None)
        g.add_edge(parent, s, kind="contains")
        # the new scope takes ?n's place: its depends edges move over, then ?n moves inside
        for p in [p for p in g.pred[n] if g.edges[p, n]["kind"] == "depends"]:
            g.remove_edge(p, n)
            kg.add_depends(p, s)
        for q in [q for q in g.succ[n] if g.edges[n, q]["kind"] == "depends"]:
            g.remove_edge(n, q)
            kg.add_depends(s, q)
        g.remove_edge(parent, n)
        if kg.children(s):
            self.place(n, s, "exit")  # after the template's own body
        else:
            g.add_edge(s, n, kind="contains")
        self.changed.append(n)

    def _wrap_body(self, a, target, t) -> None:
        s = self.node(target)
        kg, g = self.kg, self.kg.g
        if not kg.is_scope(s):
            raise RuleError(a.pos, f"wrap-body: {kg.describe(s)} is not a scope")
        if split_keys(t.items, 1)[0]:
            raise RuleError(t.pos, "wrap-body: the template is an empty scope; the body of the target fills it")
        body = kg.children(s)
        new = self.instantiate(t, None)
        # the body keeps its depends edges: its nodes stay siblings, now inside the new scope
        for c in body:
            g.remove_edge(s, c)
            g.add_edge(new, c, kind="contains")
        g.add_edge(s, new, kind="contains")
        self.changed.extend(body)

    def _move(self, a, target, *kv) -> None:
        n = self.node(target)
        _, keys = split_keys(kv, 0)
        scope = self.node(keys["into"])
        where = str(self.value(keys["at"])) if "at" in keys else "exit"
        self.detach(n)
        self.place(n, scope, where)
        self.changed.append(n)

    # ------------------------------------------------------------------ cloning
    def _clone(self, a, target, *kv) -> None:
        src = self.node(target)
        _, keys = split_keys(kv, 0)
        matcher = Matcher(self.kg)
        leaves = {n for n in self.kg.descendants(src) if not self.kg.is_scope(n)}
        kept = leaves if "keep" not in keys else matcher.select(keys["keep"], self.b, src) & leaves
        mapping: dict[str, Term] = {}
        shifted: set[int] = set()
        if "substitute" in keys:
            if len(keys["substitute"]) != 3:
                raise RuleError(keys["substitute"].pos, ":substitute takes (FILTER NAME TERM)")
            pat, var, term = keys["substitute"].items
            mapping = {str(self.value(var)): as_term(self.value(term))}
            shifted = matcher.select(pat, self.b, src) & kept
        parent = self.kg.parent(src)
        new = self._copy(src, kept, mapping, shifted, root=True)
        self.place(new, parent, "before", src)
        if "set" in keys:
            self._set_attrs(new, keys["set"].items)
        if "as" in keys:
            self.b[keys["as"].value] = NodeRef(new)

    def _copy(self, n: int, kept: set, mapping: dict, shifted: set, root: bool = False) -> Optional[int]:
        """Copy ``n``'s subtree: kept leaves, and the scopes holding some (the root always)."""
        kg = self.kg
        inside = [d for d in kg.descendants(n) if d in kept] if kg.is_scope(n) else []
        if not root and (n not in kept if not kg.is_scope(n) else not inside):
            return None
        attrs = kg.attrs(n)
        # a leaf in the substituted set, or an inner scope holding only such leaves, sees the new value
        if n in shifted or (not root and inside and all(d in shifted for d in inside)):
            for k in OPS[kg.op(n)].terms:
                v = attrs.get(k)
                if isinstance(v, Term):
                    attrs[k] = substitute(v, mapping)
                elif isinstance(v, tuple):
                    attrs[k] = tuple(substitute(x, mapping) if isinstance(x, Term) else x for x in v)
        first = kg[n]["origin"]
        source = first.get("source") or (f"{first['rule']} @ {first['at']}" if first.get("rule")
                                         else f"build @ {first.get('where', '?')}")
        new = kg.add(kg.op(n), None, origin={**self.origin, "from": n, "source": source}, **attrs)
        self.created.append(new)
        if not kg.is_scope(n):
            return new
        seq = []
        for c in sibling_order(kg, n):
            cc = self._copy(c, kept, mapping, shifted)
            if cc is not None:
                kg.g.add_edge(new, cc, kind="contains")
                seq.append(cc)
        kg.order_by_effects(seq)  # the copies keep the original's order wherever effects conflict
        return new

    # ------------------------------------------------------------------ edges, bindings, failure
    def _add_edge(self, a, x, y) -> None:
        self.kg.add_depends(self.node(x), self.node(y))

    def _remove_edge(self, a, x, y) -> None:
        u, v = self.node(x), self.node(y)
        if self.kg.g.has_edge(u, v):
            self.kg.remove_depends(u, v)

    def _let(self, a, var, expr) -> None:
        self.b[var.value] = self.value(expr)

    def _fail(self, a, msg, *args) -> None:
        text = re.sub(r"\{(\?[\w-]+)\}", lambda m: _show(self.b.get(m.group(1), m.group(1)), self.kg),
                      str(self.value(msg)))
        raise RuleFailure(text)


def _coerce(spec, key: str, value: Any) -> Any:
    """Values of term attributes become terms (tuples of them for coordinates)."""
    if key not in spec.terms:
        return value
    return tuple(as_term(x) for x in value) if isinstance(value, tuple) else as_term(value)


def _show(v: Any, kg: KernelGraph) -> str:
    return kg.describe(v.id) if isinstance(v, NodeRef) and v.id in kg else str(v)
