"""The engine's matching work grows at most linearly with the graph: counted in matcher search steps
(``Lowered.match_work``: candidates and pattern elements tried), never in seconds."""
import pytest

from benchmarks.compile_times import synthetic
from cbrules import api
from cbrules.rewrite import engine


@pytest.fixture(scope="module")
def rules():
    return api.load_rules()


def work(rules, family: str, nodes: int) -> tuple[int, int]:
    """(nodes as built, matcher steps) of lowering a synthetic kernel without egglog."""
    k = synthetic(family, nodes)
    return len(k.graph), engine.lower(k.graph, rules, simplify=False, time_limit=None).match_work


def assert_linear(small: tuple[int, int], large: tuple[int, int]) -> None:
    (n1, w1), (n2, w2) = small, large
    assert n2 >= 3 * n1, "the sizes must differ enough for a square to show"
    # linear: w2 / w1 <= n2 / n1 (with a quarter of slack); a quadratic matcher would be ~ (n2 / n1) ** 2
    assert w1 > 0 and w2 / w1 <= 1.25 * n2 / n1, f"matching work {w1} -> {w2} for {n1} -> {n2} nodes"


def test_long_body_matching_is_linear(rules):
    """One circular-buffered loop around a chain of elementwise ops: the chain's length must not
    multiply the matcher's work (the rules look up loops, loads and buffers through the op index)."""
    assert_linear(work(rules, "long body", 100), work(rules, "long body", 400))


@pytest.mark.xfail(strict=True, reason="cb-slot-reader, cb-wait-before-first-read and cb-init-barriers join every "
                   "circular-buffered loop with every alloc before the tma_load that ties them: quadratic in the "
                   "number of loops until the matcher orders joins by bound variables (issue 16)")
def test_many_loops_matching_is_linear(rules):
    assert_linear(work(rules, "many loops", 48), work(rules, "many loops", 160))


def test_match_work_counts_the_search(rules):
    """The counter is not a constant: a graph with more loops costs more matching."""
    assert work(rules, "many loops", 48)[1] < work(rules, "many loops", 96)[1]
