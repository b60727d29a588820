"""Warp-specialized circular buffering on the CPU: the lowered structure of every seed kernel, its
NVRTC compile, and the named errors of requests the rules refuse (the kernel as built unchanged)."""
import subprocess
import sys

import pytest

from cbrules import api
from cbrules.ir.builder import Kernel, circular_buffer, threadIdx
from cbrules.rewrite.engine import LoweringError
from cbrules.kernels import KERNELS, SEED_MATRIX, reductions
from cbrules.ir.terms import call, evaluate
from rulekit import write_rules

WS_CASES = [(name, s, regs) for name in SEED_MATRIX for s in (2, 3, 4) for regs in (None, (40, 232))]


def ws_id(case) -> str:
    name, s, regs = case
    return f"{name}-S{s}-" + ("regs" if regs else "noregs")


def ops_in(kg, scope, op):
    return [n for n in kg.descendants(scope) if kg.op(n) == op]


def known_trips(kg, loop):
    try:
        return evaluate(kg[loop]["stop"], {})
    except KeyError:
        return None


def values(term, var, rng):
    return [evaluate(term, {var: i}) for i in rng]


def roles(kg):
    """(consumer if, producer else) of a warp-specialized kernel: before the if only the barrier
    inits (fenced to the async proxy) and one block sync, which every thread runs."""
    top = kg.children(kg.root)
    (cons,) = [c for c in top if kg.op(c) == "if" and kg[c].get("tag") == "cb-consumers"]
    before = [c for c in top if c != cons]
    assert [kg.op(c) for c in before if kg.op(c) != "if"] == ["syncthreads"]
    assert {kg.op(d) for c in before if kg.op(c) == "if" for d in kg.descendants(c)} == {"for", "mbarrier_init",
                                                                                        "fence_proxy_async"}
    (els,) = [c for c in kg.children(cons) if kg.op(c) == "else"]
    return cons, els


