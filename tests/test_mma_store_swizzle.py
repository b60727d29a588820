"""Tile stores through swizzled tensor maps: the rules stage each box in the map's swizzle
(rules/tma_store.rules, tma-store-to-swizzled-staging) and the TMA store reads it back dense. A small
kernel at every span and dtype, and matmul_tc(store_swizzle=True) on the CPU model (a persistent walk,
against numpy; the checker over trip counts is in test_mma_check.py); the generated CUDA, the refusals,
and mutations: dense staging under a swizzled map, and slots off the pattern."""

import ml_dtypes
import numpy as np
import pytest

from cbrules import api
from cbrules.ir.builder import Kernel, SwizzleError, ceil_div, threadIdx
from cbrules.ir.terms import call
from cbrules.kernels import KERNELS
from cbrules.kernels.matmul_tc import MatmulTileError, matmul_tc
from cbrules.reference.hazards import InterpError
from cbrules.reference.interp import run
from rulekit import lower_case, write_rules

WS = dict(warp_specialize=True, registers=(40, 232))
SWIZZLE_SPANS = {"32B": 32, "64B": 64, "128B": 128}

# after the shipped rule staged it swizzled, the staging store goes back to its dense index while the
# map (and so the TMA store) still swizzles
DENSE_STAGING = """
(graph-rule mut-dense-staging
  :doc "a swizzled tile staged densely"
  :phase tma-store
  :after (tma-store-to-swizzled-staging)
  :match ((store ?st :dst ?stage :tag (absent) :tile (:index ?ix :box ?box :swizzle ?span))
          (nearest ?L (for :kind "serial") :around ?st)
          (for ?L :var ?i :annotations (:tma_store (:stage ?stage))))
  :rewrite ((set ?st :index (+ ?ix (* (% (var ?i) 2) (product ?box))) :tag "mut-dense")))
"""

# the staging buffer 128-byte aligned as for a dense map: its slots start off the 1024-byte pattern
MISALIGNED = """
(graph-rule mut-stage-align-128
  :doc "a swizzled staging buffer aligned as a dense one"
  :phase tma-store
  :after (tma-store-stage)
  :match ((alloc ?a :tag "cb-stage" :align 1024))
  :rewrite ((set ?a :align 128)))
"""


