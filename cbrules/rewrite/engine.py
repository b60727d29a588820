"""The driver: apply graph rules phase by phase to a fixpoint, then simplify terms with egglog.

egglog runs once, after the last phase (rules that need an index fact before then ask it through
the ``provably-*`` guards, see :class:`cbrules.egg.Oracle`); a graph whose term set and ranges
were simplified before takes the cached result.

Within a phase the first rule (in ``:after``/file order) with matches not applied before fires on
all of them, each match checked again just before it is applied; then matching starts again from
the first rule. A match is identified by the rule and the nodes it bound, so a rule fires once
per set of nodes. A rule looks again only when a node of an op it watches changed since it found
nothing new (:func:`cbrules.rewrite.plan.watched_ops`), and a rule whose matches each read one
node's subtree looks only at the nodes of that op the applications since touched
(:mod:`cbrules.rewrite.anchors`), and only where an application changed a node of an op it
watches; such a match found for a batch is applied without matching it again when nothing of
those ops changed at its node since. Lowering works on a private copy of the user's graph,
so a failure leaves the graph as it was; what the engine remembers about that copy and about the
rules' news between applications is :mod:`cbrules.rewrite.memory`'s (off: ``REMEMBER``). ``verify()`` checks the lowered kernel; a lowering that fails is run again with
``verify()`` after each phase that changed the graph, so the error names the first phase that left
an invalid graph (debug mode and a lowering stopped early check each phase on the first run, and
in debug mode the structural checks also run after each application). A verified graph costs a
full pass per check; checking every phase of every lowering cost more than half the time of a
large kernel, for an answer only a failing lowering needs. ``Lowered.match_work`` counts
the matcher's search steps, the measure of matching cost the scaling tests compare across sizes.

Lowering is bounded: in a phase one rule may fire at most ``RULE_FIRINGS_PER_NODE`` times the
number of nodes the graph had when the phase began, plus ``RULE_FIRINGS_EXTRA`` (the shipped rules
fire at most 0.2 times a node in a phase on every built-in kernel and the synthetic scaling kernels), the
graph may hold at most :func:`graph_bound` nodes of the input's (an application can double it), and
the whole lowering has a wall-time limit (``time_limit``). Each bound ends in a
:class:`LoweringError` naming the phase and the rules still firing or growing the graph.
"""
from __future__ import annotations

import contextlib
import gc
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Optional

import networkx as nx

from .actions import Rewriter, RuleFailure
from .anchors import Anchor
from ..errors import CbrulesError
from ..ir.graph import KernelGraph
from .match import Matcher, MatchTimeout
from .memory import Memory, RuleNews
from .plan import absent_requirement
from .rulefile import GraphRule, RuleSet
from ..ir.order import ScheduleError
from ..sexpr import RuleError
from .simplifier import SIMPLIFIED, oracle_for, simplify_terms, term_ranges  # noqa: F401  (public here too)
from ..ir.terms import Term
from .values import NodeRef
from ..ir.verify import GraphError

RULE_FIRINGS_PER_NODE = 4
RULE_FIRINGS_EXTRA = 64
# The lowered graph may hold at most GRAPH_NODES_PER_INPUT_NODE times the input's nodes plus
# GRAPH_NODES_EXTRA: the firing bound counts applications, and one application that copies a scope
# into itself doubles the graph (the shipped rules grow a built-in kernel at most 8.1 times, a tiny
# one most: 9 nodes to 73).
GRAPH_NODES_PER_INPUT_NODE = 32
GRAPH_NODES_EXTRA = 2000
# the built-in kernels lower in well under a second, 1,000-node synthetic kernels in seconds
DEFAULT_TIME_LIMIT = 60.0
# anchored matching (anchors.py) on; off, every rule is matched on the whole graph each time: the same
# applications in the same order (tests/test_engine_memory.py compares them, with REMEMBER, which turns
# it off too)
ANCHORED = True
# what the engine remembers between applications to match less (memory.py: the kept effects, sibling
# orders, resource and op indexes of its private copy; which rules may have news; the attribute tables;
# anchored matching); off, every batch matches every rule on the whole graph as read afresh: the same
# applications, the same lowered graph, slower (tests/test_engine_memory.py compares the two over
# every built-in kernel)
REMEMBER = True

