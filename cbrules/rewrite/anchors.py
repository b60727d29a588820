"""Anchored rules: the rules whose matches each read only one node's subtree, so that the engine
matches them again only at the nodes an application changed since they last looked.

A rule is anchored when its first ``:match`` element is a node pattern ``(OP ?A ...)`` with no
scope key, and everything after it reads only what is inside ``?A`` (or ``?A`` itself): node patterns
``:in`` or ``:child-of`` ``?A`` or a node bound inside it, relations over such nodes (their order
among siblings inside ``?A``, their effects), and node patterns of other ops with no scope key
("outside" patterns, e.g. the ``alloc`` a loop's buffer names). Its matches at an anchor node then
change only when something inside that node changes (the engine's memory records it, see
:class:`cbrules.rewrite.memory.RuleNews`) or when a node that changed now passes an
outside pattern's op and attribute checks (the engine then matches the whole graph again; a node
that leaves an outside pattern, or goes, only takes matches away). Guards that ask egglog
(``provably-*``) read every loop's range: a rule with one is not anchored.

The matcher enumerates the anchor first, in id order, so the matches at the anchors changed,
taken anchor by anchor in id order, come in the order a whole-graph search gives them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .plan import pattern_parts
from .schema import RELATIONS, STRUCTURAL_KEYS, split_keys_once
from ..sexpr import Atom, Expr, SList, variables


@dataclass(frozen=True)
class Anchor:
    """A rule's anchor pattern: its op and node variable, the ops of its outside patterns, and those
    patterns."""

    op: str
    var: str
    outside: frozenset
    patterns: tuple = field(default=(), repr=False, compare=False)  # the outside node patterns


def _var(x: Expr) -> Optional[str]:
    return x.value if isinstance(x, Atom) and x.kind == "var" else None


def _scope_vars(keys: dict) -> Optional[list[str]]:
    """The variables a node pattern's scope keys name (None when one is not a plain variable)."""
    out = []
    for k in STRUCTURAL_KEYS:
        if k in keys:
            v = _var(keys[k])
            if v is None:
                return None
            out.append(v)
    return out


def anchor_of(match: tuple, guards: tuple) -> Optional[Anchor]:
    """The rule's :class:`Anchor`, or None when a match may read outside one node's subtree."""
    if not match or not isinstance(match[0], SList) or match[0].head() in RELATIONS:
        return None
    op = match[0].head()
    var, keys = pattern_parts(match[0])
    if op in (None, "_") or var is None or _scope_vars(keys) != []:
        return None
    if "provably-" in " ".join(map(str, guards)):
        return None
    inside: set[str] = set()  # variables bound to nodes strictly inside the anchor
    outside: set[str] = set()  # variables bound by outside patterns
    named = set(variables(match[0]))  # every variable named so far (bound or not: a relation binding one is refused)
    ops: set[str] = set()
    patterns: list[SList] = []
    for e in match[1:]:
        if not isinstance(e, SList):
            return None
        head = e.head()
        if head in RELATIONS:
            binds = _relation(e, head, var, inside)
            if binds is None or binds & named:
                return None
            inside |= binds
            named |= set(variables(e))
            continue
        if head is None:
            return None
        v, keys = pattern_parts(e)
        scopes = _scope_vars(keys)
        if scopes is None or v is not None and v in named and not (v == var or v in inside):
            return None
        named |= set(variables(e))
        if v is not None and (v == var or v in inside):
            if scopes and not all(s == var or s in inside for s in scopes):
                return None
            continue  # the attributes of a node already bound inside
        if scopes and all(s == var or s in inside for s in scopes):
            if v is not None:
                inside.add(v)
            continue
        if head == "_" or scopes and any(s == var or s in inside for s in scopes):
            return None
        ops.add(head)  # an outside pattern: a node of its op that changes may change the matches
        patterns.append(e)
        if v is not None:
            outside.add(v)
    return Anchor(op, var, frozenset(ops), tuple(patterns))


def _inner_local(p: Expr, var: str, inside: set[str], around: bool) -> bool:
    """Whether a relation's inner node pattern reads only nodes inside the anchor: its scope keys
    name the anchor or nodes inside it, and it has one when the relation looks ``:around`` a node
    (the node's enclosing scopes, the anchor's own included, are tried too: they never match)."""
    if not isinstance(p, SList) or p.head() in RELATIONS or p.head() is None:
        return False
    _, keys = pattern_parts(p)
    scopes = _scope_vars(keys)
    return scopes is not None and (bool(scopes) or not around) and all(s == var or s in inside for s in scopes)


def _relation(e: SList, head: str, var: str, inside: set[str]) -> Optional[set[str]]:
    """The variables relation ``e`` binds (to nodes inside the anchor), or None when it may read
    outside it (the caller refuses a relation that binds a variable named before)."""
    items = e.items
    scope_ok = (lambda x: (v := _var(x)) is not None and (v == var or v in inside))
    in_ok = (lambda x: _var(x) is not None and _var(x) in inside)
    if head == "distinct":
        return set()
    if head in ("inside", "child"):
        return {_var(items[1])} if len(items) == 3 and _var(items[1]) and scope_ok(items[2]) else None
    if head in ("reads", "writes"):
        return set() if len(items) == 3 and in_ok(items[1]) else None
    if head in ("first-reader", "last-reader"):
        _, keys = split_keys_once(e, 2)
        return {_var(items[1])} if _var(items[1]) and "in" in keys and scope_ok(keys["in"]) else None
    if head in ("no", "nearest", "count", "sum", "collect"):
        at = {"no": 1, "nearest": 2, "count": 2, "sum": 3, "collect": 3}[head]
        if len(items) <= at:
            return None
        _, keys = split_keys_once(e, at + 1)
        if "in" in keys and not scope_ok(keys["in"]) or "around" in keys and not scope_ok(keys["around"]):
            return None
        if not ("in" in keys or "around" in keys) or not _inner_local(items[at], var, inside, "around" in keys):
            return None
        if head == "nearest":
            return {_var(items[1])} if _var(items[1]) else None
        return set()
    if head in ("next", "before"):  # one bound inside: the other is its sibling, inside too
        a, b = (_var(items[1]), _var(items[2])) if len(items) == 3 else (None, None)
        if a is None or b is None or not (a in inside or b in inside):
            return None
        return set() if a in inside and b in inside else {b if a in inside else a}
    if head == "between":
        if len(items) != 4 or not (in_ok(items[1]) and in_ok(items[2])) or _var(items[3]) is None:
            return None
        return {_var(items[3])}
    if head in ("ordered", "independent"):
        return set() if len(items) == 3 and in_ok(items[1]) and in_ok(items[2]) else None
    return None
