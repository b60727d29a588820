"""Vector accesses on a Hopper GPU: the half-precision tiles the benchmarks use (one 4-, 8- or 16-byte
copy a thread instead of one access per element) against numpy, outputs poisoned first."""
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS, reductions
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu
PERSISTENT = [(4096, 1024, 256), (16384, 8192, 512), (2048, 1024, 128)]  # row, width, threads: 8, 16, 16 bytes


def _check_sums(sp, ck, shapes, dtype, seed, axis):
    """Run a sum kernel on each shape against numpy; the tolerance grows with the summed length (a sum
    of ~sqrt(n)-sized values rounded to the output dtype)."""
    for shape in shapes:
        args = sp.make_inputs(shape, np.random.default_rng(seed), dtype)
        rtol, atol = sp.tolerances(shape, dtype)
        failures = poisoned_run(ck, args, sp.expected(args), sp.outputs, rtol, atol + 1e-2 * np.sqrt(shape[axis]),
                                shape)
        assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("row, width, threads", PERSISTENT)
def test_vectorized_normalize(dtype, row, width, threads):
    sp = KERNELS["persistent"]
    ck = api.compile(reductions.persistent(2, row=row, width=width, threads=threads, dtype=dtype))
    assert "cb_vcopy<" in ck.source.text
    args = sp.make_inputs((300, row), np.random.default_rng(row), dtype)
    failures = poisoned_run(ck, args, sp.expected(args), sp.outputs, *sp.tolerances((300, row), dtype), (300, row))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("width", [512, 1024, 2048])
def test_vectorized_inner_sum(dtype, width):
    sp = KERNELS["inner_reduction"]
    ck = api.compile(reductions.inner_reduction(3, width=width, dtype=dtype))
    assert "cb_vcopy<" in ck.source.text
    _check_sums(sp, ck, ((257, 5000), (64, 65536)), dtype, seed=width, axis=1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("width, rows", [(1024, 4), (512, 8), (256, 2)])
def test_inner_sum_rows_a_block(dtype, width, rows):
    """Several rows a block; M not a multiple of the rows (the last block's extra rows store nothing)."""
    sp = KERNELS["inner_reduction"]
    ck = api.compile(reductions.inner_reduction(3, width=width, rows=rows, dtype=dtype))
    _check_sums(sp, ck, ((257, 5000), (1023, 4096)), dtype, seed=width + rows, axis=1)


@pytest.mark.parametrize("dtype, rows, cols", [("bfloat16", 512, 64), ("bfloat16", 512, 32), ("float32", 512, 32)])
def test_outer_sum_tiles_taller_than_a_box(dtype, rows, cols):
    sp = KERNELS["outer_reduction"]
    ck = api.compile(reductions.outer_reduction(3, rows=rows, cols=cols, dtype=dtype))
    _check_sums(sp, ck, ((1500, 264), (4096, 1000)), dtype, seed=rows + cols, axis=0)


# the bfloat16 tuned variants (cbrules/kernels/tuned.py: rows a block, tall tiles, 256-element boxes,
# whole rows in flight) on shapes that pick them, M cutting through the blocks
HALF_BENCH = [("inner_sum", (1001, 4096)), ("outer_sum", (1500, 4096)), ("normalize", (101, 4096)),
              ("normalize", (37, 16384)), ("normalize", (9, 32768)), ("normalize", (5, 65536))]


@pytest.mark.parametrize("op, shape", HALF_BENCH, ids=str)
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_half_benchmark_kernels(op, shape, stages):
    from cbrules.kernels.tuned import build_generated, tiles
    sp = KERNELS[tiles(op, shape, "bfloat16")[0]]
    ck = api.compile(build_generated(op, shape, stages, "bfloat16"))
    args = sp.make_inputs(shape, np.random.default_rng(stages), "bfloat16")
    rtol, atol = sp.tolerances(shape, "bfloat16")
    if op != "normalize":  # a sum of ~sqrt(n)-sized values rounded to bfloat16
        atol += 1e-2 * np.sqrt(shape[1] if op == "inner_sum" else shape[0])
    failures = poisoned_run(ck, args, sp.expected(args), sp.outputs, rtol, atol, shape)
    assert not failures, "\n".join(failures)
