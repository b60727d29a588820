"""The rule language's schema: the tables the rule-file reader checks a rule against and the matcher,
the actions and the egglog bridge then rely on.

Reading a rule file needs only these tables, so it loads no egglog, networkx or numpy: the op table
(:mod:`cbrules.ir.ops`), the relations a ``:match`` may use, the actions a ``:rewrite`` may take,
the value functions (:mod:`cbrules.rewrite.values`) and the egglog forms a file may hold.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir.ops import OPS, SCOPES  # noqa: F401  (the op table, public here)
from ..sexpr import Atom, RuleError, derived
from .values import FUNCTIONS, NODE_FUNCTIONS  # noqa: F401  (the value functions, public here)

STRUCTURAL_KEYS = ("in", "child-of")
# relation name -> (positional argument count, required keywords, optional keywords)
RELATIONS: dict[str, tuple[int, tuple[str, ...], tuple[str, ...]]] = {
    "inside": (2, (), ()),          # (inside ?n ?scope): ?n is a descendant of ?scope
    "child": (2, (), ()),           # (child ?n ?scope): ?n is directly in ?scope's body
    "reads": (2, (), ()),           # (reads ?n ?buf): statement ?n (not a scope) reads buffer ?buf
    "writes": (2, (), ()),          # (writes ?n ?buf)
    "first-reader": (1, ("of", "in"), ()),  # the child of ?scope that reads ?buf first
    "last-reader": (1, ("of", "in"), ()),   # ... and last, in schedule order
    "no": (1, (), ("in", "around")),  # (no PATTERN :in ?scope | :around ?n): no node inside / around matches
    "nearest": (2, ("around",), ()),  # (nearest ?x PATTERN :around ?n): ?n or its closest enclosing match
    "count": (2, ("in",), ()),      # (count ?k PATTERN :in ?scope): ?k = number of matches
    "sum": (3, ("in",), ()),        # (sum ?k ATTR PATTERN :in ?scope): ATTR summed over one iteration of ?scope
    "collect": (3, ("in",), ()),    # (collect ?k ATTR PATTERN :in ?scope): ?k = the tuple of the matches' ATTR values
    # order among the children of one scope, in schedule order (the order codegen prints them)
    "next": (2, (), ()),            # (next ?a ?b): ?b runs right after ?a, nothing between them
    "before": (2, (), ()),          # (before ?a ?b): ?a runs before ?b, both children of one scope
    "between": (3, (), ()),         # (between ?a ?b ?x): ?x runs after ?a and before ?b (?a, ?b bound)
    "distinct": (2, (), ()),        # (distinct ?a ?b ...): the variables are bound to different nodes
    "ordered": (2, (), ()),         # (ordered ?a ?b): bound siblings that depends edges order (either way)
    "independent": (2, (), ()),     # (independent ?a ?b): bound siblings no chain of depends edges orders:
                                    # one may be moved into the other without reordering anything
}
VARIADIC_RELATIONS = ("distinct",)  # take their count of positional arguments or more

# action -> (min positional, max positional, allowed keywords, index of the first template argument or None)
ACTIONS: dict[str, tuple[int, Optional[int], tuple[str, ...], Optional[int]]] = {
    "insert-before": (2, None, (), 1), "insert-after": (2, None, (), 1),
    "insert-at-entry": (2, None, (), 1), "insert-at-exit": (2, None, (), 1),
    "erase": (1, 1, (), None), "set": (1, 1, None, None), "set-option": (2, 2, None, None),
    "replace": (2, 2, (), 1), "wrap": (2, 2, (), 1),
    "wrap-body": (2, 2, (), 1),
    "move": (1, 1, ("into", "at", "before"), None), "clone": (1, 1, ("as", "set", "keep", "substitute"), None),
    "add-edge": (2, 2, (), None), "remove-edge": (2, 2, (), None), "let": (2, 2, (), None),
    "rewrite-terms": (3, 3, (), None),
    "fail": (1, None, ("code",), None),
}


# The egglog forms a rule file may hold: declarations only (cbrules.rewrite.egg maps each to the
# egglog command it must parse to and says why each is safe).
EGGLOG_FORMS = ("datatype", "datatype*", "sort", "function", "constructor", "relation", "ruleset", "rewrite",
                "birewrite", "rule")
_RUN = "cbrules runs every ruleset itself after each phase, under node, iteration and time budgets; " \
       "declare the ruleset with (ruleset NAME) and remove this form"
_FILES = "rule files are data and may not read, write or include files; remove this form"
_ACTION = "top-level actions are not allowed; state a fact as a rule with an empty query: (rule () (ACTION))"
_QUERY = "queries and output belong in tests, not in rule files; remove this form"
# The other egglog commands (egglog 13.2), each refused with the fix.
EGGLOG_REFUSED: dict[str, str] = {
    "run": _RUN, "run-schedule": _RUN, "unstable-combined-ruleset": "combined rulesets are not supported; "
    "cbrules runs every declared ruleset in declaration order (`ranges` first)",
    "input": _FILES, "output": _FILES, "include": _FILES,
    "let": _ACTION, "set": _ACTION, "union": _ACTION, "delete": _ACTION, "subsume": _ACTION, "panic": _ACTION,
    "check": _QUERY, "fail": _QUERY, "extract": _QUERY, "simplify": _QUERY, "query-extract": _QUERY,
    "prove": _QUERY, "prove-exists": _QUERY, "print-function": _QUERY, "print-size": _QUERY,
    "print-stats": _QUERY, "push": _QUERY, "pop": _QUERY,
}


@dataclass(frozen=True)
class EggForm:
    """One egglog form: its exact source text and where it starts (1-based line and column)."""

    text: str
    file: str
    line: int
    col: int


def split_keys(items, start: int) -> tuple[list, dict]:
    """Positional items and ``:key value`` pairs of a list, from index ``start``."""
    pos, keys, i = [], {}, start
    while i < len(items):
        x = items[i]
        if isinstance(x, Atom) and x.kind == "kw":
            if i + 1 >= len(items):
                raise RuleError(x.pos, f"keyword :{x.value} has no value")
            keys[x.value] = items[i + 1]
            i += 2
        else:
            pos.append(x)
            i += 1
    return pos, keys


def split_keys_once(e, start: int) -> tuple[list, dict]:
    """:func:`split_keys` of a list of rule text from item ``start`` on, kept on the text (see
    :func:`cbrules.sexpr.derived`): the matcher splits the same patterns for every candidate
    node. The caller must not change what it gets."""
    splits = derived(e).setdefault("split", {})
    got = splits.get(start)
    if got is None:
        got = splits[start] = split_keys(e.items, start)
    return got


def settable(key: str, expr) -> None:
    """``op`` and ``origin`` say what a node is and where it came from: a rule replaces the node instead."""
    if key in ("op", "origin"):
        raise RuleError(expr.pos, f"a rule cannot set :{key} (it says what the node is and where it came "
                        "from); use (replace ?n TEMPLATE) to make a different node")
