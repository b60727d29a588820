"""The seed matrix on a Hopper GPU: every kernel x S x P x WAR mode x shape against numpy.

Each (kernel, S, P, WAR) compiles once and runs every shape; outputs are poisoned (NaN) before
each launch. A shape whose circular-buffered loop runs fewer iterations than S runs too (the
prologue's loads past the end are predicated off).
"""
import numpy as np
import pytest

from cbrules import api
from cbmatrix import CASES, case_id, spec
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu


def compiled(sp, shape, S, P, war, cache={}):
    params = sp.build_params(shape)
    key = (sp.name, S, P, war, tuple(sorted(params.items())))
    if key not in cache:
        cache[key] = api.compile(sp.build(shape, stages=S, prefetch=P, war=war))
    return cache[key]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_seed_matrix_against_numpy(case):
    name, S, P, war = case
    sp = spec(name)
    failures, ran = [], 0
    for shape in sp.shapes:
        ck = compiled(sp, shape, S, P, war)
        args = sp.inputs(shape, np.random.default_rng(hash((name, S, P, shape)) % 2**32))
        want = sp.reference(args)
        failures += poisoned_run(ck, args, want, sp.outputs, *sp.tolerance(shape), shape)
        ran += 1
    assert not failures, "\n".join(failures)
    assert ran == len(sp.shapes)
