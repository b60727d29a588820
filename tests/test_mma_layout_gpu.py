"""matmul_tc with B in both layouts on a Hopper GPU: ``b_layout="nk"`` (b [N, K], c = a @ b^T) and
``b_layout="kn"`` (b [K, N] row-major, c = a @ b, read MN-major through the wgmma transpose bit) at
128x128x64, 500x1000x300 and 4096^3 for bfloat16 and float16, against one float64 numpy reference of the
same data; then kn tile variants (every panel swizzle span, persistent, not warp-specialized, float32
output). Outputs poisoned first. Run on the H200: ``pytest -q -m gpu tests/test_mma_layout_gpu.py``."""
import ml_dtypes
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu
SPEC = KERNELS["matmul_tc"]
WS = dict(warp_specialize=True, registers=(40, 232))
SHAPES = ((128, 128, 64), (500, 1000, 300), (4096, 4096, 4096))
NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def _compiled(cache={}, **kw):
    key = tuple(sorted(kw.items()))
    if key not in cache:
        cache[key] = api.compile(SPEC.factory(**kw))
    return cache[key]


def _data(shape, dtype, cache={}):
    """(a [M, K], b [K, N], float64 a @ b) of one seed, shared by both layouts."""
    key = (shape, dtype)
    if key not in cache:
        m, n, kk = shape
        rng = np.random.default_rng(sum(shape))
        a = rng.standard_normal((m, kk), dtype=np.float32).astype(NP[dtype])
        b = rng.standard_normal((kk, n), dtype=np.float32).astype(NP[dtype])
        cache[key] = a, b, a.astype(np.float64) @ b.astype(np.float64)
    return cache[key]


def _run(ck, shape, b_layout, dtype="bfloat16", out_dtype=None):
    """Launch on ``shape`` with b in ``b_layout``; K padded with zeros to a multiple of 8 (TMA row pitches
    are multiples of 16 bytes), which adds nothing to the product."""
    m, n, kk = shape
    a, b, want = _data(shape, dtype)
    pad = -kk % 8
    a = np.pad(a, ((0, 0), (0, pad)))
    b = np.pad(b, ((0, pad), (0, 0)))
    args = {"a": a, "b": b if b_layout == "kn" else np.ascontiguousarray(b.T),
            "c": np.empty((m, n), NP[out_dtype or dtype])}
    return poisoned_run(ck, args, {"c": want}, ("c",), *SPEC.tolerances(shape, out_dtype or dtype),
                        f"{shape} b_layout={b_layout}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_both_layouts_both_dtypes(b_layout, dtype):
    ck = _compiled(stages=4, dtype=dtype, b_layout=b_layout, **WS)
    failures = [f for shape in SHAPES for f in _run(ck, shape, b_layout, dtype)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("kw", [
    dict(stages=3, bn=128, bk=32),  # 128-byte panels, two k-steps a tile
    dict(stages=3, bm=128, bn=96, bk=64, out_dtype="float32"),  # 64-byte panels of 32 columns
    dict(stages=3, bm=64, bn=48, bk=16, groups=1),  # 32-byte panels of 16 columns
    dict(stages=4, persistent=132),
    dict(stages=3, bn=192, persistent=4),
    dict(stages=3, war="sync", ws=False),
    dict(stages=3, war="mbarrier", ws=False),
    dict(stages=4, out_dtype="float32"),
    dict(stages=4, dtype="float16", bn=128, group_m=1),
], ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_kn_variants(kw):
    kw = dict(kw)
    ws = WS if kw.pop("ws", True) else {}
    ck = _compiled(b_layout="kn", **kw, **ws)
    dtype, out_dtype = kw.get("dtype", "bfloat16"), kw.get("out_dtype")
    failures = [f for shape in ((500, 1000, 300), (129, 264, 72), (1024, 2048, 4096))
                for f in _run(ck, shape, "kn", dtype, out_dtype)]
    assert not failures, "\n".join(failures)
