"""Swizzled TMA tiles on the CPU: the XOR pattern, the interpreter's shared-memory layout, the rule
that swizzles reads, the limits as named errors, and the swizzled kernels through the checker."""
import numpy as np
import pytest

from cbrules import api, cli
from cbrules.ir.builder import Kernel, SwizzleError, threadIdx
from cbrules.check import Checker
from cbrules.reference.interp import run
from cbrules.kernels import KERNELS, UnsupportedVariantError
from cbrules.ir.terms import swizzle_index
from rulekit import write_rules

SPANS = {"32B": 32, "64B": 64, "128B": 128}


def _reference_pattern(o, span):
    """REFERENCE §7, written out per mode: 128B o ^ (((o >> 7) & 7) << 4), 64B & 3, 32B & 1."""
    mask = {128: 7, 64: 3, 32: 1}[span]
    return o ^ (((o >> 7) & mask) << 4)


@pytest.mark.parametrize("span", (32, 64, 128))
@pytest.mark.parametrize("esize", (2, 4))
def test_swizzle_index_is_the_documented_pattern_and_a_permutation(span, esize):
    repeat = 8 * span // esize  # elements in one pattern
    i = np.arange(4 * repeat)
    got = swizzle_index(i, esize, span)
    np.testing.assert_array_equal(got * esize, _reference_pattern(i * esize, span) - (i * esize) % esize)
    assert sorted(got[:repeat]) == list(range(repeat))  # a permutation of each repeat
    np.testing.assert_array_equal(got[repeat:2 * repeat], got[:repeat] + repeat)  # and it repeats
    assert swizzle_index(128 // esize, esize, span) == 144 // esize  # row 1, chunk 0 -> chunk 1


def _layout_kernel(swizzle: str, dtype: str = "float32", rows: int = 8):
    """One swizzled box TMA-loaded with a barrier, then shared memory copied out as it lies (no
    swizzled reads): ``out`` shows the layout the TMA wrote."""
    esize = 4 if dtype == "float32" else 2
    w = SPANS[swizzle] // esize
    k = Kernel("layout", block=rows * w)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n), dtype), k.tensor("out", (rows * w,), dtype)
    xm = k.tensor_map(x, box=(rows, w), swizzle=swizzle)
    tile = k.alloc("tile", "shared", dtype, (rows, w), align=8 * SPANS[swizzle])
    bar = k.alloc("bar", "shared", "mbarrier", (1,))
    k.grid(1)
    with k.elect_one():
        k.mbarrier_init(bar, 0, 1)
        k.fence_proxy_async()
    k.syncthreads()
    with k.elect_one():
        k.mbarrier_arrive_expect_tx(bar, 0, xm.box_bytes)
        k.tma_load(xm, (0, 0), tile, barrier=bar, slot=0)
    k.mbarrier_wait(bar, 0, 0)
    k.store(out, threadIdx.x, k.load(tile, threadIdx.x))
    k.syncthreads()
    with k.elect_one():
        k.mbarrier_inval(bar, 0)
    return k


