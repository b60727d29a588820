"""FP8 matmul_tc (wgmma m64nNk32 e4m3/e5m2) on a Hopper GPU against a float64 numpy reference of the
dequantized inputs: every type pair, each scaling, warp-specialized and not, ping-pong, an epilogue, an
FP8 output; torch float8 tensors borrowed in place where torch is installed. Outputs poisoned first."""
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS
from cbrules.kernels.specs import matmul_tc_variant, with_pingpong
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu
SPEC = KERNELS["matmul_tc"]
WS = dict(warp_specialize=True, registers=(40, 232))
SHAPES = ((128, 128, 128), (500, 1000, 384), (4096, 4096, 4096), (129, 264, 80))
PAIRS = [("float8_e4m3", None), ("float8_e5m2", None), ("float8_e4m3", "float8_e5m2"), ("float8_e5m2", "float8_e4m3")]


def _spec(dtype, scaling=None, epilogue="none"):
    base = matmul_tc_variant(SPEC, "nk", epilogue, scaling) if scaling or epilogue != "none" else SPEC
    return base.for_dtype(dtype)


def _run(spec, ck, shape, dtype, b_dtype=None, seed=0):
    import ml_dtypes
    args = spec.make_inputs(shape, np.random.default_rng(seed), dtype)
    if b_dtype is not None:  # B of the other FP8 type: its own rounding of the same normal values
        rng = np.random.default_rng(seed + 1)
        args["b"] = rng.standard_normal(args["b"].shape, dtype=np.float32).astype(
            {"float8_e4m3": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}[b_dtype])
    want = spec.expected(args)
    return poisoned_run(ck, args, want, spec.outputs, *spec.tolerances(shape, dtype), shape)


@pytest.mark.parametrize("dtype,b_dtype", PAIRS, ids=lambda v: str(v))
def test_type_pairs_warp_specialized(dtype, b_dtype):
    spec = _spec(dtype)
    ck = api.compile(spec.build(stages=4, dtype=dtype, **WS) if b_dtype is None else
                     spec.factory(stages=4, dtype=dtype, b_dtype=b_dtype, **WS))
    failures = [f for shape in SHAPES for f in _run(spec, ck, shape, dtype, b_dtype)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("scaling", ["none", "tensor", "rowcol", "block"])
def test_scalings(scaling):
    spec = _spec("float8_e4m3", scaling)
    ck = api.compile(spec.build(stages=4, dtype="float8_e4m3", **WS))
    failures = [f for shape in SHAPES[:2] + SHAPES[3:] for f in _run(spec, ck, shape, "float8_e4m3", seed=3)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("war", ["sync", "mbarrier"])
def test_not_warp_specialized(war):
    spec = _spec("float8_e4m3")
    ck = api.compile(spec.build(stages=3, war=war, dtype="float8_e4m3"))
    failures = [f for shape in SHAPES[:2] + ((130, 136, 48),) for f in _run(spec, ck, shape, "float8_e4m3", seed=5)]
    assert not failures, "\n".join(failures)


def test_fast_accumulation_within_its_bound():
    # promote=False: the tensor cores' own accumulation over all of K, which keeps fewer bits than float32;
    # each element within 2**-10 of the sum of its |a_k b_k| (measured on the H200: at most 2**-11), the
    # promoted kernel within the spec's far tighter tolerance on the same data
    import ml_dtypes
    from cbrules.kernels.matmul_tc import matmul_tc
    fast = api.compile(matmul_tc(stages=4, dtype="float8_e4m3", out_dtype="float32", promote=False, **WS))
    promoted = api.compile(matmul_tc(stages=4, dtype="float8_e4m3", out_dtype="float32", **WS))
    m, n, k = 512, 512, 8192
    rng = np.random.default_rng(13)
    a, b = (rng.standard_normal(s, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn) for s in ((m, k), (n, k)))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact, bound = a64 @ b64.T, np.abs(a64) @ np.abs(b64).T * 2.0 ** -10
    errors = {}
    for nm, ck in (("fast", fast), ("promoted", promoted)):
        c = np.full((m, n), np.nan, np.float32)
        ck(a=a, b=b, c=c, scale_a=1.0, scale_b=1.0)
        errors[nm] = np.abs(c - exact)
    assert (errors["fast"] <= bound).all(), errors["fast"].max()
    assert errors["promoted"].max() <= _tight(k), errors["promoted"].max()
    assert errors["promoted"].max() < errors["fast"].max() / 4  # what promotion is for


def _tight(k):
    return SPEC.for_dtype("float8_e4m3").tolerances((1, 1, k), "float8_e4m3")[1]


def test_pingpong_and_epilogue():
    spec = with_pingpong(_spec("float8_e4m3", "rowcol", "bias_gelu"), 132)
    ck = api.compile(spec.build(stages=4, dtype="float8_e4m3", **WS))
    failures = [f for shape in SHAPES for f in _run(spec, ck, shape, "float8_e4m3", seed=9)]
    assert not failures, "\n".join(failures)


def test_fp8_output_saturates():
    # c in e4m3 with an output scale: acc * scale_a * scale_b * scale_c rounded and saturated to +-448
    import ml_dtypes
    from cbrules.kernels.matmul_tc import matmul_tc
    ck = api.compile(matmul_tc(stages=4, dtype="float8_e4m3", out_dtype="float8_e4m3", **WS))
    m, n, k = 500, 1024, 384  # an FP8 c's rows are n bytes: a multiple of 16 for its TMA store
    rng = np.random.default_rng(11)
    a = rng.standard_normal((m, k), dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
    b = rng.standard_normal((n, k), dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
    c = np.zeros((m, n), ml_dtypes.float8_e4m3fn)
    scales = dict(scale_a=0.5, scale_b=2.0, scale_c=8.0)  # |c| past 448 for some elements: saturation
    exact = (a.astype(np.float64) @ b.astype(np.float64).T) * 8.0
    want = np.clip(exact, -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert (np.abs(exact) > 448).any()
    args = dict(a=a, b=b, c=c, **scales)
    # one e4m3 step (2**-3 relative), and the promoted accumulation's error (3e-3 sqrt(K)) times the scales
    assert not poisoned_run(ck, args, {"c": want}, ("c",), 2.0 ** -3, 8 * 3e-3 * k ** 0.5, (m, n, k))


def test_torch_float8_tensors_borrowed_in_place():
    torch = pytest.importorskip("torch")
    from cbrules.kernels.matmul_tc import matmul_tc
    ck = api.compile(matmul_tc(stages=4, dtype="float8_e4m3", **WS))
    m, n, k = 512, 768, 1024
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ck(a=a, b=b, c=c, scale_a=0.5, scale_b=1.5)
    torch.cuda.synchronize()
    want = (a.double() @ b.double().T) * 0.75
    assert torch.allclose(c.double(), want, rtol=2 ** -7, atol=0.05), (c.double() - want).abs().max()
