"""The tile parameters the benchmarks tune, checked on the CPU: lowered, interpreted with the
barrier protocol checked, against numpy (the GPU matrix runs the default tiles)."""
import numpy as np
import pytest

from cbrules import api, interp
from cbrules.kernels import reductions, tiled2d


@pytest.mark.parametrize("stages, prefetch, war", [(2, 0, "sync"), (3, 2, "mbarrier"), (4, 1, "sync")])
def test_narrow_outer_reduction(stages, prefetch, war):
    x = np.random.default_rng(stages).standard_normal((700, 100), dtype=np.float32)
    kg = api.lower(reductions.outer_reduction(stages, prefetch, war, rows=64, cols=32))
    got = interp.run(kg, {"x": x, "out": np.full(100, np.nan, np.float32)})["out"]
    np.testing.assert_allclose(got, x.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("stages, prefetch, war", [(2, 1, "sync"), (3, 0, "mbarrier")])
def test_wide_inner_reduction(stages, prefetch, war):
    x = np.random.default_rng(stages).standard_normal((3, 3000), dtype=np.float32)
    kg = api.lower(reductions.inner_reduction(stages, prefetch, war, width=1024))
    got = interp.run(kg, {"x": x, "out": np.full(3, np.nan, np.float32)})["out"]
    np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-4, atol=1e-3)


def test_tall_pointwise_tiles():
    x = np.random.default_rng(0).standard_normal((37, 1000), dtype=np.float32)
    y = np.random.default_rng(1).standard_normal((37, 1000), dtype=np.float32)
    kg = api.lower(tiled2d.pointwise(3, rows=8))
    got = interp.run(kg, {"x": x, "y": y, "out": np.full_like(x, np.nan)})["out"]
    np.testing.assert_allclose(got, x + y, rtol=1e-6)


def test_bad_tile_parameters_are_refused():
    with pytest.raises(ValueError, match="must divide 256"):
        reductions.outer_reduction(cols=48)
    with pytest.raises(ValueError, match="multiple of 256"):
        reductions.inner_reduction(width=300)