@pytest.mark.parametrize("swizzle", SPANS)
def test_interpreter_lays_out_a_swizzled_box_as_the_hardware_does(swizzle):
    k = _layout_kernel(swizzle)
    w = SPANS[swizzle] // 4
    x = np.arange(8 * w * 3, dtype=np.float32).reshape(8 * 3, w)[:8]  # element value = logical index
    got = run(k, {"x": np.ascontiguousarray(x), "out": np.zeros(8 * w, np.float32)})["out"]
    want = np.empty(8 * w, np.float32)
    o = np.arange(8 * w) * 4
    want[_reference_pattern(o, SPANS[swizzle]) // 4] = x.reshape(-1)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, x.reshape(-1))  # the layout really moved


@pytest.mark.parametrize("swizzle", SPANS)
@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
@pytest.mark.parametrize("kernel", ("multi_dim", "pointwise"))
def test_swizzled_kernels_in_the_checker(kernel, dtype, swizzle):
    checker = Checker(blocks="sample", dtype=dtype, swizzle=swizzle)
    for stages, war in ((2, "sync"), (3, "mbarrier")):
        for trips in (stages, 2 * stages + 1):
            res = checker.check(KERNELS[kernel], trips, stages, war=war)
            assert res.status == "ok", f"{kernel} {dtype} {swizzle} S={stages} {war} trips={trips}: {res.detail}"


WRONG_SPAN = """
(disable tma-swizzle-reads)
(graph-rule mut-swizzle-wrong-span
  :doc "reads swizzled with half the map's span"
  :phase tma-swizzle
  :match ((tma_load ?ld :dst ?buf :swizzle ?span)
          (alloc ?a :buf ?buf :dtype ?dt)
          (load ?r :src ?buf :index ?ix :tag (absent)))
  :rewrite ((set ?r :index (call "swizzle" ?ix (bytes-of ?dt) (/ ?span 2)) :tag "cb-swizzled")))
"""


@pytest.mark.parametrize("mutation", ("(disable tma-swizzle-reads)\n", WRONG_SPAN))
def test_a_wrong_or_missing_swizzle_of_the_reads_fails_on_the_cpu(mutation, tmp_path):
    write_rules(tmp_path / "mut", mutation)
    checker = Checker(blocks="sample", swizzle="128B", rules=[tmp_path / "mut"])
    res = checker.check(KERNELS["multi_dim"], 4, 2)
    assert res.status == "FAIL" and "differs from numpy" in res.detail


@pytest.mark.parametrize("swizzle", SPANS)
def test_nvrtc_compiles_swizzled_variants(swizzle):
    ck = api.compile(KERNELS["pointwise"].build(stages=3, dtype="bfloat16", swizzle=swizzle, tma_store=True))
    assert f"cb_swizzle((int)threadIdx.x / {SPANS[swizzle] // 2} * " in ck.source.text


def test_cli_compile_swizzle(capsys):
    assert cli.main(["compile", "pointwise", "--swizzle", "128B", "--stages", "2"]) == 0
    assert "x_tile[cb_swizzle(" in capsys.readouterr().out
    assert cli.main(["compile", "inner_reduction", "--swizzle", "64B"]) == 1
    assert "UnsupportedVariantError: kernel inner_reduction: swizzle 64B" in capsys.readouterr().err


def test_swizzle_free_text_is_unchanged():
    t = api.generate(KERNELS["pointwise"].build(stages=2)).text
    assert "cb_swizzle" not in t


# ------------------------------------------------------------------------------ limits
def _map(box, swizzle, dtype="float32"):
    k = Kernel("k", block=32)
    x = k.tensor("x", (64, 64), dtype)
    return k, k.tensor_map(x, box=box, swizzle=swizzle)


def test_inner_box_wider_than_the_span_is_refused():
    with pytest.raises(SwizzleError, match=r"spans 64 x 4 = 256 bytes, more than the 128-byte span"):
        _map((8, 64), "128B")


def test_inner_box_narrower_than_the_span_is_refused():
    with pytest.raises(SwizzleError, match="needs it to span exactly 64 bytes"):
        _map((8, 8), "64B")


def test_unknown_swizzle_is_refused():
    with pytest.raises(SwizzleError, match="swizzle '256B' is not one of"):
        _map((8, 32), "256B")


def test_tile_buffer_off_the_pattern_is_refused():
    k, m = _map((8, 32), "128B")
    tile = k.alloc("tile", "shared", "float32", (8, 32))  # 128-byte aligned only
    with pytest.raises(SwizzleError, match="aligned to 128 bytes.*align=1024"):
        k.tma_load(m, (0, 0), tile)


def test_box_that_breaks_the_pattern_is_refused():
    k, m = _map((4, 32), "128B")  # 512 bytes: the next box would start mid-pattern
    tile = k.alloc("tile", "shared", "float32", (8, 32), align=1024)
    with pytest.raises(SwizzleError, match="spans 512 bytes, not a multiple of the 1024-byte"):
        k.tma_load(m, (0, 0), tile)


def test_tma_store_through_a_swizzled_map_is_refused():
    k, m = _map((8, 32), "128B")
    s = k.alloc("s", "shared", "float32", (8, 32), align=1024)
    with pytest.raises(SwizzleError, match="TMA stores through swizzled tensor map"):
        k.tma_store(m, (0, 0), s)


def test_swizzle_on_a_kernel_that_reads_dense_rows_is_refused():
    with pytest.raises(UnsupportedVariantError, match="swizzle 128B is not supported"):
        KERNELS["matmul"].build(swizzle="128B")
