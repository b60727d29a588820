"""Issue 17's traps on a Hopper GPU: short rows and trip counts 0..S (the predicated prologue), the
masked row max with -inf, select and scalar launch parameters, literals, and the example kernel file.
Outputs are poisoned (NaN) before each launch."""
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cbrules import api
from cbrules.ir.builder import Kernel, threadIdx
from cbrules.kernels import get
from gpucheck import poisoned_run
from test_literals_select import inputs as row_inputs, row_max
from test_trip_counts import counted

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("war", ["sync", "mbarrier"])
def test_short_rows_of_a_wide_tile(war):
    """Width 1024, S = 4: N = 128 is one tile (three stages never loaded), and longer rows around S."""
    ck = api.compile(get("inner_reduction").factory(stages=4, war=war, width=1024))
    rng = np.random.default_rng(0)
    failures = []
    for n in (128, 1000, 1024, 2048, 3000, 4096, 4100, 9000):
        x = rng.standard_normal((64, n), dtype=np.float32)
        want = {"out": x.astype(np.float64).sum(1)}
        failures += poisoned_run(ck, {"x": x, "out": np.zeros(64, np.float32)}, want, ("out",), 1e-4, 3e-6 * n, (64, n))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name, stages, war", [(n, s, w) for n in ("single_dim", "inner_reduction") for s in (2, 3, 4)
                                               for w in ("sync", "mbarrier")])
def test_trip_counts_1_to_S_of_the_seed_kernels(name, stages, war):
    spec = get(name)
    failures = []
    for t in range(1, stages + 1):
        shape = spec.shape_for_trips(t) if name == "inner_reduction" else (256 * t * 3 + 100,)
        # single_dim's trip count is a build parameter; inner_reduction's comes from N at launch
        ck = api.compile(spec.build(shape, trips=t if name == "single_dim" else None, stages=stages, war=war))
        args = spec.inputs(shape, np.random.default_rng(t))
        failures += poisoned_run(ck, args, spec.reference(args), spec.outputs, *spec.tolerance(shape), (t, shape))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("stages, war", [(2, "sync"), (3, "sync"), (4, "mbarrier"), (3, "mbarrier")])
def test_a_symbolic_trip_count_0_to_S(stages, war):
    ck = api.compile(counted(stages, war))
    x = np.random.default_rng(3).standard_normal(6 * 256, dtype=np.float32)
    for t in range(0, stages + 2):
        out = np.full_like(x, 7.0)
        ck(x=x, out=out, T=t)
        np.testing.assert_array_equal(out[: t * 256], 2 * x[: t * 256])
        assert (out[t * 256:] == 7.0).all()  # nothing written past the trip count


def test_masked_row_max_with_minus_infinity_select_and_scalars():
    ck = api.compile(row_max())
    for cols in (8, 296, 1000, 4096):
        a = row_inputs(rows=40, cols=cols, seed=cols)
        want = {"out": a["x"].max(1).astype(np.float64) * 1.5 - 0.25}
        failures = poisoned_run(ck, {**a, "scale": 1.5, "shift": -0.25}, want, ("out",), 1e-6, 1e-6, cols)
        assert not failures, failures
    with pytest.raises(Exception, match="not finite"):
        ck(**row_inputs(), scale=math.inf, shift=0.0)


def test_infinities_and_nan_literals_on_the_device():
    k = Kernel("lits", block=32)
    out = k.tensor("out", (96,))
    for i, v in enumerate((math.inf, -math.inf, math.nan)):
        k.store(out, i * 32 + threadIdx.x, k.assign(v, dtype="float64" if i == 1 else "float32"))
    got = np.zeros(96, np.float32)
    api.compile(k)(out=got)
    got = got.reshape(3, 32)
    assert (got[0] == np.inf).all() and (got[1] == -np.inf).all() and np.isnan(got[2]).all()


@pytest.mark.parametrize("extra", [[], ["--stages", "4", "--war", "mbarrier"], ["--dtype", "bfloat16"],
                                   ["--warp-specialize"]])
def test_the_example_kernel_file_runs(extra):
    r = subprocess.run([sys.executable, "-m", "cbrules.cli", "run", str(ROOT / "examples" / "rms_norm.py"),
                        "--shape", "512,1000", "--reps", "3", *extra], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "out: max abs error" in r.stdout and "(ok)" in r.stdout
