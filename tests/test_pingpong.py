"""Ping-pong consumer warp groups (rules/ws_pingpong.rules) in the interpreter: the groups run as roles
of their own, concurrently with the producer under every schedule; the lowered matmul_tc computes what
the cooperative kernel does, bit for bit; and the named-barrier hand-over, mutated (an arrive dropped,
the wrong barrier, the wrong thread count, the turn not waited for), fails by name: a deadlock, a
barrier reached twice, mismatched counts or arrivals left at the end, or the parity alias that an
unordered group runs into."""
import numpy as np
import pytest

from cbrules import api
from cbrules.errors import CbrulesError
from cbrules.ir.builder import circular_buffer
from cbrules.ir.builder_values import BuildError
from cbrules.kernels import KERNELS
from cbrules.kernels.matmul_tc import MatmulTileError, matmul_tc
from cbrules.reference import protocol
from cbrules.reference.interp import SCHEDULES, prepare, run
from cbrules.rewrite.engine import LoweringError
from rulekit import Mutation, mutation_folders

SPEC = KERNELS["matmul_tc"]
SHAPE = (300, 64, 120)  # three 128x64 tiles on one block: group 0 takes two, group 1 one; two k steps
PP = dict(stages=2, warp_specialize=True, registers=(40, 232), bm=128, bn=64, persistent=1)

