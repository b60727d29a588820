"""``api.check``: the CPU checker from Python, on a Kernel you built, a built-in name or a kernel file."""
import numpy as np
import pytest

from cbrules import api
from cbrules.ir.builder import Kernel, blockIdx, ceil_div, circular_buffer, threadIdx
from cbrules.reference import protocol
from rulekit import write_rules

W = 256


def _scaled_exp(stages=3, war=None, strict=False):
    """out[m, n] = 2 exp(x[m, n]): one circular-buffered loop over tiles of a row."""
    k = Kernel("scaled_exp", block=W)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n)), k.tensor("out", (m, n))
    x_map = k.tensor_map(x, box=(1, W))
    k.grid(m)
    tile = k.alloc("tile", "shared", "float32", (1, W))
    with k.loop("j", ceil_div(n, W), circular_buffer=circular_buffer(stages=stages, war=war,
                                                                           strict_trip_count=strict)) as j:
        k.tma_load(x_map, (blockIdx.x, j * W), tile)
        col = j * W + threadIdx.x
        with k.if_(col.lt(n)):
            k.store(out, blockIdx.x * n + col, k.mul(k.exp(k.load(tile, threadIdx.x)), 2.0))
    return k


def _inputs(trips, rng=np.random.default_rng(5)):
    shape = (3, W * trips - 8)  # a ragged last tile
    return {"x": rng.standard_normal(shape, dtype=np.float32), "out": np.full(shape, np.nan, np.float32)}


def _reference(args):
    return {"out": 2 * np.exp(args["x"].astype(np.float64))}


def test_every_trip_count_of_a_kernel_you_built():
    report = api.check(_scaled_exp(stages=2), _inputs, _reference)
    assert report.ok, str(report)
    assert [c.trips for c in report.cases] == list(range(9))  # 0 .. 4S
    assert report.cases[3].shape == (3, 3 * W - 8) and report.cases[3].err_numpy < 1e-5
    assert report.cases[0].err_numpy is None  # trip count 0: compared with the kernel before lowering only
    assert "9 trip counts: 9 ok, 0 failed" in str(report)


def test_a_strict_trip_count_refusal_below_the_stages_is_the_expected_answer():
    report = api.check(_scaled_exp(stages=3, strict=True), _inputs, _reference, trips=[0, 1, 2, 3, 5])
    assert report.ok, str(report)
    assert [c.status for c in report.cases] == ["refused"] * 3 + ["ok"] * 2
    assert all(c.code == "short-loop" for c in report.cases[:3])
    # without strict_trip_count the same short loops run, predicated, and are checked against numpy
    assert [c.status for c in api.check(_scaled_exp(stages=3), _inputs, _reference, trips=[1, 2]).cases] == ["ok"] * 2


def test_a_short_loop_that_runs_although_the_kernel_asks_strict_trip_count_fails(tmp_path):
    write_rules(tmp_path / "lax", "(disable cb-reject-short-loop cb-require-trip-count)\n")
    report = api.check(_scaled_exp(stages=3, strict=True), _inputs, _reference, trips=[2, 3], rules=[tmp_path / "lax"])
    assert [c.status for c in report.cases] == ["FAIL", "ok"]
    assert "trip count 2 < stages 3 ran instead of being refused with code short-loop" in report.cases[0].detail


def test_one_case_from_launch_arguments_and_a_wrong_reference_fails():
    args = _inputs(3)
    assert api.check(_scaled_exp(), args, _reference).ok
    report = api.check(_scaled_exp(), args, lambda a: {"out": 2 * np.exp(a["x"]) + 1e-3})
    assert not report.ok and "out differs from numpy" in report.failures[0].detail
    assert report.cases[0].trips is None and report.cases[0].shape == args["x"].shape


def test_without_a_reference_the_lowered_kernel_is_compared_with_the_kernel_before_lowering():
    report = api.check(_scaled_exp(), _inputs, trips=[1, 4])
    assert report.ok and all(c.err_numpy is None and c.err_unlowered == 0 for c in report.cases)


def test_a_broken_protocol_is_named(tmp_path):
    folder = tmp_path / "drop-wait"
    write_rules(folder, "(disable cb-wait-before-first-read)\n")
    report = api.check(_scaled_exp(), _inputs, _reference, trips=[3], rules=[folder])
    assert not report.ok and protocol.RawHazard.__name__ in report.failures[0].detail


def test_a_built_in_kernel_and_a_kernel_file_by_name():
    report = api.check("single_dim", stages=2, prefetch=0, war="mbarrier", trips=[0, 2, 5])
    assert report.ok and [c.trips for c in report.cases] == [0, 2, 5]
    assert api.check("examples/rms_norm.py", stages=2, trips=[1]).ok


def test_misuse_is_a_clear_error():
    with pytest.raises(TypeError, match="circular_buffer"):
        api.check(_scaled_exp(), _inputs, stages=3)
    with pytest.raises(TypeError, match="needs inputs"):
        api.check(_scaled_exp())
    with pytest.raises(TypeError, match="its own inputs"):
        api.check("single_dim", _inputs)
    with pytest.raises(TypeError, match="not list"):
        api.check([1, 2])
