"""The reference interpreter on tiny hand-built kernels: each op against numpy (with CUDA's
meaning), argument binding, and every protocol failure provoked on purpose."""
import numpy as np
import pytest

from cbrules import api
from cbrules.reference import protocol
from cbrules.ir.builder import Kernel, threadIdx
from cbrules.ir.terms import parse
from cbrules.reference.interp import NonUniform, OutOfBounds, run
from cbrules.kernels import get
from cbrules.ir.bind import LaunchError

T = 64
F32 = np.float32


def one_d(block=T, n_param="N"):
    k = Kernel("t", block=block)
    n = k.symbol(n_param)
    return k, n


def _rng_args(*names, n=T, positive=False):
    rng = np.random.default_rng(1)
    out = {}
    for name in names:
        v = rng.standard_normal(n).astype(F32)
        out[name] = np.abs(v) + F32(0.1) if positive else v
    return out


# ------------------------------------------------------------------------------ compute ops
UNARY = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda v: F32(1) / np.sqrt(v),
         "neg": np.negative, "abs": np.abs}
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "max": np.maximum, "min": np.minimum}


@pytest.mark.parametrize("op", sorted(UNARY) + sorted(BINARY))
def test_elementwise_op_matches_numpy_in_float32(op):
    k, n = one_d()
    x, y, out = k.tensor("x", (n,)), k.tensor("y", (n,)), k.tensor("out", (n,))
    a, b = k.load(x, threadIdx.x), k.load(y, threadIdx.x)
    v = getattr(k, op)(a) if op in UNARY else getattr(k, op)(a, b)
    k.store(out, threadIdx.x, v)
    args = {**_rng_args("x", "y", positive=op in ("log", "sqrt", "rsqrt")), "out": np.zeros(T, F32)}
    got = run(k, args)["out"]
    want = UNARY[op](args["x"]) if op in UNARY else BINARY[op](args["x"], args["y"])
    assert got.dtype == F32 and want.dtype == F32
    np.testing.assert_array_equal(got, want)


def test_fma_rounds_once_like_fmaf():
    k, n = one_d(block=32)
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    a = k.load(x, 0)
    k.store(out, threadIdx.x, k.fma(a, a, k.load(x, 1)))
    e = 2.0 ** -12
    args = {"x": np.array([1 + e, -(1 + 2 * e)] + [0] * 30, F32), "out": np.zeros(32, F32)}
    got = run(k, args)["out"]
    assert got[0] == F32(2.0 ** -24)  # a*a+c separately rounded would give 0


def test_c_integer_division_and_remainder_truncate():
    k, n = one_d(block=32)
    out = k.tensor("out", (n,))
    q = k.assign((threadIdx.x - 16) / 3, dtype="int32")
    r = k.assign((threadIdx.x - 16) % 3, dtype="int32")
    k.store(out, threadIdx.x, k.add(k.mul(q, 100.0), r))
    got = run(k, {"out": np.zeros(32, F32)})["out"]
    t = np.arange(32) - 16
    q_c, r_c = np.trunc(t / 3), np.fmod(t, 3)
    np.testing.assert_array_equal(got, (q_c * 100 + r_c).astype(F32))


def test_int_register_truncates_and_mixed_arithmetic_is_float():
    k, n = one_d(block=32)
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    i = k.assign(k.load(x, threadIdx.x), dtype="int32", dst="i")  # float -> int truncates toward zero
    k.store(out, threadIdx.x, k.add(i, 0.5))
    args = {"x": np.linspace(-3.7, 3.7, 32).astype(F32), "out": np.zeros(32, F32)}
    np.testing.assert_array_equal(run(k, args)["out"], np.trunc(args["x"]) + F32(0.5))


