"""Persistent attention on the CPU: blocks that walk the (head, query tile) pairs, the producer loading
each tile's Q as a walk operand (rules/mma.rules: its own barrier pair, freed after the key loop). The
interpreter against a float64 reference with outputs NaN-poisoned, the protocol mutations it catches, the
program's shape, a kernel of its own with a walk operand, and the refusals by name."""
import numpy as np
import pytest

from cbrules import api
from cbrules.check import Checker
from cbrules.cli import main
from cbrules.ir.builder import Kernel, blockIdx, circular_buffer
from cbrules.kernels import KERNELS
from cbrules.kernels.attention import AttentionError, attention
from cbrules.reference.hazards import InterpError
from cbrules.reference.interp import run
from cbrules.rewrite.engine import LoweringError
from cbrules.schedule import print_program, schedule
from rulekit import write_rules
from test_attention import _assert_close, _case

SPEC = KERNELS["attention"]


@pytest.mark.parametrize("shape,d,stages,blocks", [
    ((3, 70, 150), 64, 2, 2),     # block 0 walks heads 0 and 2
    ((2, 200, 130), 128, 3, 3),   # two query tiles a head, the last one ragged
    ((3, 1, 1), 64, 2, 2),        # one key, one query
    ((1, 17, 300), 64, 3, 5),     # more blocks than tiles
    ((2, 70, 100), 256, 2, 1),    # one block walks both heads, 64-key tiles
], ids=str)
def test_persistent_matches_numpy(shape, d, stages, blocks):
    got, want = _case(*shape, d, False, stages=stages, warp_specialize=True, persistent=blocks)
    _assert_close(got, want, "bfloat16")


def _program(**kw) -> str:
    return print_program(schedule(api.lower(attention(**kw))))


def test_the_producer_loads_q_each_walk_step_and_the_consumers_free_it_after_the_key_loop():
    text = _program(head_dim=128, stages=2, warp_specialize=True, persistent=132)
    consumer, _, producer = text.partition("else ")
    loads = [ln for ln in producer.splitlines() if "tma_load tmap=q_tmap" in ln]
    assert len(loads) == 2 and "tma_load tmap=q_tmap" not in consumer  # two panels, by the producer
    q_full = loads[0].split("barrier=")[1].split()[0]
    q_empty = q_full.replace("full", "empty")
    walk = producer[producer.index("var=walk"):]
    assert walk.index(f"mbarrier_wait barrier={q_empty}") < walk.index("tma_load tmap=q_tmap") \
        < walk.index("var=t ")  # waits for the freed tile, then loads it before the key tiles
    steps = consumer[consumer.index("var=walk"):]
    wait = steps.index(f"mbarrier_wait barrier={q_full}")
    key_loop = steps.index("var=t ")
    release = steps.index(f"mbarrier_arrive barrier={q_empty}")
    assert wait < key_loop < release  # waited for before the loop, freed once after it
    assert steps.count(f"mbarrier_arrive barrier={q_empty}") == 1
    assert "parity=((walk - blockIdx.x) / 132 + cb_once_" in steps  # its phase counts the walk's steps


@pytest.mark.parametrize("mutation,caught", [
    # freed at the end of its own trip, before the consumers wait for it: the producer re-arms a phase early
    ("(disable mma-walk-operand-release)\n", "arrival.*pending"),
    ("(disable mma-once-wait)\n", "reads q_t0.*has not completed yet"),  # read before its load completed
], ids=["freed-at-its-own-trip", "no-wait-for-q"])
def test_walk_operand_mutations_are_caught(tmp_path, mutation, caught):
    write_rules(tmp_path / "mut", mutation)
    args = SPEC.variant(head_dim=64).make_inputs((3, 64, 130), np.random.default_rng(1), "bfloat16")
    kg = api.lower(attention(head_dim=64, stages=2, warp_specialize=True, persistent=2),
                   rules=[str(tmp_path / "mut")])
    with pytest.raises(InterpError, match=caught), np.errstate(divide="ignore", invalid="ignore"):
        run(kg, args)


def test_the_checker_passes_a_few_trip_counts():
    spec = SPEC.variant(head_dim=64, persistent=1)
    checker = Checker(dtype="bfloat16")
    for trips in (0, 1, 3):
        res = checker.check(spec, trips, 2, warp_specialize=True)
        assert res.status == "ok", res.detail


