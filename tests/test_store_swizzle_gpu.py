"""TMA-store epilogues and swizzled tiles on a Hopper GPU: the interpreter's swizzled layout against
the hardware's, tile stores through swizzled maps, and the tile-output / swizzling kernels at the seed
shapes against numpy; torch bfloat16 tensors borrowed through DLPack."""
import numpy as np
import pytest

from cbrules import api
from cbrules.reference.interp import run
from cbrules.kernels import KERNELS
from test_swizzle import SPANS, _layout_kernel
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu
NP = {"float32": np.float32, "float16": np.float16}


def _np_dtype(dtype):
    import ml_dtypes
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else NP[dtype]


@pytest.mark.parametrize("swizzle", SPANS)
@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
def test_hardware_swizzled_layout_matches_the_interpreter(swizzle, dtype):
    """The lowered layout kernel reads with swizzled addresses (rules/swizzle.rules), so it returns
    the box in logical order only if the hardware put each element where the interpreter's pattern
    says (the interpreter's raw layout itself is test_swizzle's)."""
    k = _layout_kernel(swizzle, dtype)
    esize = 4 if dtype == "float32" else 2
    w = SPANS[swizzle] // esize
    x = (np.arange(8 * w * 2) % 251).astype(np.float32).reshape(16, w).astype(_np_dtype(dtype))
    args = {"x": x, "out": np.zeros(8 * w, _np_dtype(dtype))}
    kg = api.lower(k)
    assert "swizzle(" in str([kg[n].get("index") for n in kg.nodes("load")])
    want = run(kg, dict(args))["out"]
    np.testing.assert_array_equal(want.astype(np.float32), x[:8].reshape(-1).astype(np.float32))
    api.compile(k)(**args)
    np.testing.assert_array_equal(args["out"].astype(np.float32), want.astype(np.float32))


def _check(sp, shape, stages, dtype, **variant):
    ck = api.compile(sp.build(shape, stages=stages, dtype=dtype, **variant))
    args = sp.make_inputs(shape, np.random.default_rng(hash((sp.name, stages, shape)) % 2**32), dtype)
    # trip counts below S included: the prologue is predicated (issue 17)
    want = sp.expected(args)
    return "\n".join(poisoned_run(ck, args, want, sp.outputs, *sp.tolerances(shape, dtype), shape))


STORE_CASES = [(n, d, s) for n in KERNELS if KERNELS[n].tile_output
               for d in ("float32", "float16", "bfloat16") for s in (2, 3, 4)]


@pytest.mark.parametrize("case", STORE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-S{c[2]}")
def test_tma_store_kernels_against_numpy(case):
    name, dtype, stages = case
    sp = KERNELS[name]
    results = [_check(sp, shape, stages, dtype, tma_store=True) for shape in sp.shapes]
    assert not [r for r in results if r], "\n".join(r for r in results if r)
    assert any(r == "" for r in results)


SWIZZLE_CASES = [(n, d, z) for n in ("multi_dim", "pointwise") for d in ("float32", "bfloat16") for z in SPANS]


@pytest.mark.parametrize("case", SWIZZLE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_swizzled_kernels_against_numpy(case):
    name, dtype, swizzle = case
    sp = KERNELS[name]
    results = [_check(sp, shape, 3, dtype, swizzle=swizzle, tma_store=True) for shape in sp.shapes]
    assert not [r for r in results if r], "\n".join(r for r in results if r)


def test_torch_bfloat16_tensors_are_borrowed():
    torch = pytest.importorskip("torch")
    sp = KERNELS["pointwise"]
    ck = api.compile(sp.build(stages=3, dtype="bfloat16", tma_store=True))
    x = torch.randn(500, 1024, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(500, 1024, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    ck(x=x, y=y, out=out)
    torch.cuda.synchronize()
    assert torch.equal(out, x + y)  # one rounding of the float32 sum, as torch's bf16 add does


@pytest.mark.parametrize("swizzle", SPANS)
@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
def test_tile_stored_through_a_swizzled_map(swizzle, dtype):
    """The rules stage each box in the map's swizzle and the hardware's TMA store reads it back dense
    (rules/tma_store.rules, tma-store-to-swizzled-staging): the CPU model's layout is the hardware's."""
    from test_mma_store_swizzle import doubled_rows_args, doubled_rows_kernel
    ck = api.compile(doubled_rows_kernel(swizzle, dtype))
    for n in (8, 29, 1000):
        args, want = doubled_rows_args(swizzle, dtype, n)
        assert not poisoned_run(ck, args, {"out": want}, ("out",), 0.0, 0.0, (n,))
