"""persistent(walk=P) on a Hopper GPU (outputs poisoned first): the bfloat16 benchmark's 32768-wide rows
and a narrow float32 row, more rows than blocks (ragged) and fewer, with and without warp specialization."""
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS, reductions
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu

# dtype, row, width, threads, box, one_box: ops.py's bfloat16 32768 choice and a narrow float32 row
WALKS = [("bfloat16", 32768, 16384, 512, 256, True), ("float32", 2048, 512, 128, 128, False)]


@pytest.mark.parametrize("dtype, row, width, threads, box, one_box", WALKS)
@pytest.mark.parametrize("ws", [False, True])
def test_a_walk_normalizes_as_numpy_does(dtype, row, width, threads, box, one_box, ws):
    sp = KERNELS["persistent"]
    ck = api.compile(reductions.persistent(2, row=row, width=width, threads=threads, box=box, dtype=dtype,
                                           one_box=one_box, warp_specialize=ws, walk=132))
    for m in (300, 37):  # 300 = 2 * 132 + 36: the blocks walk 3 or 2 rows; 37 < 132: 37 blocks of one row
        shape = (m, row)
        args = sp.make_inputs(shape, np.random.default_rng(row + m), dtype)
        failures = poisoned_run(ck, args, sp.expected(args), sp.outputs, *sp.tolerances(shape, dtype), shape)
        assert not failures, "\n".join(failures)
