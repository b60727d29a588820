"""persistent(walk=P): P blocks walk the rows blockIdx.x, +P, ... (with warp specialization the producer
runs ahead into the next row). On the CPU: numpy's normalization at ragged row counts and fewer rows than
blocks, every trip count the checker tries, the CUDA of a walk, and walk=0's CUDA unchanged."""
import dataclasses
import functools

import numpy as np
import pytest

from cbrules import api
from cbrules.check import Checker, trip_counts
from cbrules.kernels import KERNELS, reductions
from cbrules.kernels.reductions import PersistentWalkError
from cbrules.reference.interp import run

BF16_32K = dict(row=32768, width=16384, threads=512, box=256, dtype="bfloat16", one_box=True)


def walk_spec(blocks: int, rows: int):
    """The persistent spec walked by ``blocks`` blocks over ``rows`` rows of 256 * trips."""
    return dataclasses.replace(KERNELS["persistent"], name=f"persistent_walk{blocks}",
                               factory=functools.partial(reductions.persistent, walk=blocks),
                               shape_for_trips=lambda t: (rows, 256 * t))


# (blocks, rows): a ragged walk (the last block takes one row fewer), fewer rows than blocks, one block
@pytest.mark.parametrize("blocks, rows", [(3, 7), (5, 2), (1, 3)])
@pytest.mark.parametrize("ws", [False, True])
def test_a_walk_normalizes_as_numpy_does(blocks, rows, ws):
    """The bfloat16 one-box kernel at a narrow row (2 stages of (4, 256) boxes), every block run."""
    sp, shape = KERNELS["persistent"], (rows, 2048)
    kernel = reductions.persistent(2, row=2048, width=1024, threads=128, box=256, dtype="bfloat16", one_box=True,
                                   walk=blocks, warp_specialize=ws)
    args = sp.make_inputs(shape, np.random.default_rng(rows), "bfloat16")
    args["out"][...] = np.nan
    # the interpreter computes every lane, masking off the producer warp group's: their sums stay 0
    with np.errstate(divide="ignore"):
        got = run(api.lower(kernel), args, {"M": rows})["out"].astype(np.float64)
    want = sp.expected(args)["out"]
    np.testing.assert_allclose(got, want, *sp.tolerances(shape, "bfloat16"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stages, ws", [(2, False), (3, False), (2, True), (3, True)])
def test_a_walk_passes_the_checker_at_every_trip_count(dtype, stages, ws):
    """``cbrules check``'s trip counts 0..4S (stages a row), 2 blocks over 5 rows: each block re-enters the
    stage loop, and with warp specialization its slots and phases run on across rows."""
    checker = Checker(dtype=dtype)
    results = [checker.check(walk_spec(2, 5), t, stages, warp_specialize=ws) for t in trip_counts(stages)]
    bad = [f"{r.trips}: {r.status} {r.detail}" for r in results if not r.ok]
    assert not bad, "\n".join(bad)


def test_a_walk_whose_phases_restart_each_row_fails_the_checker(tmp_path):
    # the mutation: slots and phases counted from 0 again at every row while the barriers run on
    (tmp_path / "off.rules").write_text("(disable cb-ws-walk-running-count)\n")
    r = Checker(dtype="bfloat16", rules=[str(tmp_path)]).check(walk_spec(2, 5), 3, 2, warp_specialize=True)
    assert not r.ok and r.status == "FAIL", r.detail


def test_the_roles_walk_the_same_rows_on_a_running_count():
    src = api.generate(reductions.persistent(2, walk=132, warp_specialize=True, **BF16_32K)).text
    src = src.split('extern "C"')[1]
    consumer, producer = src.split("} else {")[-2:]
    g = "((row - (int)blockIdx.x) / 132 * 2 + j)"
    assert f"cb_mbar_wait(cb_smem_addr(&cb_full_5[{g} % 2]), {g} / 2 % 2);" in consumer
    assert f"cb_mbar_wait(cb_smem_addr(&cb_empty_5[{g} % 2]), {g} / 2 % 2);" in producer
    walk = "for (int row = (int)blockIdx.x; row < M; row += 132)"
    assert walk in consumer and walk in producer
    # barriers initialised once before the roles and invalidated once after the walk; the consumers'
    # block reductions synchronise on their named barrier, never the whole block
    assert src.count("cb_mbar_init(") == 2 and src.count("cb_mbar_inval(") == 2
    assert consumer.index(walk) < consumer.index("cb_mbar_inval(")
    rows = consumer[consumer.index(walk):]
    assert rows.count("cb_block_reduce_named<float>(") == 2 and "__syncthreads()" not in rows


def test_walk_zero_is_one_block_a_row():
    assert api.generate(reductions.persistent(2, walk=0, **BF16_32K)).text == \
        api.generate(reductions.persistent(2, **BF16_32K)).text
    assert "for (int row" in api.generate(reductions.persistent(2, walk=132, **BF16_32K)).text


@pytest.mark.parametrize("kw", [dict(), dict(warp_specialize=True)])
def test_the_32768_wide_walk_keeps_its_row_in_registers(kw):
    """64 floats a consumer thread: no spills with the registers NVRTC chooses (measured nothing)."""
    r = api.compile(reductions.persistent(2, walk=132, **BF16_32K, **kw)).cubin.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, r


@pytest.mark.parametrize("walk", [-1, True, 2.0, "132"])
def test_walk_refusals(walk):
    with pytest.raises(PersistentWalkError, match=f"walk={walk!r}: give the number of blocks"):
        reductions.persistent(2, walk=walk)
