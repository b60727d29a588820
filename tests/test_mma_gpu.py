"""matmul_tc (wgmma tensor cores) on a Hopper GPU against a float64 numpy reference: S in 2..5 x the
shapes of its spec (128x128x64, 500x1000x304, 1024x2048x4096, ragged 129x264x72) warp-specialized, the
output dtypes, the tile variants, persistent blocks and the non-warp-specialized lowerings; outputs
poisoned first."""
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu
SPEC = KERNELS["matmul_tc"]
WS = dict(warp_specialize=True, registers=(40, 232))


def _compiled(cache={}, **kw):
    key = tuple(sorted(kw.items()))
    if key not in cache:
        cache[key] = api.compile(SPEC.factory(**kw))
    return cache[key]


def _run(ck, shape, dtype="bfloat16", out_dtype=None, seed=0):
    args = SPEC.make_inputs(shape, np.random.default_rng(seed), dtype)
    if out_dtype is not None and out_dtype != dtype:
        args["c"] = args["c"].astype(np.float32 if out_dtype == "float32" else np.float16)
    want = SPEC.expected(args)
    return poisoned_run(ck, args, want, SPEC.outputs, *SPEC.tolerances(shape, out_dtype or dtype), shape)


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_warp_specialized_stages_and_shapes(stages):
    # 128x256 tiles fit 4 stages; 5 stages take 128x128 tiles
    ck = _compiled(stages=stages, bn=256 if stages <= 4 else 128, **WS)
    failures = [f for shape in SPEC.shapes for f in _run(ck, shape, seed=stages)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype,out_dtype", [("float16", "float16"), ("bfloat16", "float32"),
                                             ("float16", "float32"), ("bfloat16", "float16")])
def test_dtypes(dtype, out_dtype):
    ck = _compiled(stages=4, dtype=dtype, out_dtype=out_dtype, **WS)
    failures = [f for shape in ((500, 1000, 304), (129, 264, 72)) for f in _run(ck, shape, dtype, out_dtype)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("tile", [dict(bm=64, bn=128, groups=1), dict(bm=128, bn=128), dict(bn=256, bk=32),
                                  dict(bn=64, bk=16), dict(group_m=1), dict(bm=256, bn=128, groups=2)],
                         ids=lambda t: "-".join(f"{k}{v}" for k, v in t.items()))
def test_tile_variants(tile):
    ck = _compiled(stages=3, **tile, **WS)
    failures = [f for shape in ((500, 1000, 304), (128, 128, 64), (1000, 520, 136)) for f in _run(ck, shape)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("war", ["sync", "mbarrier"])
def test_not_warp_specialized(war):
    # every MMA group is waited for right after its commit; K loops shorter than S (one tile: K = 64)
    # run with the prologue predicated (issue 17)
    ck = _compiled(stages=3, war=war)
    failures = [f for shape in ((500, 1000, 304), (128, 128, 64), (130, 136, 40)) for f in _run(ck, shape)]
    assert not failures, "\n".join(failures)


def test_k_not_a_multiple_of_8_is_padded_with_zeros():
    # TMA needs 16-byte row pitches: K = 300 bfloat16 is refused at launch (TmaLimitError, a CPU test);
    # zero columns up to 304 give the same product
    rng = np.random.default_rng(7)
    m, n, k = 500, 1000, 300
    args = SPEC.make_inputs((m, n, k), rng, "bfloat16")
    want = SPEC.expected(args)
    pad = {"a": np.pad(args["a"], ((0, 0), (0, 4))), "b": np.pad(args["b"], ((0, 0), (0, 4))), "c": args["c"]}
    ck = _compiled(stages=4, **WS)
    assert not poisoned_run(ck, pad, want, SPEC.outputs, *SPEC.tolerances((m, n, k), "bfloat16"), (m, n, k))


@pytest.mark.parametrize("blocks,stages,bn", [(132, 4, 256), (3, 3, 256), (5, 5, 128), (1, 2, 128), (4, 3, 192)])
def test_persistent_blocks(blocks, stages, bn):
    # few blocks walk many tiles: the slots, phases and staging slots run on across tiles
    ck = _compiled(stages=stages, bn=bn, persistent=blocks, **WS)
    failures = [f for shape in SPEC.shapes + ((1000, 520, 136),) for f in _run(ck, shape, seed=blocks)]
    assert not failures, "\n".join(failures)


def test_persistent_float32_output():
    ck = _compiled(stages=4, out_dtype="float32", persistent=7, **WS)
    assert not _run(ck, (500, 1000, 304), "bfloat16", "float32")


def test_persistent_not_warp_specialized():
    # each tile's K loop pipelined on its own (barriers initialised and invalidated per tile)
    ck = _compiled(stages=3, bn=128, persistent=5)
    assert not [f for shape in ((500, 1000, 304), (1000, 520, 200)) for f in _run(ck, shape)]


@pytest.mark.parametrize("kw", [dict(stages=4), dict(stages=4, group_m=16), dict(stages=3, bn=128),
                                dict(stages=4, dtype="float16", out_dtype="float16"),
                                dict(stages=4, out_dtype="float32"), dict(stages=3, war="mbarrier", ws=False),
                                dict(stages=4, persistent=132), dict(stages=3, bn=192, persistent=4),
                                dict(stages=4, swizzle=False), dict(stages=3, persistent=4, swizzle=False)],
                         ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_swizzled_epilogue_staging(kw):
    # store_swizzle=True: C staged in its map's 128-byte swizzle, ragged edges clipped by the TMA store
    # (the default elsewhere in this file); swizzle=False: the dense staging it replaced
    kw = dict(kw)
    ws = WS if kw.pop("ws", True) else {}
    ck = _compiled(store_swizzle=kw.pop("swizzle", True), **kw, **ws)
    dtype, out_dtype = kw.get("dtype", "bfloat16"), kw.get("out_dtype")
    failures = [f for shape in ((129, 264, 200), (500, 1000, 304), (1024, 2048, 4096))
                for f in _run(ck, shape, dtype, out_dtype, seed=3)]
    assert not failures, "\n".join(failures)
