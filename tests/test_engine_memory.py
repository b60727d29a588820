"""What the engine remembers between applications (engine.REMEMBER: the graph's kept effects, sibling
orders and resource and op indexes, which rules may have news, the attribute tables, anchored matching)
decides how much it matches, never what it does: with it off, every batch matches every rule on the whole
graph read afresh. Over every built-in kernel (and its warp-specialized, FP8, persistent and ping-pong
variants) and the synthetic families, the lowered graph is the same node for node, and where the trace
is kept the applications are the same, in the same order, with the same bindings."""
import pytest

from cbrules import api
from cbrules.kernels import KERNELS
from cbrules.kernels.attention import attention
from cbrules.kernels.matmul_tc import matmul_tc
from cbrules.rewrite import engine
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


def test_the_same_late_matches_with_and_without_the_engines_memory(tmp_path, monkeypatch):
    """Rules that find matches only after a later rule made them (test_anchors' LATE_MATCHES: what the
    anchored search and the rules' news must not miss), on the synthetic loops."""
    from cbrules.rewrite import rulefile
    from rulekit import write_rules
    from test_anchors import LATE_MATCHES
    write_rules(tmp_path / "rules", LATE_MATCHES)
    rules = rulefile.load([tmp_path / "rules"])

    def applications(remember):
        with monkeypatch.context() as m:
            m.setattr(engine, "REMEMBER", remember)
            trace = engine.lower(synthetic("many loops", 48).graph, rules, debug=True, time_limit=None,
                                 stop_after_phase="p").trace
        return [(r.rule, r.bindings) for r in trace.records]
    without = applications(False)
    assert [rule for rule, _ in without].count("mark") == 3
    assert applications(True) == without


def test_the_memory_is_what_the_switch_turns_off(monkeypatch):
    """Off, the engine keeps no derived facts on its copy and runs no anchored matching (so the test above
    compares two different ways of matching, not one twice)."""
    kept = []
    real = engine.KernelGraph.keep_derived

    def spy(self, keep=True):
        kept.append(keep)
        return real(self, keep)
    monkeypatch.setattr(engine.KernelGraph, "keep_derived", spy)
    for remember in (True, False):
        kept.clear()
        with monkeypatch.context() as m:
            m.setattr(engine, "REMEMBER", remember)
            api.lower(CASES["single_dim_unswitch S=3"]())
        assert (True in kept) == remember
