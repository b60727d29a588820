"""The driver: apply graph rules phase by phase to a fixpoint, then simplify terms with egglog.

Within a phase the first rule (in ``:after``/file order) with matches not applied before fires on
all of them, each match checked again just before it is applied; then matching starts again from
the first rule. A match is identified by the rule and the nodes it bound, so a rule fires once
per set of nodes. Each application rewrites a copy of the graph: a failure leaves the
graph as it was. ``verify()`` runs after each phase; in debug mode the structural checks also run
after each application.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from .actions import Rewriter, RuleFailure
from .graph import BUILTINS, KernelGraph
from .match import Matcher
from .ops import OPS
from .rulefile import GraphRule, RuleSet
from .schedule import ScheduleError
from .sexpr import RuleError
from .terms import Term, evaluate
from .values import NodeRef
from .verify import GraphError

DEFAULT_MAX_STEPS = 10_000


class LoweringError(Exception):
    """Lowering stopped: a rule refused the kernel, failed, or rules kept firing past the bound.
    In debug mode ``trace`` holds what happened up to the failure."""

    trace = None


@dataclass
class Application:
    """One rule application (or one egglog simplification) in the trace."""

    step: int
    rule: str
    at: str
    phase: str
    bindings: dict
    created: list
    erased: list
    changed: list
    seconds: float
    egg: Optional[dict] = None  # egglog report: rule -> matches, for simplification steps


@dataclass
class Trace:
    """What debug mode records: every application, and the graph after each step."""

    initial: KernelGraph
    records: list[Application] = field(default_factory=list)
    graphs: dict[int, KernelGraph] = field(default_factory=dict)
    rules: dict[str, GraphRule] = field(default_factory=dict)


@dataclass
class Lowered:
    graph: KernelGraph
    trace: Optional[Trace]
    steps: int


def _match_key(rule: GraphRule, b: dict) -> tuple:
    return rule.name, tuple(sorted((k, v.id) for k, v in b.items() if isinstance(v, NodeRef)))


def _show(v) -> str:
    return str(v) if not isinstance(v, dict) else "{" + ", ".join(f"{k}: {x}" for k, x in v.items()) + "}"


def lower(kg: KernelGraph, rules: RuleSet, *, debug: bool = False, stop_after: Optional[int] = None,
          max_steps: int = DEFAULT_MAX_STEPS, simplify: bool = True) -> Lowered:
    """Apply ``rules`` to a copy of ``kg``; the input graph is never modified."""
    kg = kg.copy()
    kg.verify()
    trace = Trace(kg.copy(), rules={r.name: r for r in rules.rules}) if debug else None
    try:
        return _lower(kg, rules, trace, debug, stop_after, max_steps, simplify)
    except LoweringError as e:
        e.trace = trace
        raise


def _lower(kg: KernelGraph, rules: RuleSet, trace: Optional[Trace], debug: bool, stop_after: Optional[int],
           max_steps: int, simplify: bool) -> Lowered:
    fired: set = set()
    step = 0
    for phase in rules.phases:
        per_rule: Counter = Counter()
        while True:
            found = _next_batch(kg, rules.in_phase(phase), fired)
            if found is None:
                break
            rule, batch = found
            for b in batch:
                b = _still_matches(kg, rule, b, fired)
                if b is None:
                    continue  # an earlier application of the batch changed what this one matched
                if sum(per_rule.values()) >= max_steps:
                    busy = ", ".join(f"{n} ({c} times)" for n, c in per_rule.most_common(5))
                    raise LoweringError(f"phase {phase!r}: still rewriting after {max_steps} applications; "
                                        f"rules still firing: {busy}. A rule probably re-creates what it matches: "
                                        "add a guard such as (no ...) or an attribute it sets")
                fired.add(_match_key(rule, b))
                step += 1
                per_rule[rule.name] += 1
                kg = _apply(kg, rule, b, step, phase, trace, debug)
                if stop_after is not None and step >= stop_after:
                    return Lowered(kg, trace, step)
        try:
            kg.verify()
        except GraphError as e:
            raise LoweringError(f"after phase {phase!r} the graph is invalid: {e}") from e
        if simplify and rules.egg_forms:
            step += 1
            kg = _simplify(kg, rules, step, phase, trace)
            if stop_after is not None and step >= stop_after:
                return Lowered(kg, trace, step)
    try:
        kg.verify(ready=True)
    except GraphError as e:
        raise LoweringError(f"the lowered kernel cannot be generated: {e}") from e
    return Lowered(kg, trace, step)


def _next_batch(kg: KernelGraph, rules: list[GraphRule], fired: set):
    """The first rule (in order) with matches not applied yet, and all those matches."""
    index = Matcher(kg)  # the graph does not change while we look: one index for every rule
    for rule in rules:
        try:
            batch = [b for b in index.fresh().matches(rule.match, rule.where) if _match_key(rule, b) not in fired]
        except RuleError as e:
            raise LoweringError(f"rule {rule.name} ({rule.at}): {e}") from e
        if batch:
            return rule, batch
    return None


def _still_matches(kg: KernelGraph, rule: GraphRule, b: dict, fired: set) -> Optional[dict]:
    """``b``'s nodes matched again on the current graph (values re-read), unless already applied."""
    nodes = {k: v for k, v in b.items() if isinstance(v, NodeRef)}
    if any(v.id not in kg for v in nodes.values()):
        return None
    try:
        for b2 in Matcher(kg).matches(rule.match, rule.where, nodes):
            if _match_key(rule, b2) not in fired:
                return b2
    except RuleError as e:
        raise LoweringError(f"rule {rule.name} ({rule.at}): {e}") from e
    return None


