"""k.shfl on a Hopper GPU: every mode and width, literal and per-lane operands, float32 and int32, against
the numpy model of test_shfl.py (and the interpreter); outputs poisoned first."""
import numpy as np
import pytest

from cbrules import api
from cbrules.reference.interp import run
from gpucheck import poisoned_run
from test_shfl import MODES, _inputs, group_max, shuffle_kernel, want_shfl

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("width", (32, 8, 4, 2, 1))
@pytest.mark.parametrize("dtype", ("float32", "int32"))
def test_every_mode_width_and_dtype_on_the_gpu(mode, width, dtype):
    failures = []
    for lane in sorted({0, min(1, width - 1), width - 1, "b"}, key=str):
        k = shuffle_kernel(mode, width, lane, dtype=dtype, block=128)
        a = _inputs(dtype, n=128, seed=width)
        args = a if lane == "b" else {n: a[n] for n in ("x", "out")}
        b = a["b"] if lane == "b" else np.full(128, lane)
        want = want_shfl(a["x"], b, mode, width)
        np.testing.assert_array_equal(run(k, {n: v.copy() for n, v in args.items()})["out"], want)
        failures += poisoned_run(api.compile(k), args, {"out": want.astype(np.float64)}, ["out"], 0, 0,
                                 f"lane {lane}")
    assert not failures, "\n".join(failures)


def test_butterfly_group_max_on_the_gpu():
    a = _inputs(seed=5)
    want = np.repeat(a["x"].reshape(-1, 4).max(axis=1), 4).astype(np.float64)
    args = {n: a[n] for n in ("x", "out")}
    assert not poisoned_run(api.compile(group_max(1, 2)), args, {"out": want}, ["out"], 0, 0, (64,))