# what a rule's matching or actions may raise on a graph or bindings it does not expect: reported
# as a LoweringError naming the rule (a hostile rule must not end in a traceback)
_RULE_ERRORS = (RuleError, GraphError, ScheduleError, LookupError, ValueError, TypeError, ArithmeticError,
                AttributeError, RecursionError, nx.NetworkXException)


class LoweringError(CbrulesError):
    """Lowering stopped: a rule refused the kernel, failed, or rules kept firing past the bound.
    In debug mode ``trace`` holds what happened up to the failure. ``code`` is the refusing
    rule's ``(fail :code ...)`` (None for other stops), ``rule`` its name."""

    trace = None
    code: Optional[str] = None
    rule: Optional[str] = None
    timed_out = False  # stopped by the time limit


@dataclass
class Progress:
    """What the lowering running now is doing, for a watcher on another thread (the command line's
    progress line); the engine writes it as it goes, a phase and an application at a time."""

    lowering: bool = False
    phase: str = ""
    step: int = 0
    rule: str = ""

    def describe(self) -> str:
        if not self.lowering:
            return "not lowering"
        return f"lowering: phase {self.phase or '-'}, step {self.step}" + (f" (rule {self.rule})" if self.rule else "")


PROGRESS = Progress()


def graph_bound(nodes: int) -> int:
    """How many nodes the graph may hold while lowering an input of ``nodes`` nodes."""
    return GRAPH_NODES_PER_INPUT_NODE * nodes + GRAPH_NODES_EXTRA


def rule_bound(nodes: int) -> int:
    """How often one rule may fire in one phase on a graph of ``nodes`` nodes at the phase's start."""
    return RULE_FIRINGS_PER_NODE * nodes + RULE_FIRINGS_EXTRA


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
    moved: list = field(default_factory=list)  # nodes given a new place (move, wrap, wrap-body)


@dataclass
class Trace:
    """What debug mode records: every application, and the graph after each step."""

    initial: KernelGraph
    records: list[Application] = field(default_factory=list)
    graphs: dict[int, KernelGraph] = field(default_factory=dict)
    rules: dict[str, GraphRule] = field(default_factory=dict)
    phases: list[str] = field(default_factory=list)  # in the order they ran
    complete: bool = False  # lowering ran to the end (no stop_after, no failure)
    files: list[str] = field(default_factory=list)  # the rule files, in the order they were read
    disabled: dict = field(default_factory=dict)  # rule -> where a (disable RULE) turned it off


@dataclass
class Lowered:
    graph: KernelGraph
    trace: Optional[Trace]
    steps: int
    match_work: int = 0  # matcher search steps (candidates and pattern elements tried): grows with the graph


def _match_key(rule: GraphRule, b: dict) -> tuple:
    return rule.name, tuple(sorted((k, v.id) for k, v in b.items() if isinstance(v, NodeRef)))


def _show(v) -> str:
    return str(v) if not isinstance(v, dict) else "{" + ", ".join(f"{k}: {x}" for k, x in v.items()) + "}"


