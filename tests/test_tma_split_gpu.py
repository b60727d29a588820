"""Split tensor maps on a Hopper GPU: the launcher's encoding of the view must land the boxes numpy's
reshape says (outputs poisoned first), and persistent(one_box=True) must normalize as numpy does."""
import numpy as np
import pytest

from cbrules import api
from cbrules.ir.bind import NP_DTYPES
from cbrules.kernels import KERNELS, reductions
from gpucheck import poisoned_run
from test_tma_split import CASES, SWIZZLED, boxes_by_numpy, split_copy, split_store

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rank, split, box, shape, dtype, swizzle",
                         [(*c, d, "none") for c in CASES for d in ("float32", "bfloat16")]
                         + [(*c, "128B") for c in SWIZZLED])
def test_split_map_boxes_on_the_gpu(rank, split, box, shape, dtype, swizzle):
    src = (np.arange(np.prod(shape)).reshape(shape) % 250 + 1).astype(NP_DTYPES[dtype])  # exact in bfloat16
    want = boxes_by_numpy(src, split, box).astype(np.float64)
    ck = api.compile(split_copy(rank, split, box, dtype, swizzle))
    args = {"x": src, "out": np.zeros(want.shape, NP_DTYPES[dtype])}
    failures = poisoned_run(ck, args, {"out": want}, ("out",), 0.0, 0.0, shape)
    assert not failures, "\n".join(failures)


def test_a_tma_store_through_a_rank_4_split_map_on_the_gpu():
    """The rank-4/5 prelude's store: the box lands at the view's coordinates, its outside part clipped, and
    nothing else of y changes."""
    y = np.random.default_rng(1).standard_normal((2, 3, 32 * 3)).astype(np.float32)
    want = y.copy()
    want.reshape(2, 3, 3, 32)[1:2, 1:3, 2:3, :] = (np.arange(128, dtype=np.float32) + 1).reshape(1, 2, 2, 32)[:, :, :1]
    api.compile(split_store())(y=y)
    np.testing.assert_array_equal(y, want)


# row, width, threads, box: the bfloat16 benchmark's 32768-wide rows (one (64, 256) box a stage), a float32
# row of 32768 (one (64, 128) box a stage) and narrower rows of several stages
ONE_BOX = [("bfloat16", 32768, 16384, 512, 256), ("float32", 32768, 8192, 512, 128),
           ("bfloat16", 16384, 4096, 256, 256), ("float32", 4096, 1024, 256, 256)]


@pytest.mark.parametrize("dtype, row, width, threads, box, stages",
                         [(*case, s) for case in ONE_BOX for s in (2, 3) if case[1] // case[2] >= s])  # S <= tiles
def test_persistent_one_box(dtype, row, width, threads, box, stages):
    sp = KERNELS["persistent"]
    ck = api.compile(reductions.persistent(stages, row=row, width=width, threads=threads, box=box, dtype=dtype,
                                           one_box=True))
    for m in (300, 37):
        shape = (m, row)
        args = sp.make_inputs(shape, np.random.default_rng(row + m), dtype)
        failures = poisoned_run(ck, args, sp.expected(args), sp.outputs, *sp.tolerances(shape, dtype), shape)
        assert not failures, "\n".join(failures)