def test_registers_arrays_shared_memory_and_block_sync():
    k, n = one_d()
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    regs = k.alloc("regs", "register", "float32", (2,))
    smem = k.alloc("smem", "shared", "float32", (T,))
    k.store(regs, 1, k.load(x, threadIdx.x))
    k.store(smem, threadIdx.x, k.load(regs, 1))
    k.syncthreads()
    k.store(out, threadIdx.x, k.load(smem, (threadIdx.x + 1) % T))
    args = {**_rng_args("x"), "out": np.zeros(T, F32)}
    np.testing.assert_array_equal(run(k, args)["out"], np.roll(args["x"], -1))


@pytest.mark.parametrize("combine", ["sum", "max", "min"])
def test_block_and_serial_reductions(combine):
    k, n = one_d(block=128)
    x, out = k.tensor("x", (4, 128)), k.tensor("out", (2,))
    k.load(x, threadIdx.x, dst="acc")
    with k.loop("r", 1, 4) as r:
        k.reduce(k.load(x, r * 128 + threadIdx.x), kind="serial", combine=combine, dst="acc")
    total = k.reduce("acc", kind="block", combine=combine)
    with k.if_(threadIdx.x.eq(0)):
        k.store(out, 0, total)
    args = {"x": np.random.default_rng(2).standard_normal((4, 128)).astype(F32), "out": np.zeros(2, F32),
            "N": 128}
    got = run(k, args)["out"][0]
    fn = {"sum": np.sum, "max": np.max, "min": np.min}[combine]
    np.testing.assert_allclose(got, fn(args["x"].astype(np.float64)), rtol=1e-5, atol=1e-5)


def test_block_reduction_and_sync_must_be_reached_by_every_thread():
    for body in ("reduce", "sync"):
        k, n = one_d()
        out = k.tensor("out", (n,))
        with k.if_(threadIdx.x.lt(32)):
            if body == "reduce":
                k.reduce(1.0, kind="block")
            else:
                k.syncthreads()
        k.store(out, threadIdx.x, 1.0)
        with pytest.raises(protocol.DivergentSync, match="32 of 64|only some threads"):
            run(k, {"out": np.zeros(T, F32)})


def test_elect_one_elects_exactly_one_thread_of_warp_0():
    k, n = one_d(block=(64, 2))
    out = k.tensor("out", (n,))
    k.assign(0.0, dst="mine")
    with k.elect_one():
        k.assign(1.0, dst="mine")
        k.store(out, 0, threadIdx.x + 100 * threadIdx.y)
    k.store(out, 1, k.reduce("mine", kind="block"))
    got = run(k, {"out": np.full(2, -1, F32)})["out"]
    assert got[0] == 0 and got[1] == 1


def test_elect_one_in_a_partial_warp_is_an_error_and_outside_warp_0_elects_nobody():
    k, n = one_d()
    out = k.tensor("out", (n,))
    with k.if_(threadIdx.x.ge(32)):
        with k.elect_one():  # no thread of warp 0 gets here: nobody is elected, no error
            k.store(out, 0, 5.0)
    with k.if_(threadIdx.x.lt(16)):
        with k.elect_one():
            k.store(out, 1, 7.0)
    with pytest.raises(protocol.ElectError, match="only part of warp 0"):
        run(k, {"out": np.zeros(T, F32)})


def test_loops_masks_and_thread_loops():
    k, n = one_d()
    out = k.tensor("out", (n, 3))
    with k.loop("i", 3) as i:
        with k.if_(threadIdx.x.lt(n)):
            k.store(out, threadIdx.x * 3 + i, threadIdx.x * 10 + i)
    with k.loop("t", 0, 5, kind="thread-x") as t:  # threads 0..4 only
        k.store(out, t * 3, -1.0)
    got = run(k, {"out": np.full((40, 3), np.nan, F32)})["out"]  # N = 40 < 64 threads
    want = (np.arange(40)[:, None] * 10 + np.arange(3)).astype(F32)
    want[:5, 0] = -1
    np.testing.assert_array_equal(got, want)


