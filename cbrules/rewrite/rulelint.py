"""What ``cbrules rules check`` says beyond errors: literal values (also each of a ``(one-of ...)``
or ``(not ...)``) checked against their attribute's type and range, and literal names against what
may reach CUDA (an error, at the literal's position), and two warnings about rules that load but
probably do not do what their author meant:

* two patterns of one op that may bind the same node (nothing says they differ), and
* a rule of the user's that sets an attribute a shipped validation phase has already read (a
  policy phase placed after ``cb-check`` escapes its checks).

Warnings are strings ``file:line:col: warning: ...``; only rules outside the shipped folder get them.
"""
from __future__ import annotations

import difflib
import os
from typing import TYPE_CHECKING, Optional

from ..ir.attributes import ENUM_ATTRS, INT_HIGH, INT_LOWEST, TERM_OR_INT, attribute_problem, ident_keys
from ..ir.ops import OPS
from .schema import split_keys
from ..sexpr import Atom, Expr, RuleError, SList

if TYPE_CHECKING:
    from .rulefile import GraphRule, RuleSet

_WORDS = {"true": True, "false": False, "nil": None}
ORDER_RELATIONS = ("distinct", "next", "before", "between", "inside", "child")


def _literal(e: Expr) -> tuple[bool, object]:
    """(True, value) of a literal atom (a number, text, true/false), else (False, None)."""
    if isinstance(e, Atom):
        if e.kind in ("int", "float", "str"):
            return True, e.value
        if e.kind == "sym" and e.value in ("true", "false"):
            return True, _WORDS[e.value]
    return False, None


def literal_problem(op: str, key: str, value: Expr) -> Optional[RuleError]:
    """The error of a literal ``value`` for attribute ``key`` of an ``op`` node (its type or range
    is wrong), at the literal's position; None for a fine literal or a computed value."""
    if op not in OPS:
        return None
    if isinstance(value, SList) and value.head() in ("one-of", "not"):  # each alternative is a literal to check
        return next((p for p in (literal_problem(op, key, x) for x in value.items[1:]) if p), None)
    is_lit, v = _literal(value)
    if not is_lit:
        return None
    if key in ident_keys(op):  # a name codegen prints: the check a rule action makes when it sets one
        why = attribute_problem(op, key, v)
        return RuleError(value.pos, f"{op} :{key} is a name the CUDA uses: {why}") if why else None
    if (op, key) not in INT_LOWEST and (op, key) not in ENUM_ATTRS:
        return None
    if isinstance(v, str) and (op, key) in INT_LOWEST:
        hint = f"; write {v} without quotes" if v.strip().lstrip("-").isdigit() else ""
        return RuleError(value.pos, f"{op} :{key} takes {_wants(op, key)}, not the text {value}{hint}")
    if (op, key) in ENUM_ATTRS and v not in ENUM_ATTRS[op, key]:
        # (rulecheck's did_you_mean would make an import cycle: rulecheck asks this module)
        close = difflib.get_close_matches(str(v), ENUM_ATTRS[op, key], n=1, cutoff=0.6)
        return RuleError(value.pos, f"{op} :{key} takes {_wants(op, key)}, not {value}"
                         + (f" (did you mean {close[0]!r}?)" if close else ""))
    why = attribute_problem(op, key, v)
    if why:
        return RuleError(value.pos, f"{op} :{key} takes {_wants(op, key)}: {why}")
    return None


def _wants(op: str, key: str) -> str:
    if (op, key) in ENUM_ATTRS:
        return "one of " + ", ".join(f'"{w}"' for w in ENUM_ATTRS[op, key])
    low, many = INT_LOWEST[op, key]
    high = INT_HIGH.get((op, key))
    span = f"an int in {low}..{high}" if high is not None else f"an int >= {low}"
    return ("a tuple of ints >= " + str(low)) if many else span + (" or a term" if (op, key) in TERM_OR_INT else "")


# ------------------------------------------------------------------------------ warnings
def _patterns(r: "GraphRule") -> list[tuple[str, str, SList]]:
    """(op, ?var, pattern) of every top-level node pattern of a rule's :match."""
    out = []
    for el in r.match:
        if isinstance(el, SList) and len(el) > 1 and el.head() in OPS:
            first = el.items[1]
            if isinstance(first, Atom) and first.kind == "var":
                out.append((el.head(), first.value, el))
    return out


def _pinned(p: SList) -> dict[str, object]:
    """The attributes a pattern pins to a literal."""
    _, keys = split_keys(p.items, 2)
    return {k: v for k, (lit, v) in ((k, _literal(x)) for k, x in keys.items()) if lit}


def _related(r: "GraphRule") -> set[frozenset]:
    """Pairs of ?variables a relation keeps apart (distinct, an order relation, inside / child)."""
    pairs = set()
    for el in r.match:
        if isinstance(el, SList) and el.head() in ORDER_RELATIONS:
            vs = [x.value for x in el.items[1:] if isinstance(x, Atom) and x.kind == "var"]
            pairs |= {frozenset((a, b)) for a in vs for b in vs if a != b}
    return pairs


def same_node_warnings(r: "GraphRule") -> list[str]:
    """Two patterns of one op whose ?variables may bind the same node."""
    out, pats, apart = [], _patterns(r), _related(r)
    for i, (op, a, pa) in enumerate(pats):
        for op2, b, pb in pats[i + 1:]:
            if op2 != op or a == b or frozenset((a, b)) in apart:
                continue
            one, two = _pinned(pa), _pinned(pb)
            if any(one[k] != two[k] for k in one.keys() & two.keys()):
                continue  # they pin one attribute to different values: never one node
            out.append(f"{pb.pos}: warning: rule {r.name}: {a} and {b} may bind the same {op} node (nothing in "
                       f":match says they differ); add (distinct {a} {b}) or an order relation such as "
                       f"(before {a} {b}) if they must be two nodes")
    return out