def _apply(kg: KernelGraph, rule: GraphRule, b: dict, step: int, phase: str, trace: Optional[Trace],
           debug: bool) -> KernelGraph:
    t0 = time.perf_counter()
    # lowering works on a private copy of the user's graph, so a failure (which stops lowering)
    # cannot touch what the user built; debug mode also keeps the graph as it was after each step
    work = kg.copy() if debug else kg
    rw = Rewriter(work, b, {"by": "rule", "rule": rule.name, "at": rule.at, "step": step})
    where = f"rule {rule.name} ({rule.at}), step {step}"
    try:
        rw.run(rule.rewrite)
        if debug:
            work.verify(structure_only=True)
    except RuleFailure as e:
        raise LoweringError(f"{e} [{where}]") from None
    except (RuleError, GraphError, ScheduleError, KeyError, ValueError, TypeError) as e:
        raise LoweringError(f"{where} failed on {', '.join(f'{k}={_show(v)}' for k, v in b.items())}: "
                            f"{e}; lowering stopped and the kernel as built is unchanged") from e
    if trace is not None:
        trace.records.append(Application(step, rule.name, rule.at, phase, {k: _show(v) for k, v in rw.b.items()},
                                         rw.created, rw.erased, sorted(set(rw.changed)), time.perf_counter() - t0))
        trace.graphs[step] = work  # never changed again: the next step works on a copy
    return work


# ---------------------------------------------------------------------------- egglog step
def term_ranges(kg: KernelGraph) -> dict:
    """Inclusive value ranges of names: loop variables from their bounds, builtins from the launch
    shape, symbols (extents) non-negative. A name bound by several loops gets the union."""
    from .egg import Range
    bx, by, bz = kg.kernel()["block"]
    ranges: dict[str, Range] = {f"threadIdx.{a}": Range(0, d - 1) for a, d in zip("xyz", (bx, by, bz))}
    ranges.update({f"blockIdx.{a}": Range(0, None) for a in "xyz"})
    ranges.update({p.name: Range(0, None) for p in kg.params().values() if p.kind == "symbol"})

    def const(t: Term):
        try:
            v = evaluate(t, {})
            return v if isinstance(v, int) and not isinstance(v, bool) else None
        except KeyError:
            return None

    loops: dict[str, list] = {}
    for n in kg.nodes("for"):
        d = kg[n]
        lo = const(d["start"])
        hi = const(d["stop"])
        loops.setdefault(d["var"], []).append(Range(lo, None if hi is None else hi - 1))
    for var, rs in loops.items():
        los = [r.lo for r in rs]
        his = [r.hi for r in rs]
        ranges[var] = Range(None if None in los else min(los), None if None in his else max(his))
    return {k: v for k, v in ranges.items() if k not in BUILTINS or v.lo is not None}


def _simplify(kg: KernelGraph, rules: RuleSet, step: int, phase: str, trace: Optional[Trace]) -> KernelGraph:
    from .egg import simplify
    t0 = time.perf_counter()
    if trace is not None:
        kg = kg.copy()  # the trace holds the graph of the previous step
    sites = []
    for n in kg.nodes():
        d = kg[n]
        for k in OPS[d["op"]].terms:
            v = d.get(k)
            if isinstance(v, Term):
                sites.append((n, k, None, v))
            elif isinstance(v, tuple):
                sites.extend((n, k, i, x) for i, x in enumerate(v) if isinstance(x, Term))
    result = simplify([s[3] for s in sites], term_ranges(kg), rules.egg_forms)
    changed = set()
    for n, k, i, t in sites:
        new = result.terms.get(t, t)
        if new != t:
            changed.add(n)
            if i is None:
                kg[n][k] = new
            else:
                kg[n][k] = kg[n][k][:i] + (new,) + kg[n][k][i + 1:]
    if trace is not None:
        trace.records.append(Application(step, "egglog", "egglog", phase, {}, [], [], sorted(changed),
                                         time.perf_counter() - t0, egg=dict(result.rule_matches)))
        trace.graphs[step] = kg
    return kg