def lower(kg: KernelGraph, rules: RuleSet, *, debug: bool = False, stop_after: Optional[int] = None,
          time_limit: Optional[float] = DEFAULT_TIME_LIMIT, simplify: bool = True,
          stop_after_phase: Optional[str] = None, _verify_phases: bool = False) -> Lowered:
    """Apply ``rules`` to a copy of ``kg``; the input graph is never modified.

    ``stop_after`` stops after that step, ``stop_after_phase`` once that phase (and its term
    simplification) is done; an unknown phase is a :class:`LoweringError` naming the phases.

    ``time_limit`` (seconds, None for none) bounds the whole lowering; each rule is also bounded
    per phase by :func:`rule_bound`. Either bound, a rule's ``(fail ...)`` or a failed application
    is a :class:`LoweringError`."""
    if stop_after_phase is not None and stop_after_phase not in rules.phases:
        from .rulecheck import did_you_mean
        raise LoweringError(f"no phase {stop_after_phase!r} to stop after" + did_you_mean(stop_after_phase, rules.phases)
                            + f"; the phases are {', '.join(rules.phases)}")
    trace = None
    PROGRESS.lowering, PROGRESS.phase, PROGRESS.step, PROGRESS.rule = True, "", 0, ""
    run = _Run(rules, debug, stop_after, time_limit, simplify)
    run.stop_after_phase = stop_after_phase
    run.verify_phases = _verify_phases or debug or stop_after is not None or stop_after_phase is not None
    try:
        with _no_cycle_collection():
            built, kg = kg, kg.copy()
            kg.verify()
            if debug:
                trace = run.trace = Trace(kg.copy(), rules={r.name: r for r in rules.rules},
                                          phases=list(rules.phases), files=list(rules.files),
                                          disabled=dict(rules.disabled))
            return run.lower(kg)
    except LoweringError as e:
        if not run.verify_phases and not e.timed_out:  # the first phase that left an invalid graph, as a checked run names it
            try:
                lower(built, rules, time_limit=time_limit, simplify=simplify, _verify_phases=True)
            except LoweringError as first:
                raise first from first.__cause__
        e.trace = trace
        raise
    finally:
        PROGRESS.lowering = False


