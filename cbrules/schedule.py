"""Scheduler: turn the kernel graph into a linear program (one ordered body per scope).

Order among siblings is the graph layer's (:mod:`cbrules.ir.order`: depends edges, ties broken by
node id), so the schedule is deterministic. The resulting :class:`Step` tree is the only thing codegen sees.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .ir.graph import KernelGraph
from .ir.order import ScheduleError, linear_order, sibling_edges, sibling_order  # noqa: F401  (public here too)


@dataclass(frozen=True)
class Step:
    """One statement of the linear program; scopes hold their ordered ``body``."""

    node: int
    op: str
    attrs: dict = field(hash=False, compare=False)
    origin: dict = field(hash=False, compare=False)
    body: tuple["Step", ...] = ()

    def walk(self):
        """This step and every step inside it, in program order."""
        yield self
        for s in self.body:
            yield from s.walk()


def schedule(kg: KernelGraph, scope: Optional[int] = None, edges: Optional[dict] = None) -> Step:
    """Linearise the graph (or the subtree at ``scope``) into a :class:`Step` tree."""
    edges = sibling_edges(kg) if edges is None else edges
    n = kg.root if scope is None else scope
    body = tuple(schedule(kg, c, edges) for c in sibling_order(kg, n, edges)) if kg.is_scope(n) else ()
    d = kg[n]
    return Step(n, d["op"], kg.attrs(n), dict(d.get("origin", {})), body)


def print_program(step: Step, indent: int = 0, ids: bool = False) -> str:
    """A readable listing of the linear program (for debugging and tests); ``ids`` starts each
    line with its node's ``#id``."""
    keys = {k: v for k, v in step.attrs.items() if k not in ("params", "symbols")}
    line = "  " * indent + (f"#{step.node} " if ids else "") + f"{step.op} " + \
        " ".join(f"{k}={_fmt(v)}" for k, v in keys.items())
    return "\n".join([line.rstrip()] + [print_program(s, indent + 1, ids) for s in step.body])


def _fmt(v: Any) -> str:
    """Terms as their text, containers through their items (never a Python repr such as ``Term('i')``)."""
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    return str(v)
