"""Circular-buffered loops that run more than once per block or share a buffer with another:
barriers live from just before the loop to just after it (re-initialised at every entry, so the
parity formula restarts at phase 0), and the block syncs after the loop before anything refills
its slots. Checked by the protocol interpreter on the CPU and on a Hopper GPU."""
import numpy as np
import pytest

from cbrules import api
from cbrules.reference import interp
from cbrules.ir.builder import Kernel, blockIdx, ceil_div, circular_buffer, threadIdx

CASES = [(2, 1, "sync"), (2, 0, "sync"), (3, 2, "sync"), (3, 1, "mbarrier"), (4, 3, "mbarrier"), (3, 0, "mbarrier")]


def _copy_body(k, xm, tile, out, row, j, n):
    k.tma_load(xm, (row, j * 256), tile)
    v = k.load(tile, threadIdx.x)
    with k.if_((j * 256 + threadIdx.x).lt(n)):
        k.store(out, row * n + j * 256 + threadIdx.x, k.add(v, 1.0))


def _kernel(name):
    k = Kernel(name, block=256)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n)), k.tensor("out", (m, n))
    return k, m, n, k.tensor_map(x, box=(1, 256)), k.alloc("tile", "shared", "float32", (1, 256)), out


def rows_in_turn(stages, prefetch, war):
    """One block walks every row: the circular-buffered loop starts afresh for each."""
    k, m, n, xm, tile, out = _kernel("rows_in_turn")
    k.grid(1)
    with k.loop("o", m) as o:
        with k.loop("j", ceil_div(n, 256), circular_buffer=circular_buffer(stages, prefetch, war)) as j:
            _copy_body(k, xm, tile, out, o, j, n)
    return k


def twice(stages, prefetch, war):
    """Two circular-buffered loops one after the other through the same tile buffer (the second
    overwrites the first's output with the same values)."""
    k, m, n, xm, tile, out = _kernel("twice")
    k.grid(m)
    for var in ("j", "i"):
        with k.loop(var, ceil_div(n, 256), circular_buffer=circular_buffer(stages, prefetch, war)) as j:
            _copy_body(k, xm, tile, out, blockIdx.x, j, n)
    return k


def twice_mixed(first, second, war):
    """Two circular-buffered loops through the same tile buffer with different stage counts: the
    buffer holds as many slots as the larger count, each slot one tile, for both loops."""
    k, m, n, xm, tile, out = _kernel("twice_mixed")
    k.grid(m)
    for var, stages in (("j", first), ("i", second)):
        with k.loop(var, ceil_div(n, 256), circular_buffer=circular_buffer(stages, None, war)) as j:
            _copy_body(k, xm, tile, out, blockIdx.x, j, n)
    return k


MIXED = [(a, b, war) for a, b in ((2, 4), (2, 3), (4, 2)) for war in ("sync", "mbarrier")]


def _args(shape):
    x = np.random.default_rng(sum(shape)).standard_normal(shape, dtype=np.float32)
    return {"x": x, "out": np.full_like(x, np.nan)}


@pytest.mark.parametrize("build", [rows_in_turn, twice])
@pytest.mark.parametrize("stages, prefetch, war", CASES)
def test_interpreted_with_protocol_checks(build, stages, prefetch, war):
    # 5 tiles a row: not a multiple of S, so a barrier's phase at the loop's end differs by slot
    args = _args((3, 5 * 256 - 100))
    got = interp.run(api.lower(build(stages, prefetch, war)), args)["out"]
    np.testing.assert_array_equal(got, args["x"] + 1)


@pytest.mark.parametrize("first, second, war", MIXED)
def test_mixed_stages_share_a_buffer(first, second, war):
    # before the fix the buffer was staged for the first loop only: the second loop's slots were
    # (its S)-th parts of that allocation, overlapping or past its end or misaligned for TMA
    g = api.lower(twice_mixed(first, second, war))
    (tile,) = [g[n] for n in g.nodes("alloc") if g[n]["buf"] == "tile"]
    assert tile["shape"] == (max(first, second), 1, 256)
    args = _args((3, 5 * 256 - 100))
    got = interp.run(g, args)["out"]
    np.testing.assert_array_equal(got, args["x"] + 1)
    src = api.generate(twice_mixed(first, second, war)).text
    for var, stages in (("j", first), ("i", second)):
        assert f"{var} % {stages} * 256" in src, f"loop {var}: slots of one whole tile (256 floats)"


def test_barriers_bracket_each_entry():
    src = api.generate(rows_in_turn(2, 1, "sync")).text
    body = src[src.index("for (int o = 0;"):]
    assert body.index("cb_mbar_init") < body.index("// prologue") < body.index("// epilogue") \
        < body.index("cb_mbar_inval"), "init and inval must lie inside the outer loop around the pipeline"


@pytest.mark.gpu
@pytest.mark.parametrize("first, second, war", MIXED)
def test_mixed_stages_on_gpu(first, second, war):
    args = _args((7, 17 * 256 - 36))
    bound = api.compile(twice_mixed(first, second, war)).bind(**args)
    bound.arrays["out"].fill_bytes(0xFF)
    bound.launch()
    bound.finish()
    np.testing.assert_array_equal(args["out"], args["x"] + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("build", [rows_in_turn, twice])
@pytest.mark.parametrize("stages, prefetch, war", CASES)
def test_on_gpu(build, stages, prefetch, war):
    args = _args((7, 17 * 256 - 36))
    bound = api.compile(build(stages, prefetch, war)).bind(**args)
    bound.arrays["out"].fill_bytes(0xFF)
    bound.launch()
    bound.finish()
    np.testing.assert_array_equal(args["out"], args["x"] + 1)
