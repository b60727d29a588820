"""Every circular-buffer request that must be refused (REFERENCE §3), with its named error."""
import pytest

from cbrules import api
from cbrules.ir.builder import BuildError, Kernel, TmaBoxError, blockIdx, circular_buffer, threadIdx
from cbrules.rewrite.engine import LoweringError
from cbrules.kernels import get
from cbrules.ir.bind import LaunchError


def lower(k):
    return api.lower(k)


def refused(k, code, *needles):
    """Lowering ``k`` is refused with ``code``; the message names the rule (and its file:line) and
    holds each needle (the values and the fix)."""
    with pytest.raises(LoweringError) as e:
        lower(k)
    assert e.value.code == code, (e.value.code, str(e.value))
    for n in needles:
        assert n in str(e.value), str(e.value)
    assert f"rule {e.value.rule} (" in str(e.value) and e.value.rule.startswith(("cb-", "tma-"))
    return str(e.value)


def one_tile_loop(cb=None, kind="serial", start=0, step=1, stop=8, alloc_inside=False, tma=True,
                  load_cb=None, rows=256):
    k = Kernel("t", block=256)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    xm = k.tensor_map(x, box=(256,))
    tile = None if alloc_inside else k.alloc("tile", "shared", "float32", (rows,))
    with k.loop("i", start, stop, step, kind=kind, **({"circular_buffer": cb} if cb else {})) as i:
        if alloc_inside:
            tile = k.alloc("tile", "shared", "float32", (rows,))
        if tma:
            k.tma_load(xm, (i * 256,), tile, circular_buffer=load_cb, **({"tile": (rows,)} if rows != 256 else {}))
            v = k.load(tile, threadIdx.x)
        else:
            v = k.load(x, i * 256 + threadIdx.x)
        k.store(out, i * 256 + threadIdx.x, v)
    return k


def test_stages_below_two():
    refused(get("single_dim").build(stages=1), "few-stages", "needs stages >= 2, got 1")


@pytest.mark.parametrize("p", [3, 7, -4])
def test_prefetch_out_of_range(p):
    refused(get("single_dim").build(stages=3, prefetch=p), "prefetch-range", f"prefetch {p} is outside [-3, 3)")


@pytest.mark.parametrize("p, main_stop", [(-1, 6), (-3, 8)])
def test_negative_prefetch_counts_from_stages(p, main_stop):
    kg = lower(get("single_dim").build(stages=3, prefetch=p))
    (main,) = [n for n in kg.nodes("for") if kg[n].get("part") == "main"]
    assert str(kg[main]["stop"]) == str(main_stop)


def test_bad_war_mode():
    refused(get("single_dim").build(stages=3, war="fence"), "war-mode", "war=fence is not a WAR protection")


@pytest.mark.parametrize("kind", ["thread-x", "block-x", "vectorize", "unroll"])
def test_parallel_or_vectorized_loop(kind):
    refused(one_tile_loop(circular_buffer(3), kind=kind), "parallel-loop", f"is a {kind} loop; only a serial loop")


@pytest.mark.parametrize("start, step", [(1, 1), (0, 2)])
def test_loop_start_and_step(start, step):
    refused(one_tile_loop(circular_buffer(2), start=start, step=step, stop=16), "loop-bounds",
            "needs start 0 and step 1")


def test_no_serial_loop_around_the_load():
    k = Kernel("t", block=256)
    n = k.symbol("N")
    x = k.tensor("x", (n,))
    tile = k.alloc("tile", "shared", "float32", (256,))
    k.tma_load(k.tensor_map(x, box=(256,)), (blockIdx.x * 256,), tile, circular_buffer=circular_buffer(2))
    refused(k, "no-loop", "no serial loop encloses it")


def test_not_loaded_from_global_memory_by_tma():
    refused(one_tile_loop(circular_buffer(2), tma=False), "no-tma-load", "no TMA load from global memory")


def test_buffer_produced_inside_the_loop():
    refused(one_tile_loop(circular_buffer(2), alloc_inside=True), "buffer-inside-loop",
            "is allocated inside circular-buffered loop")


