"""Anchored rules (cbrules.rewrite.anchors): which rules the engine matches again only at the nodes an
application touched, and that doing so changes nothing a lowering does."""
import pytest

from synthetic import synthetic
from cbrules import api
from cbrules.kernels import KERNELS
from cbrules.rewrite import engine, rulefile
from cbrules.rewrite.anchors import anchor_of
from cbrules.sexpr import read
from rulekit import write_rules


@pytest.fixture(scope="module")
def rules():
    return api.load_rules()


def anchor(match: str, where: str = "()"):
    a = anchor_of(tuple(read(match)[0].items), tuple(read(where)[0].items))
    return a and (a.op, a.var, sorted(a.outside))


@pytest.mark.parametrize("match, expected", [
    # only the anchor's subtree: scopes, relations over nodes inside it, the anchor's own attributes
    ('((for ?L :part (absent)) (tma_load ?ld :in ?L) (nearest ?P (_ :child-of ?L) :around ?ld) (_ ?P :tag (absent)))',
     ("for", "?L", [])),
    ('((for ?L) (if ?p :child-of ?L) (sum ?k bytes (tma_load) :in ?p) (no (mbarrier_wait) :in ?p))', ("for", "?L", [])),
    ('((if ?p :stage "producer") (_ ?x :in ?p :stage (absent)))', ("if", "?p", [])),
    ('((for ?L) (load ?a :in ?L) (before ?a ?b))', ("for", "?L", [])),
    # an outside pattern: the engine matches everything again when a node of its op changes
    ('((for ?L) (alloc ?a :buf ?buf) (tma_load :dst ?buf :in ?L))', ("for", "?L", ["alloc"])),
    # read outside the anchor: not anchored
    ('((for ?L) (_ ?x :tag "t"))', None),                       # any op, anywhere
    ('((for ?L) (nearest ?P (for :part "x") :around ?L))', None),  # the anchor's enclosing scopes
    ('((for ?L) (before ?L ?x))', None),                        # the anchor's siblings
    ('((for ?L) (load ?a :in ?L) (before ?a ?L))', None),
    ('((for ?L) (for ?M :part "p") (no (if) :in ?M))', None),   # inside an outside node
    ('((for ?L) (load ?a :in ?L) (reads ?x "buf"))', None),     # every node of the graph
    ('((_ ?n :tag "t"))', None),                                # no anchor op
    ('((load ?n :in ?S))', None),                               # an anchor with a scope
    ('((no (for)) (for ?L))', None),                            # a relation first
])
def test_anchor_of(match, expected):
    assert anchor(match) == expected


def test_egglog_guards_are_not_anchored():
    """``provably-*`` asks egglog under every loop's range, which any loop may change."""
    assert anchor("((for ?L) (load ?a :index ?i :in ?L))", "((provably-equal ?i 0))") is None
    assert anchor("((for ?L) (load ?a :index ?i :in ?L))", "((> ?i 0))") == ("for", "?L", [])


def test_shipped_rules_are_mostly_anchored(rules):
    """The circular-buffer rules that look into each loop are anchored at it (what makes matching
    them again after a batch cost the loops it touched)."""
    by_name = {r.name: anchor_of(r.match, r.where) for r in rules.rules}
    for name in ("cb-issue-under-elect-one", "cb-issue-join", "cb-issue-apart", "cb-arrive-expect-tx",
                 "cb-prologue", "cb-main", "cb-epilogue", "cb-rotate-slots"):
        assert by_name[name] is not None and by_name[name].op == "for", name
    assert by_name["cb-stage-buffers"].outside == {"alloc"}
    assert by_name["cb-one-wait-per-stage"] is None  # provably-equal


def applications(k, rules, monkeypatch, anchored: bool, **kw) -> list:
    with monkeypatch.context() as m:
        if not anchored:
            m.setattr(engine, "ANCHORED", False)
        trace = engine.lower(k.graph, rules, debug=True, simplify=False, time_limit=None, **kw).trace
    return [(r.step, r.rule, r.bindings, r.created, r.erased, r.changed) for r in trace.records]


@pytest.mark.parametrize("name", ["many loops", "matmul_tc", "inner_reduction", "persistent", "two_pass",
                                  "single_dim_unswitch"])