def _panel_kernel(load_after: bool = False) -> Kernel:
    """A kernel of its own with a walk operand: each walk step multiplies one [64, 64] panel of A (loaded
    once a step) by the N / 64 tiles of B in a warp-specialized loop and stores the product tiles."""
    k = Kernel("panels", block=128)
    m, n = k.symbol("M"), k.symbol("N")
    a = k.tensor("a", (m, 64), "bfloat16")
    b = k.tensor("b", (n, 64), "bfloat16")
    c = k.tensor("c", (m, n), "float32")
    a_map = k.tensor_map(a, box=(64, 64), swizzle="128B")
    b_map = k.tensor_map(b, box=(64, 64), swizzle="128B")
    c_map = k.tensor_map(c, box=(64, 64))
    a_t = k.alloc("a_t", "shared", "bfloat16", (64, 64), align=1024)
    b_t = k.alloc("b_t", "shared", "bfloat16", (64, 64), align=1024)
    acc = k.mma_accumulator(64, 64)
    panels = (m + 63) / 64
    k.grid(2)
    with k.loop("walk", blockIdx.x, panels, 2) as w:
        if not load_after:
            k.tma_load(a_map, (w * 64, 0), a_t)
        with k.loop("t", (n + 63) / 64, circular_buffer=circular_buffer(2, warp_specialize=True)) as t:
            k.tma_load(b_map, (t * 64, 0), b_t)
            k.mma(acc, a_t, b_t, scale_d=0)
            k.mma_store(acc, c_map, (w * 64, t * 64))
        if load_after:
            k.tma_load(a_map, (w * 64, 0), a_t)
    return k


def test_a_kernel_of_its_own_with_a_walk_operand():
    rng = np.random.default_rng(3)
    import ml_dtypes
    a = rng.standard_normal((200, 64)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((136, 64)).astype(ml_dtypes.bfloat16)
    c = np.full((200, 136), np.nan, np.float32)
    got = run(api.lower(_panel_kernel()), {"a": a, "b": b, "c": c})
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(np.asarray(got["c"]), want, rtol=1e-5, atol=1e-4)


def test_a_walk_operand_loaded_after_its_loop_is_refused_by_name():
    with pytest.raises(LoweringError) as e:
        api.lower(_panel_kernel(load_after=True))
    assert e.value.code == "mma-unbuffered-operand"


def test_refusals_by_name(capsys):
    for bad, what in ((dict(persistent=4), "needs warp_specialize"),
                      (dict(persistent=4, warp_specialize=True, causal=True), "causal=True"),
                      (dict(persistent=4, warp_specialize=True, key_blocks=lambda r, n: (0, n, None)), "key_blocks"),
                      (dict(persistent=-1, warp_specialize=True), "number of blocks"),
                      (dict(persistent=True, warp_specialize=True), "number of blocks"),
                      (dict(persistent=2 ** 40, warp_specialize=True), "number of blocks")):
        with pytest.raises(AttentionError, match=what):
            attention(**bad)
    assert main(["compile", "attention", "--persistent", "132"]) == 2  # a wrong command line
    assert "needs --warp-specialize" in capsys.readouterr().err
    assert main(["compile", "attention", "--persistent", "132", "--warp-specialize", "--causal"]) == 1
    assert "causal=True" in capsys.readouterr().err
    assert main(["compile", "matmul_tc", "--persistent", "132", "--warp-specialize"]) == 2
    assert "takes no such parameters" in capsys.readouterr().err
    for bad in ("-5", "99999999999"):
        assert main(["compile", "attention", "--persistent", bad, "--warp-specialize"]) == 1
        assert "give the number of blocks" in capsys.readouterr().err
    assert main(["compile", "attention", "--persistent", "x", "--warp-specialize"]) == 2
    assert "invalid int value" in capsys.readouterr().err


def test_compile_holds_the_walk(capsys):
    assert main(["compile", "attention", "--head-dim", "128", "--warp-specialize", "--persistent", "132"]) == 0
    captured = capsys.readouterr()
    assert "for (int walk = (int)blockIdx.x;" in captured.out and "setmaxnreg" in captured.out
    assert "0/0 B spill stores/loads, 0 B stack" in captured.err
