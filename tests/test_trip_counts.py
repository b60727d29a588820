"""Any trip count: a circular-buffered loop that runs fewer times than it has stages (0 included)
runs correctly, its prologue's loads past the end predicated off so that every armed barrier is
waited on; `cbrules check` covers trip counts 0..4S for every seed kernel (GPU runs: test_traps_gpu.py)."""
import numpy as np
import pytest

from cbrules import api
from cbrules.check import Checker, trip_counts
from cbrules.ir.builder import Kernel, blockIdx, circular_buffer, threadIdx
from cbrules.kernels import KERNELS, SEED_MATRIX, get
from cbrules.reference.interp import run

CHECKER = Checker(blocks="sample")
VARIANTS = [dict(stages=2), dict(stages=3, war="mbarrier"), dict(stages=2, warp_specialize=True)]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xdist_group(f"trips-{n}")) for n in SEED_MATRIX])
def test_the_checker_runs_every_seed_kernel_for_trip_counts_0_to_4S(name):
    failures = []
    for v in VARIANTS:
        for t in trip_counts(v["stages"]):
            r = CHECKER.check(KERNELS[name], t, v["stages"], None, v.get("war"),
                              warp_specialize=v.get("warp_specialize", False))
            if r.status != "ok":
                failures.append(f"{v} trips={t}: {r.status}: {r.detail}")
    assert not failures, "\n".join(failures)
    assert list(trip_counts(3)) == list(range(0, 13))


def test_short_rows_of_a_wide_tile_run():
    """The issue's case: width 1024, S = 4, rows of N = 128 (one tile, three stages never loaded)."""
    k = get("inner_reduction").factory(stages=4, width=1024)
    rng = np.random.default_rng(1)
    for n in (128, 1000, 2048, 4100):
        x = rng.standard_normal((3, n), dtype=np.float32)
        got = run(api.lower(k), {"x": x, "out": np.full(3, np.nan, np.float32)})["out"]
        np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-4, atol=1e-4)


def counted(stages=3, war=None):
    """``out[t * 256 + x] = 2 * x[...]`` for t < T: a trip count that is a launch parameter of its own,
    so it can be 0 while every tensor has positive extents."""
    k = Kernel("counted", block=256)
    n, trips = k.symbol("N"), k.symbol("T")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    xm = k.tensor_map(x, box=(256,))
    tile = k.alloc("tile", "shared", "float32", (256,))
    k.grid(1)
    with k.loop("t", trips, circular_buffer=circular_buffer(stages, war=war)) as t:
        k.tma_load(xm, (t * 256,), tile)
        with k.if_((t * 256 + threadIdx.x).lt(n)):
            k.store(out, t * 256 + threadIdx.x, k.mul(k.load(tile, threadIdx.x), 2.0))
    return k


@pytest.mark.parametrize("war", ["sync", "mbarrier"])
def test_a_symbolic_trip_count_from_0_to_past_S_runs(war):
    kg = api.lower(counted(3, war))
    assert kg.kernel()["requires"] == ()  # no launch is refused for being short
    x = np.random.default_rng(2).standard_normal(6 * 256, dtype=np.float32)
    for t in range(0, 7):
        got = run(kg, {"x": x, "out": np.full_like(x, np.nan), "T": t})["out"]
        np.testing.assert_array_equal(got[: t * 256], 2 * x[: t * 256])
        assert np.isnan(got[t * 256:]).all()


def test_the_prologue_is_predicated_and_the_main_loop_untouched():
    text = api.generate(get("inner_reduction").build(stages=3)).text
    assert "if (j < cb_ceil_div(N, 256)) {" in text  # prologue: loads past the end are not issued
    assert "for (int j = cb_max(cb_ceil_div(N, 256) - 2, 0);" in text  # epilogue: never a negative tile
    main = text[text.index("// main"):text.rindex("\n", 0, text.index("// epilogue"))]
    assert "cb_max" not in main and "if (j <" not in main
    # a trip count known to cover the prologue keeps it as it was
    assert "if (i <" not in api.generate(get("single_dim").build(stages=3)).text


def test_a_known_short_trip_count_lowers_and_runs():
    spec = get("single_dim")
    kg = api.lower(spec.build(stages=4, tiles_per_block=2))
    x = np.random.default_rng(3).standard_normal(1000, dtype=np.float32)
    got = run(kg, {"x": x, "out": np.full_like(x, np.nan)})["out"]
    np.testing.assert_allclose(got, np.exp(x), rtol=1e-6)