def test_anchored_matching_changes_nothing(rules, monkeypatch, name):
    """The same applications, in the same order, with the same bindings, as matching every rule on
    the whole graph each time (what the engine did before)."""
    k = synthetic(name, 64) if name == "many loops" else KERNELS[name].build(KERNELS[name].default_shape)
    whole = applications(k, rules, monkeypatch, anchored=False)
    assert len(whole) >= 20
    assert applications(k, rules, monkeypatch, anchored=True) == whole


# mark: anchored at each loop, it finds nothing until tag has fired, then one match in each loop that
# tag touched (three of the six)
LATE_MATCHES = """(phases p)
(graph-rule mark :phase p :match ((for ?L) (load ?r :in ?L :tag "late")) :rewrite ((set ?r :tag "done")))
(graph-rule tag :phase p :after (mark) :match ((for ?L :var ?i) (load ?r :in ?L :tag (absent)))
  :where ((or (= ?i "j0") (= ?i "j2") (= ?i "j4"))) :rewrite ((set ?r :tag "late")))
"""


@pytest.mark.parametrize("anchored", [False, True])
def test_anchored_rule_finds_what_a_later_batch_made(tmp_path, monkeypatch, anchored):
    """An anchored rule that found nothing is matched again at the loops another rule touched since,
    and finds there every match the whole-graph search finds, in the same order."""
    write_rules(tmp_path / "rules", LATE_MATCHES)
    k = synthetic("many loops", 48)
    got = applications(k, rulefile.load([tmp_path / "rules"]), monkeypatch, anchored, stop_after_phase="p")
    loads = {b["?L"]: b["?r"] for _, rule, b, *_ in got if rule == "tag"}
    assert len(loads) == 3
    assert [(rule, b["?r"]) for _, rule, b, *_ in got] == \
        [("tag", r) for r in loads.values()] + [("mark", r) for r in loads.values()]


def test_a_rule_looks_again_at_a_loop_only_for_ops_it_watches(rules, monkeypatch):
    """An anchored rule looks again at a loop an application changed only when a node of an op it
    watches changed there: the same applications as looking again at every changed loop, and
    there are loops it does not look at again."""
    k = synthetic("many loops", 64)
    skipped = []
    real = engine._Run._changed_for

    def every_change(self, rule, n, since):
        changed = self.changes.changed(n, since, None)
        if changed and not real(self, rule, n, since):
            skipped.append(rule.name)
        return changed
    watched = applications(k, rules, monkeypatch, anchored=True)
    with monkeypatch.context() as m:
        m.setattr(engine._Run, "_changed_for", every_change)
        every = applications(k, rules, monkeypatch, anchored=True)
    assert every == watched and len(watched) >= 100
    assert "cb-stage-buffers-for-most-stages" in skipped


# use: anchored at each loop with an outside pattern (a ready alloc); it finds nothing until ready has
# fired. touch changes every alloc without making one ready (news of the op that gains no match), ready
# makes one alloc ready (news that does): the matches appear then, at every loop, as a whole-graph search
# finds them
OUTSIDE_NEWS = """(phases p)
(graph-rule use :phase p :match ((for ?L) (load ?r :in ?L :tag (absent)) (alloc ?a :tag "ready"))
  :rewrite ((set ?r :tag "used")))
(graph-rule touch :phase p :after (use) :match ((alloc ?a :tag (absent) :stage (absent)))
  :rewrite ((set ?a :stage "seen")))
(graph-rule ready :phase p :after (touch) :match ((alloc ?a :buf "tile3" :tag (absent))) :rewrite ((set ?a :tag "ready")))
"""


@pytest.mark.parametrize("anchored", [False, True])
def test_an_outside_node_that_comes_to_match_sends_the_rule_back_to_the_whole_graph(tmp_path, monkeypatch, anchored):
    write_rules(tmp_path / "rules", OUTSIDE_NEWS)
    k = synthetic("many loops", 48)
    got = applications(k, rulefile.load([tmp_path / "rules"]), monkeypatch, anchored, stop_after_phase="p")
    assert [rule for _, rule, *_ in got] == ["touch"] * 6 + ["ready"] + ["use"] * 6
    if anchored:
        whole = applications(k, rulefile.load([tmp_path / "rules"]), monkeypatch, False, stop_after_phase="p")
        assert got == whole
    assert anchor_of(rulefile.load([tmp_path / "rules"]).rules[0].match, ()).outside == {"alloc"}