def test_two_buffers_with_different_options():
    k = Kernel("t", block=256)
    n = k.symbol("N")
    x, y = k.tensor("x", (n,)), k.tensor("y", (n,))
    xm, ym = k.tensor_map(x, box=(256,)), k.tensor_map(y, box=(256,))
    a, b = k.alloc("a", "shared", "float32", (256,)), k.alloc("b", "shared", "float32", (256,))
    with k.loop("i", 8) as i:
        k.tma_load(xm, (i * 256,), a, circular_buffer=circular_buffer(2))
        k.tma_load(ym, (i * 256,), b, circular_buffer=circular_buffer(3))
    refused(k, "conflicting-options", "ask for different circular-buffer options")


def test_marking_the_load_equals_marking_the_loop():
    by_load = api.generate(one_tile_loop(load_cb=circular_buffer(3))).text
    by_loop = api.generate(one_tile_loop(cb=circular_buffer(3))).text
    assert by_load == by_loop and "cb_mbar_wait" in by_load


@pytest.mark.parametrize("box, message", [((512,), "outside 1..256"), ((3,), "not a multiple of 16"),
                                          ((0,), "outside 1..256")])
def test_tma_box_limits(box, message):
    k = Kernel("t")
    x = k.tensor("x", (k.symbol("N"),))
    with pytest.raises(TmaBoxError, match=message):
        k.tensor_map(x, box=box)


def test_shared_memory_times_stages_over_the_limit():
    refused(one_tile_loop(circular_buffer(4), rows=16384), "shared-memory",
            "4 stages need 262144 bytes of shared memory")


def test_strict_trip_count_refuses_a_short_loop_at_lowering_time():
    refused(one_tile_loop(circular_buffer(4, strict_trip_count=True), stop=2), "short-loop",
            "runs 2 iterations, fewer than stages=4, and asks for strict_trip_count")
    lower(get("single_dim").build(stages=4, tiles_per_block=2))  # without it the loop runs (predicated)


def test_strict_trip_count_refuses_a_short_loop_at_launch():
    ck = api.compile(one_tile_loop(circular_buffer(3, strict_trip_count=True), stop="ceil_div(N, 256)"))
    with pytest.raises(LaunchError, match=r"trip count ceil_div\(N, 256\) must be >= stages=3") as e:
        ck.bind_symbols({"x": (512,), "out": (512,)}, {})  # 2 tiles < 3 stages
    assert e.value.code == "short-loop"
    assert ck.bind_symbols({"x": (768,), "out": (768,)}, {})["N"] == 768
    assert api.compile(get("multi_dim").build(stages=3)).source.requires == ()  # by default: no refusal


def test_strict_trip_count_must_be_a_bool():
    with pytest.raises(BuildError, match="strict_trip_count must be True or False"):
        one_tile_loop({"stages": 3, "strict_trip_count": 1})


def test_a_barrierless_load_outside_any_loop_is_not_generated():
    k = Kernel("t", block=256)
    x = k.tensor("x", (k.symbol("N"),))
    tile = k.alloc("tile", "shared", "float32", (256,))
    k.tma_load(k.tensor_map(x, box=(256,)), (0,), tile)
    with pytest.raises(LoweringError, match="has no barrier"):
        lower(k)


def test_an_unmarked_loop_gets_the_single_stage_lowering():
    kg = lower(one_tile_loop())
    (main,) = [n for n in kg.nodes("for") if kg[n].get("part") == "main"]
    assert [kg.op(c) for c in kg.children(main)].count("if") == 1
    assert {kg[a]["shape"] for a in kg.nodes("alloc") if kg[a]["dtype"] == "mbarrier"} == {(1,)}


def test_wide_tile_of_several_rows_is_refused():
    k = Kernel("t", block=256)
    m, n = k.symbol("M"), k.symbol("N")
    x = k.tensor("x", (m, n))
    tile = k.alloc("tile", "shared", "float32", (2, 256))
    with k.loop("j", 8, circular_buffer=circular_buffer(2)) as j:
        k.tma_load(k.tensor_map(x, box=(2, 128)), (0, j * 256), tile, tile=(2, 256))
        k.load(tile, threadIdx.x)
    refused(k, "tma-wide-multirow-tile", "has more than one row", "rule tma-reject-wide-multirow-tile")


def test_unrolled_stage_must_divide_the_tiles():
    with pytest.raises(ValueError, match="must be a multiple of unroll=4"):
        get("single_dim_unroll").build(stages=2, tiles_per_block=10)
