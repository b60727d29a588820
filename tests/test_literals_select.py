"""Infinities and NaN as literals, select(pred, a, b), and scalar launch parameters (k.scalar): the
builder, the interpreter, NVRTC and the launcher's checks (the GPU runs are in test_traps_gpu.py)."""
import math

import numpy as np
import pytest

from cbrules import api
from cbrules.ir.bind import LaunchError
from cbrules.ir.builder import BuildError, Kernel, blockIdx, ceil_div, circular_buffer, threadIdx
from cbrules.reference.interp import run

WIDTH = 256


def row_max(dtype="float32", scalar_dtype="float32", finite=True):
    """``out[m] = max(x[m, :]) * scale + shift``: the ragged tail is masked with select and -inf (TMA's
    zero padding would win the max of a negative row)."""
    k = Kernel("row_max", block=WIDTH)
    m, n = k.symbol("M"), k.symbol("N")
    scale, shift = k.scalar("scale", scalar_dtype, finite=finite), k.scalar("shift", "float64")
    x, out = k.tensor("x", (m, n), dtype), k.tensor("out", (m,), dtype)
    xm = k.tensor_map(x, box=(1, WIDTH))
    tile = k.alloc("tile", "shared", dtype, (1, WIDTH))
    k.grid(m)
    k.assign(float("-inf"), dst="best")
    with k.loop("j", ceil_div(n, WIDTH), circular_buffer=circular_buffer(2)) as j:
        k.tma_load(xm, (blockIdx.x, j * WIDTH), tile)
        v = k.select((j * WIDTH + threadIdx.x).lt(n), k.load(tile, threadIdx.x), float("-inf"))
        k.reduce(v, kind="serial", combine="max", dst="best")
    total = k.reduce(k.assign("best"), kind="block", combine="max")
    with k.if_(threadIdx.x.eq(0)):
        k.store(out, blockIdx.x, k.fma(total, scale, shift))
    return k


def inputs(rows=3, cols=296, seed=0):
    rng = np.random.default_rng(seed)
    x = -np.abs(rng.standard_normal((rows, cols), dtype=np.float32)) - 1  # every element < 0: padding would win
    return {"x": x, "out": np.full(rows, np.nan, np.float32)}


def test_select_and_minus_infinity_mask_a_ragged_tail():
    a = inputs()
    got = run(api.lower(row_max()), {**a, "scale": 2.0, "shift": 0.5})["out"]
    np.testing.assert_allclose(got, a["x"].max(1) * 2 + 0.5, rtol=1e-6)
    assert (got < 0).all()  # the zero padding did not count


def test_infinities_and_nan_compile_with_nvrtc():
    src = api.generate(row_max()).text
    assert "__int_as_float(0xff800000)" in src and "inff" not in src
    assert " ? " in src and "float scale" in src and "double shift" in src
    api.compile(row_max())  # NVRTC takes it (it refused `-inff` before)

    k = Kernel("lits", block=32)
    out = k.tensor("out", (96,))
    for i, v in enumerate((math.inf, -math.inf, math.nan)):
        k.store(out, i * 32 + threadIdx.x, k.assign(v, dtype="float64" if i == 1 else "float32"))
    api.compile(k)
    got = run(api.lower(k), {"out": np.zeros(96, np.float32)})["out"].reshape(3, 32)
    assert (got[0] == np.inf).all() and (got[1] == -np.inf).all() and np.isnan(got[2]).all()


def test_an_infinity_in_an_integer_register_or_an_index_is_refused():
    k = Kernel("bad", block=32)
    with pytest.raises(BuildError, match="int32 register.*only float32 and float64"):
        k.assign(float("inf"), dtype="int32")
    out = k.tensor("out", (32,))
    k.store(out, threadIdx.x + float("nan"), 1.0)
    with pytest.raises(Exception, match="no index, bound or predicate"):
        api.lower(k)


def test_half_precision_tensors_take_infinity():
    a = inputs()
    k = row_max(dtype="bfloat16")
    import ml_dtypes
    x16 = a["x"].astype(ml_dtypes.bfloat16)
    got = run(api.lower(k), {"x": x16, "out": np.zeros(3, ml_dtypes.bfloat16), "scale": 1.0, "shift": 0.0})["out"]
    np.testing.assert_array_equal(got.astype(np.float32), x16.astype(np.float32).max(1))


@pytest.mark.parametrize("value, message", [
    (float("inf"), "not finite"), (float("nan"), "not finite"), ("1.0", "not a number"),
    (True, "not a number"), (1e39, "too large for float32"), (None, "not a number"),
])
def test_the_launcher_checks_float_scalars(value, message):
    with pytest.raises(LaunchError, match=message):
        run(api.lower(row_max()), {**inputs(), "scale": value, "shift": 0.0})


def test_a_non_finite_scalar_runs_when_declared_so():
    got = run(api.lower(row_max(finite=False)), {**inputs(), "scale": float("inf"), "shift": 0.0})["out"]
    assert (got == -np.inf).all()


def test_a_missing_scalar_is_named():
    with pytest.raises(LaunchError, match="no value for symbol.*scale"):
        run(api.lower(row_max()), {**inputs(), "shift": 0.0})


@pytest.mark.parametrize("dtype, value, message", [
    ("int32", 2.0, "not an integer"), ("uint32", -1, "outside uint32's range"), ("int64", 2 ** 63, "outside int64"),
    ("uint64", 1.5, "is a float"),
])
def test_the_launcher_checks_integer_scalars(dtype, value, message):
    with pytest.raises(LaunchError, match=message):
        run(api.lower(row_max(scalar_dtype=dtype)), {**inputs(), "scale": value, "shift": 0.0})


def test_integer_scalars_run():
    a = inputs()
    got = run(api.lower(row_max(scalar_dtype="int64")), {**a, "scale": 3, "shift": 0.25})["out"]
    np.testing.assert_allclose(got, a["x"].max(1) * 3 + 0.25, rtol=1e-6)


def test_half_scalars_are_refused_at_build():
    with pytest.raises(BuildError, match="dtype 'float16' is not one of"):
        Kernel("h").scalar("eps", "float16")