def test_out_of_range_index_names_node_thread_and_iteration():
    k, n = one_d()
    out = k.tensor("out", (n,))
    with k.loop("i", 3) as i:
        k.store(out, i * 64 + threadIdx.x, 1.0)
    with pytest.raises(OutOfBounds) as e:
        run(k, {"out": np.zeros(100, F32)})
    msg = str(e.value)
    assert "store" in msg and "thread 36 writes out[100]" in msg and "i=1" in msg
    assert e.value.iteration == (("i", 1, None),)


def test_non_uniform_loop_bound_is_refused():
    k, n = one_d()
    out = k.tensor("out", (n,))
    with k.loop("i", threadIdx.x % 2):
        k.store(out, threadIdx.x, 1.0)
    with pytest.raises(NonUniform, match="stop of loop i differs"):
        run(k, {"out": np.zeros(T, F32)})


# ------------------------------------------------------------------------------ TMA
def _box_kernel(coords, store_back=False):
    k = Kernel("box", block=32)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n)), k.tensor("out", (4, 8))
    xm = k.tensor_map(x, box=(4, 8))
    tile = k.alloc("tile", "shared", "float32", (4, 8))
    k.tma_load(xm, coords, tile)  # no barrier: the unlowered meaning, done at once
    k.store(out, threadIdx.x, k.load(tile, threadIdx.x))
    if store_back:
        k.tma_store(xm, (coords[0] + 2, coords[1] - 8), tile)
    return k


@pytest.mark.parametrize("coords", [(3, 8), (-2, -5), (0, 0), (5, 20)])
def test_tma_load_copies_the_box_and_zero_fills_outside(coords):
    x = np.arange(5 * 12, dtype=F32).reshape(5, 12) + 1
    got = run(_box_kernel(coords), {"x": x, "out": np.full((4, 8), np.nan, F32)})["out"]
    padded = np.zeros((5 + 40, 12 + 60), F32)
    padded[20:25, 30:42] = x
    want = padded[20 + coords[0]:24 + coords[0], 30 + coords[1]:38 + coords[1]]
    np.testing.assert_array_equal(got, want)


def test_tma_store_writes_only_inside_the_tensor():
    x = np.arange(5 * 12, dtype=F32).reshape(5, 12) + 1
    k = _box_kernel((3, 8), store_back=True)  # stores the tile at (5, 0): entirely below the tensor
    got = run(k, {"x": x.copy(), "out": np.zeros((4, 8), F32)})
    assert "x" in got and np.array_equal(got["x"], x)
    k = _box_kernel((1, 8), store_back=True)  # tile of rows 1..4, cols 8..15 stored at (3, 0)
    got = run(k, {"x": x.copy(), "out": np.zeros((4, 8), F32)})["x"]
    want = x.copy()
    want[3:5, 0:4] = x[1:3, 8:12]
    want[3:5, 4:8] = 0  # the zero-filled part of the tile lands too
    np.testing.assert_array_equal(got, want)


def test_a_tile_wider_than_its_box_loads_dense_before_lowering():
    k = Kernel("wide", block=32)
    m, n = k.symbol("M"), k.symbol("N")
    x, out = k.tensor("x", (m, n)), k.tensor("out", (2, 64))
    tile = k.alloc("tile", "shared", "float32", (2, 64))
    k.tma_load(k.tensor_map(x, box=(2, 16)), (1, 4), tile, tile=(2, 64))  # four boxes' worth
    with k.loop("e", 4) as e:
        k.store(out, e * 32 + threadIdx.x, k.load(tile, e * 32 + threadIdx.x))
    x = np.arange(4 * 60, dtype=F32).reshape(4, 60)
    want = np.zeros((2, 64), F32)
    want[:, :56] = x[1:3, 4:60]
    np.testing.assert_array_equal(run(k, {"x": x, "out": np.zeros((2, 64), F32)})["out"], want)


