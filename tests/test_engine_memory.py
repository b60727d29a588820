"""What the engine remembers between applications (cbrules.rewrite.memory; engine.REMEMBER: the kept
effects, sibling orders and resource and op indexes of its private copy, which rules may have news, the
attribute tables, anchored matching) decides how much it matches, never what it does: with it off, every
batch matches every rule on the whole graph read afresh. Over every built-in kernel (and its
warp-specialized, FP8, persistent and ping-pong variants) and the synthetic families, the lowered graph
is the same node for node, and where the trace is kept the applications are the same, in the same
order, with the same bindings; rules whose matches appear only after later applications find them
both ways; and at the end of a lowering the memory's answers are those of the graph read afresh."""
import pytest

from cbrules import api
from cbrules.kernels import KERNELS
from cbrules.kernels.attention import attention
from cbrules.kernels.matmul_tc import matmul_tc
from cbrules.ir import order
from cbrules.rewrite import engine, memory
from synthetic import synthetic


def _built(name, **options):
    spec = KERNELS[name]
    return spec.build(spec.default_shape, **(options if spec.pipelined else {}))


CASES = {f"{name} S=3": (lambda name=name: _built(name, stages=3)) for name in KERNELS}
CASES.update({f"{name} warp-specialized": (lambda name=name: _built(name, stages=2, warp_specialize=True))
              for name in KERNELS if KERNELS[name].pipelined})
CASES.update({
    "attention D=128 causal WS": lambda: attention(head_dim=128, causal=True, warp_specialize=True),
    "attention D=256 persistent": lambda: attention(head_dim=256, warp_specialize=True, persistent=132),
    "attention D=64 FP8 WS causal": lambda: attention(head_dim=64, dtype="float8_e4m3", causal=True,
                                                      warp_specialize=True),
    "matmul_tc FP8": lambda: matmul_tc(dtype="float8_e4m3", warp_specialize=True, registers=(40, 232)),
    "matmul_tc ping-pong": lambda: matmul_tc(pingpong=True, persistent=132, warp_specialize=True, stages=3),
    "many loops": lambda: synthetic("many loops", 96),
    "long body": lambda: synthetic("long body", 200),
})
TRACED = ("single_dim_unswitch S=3", "two_pass warp-specialized", "matmul_tc warp-specialized",
          "attention D=128 causal WS", "attention D=64 FP8 WS causal", "many loops")


def _lowered(build, remember: bool, monkeypatch, debug: bool = False):
    with monkeypatch.context() as m:
        m.setattr(engine, "REMEMBER", remember)
        return api.lower(build(), debug=debug, time_limit=None)


def _graph(kg) -> tuple:
    """The lowered graph node for node: each node's attributes and every edge with its kind."""
    nodes = tuple((n, dict(kg[n])) for n in sorted(kg.nodes()))
    edges = tuple(sorted((a, b, d["kind"]) for a, b, d in kg.g.edges(data=True)))
    return nodes, edges, dict(kg.kernel())


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_same_lowered_graph_with_and_without_the_engines_memory(name, monkeypatch):
    build = CASES[name]
    assert _graph(_lowered(build, False, monkeypatch)) == _graph(_lowered(build, True, monkeypatch))


@pytest.mark.parametrize("name", TRACED)
def test_the_same_applications_with_and_without_the_engines_memory(name, monkeypatch):
    def applications(remember):
        trace = _lowered(CASES[name], remember, monkeypatch, debug=True).trace
        return [(r.step, r.rule, r.bindings, r.created, r.erased, r.changed) for r in trace.records]
    without = applications(False)
    assert len(without) >= 20
    assert applications(True) == without


# mark: anchored at each loop, it finds nothing until tag has fired, then one match in each loop that
# tag touched (three of the six)
LATE_MATCHES = """(phases p)
(graph-rule mark :phase p :match ((for ?L) (load ?r :in ?L :tag "late")) :rewrite ((set ?r :tag "done")))
(graph-rule tag :phase p :after (mark) :match ((for ?L :var ?i) (load ?r :in ?L :tag (absent)))
  :where ((or (= ?i "j0") (= ?i "j2") (= ?i "j4"))) :rewrite ((set ?r :tag "late")))
"""
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
LATE = {"late matches": (LATE_MATCHES, ["tag"] * 3 + ["mark"] * 3),
        "outside news": (OUTSIDE_NEWS, ["touch"] * 6 + ["ready"] + ["use"] * 6)}


