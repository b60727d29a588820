"""No silent partial loads: a shared buffer read while its TMA loads leave part of it unwritten, a TMA
load past its buffer and a read past a TMA-loaded buffer are refused where the kernel is built."""
import numpy as np
import pytest

from cbrules import api
from cbrules.ir.builder import Kernel, PartialTileError, blockIdx, ceil_div, circular_buffer, lanes, threadIdx
from cbrules.reference.interp import run


def row_sum(width=1024, tile=None, box=256, offsets=None):
    """An RMS-style row reduction: a tile of ``width`` columns per iteration."""
    k = Kernel("rows", block=256)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n)), k.tensor("out", (m,))
    xm = k.tensor_map(x, box=(1, box))
    buf = k.alloc("tile", "shared", "float32", (1, width))
    k.grid(m)
    k.assign(0.0, dst="acc")
    with k.loop("j", ceil_div(n, width), circular_buffer=circular_buffer(2)) as j:
        if offsets is None:
            k.tma_load(xm, (blockIdx.x, j * width), buf, **({} if tile is None else {"tile": tile}))
        else:
            for off in offsets:
                k.tma_load(xm, (blockIdx.x, j * width + off), buf, offset=off)
        for lane in lanes(width // 256, 256):
            k.reduce(k.load(buf, lane), kind="serial", dst="acc")
    total = k.reduce(k.assign("acc"), kind="block")
    with k.if_(threadIdx.x.eq(0)):
        k.store(out, blockIdx.x, total)
    return k


def test_one_box_into_a_wider_buffer_is_refused_with_the_fix():
    with pytest.raises(PartialTileError) as e:
        row_sum()
    msg = str(e.value)
    for needle in ("'tile'", "box (1, 256)", "256..1023", "tile=(1, 1024)", "test_partial_tiles.py"):
        assert needle in msg, msg


def test_the_fix_named_in_the_error_runs_and_matches_numpy():
    k = row_sum(tile=(1, 1024))
    x = np.random.default_rng(0).standard_normal((3, 2000), dtype=np.float32)
    got = run(api.lower(k), {"x": x, "out": np.full(3, np.nan, np.float32)})["out"]
    np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-4, atol=1e-3)


def test_loads_at_offsets_that_cover_the_buffer_are_accepted():
    row_sum(offsets=(0, 256, 512, 768))


def test_loads_at_offsets_with_a_gap_are_refused():
    with pytest.raises(PartialTileError, match=r"elements 512\.\.767 are never written"):
        row_sum(offsets=(0, 256, 768))


def test_a_load_past_the_end_of_its_buffer_is_refused():
    k = Kernel("over", block=256)
    x = k.tensor("x", (k.symbol("N"),))
    buf = k.alloc("tile", "shared", "float32", (256,))
    xm = k.tensor_map(x, box=(256,))
    with k.loop("i", 4) as i:
        with pytest.raises(PartialTileError, match="at offset 128 of buffer 'tile'.*writes past the buffer"):
            k.tma_load(xm, (i * 256,), buf, offset=128)


def test_a_read_past_a_loaded_buffer_is_refused_unless_predicated():
    def kernel(guard):
        k = Kernel("past", block=256)
        x, out = k.tensor("x", (k.symbol("N"),)), k.tensor("out", (k.symbol("M"),))
        buf = k.alloc("tile", "shared", "float32", (128,))
        with k.loop("i", 4, circular_buffer=circular_buffer(2)) as i:
            k.tma_load(k.tensor_map(x, box=(128,)), (i * 128,), buf)
            if guard:
                with k.if_(threadIdx.x.lt(128)):
                    k.store(out, i * 128 + threadIdx.x, k.load(buf, threadIdx.x))
            else:
                k.store(out, i * 128 + threadIdx.x, k.load(buf, threadIdx.x))
        return k

    kernel(guard=True)
    with pytest.raises(PartialTileError, match=r"reaches 255, outside its 128 elements"):
        kernel(guard=False)


def test_every_builtin_kernel_still_builds():
    from cbrules.kernels import KERNELS
    for spec in KERNELS.values():
        spec.build()