@contextlib.contextmanager
def _no_cycle_collection():
    """Python's cycle collector off while lowering (as it was, after). A graph is a few hundred
    thousand small dicts on a large kernel; lowering allocates enough to start many full
    collections, each walking all of them (a third of the time of a 10,000-node body). Lowering
    makes no cycles that must go before it ends: the collector's next full collection takes them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            # what lowering allocated joins the oldest generation directly (freeze, then unfreeze,
            # moves every tracked object there): enabled as it is, the collector's next young
            # collection walks all of it only to promote it (a tenth of the time of lowering 1,000
            # loops); the oldest generation's collections see it as they would have anyway. Not
            # when the program froze objects itself: unfreezing would hand those back as well
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


class _Run:
    """One lowering: the options, the bounds, and what has fired so far."""

    def __init__(self, rules: RuleSet, debug: bool, stop_after: Optional[int], time_limit: Optional[float],
                 simplify: bool):
        self.rules, self.debug, self.stop_after = rules, debug, stop_after
        self.trace: Optional[Trace] = None  # debug mode: what happened
        self.time_limit, self.simplify = time_limit, simplify
        self.deadline = None if time_limit is None else time.monotonic() + time_limit
        self.fired: set = set()
        self.step = 0
        self.phase = ""
        self.per_rule: Counter = Counter()  # applications of each rule in the current phase
        self.grown: Counter = Counter()  # nodes each rule added (net) in the current phase
        self.input_nodes = 0
        self.by_name: dict[str, GraphRule] = {}
        self.stop_after_phase: Optional[str] = None
        self.match_work = 0
        # anchored rules (see anchors.py; a rule's anchor and watched ops are derived once per rule:
        # GraphRule.anchor, GraphRule.watched)
        self.anchored = ANCHORED and REMEMBER
        self.remember = REMEMBER
        # which rules may have new matches where (incremental and anchored matching read it)
        self.news = RuleNews(frozenset(r.anchor.op for r in rules.rules if r.anchor is not None)
                             if self.anchored else frozenset(), REMEMBER)
        self.memory: Optional[Memory] = None  # the private copy and what is kept of it, while rules run
        # this batch: step -> the nodes touched since, and (step, op) -> those of op, in id order
        self.found: dict = {}
        self.verified = False  # the graph is unchanged since it last passed verify()
        self.verify_phases = True  # verify() after each phase that changed the graph, not only at the end
        self.oracle = oracle_for(tuple(rules.egg_forms)) if rules.egg_forms else None

    def _decider(self, kg: KernelGraph):
        """The ``provably-*`` guards' oracle for this graph: egglog under the graph's range facts
        (computed on the first question; the graph does not change while a matcher looks)."""
        if self.oracle is None:
            return None
        ranges: list = []

        def decide(pred: Term) -> bool:
            if not ranges:
                ranges.append(term_ranges(kg))
            return self.oracle.decide(pred, ranges[0])
        return decide

    def lower(self, kg: KernelGraph) -> Lowered:
        self.verified = True  # lower() verified the copy it hands over
        # every change to the private copy goes through the Rewriter, which tells the memory
        self.memory = Memory(kg, self.remember)
        self.input_nodes = len(kg)
        most = graph_bound(self.input_nodes)
        for phase in self.rules.phases:
            ordered = self.rules.in_phase(phase)  # once a phase: the order does not change while it runs
            self.phase, self.per_rule, self.grown = phase, Counter(), Counter()
            PROGRESS.phase, PROGRESS.rule = phase, ""
            self.by_name = {r.name: r for r in ordered}
            kg, stopped = self._fixpoint(kg, phase, ordered, most)
            if stopped:
                return self._done(kg)
            setters, again = self.rules.rechecks().get(phase, ((), ()))
            fired = sorted(n for n in setters if self.per_rule[n])
            if fired:
                kg, stopped = self._recheck(kg, phase, fired, list(again), most)
                if stopped:
                    return self._done(kg)
            if self.verify_phases and not self.verified:  # a pure check: an unchanged graph passes it again
                self._verify(kg, f"after phase {phase!r} the graph is invalid")
                self.verified = True
            if phase == self.stop_after_phase:
                return self._done(self._simplified(kg))
        kg = self._simplified(kg)
        self._check_time()
        self._verify(kg, "the lowered kernel cannot be generated", ready=True)
        if self.trace is not None:
            self.trace.complete = True
        return self._done(kg)

    def _fixpoint(self, kg: KernelGraph, phase: str, ordered: list[GraphRule], most: int
                  ) -> tuple[KernelGraph, bool]:
        """Apply ``ordered`` (the rules of ``phase``) until none matches anything new: the graph, and
        whether ``stop_after`` stopped it."""
        start_nodes = len(kg)
        bound = rule_bound(start_nodes)
        while True:
            found = self._next_batch(kg, ordered)
            if found is None:
                return kg, False
            rule, batch = found
            at = rule.at  # a path made relative: once a batch, not per application
            for key, b in batch:
                self._check_time()
                still = self._still_matches(kg, rule, b, key)
                if still is None:
                    continue  # an earlier application of the batch changed what this one matched
                key, b = still
                if self.per_rule[rule.name] >= bound:
                    raise self._bound_error(rule, bound, start_nodes)
                self.fired.add(key)
                self.step += 1
                PROGRESS.step, PROGRESS.rule = self.step, rule.name
                self.per_rule[rule.name] += 1
                self.memory.at_step(self.step)
                before = len(kg)
                kg, ops = _apply(self.memory, rule, at, b, self.step, phase, self.trace, self.debug)
                self.grown[rule.name] += len(kg) - before
                if len(kg) > most:
                    raise self._size_error(rule, len(kg), most)
                self.news.applied(self.memory, self.step, ops)
                self.verified = False
                if self.stop_after is not None and self.step >= self.stop_after:
                    return kg, True

    def _recheck(self, kg: KernelGraph, phase: str, setters: list[str], checks: list[GraphRule], most: int
                 ) -> tuple[KernelGraph, bool]:
        """Run the shipped validation rules ``checks`` again after ``phase``, whose user rules
        ``setters`` fired and set what the checks read after they ran: a value they refuse is refused
        now, named with the phase and how to place it, instead of reaching the CUDA unchecked."""
        self.by_name.update((c.name, c) for c in checks)
        try:
            return self._fixpoint(kg, phase, checks, most)
        except LoweringError as e:
            if e.timed_out or e.rule not in {c.name for c in checks}:
                raise
            e.args = (f"{e.args[0]} (checked again after phase {phase}, whose rule {', '.join(setters)} set "
                      f"what phase {self.by_name[e.rule].phase} had validated; declare the phase before it: "
                      f"(phase {phase} :before {self.by_name[e.rule].phase}))", *e.args[1:])
            raise

    def _done(self, kg: KernelGraph) -> Lowered:
        self.memory = None  # the graph handed back is plain: the caller may change it as it likes
        return Lowered(kg, self.trace, self.step, self.match_work)

    def _simplified(self, kg: KernelGraph) -> KernelGraph:
        """``kg`` with its terms simplified by egglog (once a lowering: after the last phase run)."""
        if not (self.simplify and self.rules.egg_forms):
            return kg
        self._check_time()
        self.step += 1
        PROGRESS.step, PROGRESS.rule = self.step, "egglog simplification"
        self.memory = None  # egglog rewrites terms without telling it, and no rule runs after
        try:
            return _simplify(kg, self.rules, self.step, self.phase, self.trace)
        except _RULE_ERRORS as e:
            raise LoweringError(f"simplifying the terms after phase {self.phase!r} failed: {type(e).__name__}: "
                                f"{e}; rules that fired in the phase: {self._firing()}") from e

    def _verify(self, kg: KernelGraph, what: str, ready: bool = False) -> None:
        try:
            kg.verify(ready=ready)
        except GraphError as e:
            raise LoweringError(f"{what}: {e}") from e
        except _RULE_ERRORS as e:  # an attribute a rule set that the checks cannot even read
            raise LoweringError(f"{what}: {type(e).__name__}: {e}; rules that fired in phase {self.phase!r}: "
                                f"{self._firing()}") from e

    # ------------------------------------------------------------------ bounds
    def _firing(self) -> str:
        """The rules that fired in the current phase, most first, with their counts and file:line."""
        busy = [f"{n} ({self.by_name[n].at}) {c} times" for n, c in self.per_rule.most_common(5)]
        more = len(self.per_rule) - len(busy)
        return ", ".join(busy) + (f" and {more} more" if more > 0 else "") if busy else "none yet"

    def _bound_error(self, rule: GraphRule, bound: int, nodes: int) -> LoweringError:
        return LoweringError(
            f"phase {self.phase!r}: rule {rule.name} ({rule.at}) would fire more than {bound} times, the "
            f"bound for a graph of {nodes} nodes ({RULE_FIRINGS_PER_NODE} per node + {RULE_FIRINGS_EXTRA}); "
            f"rules still firing: {self._firing()}. A rule probably re-creates what it matches: add a guard "
            "such as (no ...) or an attribute it sets, and match on it")

    def _size_error(self, rule: GraphRule, nodes: int, most: int) -> LoweringError:
        growers = [f"{n} ({self.by_name[n].at}) +{g}" for n, g in self.grown.most_common(3) if g > 0]
        return LoweringError(
            f"phase {self.phase!r}: rule {rule.name} ({rule.at}) grew the graph to {nodes} nodes at step {self.step}, "
            f"past the bound of {most} for an input of {self.input_nodes} nodes ({GRAPH_NODES_PER_INPUT_NODE} per "
            f"input node + {GRAPH_NODES_EXTRA}); nodes added in the phase: {', '.join(growers)}. A rule probably "
            "copies a scope into itself or into what it matches next: add a guard that stops it")

    def _check_time(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise self._time_error()

    def _time_error(self, matching: Optional[GraphRule] = None) -> LoweringError:
        doing = f" while matching rule {matching.name} ({matching.at})" if matching is not None else ""
        err = LoweringError(
            f"phase {self.phase!r}: lowering ran past its time limit of {self.time_limit:g} s at step "
            f"{self.step}{doing}; rules still firing: {self._firing()}. If the kernel is just large, pass a "
            "larger time_limit to api.lower/engine.lower (None: no limit); otherwise a rule keeps rewriting "
            "or matching without end: add a guard that stops it")
        err.timed_out = True
        return err

    # ------------------------------------------------------------------ matching
    def _next_batch(self, kg: KernelGraph, rules: list[GraphRule]):
        """The first rule (in order) with matches not applied yet, and all those matches."""
        index = Matcher(kg, deadline=self.deadline, decide=self._decider(kg), plan=True,  # the graph does not change while we look
                        attr_tables=self.news.kept_tables(self.step), memory=self.memory)
        self.found = {}
        news = self.news
        for rule in rules:
            if not news.may_have_news(rule):
                continue
            keyed = ((_match_key(rule, b), b) for b in self._search(kg, index, rule))
            batch = [(key, b) for key, b in keyed if key not in self.fired]  # each match's key read once
            news.known[rule.name] = self.step
            if batch:
                return rule, batch
            news.quiet[rule.name] = self.step
        return None

    def _search(self, kg: KernelGraph, index: Matcher, rule: GraphRule) -> Iterator[dict]:
        """``rule``'s matches: on the whole graph (unless a node it needs is missing), or for an
        anchored rule whose outside patterns' ops nothing touched since its matches were last known,
        at the anchors changed since in an op it watches (in
        id order: the order of the whole-graph search; the matches elsewhere are those known then,
        all of them fired or about to be)."""
        since = self.news.known.get(rule.name)
        anchor = rule.anchor if self.anchored else None
        if since is None or anchor is None or self._outside_news(kg, index, anchor, since):
            if not absent_requirement(rule.match, index):
                yield from self._matches(index.fresh(), rule)
            return
        m = index.fresh()
        todo = self.found.get((since, anchor.op))  # rules that last looked at one step share it
        if todo is None:
            op = kg.op
            todo = self.found[since, anchor.op] = sorted(n for n in self._touched_since(since) if op(n) == anchor.op)
        first = rule.match[0]
        for n in todo:
            held = m.attributes_hold(first, n) if self._changed_for(rule, n, since) else None
            if held is not None:  # the anchor's own pattern holds: the search goes on from there
                m.ticks = 0  # _matches adds them up for each anchor
                yield from self._matches(m, rule, held, held=1)

    def _outside_news(self, kg: KernelGraph, m: Matcher, anchor: Anchor, since: int) -> bool:
        """Whether a node that an application touched since step ``since`` now passes an outside
        pattern's op and attribute checks: only such a node can join a match not known then (an
        outside pattern is a plain node pattern, so a node that leaves it, or goes, only takes matches
        away, and a node that did not change matches as it did)."""
        ops = self.news.ops_touched_since(anchor.outside, since)
        if not ops:
            return False
        op = kg.op
        patterns = [p for p in anchor.patterns if p.head() in ops]
        return any(op(n) in ops and any(m.attributes_hold(p, n) is not None for p in patterns)
                   for n in self._touched_since(since))

    def _touched_since(self, since: int) -> list[int]:
        """The nodes the memory's touch log marked after step ``since``, read once a batch (the rules
        that last looked at one step share it)."""
        got = self.found.get(since)
        if got is None:
            got = self.found[since] = self.memory.touched_since(since)
        return got

    def _changed_for(self, rule: GraphRule, n: int, since: int) -> bool:
        """Whether anchored ``rule``'s matches at node ``n`` may differ from those known at step ``since``."""
        return self.news.changed(n, since, rule.watched)

    def _still_matches(self, kg: KernelGraph, rule: GraphRule, b: dict, key: tuple) -> Optional[tuple[tuple, dict]]:
        """``b``'s nodes matched again on the current graph (values re-read), with the match's key
        (``key``: ``b``'s), unless already applied. An anchored rule's match whose anchor no
        application since the batch was found changed in an op the rule watches, and whose outside
        ops none touched, is ``b`` itself (its matches there are as they were)."""
        anchor, since = rule.anchor if self.anchored else None, self.news.known[rule.name]
        if anchor is not None and not self._changed_for(rule, b[anchor.var].id, since) and \
                not self.news.ops_touched_since(anchor.outside, since):
            return (key, b) if key not in self.fired else None
        nodes = {k: v for k, v in b.items() if isinstance(v, NodeRef)}
        if any(v.id not in kg for v in nodes.values()):
            return None
        m = Matcher(kg, deadline=self.deadline, decide=self._decider(kg), plan=True, memory=self.memory)
        keyed = ((_match_key(rule, b2), b2) for b2 in self._matches(m, rule, nodes))
        return next(((k2, b2) for k2, b2 in keyed if k2 not in self.fired), None)

    def _matches(self, m: Matcher, rule: GraphRule, nodes: Optional[dict] = None, held: int = 0) -> Iterator[dict]:
        """``rule``'s matches by ``m`` (starting from ``nodes``; ``held``: see Matcher.matches), its
        failures named, its work counted."""
        try:
            yield from m.matches(rule.match, rule.where, nodes, held)
        except MatchTimeout:
            raise self._time_error(rule) from None
        except _RULE_ERRORS as e:
            raise _rule_error(rule, "matching", e) from e
        finally:
            self.match_work += m.ticks