def test_tensor_map_limits_are_checked_at_launch():
    from cbrules.ir.limits import TmaLimitError
    with pytest.raises(TmaLimitError, match="stride"):
        run(_box_kernel((0, 0)), {"x": np.zeros((5, 11), F32), "out": np.zeros((4, 8), F32)})


# ------------------------------------------------------------------------------ binding
def test_symbols_come_from_shapes_and_requires_are_checked_like_the_launcher():
    kg = api.lower(get("multi_dim").build(stages=3))
    args = {"x": np.zeros((4, 512), F32), "out": np.zeros((4, 512), F32)}
    kg.kernel()["requires"] = ((parse("N >= 768"), "N must be >= 768", "short-loop"),)
    with pytest.raises(LaunchError, match=r"N must be >= 768 \[N >= 768 is false for M=4, N=512\]"):
        run(kg, args)
    with pytest.raises(LaunchError, match="dimension 1 is 512"):
        run(kg, {"x": np.zeros((4, 768), F32), "out": np.zeros((4, 512), F32)})
    with pytest.raises(LaunchError, match="unknown argument"):
        run(kg, {**args, "z": 1})
    with pytest.raises(LaunchError, match="float64"):
        run(kg, {"x": np.zeros((4, 768)), "out": np.zeros((4, 768), F32)})


def test_a_requirement_the_builder_declares_survives_lowering_and_refuses_by_name():
    from cbrules.ir.builder import BuildError, ceil_div, circular_buffer
    from cbrules.ir.terms import name
    k = Kernel("req", block=256)
    n, m = k.symbol("N"), k.symbol("M")
    x, out = k.tensor("x", (n,)), k.tensor("out", (m,))
    k.require(m.ge(n), "out must have room for every x")
    x_map = k.tensor_map(x, box=(256,))
    tile = k.alloc("tile", "shared", "float32", (256,))
    k.grid(1)
    with k.loop("t", ceil_div(n, 256), circular_buffer=circular_buffer(2)) as t:
        k.tma_load(x_map, (t * 256,), tile)
        i = t * 256 + threadIdx.x
        with k.if_(i.lt(n)):
            k.store(out, i, k.load(tile, threadIdx.x))
    kg = api.lower(k)
    got = run(kg, {"x": np.arange(600, dtype=F32), "out": np.zeros(600, F32)})["out"]
    assert np.array_equal(got, np.arange(600, dtype=F32))
    with pytest.raises(LaunchError, match=r"out must have room for every x \[M >= N is false for M=500, N=600\]"):
        run(kg, {"x": np.arange(600, dtype=F32), "out": np.zeros(500, F32)})
    assert api.generate(k).requires[0][1] == "out must have room for every x"  # the launcher checks it too
    with pytest.raises(BuildError, match="names Q, which are not symbols"):
        k.require(name("Q").gt(0), "q")
    with pytest.raises(BuildError, match="non-empty string"):
        k.require(n.gt(0), "")
    from cbrules.errors import CbrulesError
    for hostile in ("N >=", "printf(N)", 1.5, None):  # each a named error, no traceback
        with pytest.raises(CbrulesError):
            k.require(hostile, "m")


def test_inputs_are_not_modified_and_a_sample_of_blocks_runs():
    spec = get("exp1d_tma")
    x = np.random.default_rng(3).standard_normal(256 * 8 * 5).astype(F32)
    out = np.full_like(x, np.nan)
    got = run(spec.build(), {"x": x, "out": out}, blocks="sample")["out"]
    assert np.isnan(out).all()
    per_block = 256 * 8
    ran = [b for b in range(5) if not np.isnan(got[b * per_block:(b + 1) * per_block]).any()]
    assert ran == [0, 2, 4]
    np.testing.assert_array_equal(got[:per_block], np.exp(x[:per_block]))