def doubled_rows_kernel(swizzle: str, dtype: str):
    """out = 2 * x over [N, W] (W * esize = the swizzle span) in boxes of 8 rows, a warp writing element
    e = 32 j + lane of each box (an inner loop over j, as matmul_tc's epilogue), each box staged and
    TMA-stored through a map with ``swizzle``; the last box ragged (N % 8 rows). (A clipped store
    directly in the staging loop would be moved after the TMA store by tma-store-drop-tile-bounds: the
    checker names that, PartialTileStore.)"""
    w = SWIZZLE_SPANS[swizzle] // (4 if dtype == "float32" else 2)
    k = Kernel("doubled_rows", block=32)
    n = k.symbol("N")
    x, out = k.tensor("x", (n, w), dtype), k.tensor("out", (n, w), dtype)
    om = k.tensor_map(out, box=(8, w), swizzle=swizzle)
    k.grid(1)
    with k.loop("i", ceil_div(n, 8)) as i:
        with k.loop("j", 8 * w // 32, kind="unroll") as j:
            row, col = (j * 32 + threadIdx.x) / w, (j * 32 + threadIdx.x) % w
            v = k.load(x, call("min", i * 8 + row, n - 1) * w + col)  # rows past N: read the last, clipped anyway
            k.store(out, (i * 8 + row) * w + col, k.mul(v, 2.0), tile=(om, (i * 8, 0), row * w + col), clip=True)
    return k


def doubled_rows_args(swizzle: str, dtype: str, n: int = 29):
    w = SWIZZLE_SPANS[swizzle] // (4 if dtype == "float32" else 2)
    np_dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    x = np.random.default_rng(1).standard_normal((n, w)).astype(np_dtype)
    return {"x": x, "out": np.full((n, w), np.nan, np_dtype)}, 2 * x.astype(np.float64)


@pytest.mark.parametrize("swizzle", SWIZZLE_SPANS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_tile_stored_through_each_swizzle_equals_numpy(swizzle, dtype):
    args, want = doubled_rows_args(swizzle, dtype)
    kg = api.lower(doubled_rows_kernel(swizzle, dtype))
    assert [p.swizzle for p in kg.params().values() if p.kind == "tmap"] == [swizzle]
    got = run(kg, args)["out"].astype(np.float64)
    np.testing.assert_array_equal(got, want)  # doubling is exact in both dtypes


def _lower_and_run(shape, rules=(), out_dtype=None, persistent=0, ws=True, seed=0):
    spec = KERNELS["matmul_tc"]
    kernel = matmul_tc(stages=3, store_swizzle=True, out_dtype=out_dtype, persistent=persistent,
                       **(WS if ws else {}))
    _, kg, args = lower_case(spec, rules=list(rules), dtype="bfloat16", seed=seed, shape=shape, kernel=kernel)
    if out_dtype == "float32":
        args["c"] = args["c"].astype(np.float32)
    got = run(kg, args)
    return spec, args, got["c"].astype(np.float64)


def _close(spec, shape, args, c, dtype="bfloat16"):
    rtol, atol = spec.tolerances(shape, dtype)
    return np.allclose(c, spec.expected(args)["c"], rtol=rtol, atol=atol)


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("ws", [True, False])
def test_swizzled_staging_equals_numpy(out_dtype, ws):
    shape = (129, 264, 200)  # ragged M, N and K: the TMA store clips the swizzled box too
    spec, args, c = _lower_and_run(shape, out_dtype=out_dtype, ws=ws)
    assert not np.isnan(c).any()  # poisoned output: every element written
    assert _close(spec, shape, args, c, out_dtype)


def test_persistent_walk_with_swizzled_staging_equals_numpy():
    shape = (300, 392, 136)  # two blocks walking six tiles: the staging loop re-entered
    spec, args, c = _lower_and_run(shape, persistent=2)
    assert not np.isnan(c).any() and _close(spec, shape, args, c)


# the checker over trip counts 0..4S with swizzled and dense staging: tests/test_mma_check.py


def test_dense_staging_under_a_swizzled_map_gives_a_wrong_result(tmp_path):
    shape = (128, 256, 64)
    spec, args, good = _lower_and_run(shape)
    assert _close(spec, shape, args, good)
    _, _, bad = _lower_and_run(shape, rules=[write_rules(tmp_path / "dense", DENSE_STAGING).parent])
    assert not _close(spec, shape, args, bad)  # every 16-byte chunk of rows 1..7 mod 8 lands elsewhere


def test_a_swizzled_slot_off_the_pattern_is_named(tmp_path):
    with pytest.raises(InterpError, match=r"TMA store with 128B swizzle reads cb_stage_\d+, allocated 128-byte "
                                          r"aligned: its slots must start on the 1024-byte pattern"):
        _lower_and_run((128, 256, 64), rules=[write_rules(tmp_path / "align", MISALIGNED).parent])


def test_generated_epilogue_writes_swizzled_places_in_1024_aligned_slots():
    plain = api.generate(matmul_tc(stages=4, store_swizzle=False, **WS))
    src = api.generate(matmul_tc(stages=4, store_swizzle=True, **WS))
    assert api.generate(matmul_tc(stages=4, **WS)).text == src.text  # the default where the box allows it
    assert [p.swizzle for p in src.params if p.name == "c_tmap"] == ["128B"]
    assert [p.swizzle for p in plain.params if p.name == "c_tmap"] == ["none"]
    body = src.text.split('extern "C"')[1]
    assert "cb_stage_10 = reinterpret_cast<cb_bf16*>(cb_smem + 1024);" in body
    assert body.count("cb_stage_10[cb_swizzle(") == 1 and "cb_swizzle(" not in plain.text.split('extern "C"')[1]
    assert src.shared_bytes == plain.shared_bytes  # the slack below the tiles' 1024-byte alignment takes it
    f32 = api.generate(matmul_tc(stages=3, out_dtype="float32", store_swizzle=True, **WS))
    assert [p.swizzle for p in f32.params if p.name == "c_tmap"] == ["128B"]  # 32 float32 columns: 128 bytes


def test_refusals():
    with pytest.raises(MatmulTileError, match="store_swizzle=1"):
        matmul_tc(store_swizzle=1)
    with pytest.raises(MatmulTileError, match="store_swizzle with bn=24"):
        matmul_tc(bn=24, store_swizzle=True)  # 24 bfloat16 columns: 48 bytes, no swizzle span
    dense = api.generate(matmul_tc(bn=24, stages=3))  # the default stages such a box dense instead
    assert [p.swizzle for p in dense.params if p.name == "c_tmap"] == ["none"]
    k = Kernel("k", block=128)
    n = k.symbol("N")
    out = k.tensor("out", (n, 64), "bfloat16")
    m = k.tensor_map(out, box=(4, 64), swizzle="128B")  # 512 bytes: half a pattern
    with k.loop("i", ceil_div(n, 4)) as i:
        with pytest.raises(SwizzleError, match=r"box \(4, 64\) spans 512 bytes, not a multiple of the 1024-byte"):
            k.store(out, i, 0.0, tile=(m, (i * 4, 0), 0))
