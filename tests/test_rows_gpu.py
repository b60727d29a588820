"""The row kernels on a Hopper GPU against float64 numpy, outputs poisoned: every dtype, row lengths of
one and of several vectors a thread, more rows than SMs."""
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS
from cbrules.kernels.rows import OPS
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 2e-2}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rows_on_the_gpu(op, dtype):
    spec = KERNELS[op]
    failures = []
    for shape in ((3, 256), (1000, 4096), (300, 8192), (17, 16384)):
        ck = api.compile(spec.build(shape, dtype=dtype))
        args = spec.make_inputs(shape, np.random.default_rng(shape[0]), dtype)
        failures += poisoned_run(ck, args, spec.expected(args), ("out",), TOL[dtype], TOL[dtype], shape)
    assert not failures, "\n".join(failures)
