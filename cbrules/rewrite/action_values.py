"""The values rewrite actions set, checked before they reach the graph: terms where an attribute takes
terms, names and numbers codegen can print, and a size bound that stops a rule feeding its own output
back; plus term replacement and how a bound value is shown in a ``fail`` message."""
from __future__ import annotations

from typing import Any

from ..ir.graph import KernelGraph
from ..ir.terms import MAX_TERM_DEPTH, MAX_TERM_PARTS, Term, as_term, extent
from ..ir.attributes import attribute_problem
from ..sexpr import RuleError
from .values import NodeRef

# values a rule sets: the shipped rules' largest term has 27 nodes and is 7 deep
MAX_VALUE_SIZE = MAX_TERM_PARTS  # what verify takes
VALUE_PARTS_PER_NODE = 16
MAX_VALUE_DEPTH = MAX_TERM_DEPTH  # what verify takes


def replace_term(t: Any, frm: Term, to: Term) -> Any:
    """``t`` with every occurrence of the subterm ``frm`` replaced by ``to``."""
    if not isinstance(t, Term):
        return t
    if t.op == frm.op and t == frm:
        return to
    if not t.args:
        return t
    args = [replace_term(x, frm, to) for x in t.args]
    for a, b in zip(args, t.args):
        if a is not b:
            return Term(t.op, tuple(args), t.value)
    return t  # unchanged: the same object, so that the caller's comparison costs nothing


def coerce(spec, key: str, value: Any) -> Any:
    """Values of term attributes become terms (tuples of them for coordinates)."""
    if key not in spec.terms:
        return value
    return tuple(as_term(x) for x in value) if isinstance(value, tuple) else as_term(value)


def check_printable(op: str, key: str, value: Any, expr) -> None:
    """Refuse, at the rule's own text, a name or number codegen could not print safely (verify
    would catch it after the phase, but could name only the node, not the action that set it)."""
    bad = attribute_problem(op, key, value)
    if bad:
        raise RuleError(expr.pos, f"{op} :{key}: {bad}")


def check_bounded(key: str, value: Any, expr, nodes: int) -> None:
    """Refuse a value a rule built that is too large to print, hash or simplify: a rule that feeds
    its own output back (``(set ?L :stop (+ ?n ?n))`` once a new node) doubles it each time."""
    if value is None or isinstance(value, (bool, int, float)):
        return  # one part, one level: within every bound
    if isinstance(value, str) and len(value) < MAX_VALUE_SIZE:
        return  # one level, fewer parts than any bound (most values a rule sets are names)
    if isinstance(value, Term):  # the figures it keeps: within the smallest bound, no walk
        parts, height = extent(value)
        if parts <= MAX_VALUE_SIZE and height <= MAX_VALUE_DEPTH:
            return
    # terms share subterms: count each tree node, visit each object once (a term keeps its figures)
    n, bound = _size(value, 0, {}, _TooDeep(expr, key)), MAX_VALUE_SIZE + VALUE_PARTS_PER_NODE * nodes
    if n > bound:
        raise RuleError(expr.pos, f"{_what(key)} would be a value of {n} parts (term nodes, characters, elements), more "
                        f"than {bound} for a graph of {nodes} nodes; a rule probably grows it each time it fires: "
                        "guard the rule")


def _what(key: str) -> str:
    """An attribute (``:stop``) or a let's variable (``(let ?t ...)``), as the rule writes it."""
    return f"(let {key} ...)" if key.startswith("?") else f":{key}"


class _TooDeep:
    """The error for a value nested past MAX_VALUE_DEPTH, made when raised (an object, not a closure:
    a closure that refers to itself is a reference cycle, and lowering runs with the cycle collector
    off, so each of the tens of thousands of values checked would stay in memory until it ends)."""

    __slots__ = ("expr", "key")

    def __init__(self, expr, key: str):
        self.expr, self.key = expr, key

    def __call__(self) -> RuleError:
        return RuleError(self.expr.pos, f"{_what(self.key)} would be a value nested more than {MAX_VALUE_DEPTH} deep; a "
                         "rule probably grows it each time it fires: guard the rule")


def _size(v: Any, depth: int, sizes: dict[int, int], too_deep: _TooDeep) -> int:
    """Parts of value ``v`` (term nodes, characters, elements), each tuple or dict counted once."""
    if depth > MAX_VALUE_DEPTH:
        raise too_deep()
    if isinstance(v, Term):
        parts, height = extent(v)  # no recursion: a term past the bound is counted, then refused
        if depth + height > MAX_VALUE_DEPTH:
            raise too_deep()
        return parts
    if isinstance(v, str):
        return 1 + len(v)
    if not isinstance(v, (tuple, dict)):
        return 1
    if id(v) not in sizes:
        parts = v.values() if isinstance(v, dict) else v
        sizes[id(v)] = 1 + sum(_size(a, depth + 1, sizes, too_deep) for a in parts)
    return sizes[id(v)]


def show_value(v: Any, kg: KernelGraph) -> str:
    return kg.describe(v.id) if isinstance(v, NodeRef) and v.id in kg else str(v)