def _rule_error(rule: GraphRule, doing: str, e: Exception) -> LoweringError:
    if isinstance(e, RuleError):
        return LoweringError(f"rule {rule.name} ({rule.at}): {e}")
    return LoweringError(f"rule {rule.name} ({rule.at}) failed while {doing}: {type(e).__name__}: {e}")


def _apply(memory: Memory, rule: GraphRule, at: str, b: dict, step: int, phase: str, trace: Optional[Trace],
           debug: bool) -> tuple[KernelGraph, set[str]]:
    """Apply ``rule`` with bindings ``b`` to the memory's graph: the graph after (in debug mode a copy,
    the one before kept in the trace), and the ops of the nodes the application touched."""
    t0 = time.perf_counter()
    # lowering works on a private copy of the user's graph, so a failure (which stops lowering)
    # cannot touch what the user built; debug mode also keeps the graph as it was after each step
    work = memory.kg.copy() if debug else memory.kg
    if debug:
        memory.moved_to(work)
    rw = Rewriter(memory, b, {"by": "rule", "rule": rule.name, "at": at, "step": step})
    where = f"rule {rule.name} ({at}), step {step}"
    try:
        rw.run(rule.rewrite)
        if debug:
            work.verify(structure_only=True)
    except RuleFailure as e:
        err = LoweringError(f"{e} [{where}]")
        err.code, err.rule = e.code, rule.name
        raise err from None
    except _RULE_ERRORS as e:
        what = str(e) if isinstance(e, (RuleError, GraphError, ScheduleError)) else f"{type(e).__name__}: {e}"
        raise LoweringError(f"{where} failed on {', '.join(f'{k}={_show(v)}' for k, v in b.items())}: "
                            f"{what}; lowering stopped and the kernel as built is unchanged") from e
    if trace is not None:
        trace.records.append(Application(step, rule.name, at, phase, {k: _show(v) for k, v in rw.b.items()},
                                         rw.created, rw.erased, sorted(set(rw.changed)), time.perf_counter() - t0,
                                         moved=sorted(set(rw.moved))))
        trace.graphs[step] = work  # never changed again: the next step works on a copy
    return work, rw.touched_ops()


def _simplify(kg: KernelGraph, rules: RuleSet, step: int, phase: str, trace: Optional[Trace]) -> KernelGraph:
    t0 = time.perf_counter()
    if trace is not None:
        kg = kg.copy()  # the trace holds the graph of the previous step
    changed, matches = simplify_terms(kg, rules.egg_forms)
    if trace is not None:
        trace.records.append(Application(step, "egglog", "egglog", phase, {}, [], [], sorted(changed),
                                         time.perf_counter() - t0, egg=matches))
        trace.graphs[step] = kg
    return kg
