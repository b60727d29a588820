"""The tile parameters the benchmarks tune, checked on the CPU: lowered, interpreted with the
barrier protocol checked, against numpy (the GPU matrix runs the default tiles)."""
import numpy as np
import pytest

from cbrules import api
from cbrules.reference import interp
from cbrules.kernels.reductions import KernelParameterError
from cbrules.kernels import matmul, reductions, tiled2d


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


def _variant(name, trips_shape, **params):
    """The built-in kernel ``name`` built with tile ``params``, for the CPU checker."""
    import dataclasses
    import functools
    from cbrules.kernels import KERNELS
    spec = KERNELS[name]
    return dataclasses.replace(spec, factory=functools.partial(spec.factory, **params), shape_for_trips=trips_shape)


@pytest.mark.parametrize("dtype, width, rows", [("float32", 256, 3), ("bfloat16", 1024, 4), ("float16", 512, 2)])
@pytest.mark.parametrize("stages, prefetch, war", [(2, 1, "sync"), (3, None, "mbarrier")])
def test_inner_reduction_rows_a_block(dtype, width, rows, stages, prefetch, war):
    """Several rows a block, the last block reaching past M (its rows arrive as zeros and store
    nothing): every trip count 0 .. 4S, interpreted with the protocol checks, against numpy and the
    kernel before lowering."""
    from cbrules.check import Checker, trip_counts
    spec = _variant("inner_reduction", lambda t: (2 * rows + 1, width * t - 64), width=width, rows=rows)
    checker = Checker(dtype=dtype)
    for trips in trip_counts(stages):
        r = checker.check(spec, trips, stages, prefetch, war)
        assert r.ok, f"trips {trips}: {r.status} {r.detail}"


@pytest.mark.parametrize("dtype, rows, cols", [("float32", 512, 32), ("bfloat16", 768, 32)])
def test_outer_reduction_tiles_taller_than_a_box(dtype, rows, cols):
    """Tiles of 2 or 3 boxes of 256 rows, M cutting through the last box."""
    from cbrules.check import Checker, trip_counts
    spec = _variant("outer_reduction", lambda t: (rows * t - 300, 3 * cols + 8), rows=rows, cols=cols)
    checker = Checker(dtype=dtype)
    for trips in trip_counts(3)[:6]:
        r = checker.check(spec, trips, 3)
        assert r.ok, f"trips {trips}: {r.status} {r.detail}"


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
    with pytest.raises(KernelParameterError, match="rows=0: give a whole number of at least 1"):
        reductions.inner_reduction(rows=0)
    with pytest.raises(ValueError, match="must be a multiple of 256"):
        reductions.outer_reduction(rows=384, cols=64)


@pytest.mark.parametrize("build, match", [
    (lambda: reductions.inner_reduction(rows="2"), r"rows='2': give a whole number"),
    (lambda: reductions.inner_reduction(rows=True), r"rows=True: give a whole number"),
    (lambda: reductions.inner_reduction(rows=10**6), "more than the 232448 a block may have"),
    (lambda: reductions.inner_reduction(width=256 * 10**5), "more than the 232448"),
    (lambda: reductions.outer_reduction(cols="a"), r"cols='a': give a whole number"),
    (lambda: reductions.outer_reduction(rows=256 * 4096, cols=64), "more than the 232448"),
    (lambda: reductions.persistent(row=2**22, width=2**20, threads=256), "more than the 232448"),
    (lambda: reductions.persistent(row=2**20, width=1024, threads=256), "4096 elements a thread in registers"),
    (lambda: reductions.persistent(box=2.5), r"box=2.5: give a whole number"),
    (lambda: reductions.two_pass(width=2**30, threads=256), "more than the 232448"),
    (lambda: reductions.two_pass(threads=0), r"threads=0: give a whole number"),
], ids=range(11))
def test_hostile_tile_parameters_are_named_errors_before_anything_is_sized(build, match):
    # huge values used to be unrolled into millions of nodes (a hang), text a raw TypeError
    with pytest.raises(KernelParameterError, match=match):
        build()


@pytest.mark.parametrize("stages, prefetch, war", [(2, 1, "sync"), (3, 2, "mbarrier"), (4, 0, "sync")])
@pytest.mark.parametrize("op", ["exp", "add"])
@pytest.mark.parametrize("rows, width, per_block", [(1, 512, 0), (1, 512, 4), (2, 256, 5)])
def test_pointwise_tilings(op, stages, prefetch, war, rows, width, per_block):
    """Wide one-row tiles, and runs of tiles per block whose last run reaches past M (5 x 2500 is
    25 tiles of 512 columns: the 7th block of 4 has one)."""
    rng = np.random.default_rng(stages)
    x, y = (rng.standard_normal((5, 2500), dtype=np.float32) for _ in range(2))
    build = tiled2d.multi_dim if op == "exp" else tiled2d.pointwise
    kg = api.lower(build(stages, prefetch, war, rows=rows, width=width, per_block=per_block))
    args = {"x": x, "out": np.full_like(x, np.nan)} | ({"y": y} if op == "add" else {})
    got = interp.run(kg, args)["out"]
    np.testing.assert_allclose(got, np.exp(x) if op == "exp" else x + y, rtol=1e-6)


