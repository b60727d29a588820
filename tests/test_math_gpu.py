"""tanh, erf, exp2, log2, sigmoid, rsqrt and exp on a Hopper GPU, outputs poisoned first: float32 within each
function's documented error (cbrules.ir.ops.MATH_ERRORS) of the exact result on random and edge inputs,
float64 and bfloat16 tensors too, and the interpreter within the same distance of the GPU."""
import numpy as np
import pytest

from cbrules import api
from cbrules.ir.bind import NP_DTYPES
from cbrules.reference.interp import run
from test_math import elementwise, inputs, reference, sigmoid_flushed, ulps

pytestmark = pytest.mark.gpu
# the documented bound against the correctly rounded result, plus the half ulp from there to the exact value
F32_ULP = {"tanh": 2.5, "erf": 2.5, "exp2": 2.5, "log2": 1.5, "sigmoid": 6.0, "rsqrt": 2.5, "exp": 2.5}
F64_ULP = 8  # the double functions' 1-2 ulp (sigmoid: 3.5) and Python's float64 reference's own few


def launched(k, x: np.ndarray) -> np.ndarray:
    """out = the kernel on x, with out poisoned (0xFF bytes: NaN) before the launch."""
    args = {"x": x, "out": np.zeros_like(x)}
    bound = api.compile(k).bind(**args)
    bound.arrays["out"].fill_bytes(0xFF)
    bound.launch()
    bound.finish()
    return args["out"]


@pytest.mark.parametrize("op", sorted(F32_ULP))
def test_float32_within_the_documented_error(op):
    x = inputs(op, n=20000, seed=11)
    k = elementwise(op)
    got = launched(k, x)
    want = reference(op, x)
    keep = sigmoid_flushed(x, got, want) if op == "sigmoid" else slice(None)
    d = ulps(got[keep], want[keep])
    assert d.max() <= F32_ULP[op], (op, x[keep][np.argmax(d)], got[keep][np.argmax(d)], d.max())
    # the interpreter (exact, rounded) within the same distance of the GPU
    interp = run(k, {"x": x, "out": np.zeros_like(x)})["out"]
    assert ulps(got[keep], interp[keep].astype(np.float64)).max() <= F32_ULP[op] + 0.5


@pytest.mark.parametrize("op", ("tanh", "erf", "exp2", "log2", "sigmoid", "rsqrt"))
def test_float64_registers_on_the_gpu(op):
    x = inputs(op, n=4000, seed=12, dtype="float64")
    got = launched(elementwise(op, "float64", "float64"), x)
    d = ulps(got, reference(op, x), bits=53, tiny=2.0 ** -1074)
    assert d.max() <= F64_ULP, (op, x[np.argmax(d)], d.max())


@pytest.mark.parametrize("op", ("tanh", "erf", "exp2", "log2", "sigmoid"))
def test_bfloat16_tensors_on_the_gpu(op):
    x = inputs(op, n=4000, seed=13, dtype="bfloat16")
    got = launched(elementwise(op, "bfloat16"), x)
    with np.errstate(over="ignore"):
        want = reference(op, x).astype(np.float32).astype(NP_DTYPES["bfloat16"]).astype(np.float64)
    keep = sigmoid_flushed(x, got, want) if op == "sigmoid" else slice(None)
    assert ulps(got[keep], want[keep], bits=8, tiny=2.0 ** -133).max() <= 1


def test_exp2_approx_within_exp2s_bound_and_flushed_below_the_normals():
    from test_math import _flushed_exp2
    x = inputs("exp2", n=20000, seed=14)
    k = elementwise("exp2_approx")
    got = launched(k, x)
    want, low = _flushed_exp2(x)
    assert low.any() and (got[low] == 0).all()
    d = ulps(got[~low], want[~low])
    assert d.max() <= F32_ULP["exp2"], (x[~low][np.argmax(d)], d.max())
    interp = run(k, {"x": x, "out": np.zeros_like(x)})["out"]
    assert ulps(got, interp.astype(np.float64)).max() <= F32_ULP["exp2"] + 0.5
