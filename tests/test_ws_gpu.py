"""The seed matrix warp-specialized on a Hopper GPU: every kernel x S in {2, 3, 4} x register
sharing (none, 40/232) x shape against numpy, outputs poisoned (NaN) before each launch. A
warp-specialized loop takes any trip count, so every shape runs (none is refused)."""
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS, SEED_MATRIX
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu

CASES = [(name, s, regs) for name in SEED_MATRIX for s in (2, 3, 4) for regs in (None, (40, 232))]


def case_id(case) -> str:
    name, s, regs = case
    return f"{name}-S{s}-" + ("regs" if regs else "noregs")


def compiled(sp, shape, S, regs, cache={}):
    params = sp.build_params(shape)
    key = (sp.name, S, regs, tuple(sorted(params.items())))
    if key not in cache:
        cache[key] = api.compile(sp.build(shape, stages=S, warp_specialize=True, registers=regs))
    return cache[key]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_warp_specialized_seed_matrix_against_numpy(case):
    name, S, regs = case
    sp = KERNELS[name]
    failures = []
    for shape in sp.shapes:
        ck = compiled(sp, shape, S, regs)
        args = sp.inputs(shape, np.random.default_rng(hash((name, S, shape)) % 2**32))
        want = sp.reference(args)
        failures += poisoned_run(ck, args, want, sp.outputs, *sp.tolerance(shape), shape)
    assert not failures, "\n".join(failures)