def test_wide_multirow_pointwise_tile_is_refused():
    from cbrules.rewrite.engine import LoweringError
    with pytest.raises(LoweringError, match="more than one row"):
        api.lower(tiled2d.multi_dim(3, rows=2, width=512))


def _normalized(x):
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(1, keepdims=True)
    return d / np.sqrt((d * d).mean(1, keepdims=True))


@pytest.mark.parametrize("stages, prefetch, war", [(2, 1, "sync"), (3, 0, "mbarrier")])
@pytest.mark.parametrize("width, threads", [(1024, 256), (1024, 512), (2048, 1024)])
def test_persistent_wide_tiles_and_blocks(stages, prefetch, war, width, threads):
    row = 4 * width  # four stages' worth
    x = np.random.default_rng(stages).standard_normal((3, row), dtype=np.float32) * 3 + 5
    kg = api.lower(reductions.persistent(stages, prefetch, war, row=row, width=width, threads=threads))
    got = interp.run(kg, {"x": x, "out": np.full_like(x, np.nan)})["out"]
    np.testing.assert_allclose(got, _normalized(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stages, prefetch, war", [(2, 1, "sync"), (3, 2, "mbarrier"), (4, 0, "sync")])
@pytest.mark.parametrize("width, threads", [(256, 256), (1024, 256), (1024, 512)])
def test_two_pass_normalization(stages, prefetch, war, width, threads):
    """N not a multiple of the tile (but of 4: TMA row strides are multiples of 16 bytes): the zeros
    past N must not enter the sums."""
    x = np.random.default_rng(stages).standard_normal((3, 4 * width + 36), dtype=np.float32) * 3 + 100
    kg = api.lower(reductions.two_pass(stages, prefetch, war, width=width, threads=threads))
    got = interp.run(kg, {"x": x, "out": np.full_like(x, np.nan)})["out"]
    np.testing.assert_allclose(got, _normalized(x), rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("stages, prefetch, war", [(2, 1, "sync"), (3, 2, "mbarrier")])
@pytest.mark.parametrize("tile, patch, bk, spread", [(64, 4, 16, True), (128, 8, 8, True), (128, 8, 16, False)])
def test_matmul_tiles(stages, prefetch, war, tile, patch, bk, spread):
    """Edges that cut through a tile on every side (M, N, K not multiples of it)."""
    rng = np.random.default_rng(tile + bk)
    a, b = rng.standard_normal((tile + 20, 3 * bk + 4), dtype=np.float32), rng.standard_normal((3 * bk + 4, 148), dtype=np.float32)
    kg = api.lower(matmul.matmul(stages, prefetch, war, tile=tile, patch=patch, bk=bk, spread=spread))
    got = interp.run(kg, {"a": a, "b": b, "c": np.full((a.shape[0], 148), np.nan, np.float32)})["c"]
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


# the tuned variants (cbrules/kernels/tuned.py, what the benchmarks measure), on shapes whose edges cut through the tiles
BENCH_CASES = [("exp", (37, 5000)), ("add", (37, 5000)), ("inner_sum", (37, 5000)), ("outer_sum", (600, 260)),
               ("normalize", (20, 16384)), ("normalize", (9, 32768)), ("normalize", (5, 65536)),
               ("matmul", (300, 260))]


@pytest.mark.gpu
@pytest.mark.parametrize("op, shape", BENCH_CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_benchmark_kernels_on_gpu(op, shape, stages):
    from cbrules.kernels import KERNELS
    from cbrules.kernels.tuned import build_generated, tiles
    spec = KERNELS[tiles(op, shape)[0]]
    args = spec.inputs(shape, np.random.default_rng(stages))
    want = spec.reference(args)
    bound = api.compile(build_generated(op, shape, stages)).bind(**args)
    for out in spec.outputs:
        bound.arrays[out].fill_bytes(0xFF)
    bound.launch()
    bound.finish()
    rtol, atol = spec.tolerance(shape)
    for out in spec.outputs:
        np.testing.assert_allclose(args[out], want[out], rtol=rtol, atol=atol)


@pytest.mark.parametrize("n", [16384, 32768])
def test_the_benchmarks_every_normalize_variant_builds(n):
    """The tuned float32 normalize of rows of 16384 and 32768 loads them directly with the stable
    statistics; the benchmark's other columns still build from it: stages="auto" (no circular-buffered loop:
    S = 1), and the warp-specialized variant (the same tiles through the TMA, the merge over the
    consumers' named barrier)."""
    from cbrules.kernels.tuned import build_generated, variant_params
    name, params = variant_params("normalize", (4, n))
    assert params["direct"] and params["stats"] == "stable"
    auto = api.lower(build_generated("normalize", (4, n), "auto"))
    assert not [m for m in auto.nodes("for") if auto[m].get("part") == "main"]  # no pipelined loop: S = 1
    body = api.generate(build_generated("normalize", (4, n), 2)).text.split('extern "C"')[1]
    assert "cb_block_stats<" in body and "cb_tma_load(" not in body
    ws = api.generate(build_generated("normalize", (4, n), 2, ws=True)).text.split('extern "C"')[1]
    assert "cb_block_stats_named<" in ws and "cb_tma_load(" in ws