def _sets(r: "GraphRule") -> list[tuple[str, str, Expr]]:
    """(op, key, where) of every attribute a rule's actions set on a node of a known op (templates
    included: a new node's attributes are set too)."""
    ops = {v: op for op, v, _ in _patterns(r)}
    out = []

    def templates(t: Expr) -> None:
        if isinstance(t, SList) and t.head() in OPS:
            pos, keys = split_keys(t.items, 1)
            out.extend((t.head(), k, t) for k in keys if k != "as")
            for c in pos:
                templates(c)
    for a in r.rewrite:
        if not isinstance(a, SList) or not len(a):
            continue
        pos, keys = split_keys(a.items, 1)
        if a.head() == "set" and pos and isinstance(pos[0], Atom) and pos[0].value in ops:
            out.extend((ops[pos[0].value], k, a) for k in keys)
        elif a.head() in ("insert-before", "insert-after", "insert-at-entry", "insert-at-exit", "replace", "wrap"):
            for t in pos[1:]:
                templates(t)
    return out


def _reads(r: "GraphRule") -> set[tuple[str, str]]:
    """(op, key) of every attribute a rule's :match patterns read (``_``: any op)."""
    out = set()
    for el in r.match:
        if isinstance(el, SList) and len(el) > 1 and (el.head() in OPS or el.head() == "_"):
            _, keys = split_keys(el.items, 2)
            out |= {(el.head(), k) for k in keys}
    return out


def _shipped(r: "GraphRule", shipped: str) -> bool:
    return os.path.realpath(r.pos.file).startswith(os.path.realpath(shipped) + os.sep)


def _validates(r: "GraphRule") -> bool:
    """The rule only refuses (``fail``) or adds a launch-time requirement (``:requires``)."""
    def checking(a) -> bool:
        if not isinstance(a, SList) or not len(a):
            return True
        _, keys = split_keys(a.items, 1)
        return a.head() in ("fail", "let") or a.head() == "set" and set(keys) <= {"requires"}
    return all(checking(a) for a in r.rewrite)


def validation_phases(rs: "RuleSet", shipped: str) -> set[str]:
    """Shipped phases all of whose rules validate (``cb-check``): what later phases may rely on."""
    by_phase: dict[str, list] = {}
    for r in rs.rules:
        if _shipped(r, shipped):
            by_phase.setdefault(r.phase, []).append(r)
    return {p for p, rules in by_phase.items() if all(map(_validates, rules))}


def late_settings(rs: "RuleSet", shipped: str) -> list[tuple["GraphRule", str, str, Expr, list]]:
    """(rule, op, key, where, checks) for each user rule that sets ``op`` ``:key`` from a phase that
    runs after a shipped validation phase whose rules ``checks`` read it (at most one key a rule)."""
    order = {p: i for i, p in enumerate(rs.phases)}
    checks: dict[tuple[str, str], list] = {}  # (op, key) -> shipped validating rules that read it
    validating = validation_phases(rs, shipped)
    for r in rs.active():
        if _shipped(r, shipped) and r.phase in validating:
            for read in _reads(r):
                checks.setdefault(read, []).append(r)
    out = []
    for r in rs.active():
        if _shipped(r, shipped) or r.phase not in order:
            continue
        for op, key, where in _sets(r):
            earlier = [c for c in checks.get((op, key), []) + checks.get(("_", key), [])
                       if order.get(c.phase, len(order)) < order[r.phase]]
            if earlier:
                out.append((r, op, key, where, earlier))
                break
    return out


def rechecks(rs: "RuleSet", shipped: str) -> dict[str, tuple[frozenset, list["GraphRule"]]]:
    """Per phase holding user rules that set what a shipped validation rule read before it: (those
    rules' names, the validation rules the engine runs again after the phase, in rule-set order)."""
    setters: dict[str, set] = {}
    again: dict[str, set] = {}
    for r, _, _, _, earlier in late_settings(rs, shipped):
        setters.setdefault(r.phase, set()).add(r.name)
        again.setdefault(r.phase, set()).update(c.name for c in earlier)
    return {p: (frozenset(setters[p]), [c for c in rs.active() if c.name in again[p]]) for p in again}


def placement_warnings(rs: "RuleSet", shipped: str) -> list[str]:
    """User rules that set what a shipped validation phase read, from a phase that runs after it:
    the engine runs those checks again after the phase (e.g. a prefetch policy placed after
    ``cb-check``), but the phase is better declared before the validation."""
    return [f"{where.pos}: warning: rule {r.name} (phase {r.phase}) sets :{key} of a {op} after phase "
            f"{earlier[0].phase} validated it (rule {earlier[0].name} at {earlier[0].at} reads it{_more(earlier)}), "
            f"so the engine runs those checks again after phase {r.phase}; declare the phase "
            f"(phase {r.phase} :before {earlier[0].phase})"
            for r, op, key, where, earlier in late_settings(rs, shipped)]


def _more(rules: list) -> str:
    n = len({c.name for c in rules}) - 1
    return f", and {n} more" if n > 0 else ""


def warnings(rs: "RuleSet", shipped: str) -> list[str]:
    """Every warning about the user's rules in ``rs`` (the shipped rules' own are not reported)."""
    out = [w for r in rs.rules if not _shipped(r, shipped) for w in same_node_warnings(r)]
    return out + placement_warnings(rs, shipped)

