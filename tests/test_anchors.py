"""Anchored rules (cbrules.rewrite.anchors): which rules the engine may match again only at the nodes an
application touched. That doing so changes nothing a lowering does (late matches included) is
tests/test_engine_memory.py's."""
import pytest

from cbrules import api
from cbrules.rewrite.anchors import anchor_of
from cbrules.sexpr import read


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
