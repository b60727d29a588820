"""The differential matrix on the CPU: every seed kernel x S in {2,3,4} x every P x both WAR modes,
lowered vs unlowered vs numpy with the barrier protocol checked, over several trip counts each (0 and
those below S included: they run, predicated);
plus fuzzing of shapes and options (a fixed number of examples from a fixed seed)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from cbrules.check import Checker, compare
from cbrules.rewrite.engine import LoweringError
from cbrules.reference.interp import run
from cbrules.kernels import KERNELS, SEED_MATRIX
from cbmatrix import CASES, case_id
from cbrules.ir.limits import TmaLimitError

CHECKER = Checker()  # one for the module: lowered graphs, inputs and unlowered results are cached
# kernels whose trip count is fixed when the kernel is built: every trip count is a fresh lowering
BUILD_TIME_TRIPS = ("single_dim", "single_dim_unroll", "single_dim_unswitch", "persistent")


def trips_for(name: str, stages: int) -> list[int]:
    """Every trip count where a case costs only interpretation (the trip count is a launch-time
    symbol); the required ones (0, S-1, S, S+1, 2S+1) where each costs a lowering or a big grid."""
    required = {0, stages - 1, stages, stages + 1, 2 * stages + 1}
    if name in BUILD_TIME_TRIPS or name == "matmul":
        return sorted(required)
    return sorted(required | set(range(1, stages)) | {2 * stages, 3 * stages, 4 * stages})


# one xdist group per kernel (`-n auto --dist loadgroup`): its cases share CHECKER's unlowered runs and inputs
@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c), marks=pytest.mark.xdist_group(c[0])) for c in CASES])
def test_lowered_matches_unlowered_and_numpy(case):
    name, stages, prefetch, war = case
    spec = KERNELS[name]
    failures = []
    for trips in trips_for(name, stages):
        r = CHECKER.check(spec, trips, stages, prefetch, war)
        if r.status != "ok":
            failures.append(f"trips={trips} shape={r.shape}: {r.detail}")
    assert not failures, "\n".join(failures)


def test_matrix_size():
    """Every (kernel, options) case of the matrix checks 0, S-1, S, S+1 and 2S+1 at least."""
    per_case = {c: trips_for(c[0], c[1]) for c in CASES}
    assert len(CASES) == len(SEED_MATRIX) * 18
    assert all({0, s - 1, s, s + 1, 2 * s + 1} <= set(t) for (_, s, _, _), t in per_case.items())
    assert sum(len(t) for t in per_case.values()) >= 4 * len(CASES)


# ------------------------------------------------------------------------------------------ fuzzing
# The budget is a count, not a clock: every drawn example runs, on a slow machine too (a time cap
# would let the examples past it pass unchecked). under 0.1 s an example on the 2-core CI machine.
FUZZ_EXAMPLES = 200


@st.composite
def fuzz_cases(draw):
    """A kernel, options that may be invalid, and a small shape (plus build-time trip count).

    The trip count is drawn around the stage count (so that most cases run), then a shape with a
    random ragged edge that makes the loop run that often."""
    name = draw(st.sampled_from(SEED_MATRIX))
    stages = draw(st.sampled_from([1, 2, 2, 3, 3, 4, 4, 5]))  # mostly valid, sometimes not
    prefetch = draw(st.one_of(st.none(), st.integers(-stages - 1, stages)))
    war = draw(st.sampled_from(["sync", "mbarrier"]))
    t = max(1, stages + draw(st.integers(-3, 6)))
    trips = t if name in BUILD_TIME_TRIPS else None

    def ragged(unit):  # a length that takes exactly t steps of unit; mostly whole 16-byte rows
        if draw(st.integers(0, 3)):
            return unit * (t - 1) + 4 * draw(st.integers(1, unit // 4))
        return unit * (t - 1) + draw(st.integers(1, unit))
    if name == "single_dim":
        shape = (draw(st.integers(1, 256 * t * 2)),)
    elif name in ("single_dim_unroll", "single_dim_unswitch"):
        shape = (draw(st.integers(1, 1024 * t * 2)),)
    elif name == "persistent":
        shape = (draw(st.integers(1, 3)), 256 * t)
    elif name == "matmul":
        shape = (draw(st.integers(1, 64)), ragged(16))
    elif name == "outer_reduction":
        shape = (8 * (t - 1) + draw(st.integers(1, 8)), draw(st.integers(1, 150).map(lambda q: 4 * q)))
    else:
        shape = (draw(st.integers(1, 6)), ragged(256))
    return name, stages, prefetch, war, trips, shape


def _must_refuse(stages, prefetch, trips) -> str:
    """The code of the refusal these options must meet, or '' if they are valid."""
    if stages < 2:
        return "few-stages"
    if prefetch is not None and not -stages <= prefetch < stages:
        return "prefetch-range"
    return ""  # any trip count runs (fewer than S too)


def fuzz_one(case) -> str:
    """Check one fuzz case; returns how it ended ("clean", "refused: ...", "TmaLimitError")."""
    name, stages, prefetch, war, trips, shape = case
    spec = KERNELS[name]
    real_trips = trips if trips is not None else spec.trips(shape)
    expect = _must_refuse(stages, prefetch, real_trips)
    try:
        prog = CHECKER.lower(spec, shape, trips, stages, prefetch, war)
    except LoweringError as e:
        assert e.rule and e.rule.startswith("cb-"), str(e)
        assert expect, f"valid options refused: {e}"
        assert e.code == expect, (e.code, str(e))
        return f"refused: {expect}"
    assert expect == "", f"lowering accepted options that {expect} must refuse"
    args = CHECKER.inputs(spec, shape)
    try:
        got = run(prog, args)
    except TmaLimitError as e:
        assert "stride" in str(e) and shape[-1] % 4, str(e)  # rows of N floats with N % 4 != 0
        return "TmaLimitError"
    before = CHECKER.unlowered(spec, shape, trips)
    problems, _, _ = compare(spec, shape, args, got, before)
    assert not problems, problems
    for out in spec.outputs:
        assert not np.isnan(got[out]).any()
    return "clean"


@seed(20261130)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(fuzz_cases())
def test_fuzz_shapes_and_options(case):
    """Each case lowers and checks clean, or fails with a documented error that its options
    explain: LoweringError naming a cb- rule, or TmaLimitError. Failing examples are
    kept in the saved example database (tests/hypothesis-db) and replayed first."""
    fuzz_one(case)
