"""Ping-pong matmul_tc (two consumer warp groups on alternate tiles of a persistent block's walk, taking
turns on the tensor cores through named barriers: rules/ws_pingpong.rules) on a Hopper GPU, at 128x128x64,
500x1000x300 and 4096^3 against a float64 numpy reference of the same data, outputs poisoned first: the
128x128 and 64x256 tiles, S = 2..5, float16 and float32 outputs, B in both layouts, and few persistent
blocks (every block walks many tiles, so both groups take many turns). Run on the H200:
``pytest -q -m gpu tests/test_pingpong_gpu.py``."""
import ml_dtypes
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS
from gpucheck import matmul_data, poisoned_run

pytestmark = pytest.mark.gpu
SPEC = KERNELS["matmul_tc"]
PP = dict(warp_specialize=True, registers=(40, 232), pingpong=True)
SHAPES = ((128, 128, 64), (500, 1000, 300), (4096, 4096, 4096))
NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def _compiled(cache={}, **kw):
    key = tuple(sorted(kw.items()))
    if key not in cache:
        cache[key] = api.compile(SPEC.factory(**{**PP, **kw}))
    return cache[key]


def _run(ck, shape, b_layout="nk", dtype="bfloat16", out_dtype=None):
    """K padded with zeros to a multiple of 8 (TMA row pitches are multiples of 16 bytes): adds nothing."""
    m, n, kk = shape
    a, b, want = matmul_data(shape, dtype)
    pad = -kk % 8
    a, b = np.pad(a, ((0, 0), (0, pad))), np.pad(b, ((0, pad), (0, 0)))
    args = {"a": a, "b": b if b_layout == "kn" else np.ascontiguousarray(b.T),
            "c": np.empty((m, n), NP[out_dtype or dtype])}
    return poisoned_run(ck, args, {"c": want}, ("c",), *SPEC.tolerances(shape, out_dtype or dtype),
                        f"{shape} b_layout={b_layout}")


@pytest.mark.parametrize("tile", [dict(bm=128, bn=128), dict(bm=64, bn=256)], ids=["128x128", "64x256"])
@pytest.mark.parametrize("blocks", [132, 3])
def test_pingpong_tiles(tile, blocks):
    ck = _compiled(stages=4, persistent=blocks, **tile)
    failures = [f for shape in SHAPES for f in _run(ck, shape)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("stages", [2, 3, 5])
def test_pingpong_stages(stages):
    ck = _compiled(stages=stages, persistent=132, bm=128, bn=128)
    failures = [f for shape in SHAPES[:2] + ((1000, 520, 136),) for f in _run(ck, shape)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype,out_dtype,b_layout", [("float16", "float16", "nk"), ("bfloat16", "float32", "nk"),
                                                      ("bfloat16", "bfloat16", "kn"), ("float16", "float32", "kn")])
def test_pingpong_dtypes_and_layouts(dtype, out_dtype, b_layout):
    ck = _compiled(stages=4, persistent=132, bm=128, bn=128, dtype=dtype, out_dtype=out_dtype, b_layout=b_layout)
    failures = [f for shape in SHAPES for f in _run(ck, shape, b_layout, dtype, out_dtype)]
    assert not failures, "\n".join(failures)