_AFTER = "(phase mut-pp :after cb-warp-specialize)\n"
MUTATIONS = {  # name: (rule text, failures that count as caught, words the message holds)
    "drop-handover": (_AFTER + """
(graph-rule mut-drop-handover
  :doc "a group never hands the tensor cores on"
  :phase mut-pp
  :match ((if ?p :tag "cb-pingpong-turn") (bar_arrive ?a :child-of ?p))
  :rewrite ((erase ?a)))
""", (protocol.Deadlock,), "bar.sync 5, 256"),
    "drop-first-turn": (_AFTER + """
(graph-rule mut-drop-first-turn
  :doc "nobody gives group 0 its first turn"
  :phase mut-pp
  :match ((for ?W :kind "warpgroup") (if ?p :tag "cb-pingpong" :child-of ?W) (bar_arrive ?a :in ?p))
  :rewrite ((erase ?a)))
""", (protocol.Deadlock,), "bar.sync 4, 256"),
    "wrong-barrier": (_AFTER + """
(graph-rule mut-wrong-barrier
  :doc "a group hands over on its own barrier instead of the next group's"
  :phase mut-pp
  :match ((if ?p :tag "cb-pingpong-turn") (bar_arrive ?a :child-of ?p))
  :rewrite ((set ?a :id (+ 4 (var "cb_wg")))))
""", (protocol.ProtocolError,), "bar.sync 4 again before it opened"),
    "wrong-count": (_AFTER + """
(graph-rule mut-wrong-count
  :doc "a group's turn counts only its own threads"
  :phase mut-pp
  :match ((for ?L :part "consumer") (bar_sync ?s :tag "cb-pingpong") (next ?s ?L))
  :rewrite ((set ?s :count 128)))
""", (protocol.ProtocolError,), ("named barrier", "wrong parity", "again before it opened")),
    # unordered, group 0 reaches its second tile's waits a phase early: they pass on the previous phase's
    # parity and its wgmma reads a slot whose load has not landed (the ring is what keeps the order)
    "drop-turn-wait": (_AFTER + """
(graph-rule mut-drop-turn-wait
  :doc "a group starts its loop without waiting for its turn"
  :phase mut-pp
  :match ((for ?L :part "consumer") (bar_sync ?s :tag "cb-pingpong") (next ?s ?L))
  :rewrite ((erase ?s)))
""", (protocol.ProtocolError,), ("named barrier", "wrong parity", "again before it opened")),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return mutation_folders(tmp_path_factory.mktemp("pp-mutations"),
                            {k: Mutation(text, caught) for k, (text, caught, _) in MUTATIONS.items()})


@pytest.fixture(scope="module")
def args():
    return SPEC.make_inputs(SHAPE, np.random.default_rng(7), "bfloat16")


@pytest.fixture(scope="module")
def cooperative(args):
    """The same tiles on two cooperating warp groups (64 rows each): what ping-pong must reproduce."""
    return run(api.lower(matmul_tc(**{**PP, "groups": 2})), args)["c"]


def test_pingpong_matches_the_cooperative_kernel_under_every_schedule(args, cooperative):
    prog = prepare(api.lower(matmul_tc(**PP, pingpong=True)))
    for schedule in SCHEDULES:
        got = run(prog, args, schedule=schedule, seed=11)["c"]
        assert np.array_equal(got.view(np.uint16), cooperative.view(np.uint16)), schedule
    ref = SPEC.reference(args)["c"]
    rtol, atol = SPEC.tolerances(SHAPE, "bfloat16")
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutated_handover_is_caught(mutation, folders, args):
    _, caught, words = MUTATIONS[mutation]
    prog = prepare(api.lower(matmul_tc(**PP, pingpong=True), rules=[folders / mutation]))
    for schedule in ("lazy",):
        with pytest.raises(caught) as e:
            run(prog, args, schedule=schedule)
        words = (words,) if isinstance(words, str) else words
        assert any(w in str(e.value) for w in words) and e.value.node is not None, f"{schedule}: {e.value}"


# ------------------------------------------------------------------------------ NVRTC, CLI
def test_cli_compiles_the_pingpong_kernel_without_spills(capsys):
    from cbrules.cli import main
    assert main(["compile", "matmul_tc", "--pingpong", "--stages", "4", "--registers", "40,232"]) == 0
    captured = capsys.readouterr()
    out = captured.out  # the CUDA; the summary goes to stderr
    assert "__launch_bounds__(384, 1)" in out and "m64n128k16.f32.bf16.bf16" in out
    assert "cb_bar_arrive((unsigned)(4 + (cb_wg + 1) % 2), 256);" in out  # the hand-over to the other group
    assert "cb_bar_sync((unsigned)(4 + cb_wg), 256);" in out and "cb_bar_sync((unsigned)(8 + cb_wg), 128);" in out
    assert "setmaxnreg.inc.sync.aligned.u32 232" in out and "setmaxnreg.dec.sync.aligned.u32 40" in out
    assert "0/0 B spill stores/loads" in captured.err


def test_a_ring_of_three_groups_without_mma_compiles():
    ck = api.compile(rows(pingpong=3))
    assert ck.source.block == (512, 1, 1) and ck.cubin.resources.spill_stores == 0
    assert "cb_bar_arrive((unsigned)(4 + (cb_wg + 1) % 3), 256);" in ck.source.text


def test_64x256_tiles_compile_without_spills_or_serialized_wgmma():
    ck = api.compile(matmul_tc(stages=4, warp_specialize=True, registers=(40, 232), bm=64, bn=256, persistent=132,
                               pingpong=True))
    r = ck.cubin.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0
    assert "C75" not in ck.cubin.log and ck.source.block == (384, 1, 1)
    assert ck.source.shared_bytes <= 232448


# ------------------------------------------------------------------------------ the rule is generic
def rows(pingpong=True, warp_specialize=True, block=128, registers=None, blocks=2, walk=True):
    """A persistent block walking rows of x, each row's 128-column tiles circular-buffered: out = 2 x.
    No tensor cores: the hand-over orders any warp-specialized loop nest."""
    from cbrules.ir.builder import Kernel, blockIdx, ceil_div, threadIdx
    k = Kernel("rows", block=block)
    r_, c_ = k.symbol("R"), k.symbol("C")
    x, out = k.tensor("x", (r_, c_)), k.tensor("out", (r_, c_))
    m = k.tensor_map(x, box=(1, 128))
    tile = k.alloc("tile", "shared", "float32", (1, 128))
    k.grid(blocks)
    cb = circular_buffer(2, warp_specialize=warp_specialize, registers=registers, pingpong=pingpong)

    def row(r):
        with k.loop("i", ceil_div(c_, 128), circular_buffer=cb) as i:
            k.tma_load(m, (r, i * 128), tile)
            k.store(out, r * c_ + i * 128 + threadIdx.x % 128, k.load(tile, threadIdx.x % 128) * 2.0)
    if walk:
        with k.loop("r", blockIdx.x, r_, blocks) as r:
            row(r)
    else:
        row(blockIdx.x)
    return k


@pytest.mark.parametrize("n_rows, groups", [(1, 2), (2, 2), (5, 2), (7, 3)])
def test_a_loop_without_mma_takes_turns_too(n_rows, groups):
    kg = api.lower(rows(pingpong=groups))
    x = np.random.default_rng(n_rows).standard_normal((n_rows, 384)).astype(np.float32)
    for schedule in SCHEDULES:
        got = run(kg, {"x": x, "out": np.full_like(x, np.nan)}, schedule=schedule, seed=2)["out"]
        np.testing.assert_array_equal(got, 2 * x)


@pytest.mark.parametrize("kernel, code", [
    (lambda: rows(warp_specialize=False), "pp-not-warp-specialized"),
    (lambda: rows(walk=False), "pp-no-walk"),
    (lambda: rows(pingpong=5), "pp-count"),
    (lambda: rows(block=256), "pp-group-size"),
    (lambda: rows(registers=(40, 240)), "ws-register-budget"),
])
def test_refusals_are_named(kernel, code):
    with pytest.raises(LoweringError) as e:
        api.lower(kernel())
    assert e.value.code == code, str(e.value)


def test_builder_and_matmul_tc_refuse_bad_options():
    with pytest.raises(BuildError, match="pingpong must be True or a count"):
        circular_buffer(2, warp_specialize=True, pingpong="yes")
    with pytest.raises(MatmulTileError, match="needs persistent=P and warp_specialize=True"):
        matmul_tc(pingpong=True, warp_specialize=True)
    assert circular_buffer(2) == {"stages": 2}  # absent unless asked for: other kernels' annotations unchanged
    assert isinstance(MatmulTileError("x"), CbrulesError)


# ------------------------------------------------------------------------------ bar.arrive in the protocol model
def _site():
    return protocol.Site(3, "test bar", (0, 0, 0))


def test_bar_arrive_orders_the_arrivers_past_before_the_waiters_only():
    p = protocol.BlockProtocol(256, {}, {})
    g0, g1 = np.arange(128), np.arange(128, 256)
    p.clocks.tick(g1)  # group 1 did something: its clock moved on
    before = int(p.clocks.now[128])
    token = p.bar_arrive(4, 256, g1, _site, wait=False)
    assert not p.bar_passed(token)
    p.clocks.tick(g1)  # group 1 goes on after its arrive: the waiters must not learn this
    token = p.bar_arrive(4, 256, g0, _site)
    assert p.bar_passed(token)
    assert (p.clocks.known[0, 128:] >= before).all() and (p.clocks.known[0, 128:] < p.clocks.now[128]).all()
    assert (p.clocks.known[128, :128] < 0).all()  # the arrivers learnt nothing of the waiters
    p.finish(_site)  # nothing left half-arrived


def test_an_arrive_nobody_takes_is_named_at_the_blocks_end():
    p = protocol.BlockProtocol(256, {}, {})
    p.bar_arrive(5, 256, np.arange(128, 256), _site, wait=False)
    with pytest.raises(protocol.UnopenedBarrier, match="named barrier 5, 256 that never opened"):
        p.finish(_site)


def test_cli_refuses_pingpong_for_another_kernel(capsys):
    from cbrules.cli import main
    assert main(["compile", "matmul", "--pingpong"]) == 1
    assert "--pingpong applies to the built-in matmul_tc only" in capsys.readouterr().err


def test_a_warpgroup_loop_of_ones_own_runs_each_group_as_a_role():
    """kind="warpgroup" from the builder: group g of the block writes row g (and one past stop skips)."""
    from cbrules.ir.builder import Kernel, threadIdx
    k = Kernel("groups", block=384)
    out = k.tensor("out", (2, 128))
    k.grid(1)
    with k.loop("g", 2, kind="warpgroup") as g:
        k.store(out, g * 128 + threadIdx.x % 128, g + 1.0)
    got = run(k, {"out": np.zeros((2, 128), np.float32)})["out"]
    np.testing.assert_array_equal(got, np.repeat([[1.0], [2.0]], 128, axis=1))
    assert "const int g = 0 + 1 * (int)(threadIdx.x / 128);" in api.generate(k).text
