"""On a Hopper GPU, the kernels issue 28's fixes changed or made possible, against numpy with
outputs poisoned first: stages="auto" where it now counts the TMA-store staging (multi_dim with
48-row tiles, pointwise --tma-store, matmul_tc 256x128) and matmul_tc with bn=96 (32-column output boxes)."""
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu


def _check(name, shapes, **params):
    spec = KERNELS[name]
    ck = api.compile(spec.factory(**params))
    failures = []
    for shape in shapes:
        args = spec.make_inputs(shape, np.random.default_rng(0), spec.dtypes[0] if name != "matmul_tc" else "bfloat16")
        failures += poisoned_run(ck, args, spec.expected(args), spec.outputs,
                                 *spec.tolerances(shape, "bfloat16" if name == "matmul_tc" else "float32"), shape)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name, params", [
    ("multi_dim", dict(stages="auto", prefetch="auto", rows=48, tma_store=True)),
    ("pointwise", dict(stages="auto", prefetch="auto", tma_store=True)),
])
def test_auto_stages_with_staged_stores(name, params):
    _check(name, [(1024, 2048), (1000, 1800)], **params)


@pytest.mark.parametrize("params", [dict(stages="auto", prefetch="auto", bm=256, bn=128),
                                    dict(stages=3, bn=96), dict(stages=3, bn=96, warp_specialize=True, registers=(40, 232))])
def test_matmul_tc_tiles(params):
    _check("matmul_tc", [(500, 1000, 304), (129, 264, 72)], **params)