@pytest.mark.parametrize("case", sorted(LATE))
def test_the_same_late_matches_with_and_without_the_engines_memory(tmp_path, monkeypatch, case):
    """Rules that find matches only after a later rule made them, on the synthetic loops: an anchored
    rule matched again at the loops another rule touched since (late matches), and one whose outside
    pattern a node comes to match, which sends it back to the whole graph (outside news). What the
    anchored search and the rules' news must not miss, found in the order the whole-graph search
    finds it."""
    from cbrules.rewrite import rulefile
    from rulekit import write_rules
    text, expected = LATE[case]
    write_rules(tmp_path / "rules", text)
    rules = rulefile.load([tmp_path / "rules"])
    assert all(r.anchor is not None for r in rules.rules if r.name in ("mark", "use"))

    def applications(remember):
        with monkeypatch.context() as m:
            m.setattr(engine, "REMEMBER", remember)
            trace = engine.lower(synthetic("many loops", 48).graph, rules, debug=True, time_limit=None,
                                 stop_after_phase="p").trace
        return [(r.rule, r.bindings) for r in trace.records]
    without = applications(False)
    assert [rule for rule, _ in without] == expected
    assert applications(True) == without


def test_the_memory_is_what_the_switch_turns_off(monkeypatch):
    """Off, the engine's memory keeps nothing of its copy and no anchored matching runs (so the tests
    above compare two different ways of matching, not one twice)."""
    made = []
    real = memory.Memory.__init__

    def spy(self, kg, remember=True):
        made.append(remember)
        real(self, kg, remember)
    monkeypatch.setattr(memory.Memory, "__init__", spy)
    for remember in (True, False):
        made.clear()
        with monkeypatch.context() as m:
            m.setattr(engine, "REMEMBER", remember)
            api.lower(CASES["single_dim_unswitch S=3"]())
        assert made == [remember]


def _fresh_resources(kg, scope) -> tuple[dict, dict]:
    users: dict = {}
    writers: dict = {}
    for c in kg.children(scope):
        reads, writes = kg.effects(c)
        for r in reads | writes:
            users.setdefault(r, set()).add(c)
        for r in writes:
            writers.setdefault(r, set()).add(c)
    return users, writers


@pytest.mark.parametrize("name", ["single_dim S=3", "two_pass S=3", "matmul_tc warp-specialized", "many loops"])
def test_what_the_memory_answers_is_what_the_graph_read_afresh_answers(name, monkeypatch):
    """At the end of a lowering the memory's answers about its copy (every node's effects, every
    scope's sibling order and resource index, the nodes by op) are those of the graph read afresh:
    what it kept and grew instead of reading again is true, also where the lowered graph would not
    show it."""
    checked = []
    done = engine._Run._done

    def check_then_done(self, kg):
        mem = self.memory
        assert mem is not None and mem.kg is kg
        assert mem.by_op() == kg.by_op()
        for n in kg.nodes():
            assert tuple(map(frozenset, mem.effects(n))) == tuple(map(frozenset, kg.effects(n))), kg.describe(n)
            if kg.is_scope(n):
                assert mem.sibling_order(n) == order.sibling_order(kg, n), kg.describe(n)
                users, writers = mem.sibling_resources(n)
                fresh = _fresh_resources(kg, n)
                assert ({r: c for r, c in users.items() if c}, {r: c for r, c in writers.items() if c}) == fresh, \
                    kg.describe(n)
        checked.append(len(kg))
        return done(self, kg)
    monkeypatch.setattr(engine._Run, "_done", check_then_done)
    lowered = engine.lower(CASES[name]().graph, api.load_rules(), simplify=False, time_limit=None)
    assert checked == [len(lowered.graph)] and checked[0] > 30


def test_the_kept_op_index_follows_added_and_removed_nodes():
    """The memory's op index (a lowering asks for it in every batch) answers as a scan of the graph
    does after nodes come and go, and the graph it wraps keeps nothing of it."""
    kg = CASES["single_dim S=3"]().graph.copy()
    mem = memory.Memory(kg)
    assert mem.by_op() == kg.by_op()
    loop = kg.nodes("for")[0]
    added = [mem.add("syncthreads", loop, {}) for _ in range(3)]
    mem.remove_nodes([added[1], kg.nodes("load")[0]])
    assert mem.by_op() == kg.by_op() and mem.by_op()["syncthreads"][-2:] == [added[0], added[2]]
    assert set(vars(kg)) == {"g", "_next_id", "trace", "root"}