def test_the_hand_built_tma_kernel_runs_clean():
    x = np.random.default_rng(4).standard_normal(5000).astype(F32)
    got = run(get("exp1d_tma").build(), {"x": x, "out": np.zeros_like(x)})["out"]
    np.testing.assert_array_equal(got, np.exp(x))


# ------------------------------------------------------------------------------ protocol failures
def pipeline(tiles=3, *, init=True, init_sync=True, double_init=False, count=1, expect=256, arrive_all=False,
             tma_all=False, wait=True, parity=lambda i: i % 2, war_sync=True, inval=True, inval_in_loop=False,
             stray_load=False, fence=True, refill_fence=True, reader_fence=False):
    """exp(x) in tiles of 64 under one full barrier, correct by default; each knob breaks one thing."""
    k = Kernel("hand", block=T)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    xm = k.tensor_map(x, box=(T,))
    tile = k.alloc("tile", "shared", "float32", (T,))
    full = k.alloc("full", "shared", "mbarrier", (1,))
    for _ in range(2 if double_init else 1 if init else 0):
        with k.elect_one():
            k.mbarrier_init(full, 0, count=count)
            if fence:
                k.fence_proxy_async()
    if init_sync:
        k.syncthreads()
    with k.loop("i", tiles) as i:
        with k.if_(True if arrive_all else "elect_one()"):
            if refill_fence:  # the plain reads of the tile before (the WAR sync) come before the TMA refill
                k.fence_proxy_async()
            k.mbarrier_arrive_expect_tx(full, 0, expect)
        with k.if_(True if tma_all else "elect_one()"):
            k.tma_load(xm, (i * T,), tile, full, slot=0)
        if wait:
            k.mbarrier_wait(full, 0, parity=parity(i))
        k.store(out, i * T + threadIdx.x, k.exp(k.load(tile, threadIdx.x)))
        if reader_fence:
            k.fence_proxy_async()
        if war_sync:
            k.syncthreads()
        if inval_in_loop:
            with k.elect_one():
                k.mbarrier_inval(full, 0)
    if stray_load:
        with k.elect_one():
            k.fence_proxy_async()
            k.tma_load(xm, (0,), tile, full, slot=0)
    if inval:
        with k.elect_one():
            k.mbarrier_inval(full, 0)
    return k


def run_pipeline(k, tiles=3):
    x = np.random.default_rng(5).standard_normal(T * tiles).astype(F32)
    return x, run(k, {"x": x, "out": np.zeros_like(x)})["out"]


def test_the_correct_pipeline_is_clean():
    x, got = run_pipeline(pipeline())
    np.testing.assert_array_equal(got, np.exp(x))


def test_readers_fences_order_their_reads_before_the_refill():
    """Each reader fencing after its read, before the WAR sync, is as good as the issuer's fence."""
    x, got = run_pipeline(pipeline(refill_fence=False, reader_fence=True))
    np.testing.assert_array_equal(got, np.exp(x))