@pytest.mark.parametrize("case", WS_CASES, ids=ws_id)
def test_warp_specialized_structure_and_compile(case):
    name, S, regs = case
    sp = KERNELS[name]
    kernel = sp.build(sp.default_shape, stages=S, warp_specialize=True, registers=regs)
    consumers = kernel.graph.kernel()["block"][0]
    buffered = [n for n in kernel.graph.nodes("for") if "circular_buffer" in kernel.graph[n]["annotations"]]
    kg = api.lower(kernel)
    assert kg.kernel()["block"] == (consumers + 128, 1, 1)
    cons, prod = roles(kg)
    assert str(kg[cons]["pred"]) == f"threadIdx.x < {consumers}"
    in_prod = set(kg.descendants(prod))
    in_cons = set(kg.descendants(cons)) - in_prod - {prod}
    # the producer: its first warp alone runs, per buffered loop, a loop that only loads, and nothing
    # else (no barrier it would share with the consumers); the other three warps end at once
    warp = [n for n in kg.children(prod) if kg.op(n) == "if"]
    assert all(kg[n]["tag"] == "cb-producer-warp" and str(kg[n]["pred"]) == f"threadIdx.x / 32 == {consumers // 32}"
               for n in warp)
    assert {kg.op(n) for n in kg.children(prod)} <= {"if", "setmaxnreg"}
    loops = [c for n in warp for c in kg.children(n)]
    assert len(loops) == len(warp)
    assert len(loops) == len(buffered) and all(kg.op(n) == "for" and kg[n]["part"] == "producer" for n in loops)
    for loop in loops:
        waits = ops_in(kg, loop, "mbarrier_wait")
        assert len(waits) == 1 and kg[waits[0]]["barrier"].startswith("cb_empty_")
        issuers = [n for n in ops_in(kg, loop, "if") if kg[n].get("tag") == "cb-issue"]
        assert ops_in(kg, loop, "tma_load") and len(ops_in(kg, loop, "mbarrier_arrive_expect_tx")) == len(issuers)
        assert {kg.op(n) for n in kg.descendants(loop)} <= {"if", "for", "mbarrier_wait", "tma_load",
                                                            "mbarrier_arrive_expect_tx", "fence_proxy_async"}
        # the consumers read the slots with plain loads: each refill starts with a proxy fence
        assert all(kg.op(kg.children(n)[0]) == "fence_proxy_async" for n in issuers)
        assert all(kg[n]["pred"] == call("elect_warp", consumers // 32) for n in ops_in(kg, loop, "if"))
    # the consumers: the kernel's code; no load issued, no block-wide sync, empties freed each iteration
    assert not [n for n in in_cons if kg.op(n) in ("tma_load", "syncthreads")]
    assert all(kg[n].get("bar_id") == 2 and kg[n]["count"] == consumers
               for n in in_cons if kg.op(n) == "reduce" and kg[n]["kind"] == "block")
    assert {(kg[n]["id"], kg[n]["count"]) for n in in_cons if kg.op(n) == "bar_sync"} == {(2, consumers)}
    mine = [n for n in in_cons if kg.op(n) == "for" and kg[n].get("part") == "consumer"]
    assert len(mine) == len(buffered)
    for loop in mine:
        arrives = ops_in(kg, loop, "mbarrier_arrive")
        assert [kg[n]["barrier"][:9] for n in arrives] == ["cb_empty_"]
        var, trips = kg[loop]["var"], range(known_trips(kg, loop) or 4 * S)
        assert values(kg[arrives[0]]["slot"], var, trips) == [i % S for i in trips]
        waits = [n for n in ops_in(kg, loop, "mbarrier_wait") if kg[n]["barrier"].startswith("cb_full_")]
        assert waits  # one before the first read of each buffer
        for wait in waits:
            assert values(kg[wait]["slot"], var, trips) == [i % S for i in trips]
            assert values(kg[wait]["parity"], var, trips) == [i // S % 2 for i in trips]
    # register sharing only when asked for
    dec = [kg[n]["count"] for n in ops_in(kg, prod, "setmaxnreg") if kg[n]["action"] == "dec"]
    inc = [kg[n]["count"] for n in in_cons if kg.op(n) == "setmaxnreg" and kg[n]["action"] == "inc"]
    assert (dec, inc) == (([regs[0]], [regs[1]]) if regs else ([], []))
    assert kg.kernel().get("min_blocks") == (1 if regs else None)
    ck = api.compile_lowered(kg)  # the graph checked above, not a second lowering
    text, r = ck.source.text, ck.cubin.resources
    assert "} else {" in text and ("__launch_bounds__(%d, 1)" % (consumers + 128) in text) == bool(regs)
    assert ("setmaxnreg.dec.sync.aligned.u32 40;" in text) == bool(regs)
    assert r.spill_stores == 0 and r.spill_loads == 0
    assert "C7508" not in (ck.cubin.log or "")  # ptxas honours setmaxnreg (it warns when it would not)


def test_cli_lower_shows_both_roles():
    out = subprocess.run([sys.executable, "-m", "cbrules.cli", "lower", "persistent", "--stages", "3",
                          "--warp-specialize", "--registers", "40,232"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for want in ("tag=cb-consumers", "else tag=cb-producers", "part=producer", "part=consumer",
                 "syncthreads part=pre-prologue", "bar_sync id=2 count=256", "setmaxnreg action=inc count=232",
                 "setmaxnreg action=dec count=40", "mbarrier_wait barrier=cb_empty_",
                 "mbarrier_arrive barrier=cb_empty_",
                 "pred=elect_warp(8)"):
        assert want in text, want


@pytest.mark.parametrize("cmd", ["lower", "compile", "trace"])
def test_cli_registers_flag_errors(cmd):
    extra = ["counts"] if cmd == "trace" else []
    bad = subprocess.run([sys.executable, "-m", "cbrules.cli", cmd, "single_dim", *extra, "--warp-specialize",
                          "--registers", "40"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--registers '40'" in bad.stderr and "Traceback" not in bad.stderr


# ------------------------------------------------------------------------------ refused requests
def tiny(block=256, stages=2, loop_kind="serial", outer=False, barrier=False, register_coord=False, **options):
    """A small exp-like kernel whose circular-buffered loop asks for ``options``."""
    k = Kernel("tiny", block=block)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    m = k.tensor_map(x, box=(256,))
    tile = k.alloc("tile", "shared", "float32", (256,))
    bar = k.alloc("bar", "shared", "mbarrier", (1,)) if barrier else None
    k.grid(1)
    base = k.assign(512, dtype="int32", dst="base") if register_coord else 0

    def body():
        with k.loop("i", 4, circular_buffer=circular_buffer(stages, **options)) as i:
            k.tma_load(m, (i * 256 + base,), tile, barrier=bar)
            k.store(out, i * 256 + threadIdx.x % 256, k.load(tile, threadIdx.x % 256))
    if outer:  # a warp-specialized loop may sit in one serial loop (a persistent walk), not deeper
        with k.loop("o", 2):
            with k.loop("o2", 2):
                body()
    else:
        body()
    return k


REFUSED = {
    "sync-war": (dict(warp_specialize=True, war="sync"), "cb-ws-reject-sync-war", 'use war="mbarrier"'),
    "half-warp-group": (dict(block=64, warp_specialize=True), "cb-ws-reject-block-shape", "multiple of 128"),
    "two-dimensional": (dict(block=(128, 2), warp_specialize=True), "cb-ws-reject-block-shape", "one-dimensional"),
    "too-many-threads": (dict(block=1024, warp_specialize=True), "cb-ws-reject-block-size", "at most 896"),
    "registers-odd": (dict(warp_specialize=True, registers=(40, 230)), "cb-ws-reject-register-count", "multiples of 8"),
    "registers-low": (dict(warp_specialize=True, registers=(16, 232)), "cb-ws-reject-register-count", "24..256"),
    "registers-high": (dict(warp_specialize=True, registers=(40, 264)), "cb-ws-reject-register-count", "24..256"),
    "registers-budget": (dict(warp_specialize=True, registers=(40, 248)), "cb-ws-reject-register-budget",
                         "need 68608 registers"),
    "registers-not-pair": (dict(warp_specialize=True, registers=(40, 232, 8)), "cb-ws-reject-register-pair",
                           "registers=(producer, consumer)"),
    "registers-alone": (dict(registers=(40, 232)), "cb-ws-reject-registers-alone", "add warp_specialize=True"),
    "prefetch": (dict(warp_specialize=True, prefetch=0), "cb-ws-reject-prefetch", "drop prefetch"),
    "nested": (dict(warp_specialize=True, outer=True), "cb-ws-reject-nested", "kernel's top level"),
    "consumer-tma": (dict(warp_specialize=True, barrier=True), "cb-ws-reject-consumer-tma",
                     "consumer warp groups would issue it"),
    "register-coordinate": (dict(warp_specialize=True, register_coord=True), "cb-ws-reject-consumer-value",
                            "uses register base"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_with_a_named_error(case):
    options, rule, fix = REFUSED[case]
    kernel = tiny(**options)
    before = (len(kernel.graph), kernel.graph.kernel()["block"], kernel.graph.depends_edges())
    with pytest.raises(LoweringError) as e:
        api.lower(kernel)
    assert rule in str(e.value) and fix in str(e.value), str(e.value)
    assert (len(kernel.graph), kernel.graph.kernel()["block"], kernel.graph.depends_edges()) == before


def test_tiny_kernel_lowers_and_compiles():
    """The control of the refusals: the same kernel with a valid request."""
    ck = api.compile(tiny(warp_specialize=True, registers=(40, 232)))
    assert "cb_elect_warp(8)" in ck.source.text and ck.cubin.resources.spill_stores == 0


def test_short_loop_is_no_error_when_warp_specialized():
    """The empty barriers bound the producer's lead, so a loop shorter than S needs no refusal, even
    with strict_trip_count (which refuses it without warp specialization)."""
    kg = api.lower(tiny(stages=5, warp_specialize=True, strict_trip_count=True))
    assert kg.kernel()["requires"] == ()
    with pytest.raises(LoweringError, match="cb-reject-short-loop") as e:
        api.lower(tiny(stages=5, strict_trip_count=True))
    assert e.value.code == "short-loop"


# ------------------------------------------------------------------------------ the generic pieces
def test_wrap_body_action_from_a_user_rule(tmp_path):
    """wrap-body is a generic action: a user rule can put a kernel's body under an if/else."""
    write_rules(tmp_path / "r", """
(phase user-wrap :before cb-mark)
(graph-rule user-wrap-body
  :doc "the whole body under a predicate, with an empty else"
  :phase user-wrap
  :match ((kernel ?K :tag (absent)))
  :rewrite ((wrap-body ?K (if :pred (lt (var "threadIdx.x") 128) :as ?t))
            (insert-at-exit ?t (else))
            (set ?K :tag "wrapped")))
""")
    sp = KERNELS["single_dim"]
    kg = api.lower(sp.build(stages=2), rules=[tmp_path / "r"])
    (top,) = [c for c in kg.children(kg.root) if kg.op(c) == "if"]  # later rules add barriers at the top
    assert [kg.op(c) for c in kg.children(top) if kg.op(c) == "else"] == ["else"]
    assert {kg[n]["part"] for n in kg.nodes("for") if n in kg.descendants(top)} >= {"main"}
    text = api.generate(sp.build(stages=2), rules=[tmp_path / "r"]).text
    assert "if ((int)threadIdx.x < 128) {" in text and "} else {\n  }" in text


def test_else_outside_an_if_is_a_graph_error():
    from cbrules.ir.verify import GraphError
    k = Kernel("bad", block=32)
    k.graph.add("else", k.graph.root, origin={})
    with pytest.raises(GraphError, match="else-branch"):
        k.graph.verify()


def test_a_register_split_the_block_cannot_hold_is_refused_before_launch():
    """setmaxnreg.inc waits until the block's pool (its threads times ptxas's registers) holds what it
    asks: a split that asks for more hangs the block on the device. A float32 row walk of 512
    consumers with 40/112 asks 128 x 40 + 512 x 112 = 62464 of 640 x 96 = 61440 (ptxas's cap at
    one block an SM): refused by name when compiled; 40/104 fits and compiles; matmul_tc's 40/232
    over 256 consumers fills its 384 x 168 exactly."""
    from cbrules.codegen.errors import RegisterPoolError
    from cbrules.kernels import KERNELS

    def build(regs):
        return reductions.persistent(stages=2, row=16384, width=4096, threads=512, stats="stable",
                                     warp_specialize=True, registers=regs)
    with pytest.raises(RegisterPoolError, match=r"512 threads x 112 \+ 128 threads x 40 = 62464 registers.*"
                                                r"640 x 96 = 61440.*would wait forever"):
        api.compile(build((40, 112)))
    ck = api.compile(build((40, 104)))
    assert sorted(ck.source.setmaxnreg) == [(40, 128), (104, 512)]
    tc = KERNELS["matmul_tc"]
    ck = api.compile(tc.build(tc.default_shape, stages=4, dtype="bfloat16", warp_specialize=True, registers=(40, 232)))
    assert sorted(ck.source.setmaxnreg) == [(40, 128), (232, 256)] and ck.cubin.resources.registers == 168


def test_a_setmaxnreg_under_a_branch_codegen_cannot_count_is_refused():
    """The pool check needs the threads of each setmaxnreg; under another predicate it says so."""
    from cbrules.codegen.registers import pool_problem
    assert pool_problem("k", (), 384, 168) is None
    assert pool_problem("k", ((232, 256), (40, 128)), 384, 168) is None
    assert "cannot count" in pool_problem("k", ((232, None), (40, 128)), 384, 168)
    assert "would wait forever" in pool_problem("k", ((232, 256), (48, 128)), 384, 168)
