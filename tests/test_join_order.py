"""Joined search (rewrite/plan.py): the matcher may search a rule's leading node patterns in another
order, but must find the same bindings, in the same order, with their variables listed the same way
as the search in written order; and the engine skips a rule only when no node it watches changed."""
import pytest

from synthetic import synthetic
from cbrules import api
from cbrules.kernels import KERNELS
from cbrules.rewrite.match import Matcher
from cbrules.rewrite.plan import join_order, watched_ops


@pytest.fixture(scope="module")
def rules():
    return api.load_rules()


def _graphs(kernel):
    """The graph after every step of a debug-mode lowering: each phase's intermediate shapes."""
    trace = api.lower(kernel, debug=True, time_limit=None).trace
    return [trace.initial, *trace.graphs.values()]


@pytest.mark.parametrize("kernel", ["pointwise", "matmul", "many loops"])
def test_joined_search_finds_what_the_written_search_finds(rules, kernel):
    k = synthetic("many loops", 48) if kernel == "many loops" else KERNELS[kernel].build(stages=3, war="mbarrier")
    graphs = _graphs(k)
    joined = 0
    for rule in rules.rules:
        if join_order(rule.match, frozenset()) is None:
            continue
        joined += 1
        for g in graphs[::3]:
            written = [list(b.items()) for b in Matcher(g).matches(rule.match, ())]
            planned = [list(b.items()) for b in Matcher(g, plan=True).matches(rule.match, ())]
            assert planned == written, f"{rule.name} ({rule.at})"
    assert joined >= 3  # the rules that join loops with allocs through their loads, at least


@pytest.mark.parametrize("kernel", ["pointwise", "matmul", "many loops"])
def test_absences_asked_first_from_an_anchor_change_nothing(rules, kernel):
    """A ``(no ...)`` naming only the given bindings is asked before the search (Matcher._absences_hold):
    from every node of the first pattern's op, the planned matcher finds what the written search finds,
    and on some graphs the absence fails (the pre-check is exercised both ways)."""
    from cbrules.rewrite.anchors import anchor_of
    from cbrules.rewrite.values import NodeRef
    k = synthetic("many loops", 48) if kernel == "many loops" else KERNELS[kernel].build(stages=3, war="mbarrier")
    graphs = _graphs(k)
    asked = {True: 0, False: 0}
    for rule in rules.rules:
        anchor = anchor_of(rule.match, rule.where)
        if anchor is None or not any(e.head() == "no" for e in rule.match):
            continue
        for g in graphs[::3]:
            for n in g.nodes(anchor.op):
                b = {anchor.var: NodeRef(n)}
                m = Matcher(g, plan=True)
                asked[m._absences_hold(rule.match, b)] += 1
                written = [list(x.items()) for x in Matcher(g).matches(rule.match, rule.where, b)]
                planned = [list(x.items()) for x in m.matches(rule.match, rule.where, b)]
                assert planned == written, f"{rule.name} ({rule.at}) at #{n}"
    assert asked[True] and asked[False]


def _rule(rules, name):
    return next(r for r in rules.rules if r.name == name)


def test_join_order_ties_the_alloc_through_the_load(rules):
    """(for ?L) (alloc ?a :buf ?buf) (tma_load :dst ?buf :in ?L) (load ... :in ?L): the load in
    the loop first, then the alloc by its buffer name, then the reader."""
    assert join_order(_rule(rules, "cb-slot-reader").match, frozenset()) == [0, 2, 1, 3]


def test_join_order_keeps_a_wildcard_child_where_written(rules):
    """(_ ?O :child-of ?K) is every child of the kernel: no better than the loop pattern before it."""
    assert join_order(_rule(rules, "cb-ws-reject-nested").match, frozenset()) is None


def test_watched_ops(rules):
    r = _rule(rules, "cb-slot-reader")
    assert watched_ops(r.match, r.where) == {"for", "alloc", "tma_load", "load"}
    r = _rule(rules, "cb-tag-producer")  # a "_" pattern: any change may matter
    assert watched_ops(r.match, r.where) is None
    r = _rule(rules, "cb-one-wait-per-stage")  # (before ...) reads sibling order
    assert watched_ops(r.match, r.where) is None


@pytest.mark.parametrize("kernel", ["pointwise", "two_pass", "many loops"])
def test_a_rule_that_needs_an_absent_node_matches_nothing(rules, kernel):
    """``absent_requirement`` rules a rule out only where the search finds nothing: on every
    intermediate graph, for every rule, it is false wherever the rule has a match, and it rules out
    some (the vectorize rules on kernels with no vectorize loop)."""
    from cbrules.rewrite.plan import absent_requirement
    k = synthetic("many loops", 48) if kernel == "many loops" else KERNELS[kernel].build(KERNELS[kernel].default_shape)
    ruled_out = set()
    for g in _graphs(k)[::4]:
        for rule in rules.rules:
            m = Matcher(g, plan=True)
            if absent_requirement(rule.match, m):
                assert next(iter(m.fresh().matches(rule.match, ())), None) is None, rule.name
                ruled_out.add(rule.name)
    assert "vectorize-reads" in ruled_out


def test_absent_requirement_reads_ops_and_literal_values(rules):
    from cbrules.rewrite.plan import absent_requirement
    from cbrules.sexpr import read
    g = KERNELS["pointwise"].build(KERNELS["pointwise"].default_shape).graph
    m = Matcher(g)

    def absent(text):
        return absent_requirement(tuple(read(text)[0].items), m)
    assert not absent('((for ?L) (tma_load ?ld :in ?L))')
    assert absent('((for ?L) (mma ?x :in ?L))')                 # no mma node
    assert absent('((for ?L :kind "vectorize"))')                # no loop of that kind
    assert not absent('((for ?L :kind (not "vectorize")))')      # not a literal
    assert not absent('((for ?L) (no (mma) :in ?L))')            # inside a relation: not required
