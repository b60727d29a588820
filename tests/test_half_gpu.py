"""The seed matrix in float16 and bfloat16 on a Hopper GPU: every kernel x S in 2..4 (default
prefetch, sync WAR) x seed shape against numpy on the rounded inputs; outputs poisoned first."""
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS, SEED_MATRIX
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu
CASES = [(name, dtype, s) for name in SEED_MATRIX for dtype in ("float16", "bfloat16") for s in (2, 3, 4)]


def _compiled(sp, shape, stages, dtype, cache={}):
    params = sp.build_params(shape)
    key = (sp.name, stages, dtype, tuple(sorted(params.items())))
    if key not in cache:
        cache[key] = api.compile(sp.build(shape, stages=stages, dtype=dtype))
    return cache[key]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-S{c[2]}")
def test_half_seed_matrix_against_numpy(case):
    name, dtype, stages = case
    sp = KERNELS[name]
    failures, ran = [], 0
    for shape in sp.shapes:
        ck = _compiled(sp, shape, stages, dtype)
        args = sp.make_inputs(shape, np.random.default_rng(hash((name, stages, shape)) % 2**32), dtype)
        # trip counts below S included: the prologue is predicated (issue 17)
        want = sp.expected(args)
        failures += poisoned_run(ck, args, want, sp.outputs, *sp.tolerances(shape, dtype), shape)
        ran += 1
    assert not failures, "\n".join(failures)
    assert ran > 0