FAILURES = {
    "drop the wait": (dict(wait=False), protocol.RawHazard, "reads tile[0], whose TMA load #"),
    "wrong parity": (dict(parity=lambda i: (i + 1) % 2), protocol.RawHazard, "has observed only 0"),
    "a stale parity": (dict(parity=lambda i: 0), protocol.RawHazard, "i=1"),
    "a wait nobody completes": (dict(count=2), protocol.Deadlock, "1 of 2 arrival(s)"),
    "expect-tx too many bytes": (dict(expect=260), protocol.TxMismatch, "expected 260 transaction bytes, the TMA "
                                 "loads delivered 256"),
    "expect-tx too few bytes": (dict(expect=252), protocol.TxMismatch, "delivered 256 bytes but the arrivals "
                                "expected only 252"),
    "no WAR sync": (dict(war_sync=False), protocol.WarHazard, "may still read tile[1]"),
    "use before init": (dict(init=False), protocol.UseBeforeInit, "never initialised"),
    "init not published": (dict(init_sync=False), protocol.UseBeforeInit, "no block sync orders the barrier's init"),
    "double init": (dict(double_init=True), protocol.DoubleInit, "initialised again"),
    "too many arrivals": (dict(arrive_all=True), protocol.TooManyArrivals, "64 arrival(s) on full[0]"),
    "TMA from every thread": (dict(tma_all=True), protocol.TmaIssueError, "64 threads issue"),
    "no inval": (dict(inval=False), protocol.MissingInval, "full[0] is still valid"),
    "use after inval": (dict(inval_in_loop=True, inval=False), protocol.UseAfterInval, "after it was invalidated"),
    "load left in flight": (dict(stray_load=True), protocol.OutstandingTma, "still in flight"),
    # the refill's fence by the initialising thread would publish the init as well
    "init not fenced": (dict(fence=False, refill_fence=False), protocol.UnfencedInit,
                        "no fence.proxy.async has made visible"),
    "refill not fenced": (dict(refill_fence=False), protocol.UnfencedRefill,
                          "no fence.proxy.async orders thread 0's plain read of tile[0]"),
}


@pytest.mark.parametrize("name", FAILURES)
def test_protocol_failure_is_named(name):
    knobs, cls, text = FAILURES[name]
    with pytest.raises(cls) as e:
        run_pipeline(pipeline(**knobs))
    assert text in str(e.value), str(e.value)
    assert e.value.barrier == "full" and e.value.slot == 0 and f"#{e.value.node}" in str(e.value)
    assert "block (0, 0, 0)" in str(e.value)


def empty_barrier_pipeline(arrive_before_read: bool):
    """One slot protected by an empty barrier all threads arrive on after their read."""
    k = Kernel("hand_empty", block=T)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    xm = k.tensor_map(x, box=(T,))
    tile = k.alloc("tile", "shared", "float32", (T,))
    full, empty = k.alloc("full", "shared", "mbarrier", (1,)), k.alloc("empty", "shared", "mbarrier", (1,))
    with k.elect_one():
        k.mbarrier_init(full, 0, count=1)
        k.mbarrier_init(empty, 0, count=T)
        k.fence_proxy_async()
    k.syncthreads()
    with k.loop("i", 3) as i:
        with k.elect_one():
            k.mbarrier_wait(empty, 0, parity=(i + 1) % 2)  # a fresh barrier passes parity 1 at once
            k.fence_proxy_async()  # the reads the empty barrier ordered before come before the refill
            k.mbarrier_arrive_expect_tx(full, 0, 256)
            k.tma_load(xm, (i * T,), tile, full, slot=0)
        k.mbarrier_wait(full, 0, parity=i % 2)
        if arrive_before_read:
            k.mbarrier_arrive(empty, 0)
        v = k.load(tile, threadIdx.x)
        if not arrive_before_read:
            k.mbarrier_arrive(empty, 0)
        k.store(out, i * T + threadIdx.x, v)
    k.syncthreads()
    with k.elect_one():
        k.mbarrier_inval(full, 0)
        k.mbarrier_inval(empty, 0)
    return k


def test_an_arrive_wait_chain_orders_reads_before_the_refill():
    x, got = run_pipeline(empty_barrier_pipeline(arrive_before_read=False))
    np.testing.assert_array_equal(got, x)
    with pytest.raises(protocol.WarHazard, match="thread 1 may still read tile"):
        run_pipeline(empty_barrier_pipeline(arrive_before_read=True))


def test_multiple_blocks_run_with_fresh_protocol_state():
    k = pipeline()
    k.grid(2)
    x = np.random.default_rng(6).standard_normal(T * 3).astype(F32)
    # both blocks compute the same tiles; the second must not see the first one's barriers
    got = run(k, {"x": x, "out": np.zeros_like(x)})["out"]
    np.testing.assert_array_equal(got, np.exp(x))
