"""The lowered structure of every seed kernel x S x P x WAR mode, and its NVRTC compile (no GPU)."""
import pytest

from cbrules import api
from cbrules.ir.terms import evaluate
from cbmatrix import CASES, case_id, spec

# bytes the one arrive_expect_tx of a stage announces, per kernel (tile bytes of all its buffers)
EXPECT_TX = {"single_dim": 1024, "single_dim_unroll": 4096, "single_dim_unswitch": 4096,
             "multi_dim": 4096, "pointwise": 8192, "inner_reduction": 1024,
             "outer_reduction": 8192, "persistent": 1024, "two_pass": 1024, "matmul": 8192}
BUFFERS = {"pointwise": 2, "matmul": 2}  # circular-buffered tiles of one stage (else 1)
BOXES_PER_STAGE = {"single_dim_unroll": 4, "single_dim_unswitch": 4, "persistent": 2}


def loops_by_part(kg, var):
    return {kg[n]["part"]: n for n in kg.nodes("for")
            if kg[n].get("part") in ("prologue", "main", "epilogue") and kg[n]["var"] == var}


def loops_by_var(kg):
    """The circular-buffered loops of the lowered kernel, by variable (their main parts)."""
    return {kg[n]["var"] for n in kg.nodes("for") if kg[n].get("part") == "main"}


def ops_in(kg, scope, op):
    return [n for n in kg.descendants(scope) if kg.op(n) == op]


def values(term, var, rng):
    return [evaluate(term, {var: i, "threadIdx.x": 0, "blockIdx.x": 0, "blockIdx.y": 0}) for i in rng]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_lowered_structure_and_compile(case):
    name, S, P, war = case
    sp = spec(name)
    kernel = sp.build(sp.default_shape, stages=S, prefetch=P, war=war)
    original = [n for n in kernel.graph.nodes("for") if "circular_buffer" in kernel.graph[n]["annotations"]]
    trips = {kernel.graph[n]["var"]: kernel.graph[n]["stop"] for n in original}
    assert len(trips) == len(original), "each circular-buffered loop of a seed kernel has its own variable"
    kg = api.lower(kernel)
    bars = {kg[a]["buf"]: kg[a] for a in kg.nodes("alloc") if kg[a]["dtype"] == "mbarrier"}
    assert len(bars) == (2 if war == "mbarrier" else 1) * len(original)
    assert all(b["shape"] == (S,) for b in bars.values())
    for var, trip in trips.items():
        check_pipelined_loop(kg, name, S, P, war, var, trip)
    ck = api.compile_lowered(kg)  # the graph checked above, not a second lowering
    assert ck.cubin.cubin[:4] == b"\x7fELF" and ck.cubin.resources.spill_stores == 0


def check_pipelined_loop(kg, name, S, P, war, var, trip):
    """The parts, barriers, slots and parities of the loop over ``var`` (``trip`` iterations)."""
    parts = loops_by_part(kg, var)
    assert set(parts) == ({"main"} if P == 0 else {"prologue", "main", "epilogue"})
    main = parts["main"]
    assert evaluate(kg[main]["start"], {}) == 0
    n_sym = {"N": 4096, "M": 4096, "K": 4096}
    n = evaluate(trip, n_sym)
    assert evaluate(kg[main]["stop"], n_sym) == n - P
    if P:
        assert (evaluate(kg[parts["prologue"]]["start"], {}), evaluate(kg[parts["prologue"]]["stop"], {})) == (0, P)
        assert evaluate(kg[parts["epilogue"]]["start"], n_sym) == n - P
        assert evaluate(kg[parts["epilogue"]]["stop"], n_sym) == n
        assert not ops_in(kg, parts["epilogue"], "tma_load")  # the epilogue loads nothing
        assert set(kg[x]["op"] for x in kg.descendants(parts["prologue"])) <= {
            "if", "for", "tma_load", "mbarrier_arrive_expect_tx", "mbarrier_wait", "fence_proxy_async"}

    # barriers: full[S] (+ empty[S]); one arrive-expect-tx per stage for all its buffers, so the
    # full barrier expects one arrival; every barrier invalidated
    opts = kg[main]["annotations"]["circular_buffer"]
    arrives = ops_in(kg, main, "mbarrier_arrive_expect_tx")
    assert [kg[a]["bytes"] for a in arrives] == [EXPECT_TX[name]]
    inits = {kg[i]["barrier"]: kg[i]["count"] for i in kg.nodes("mbarrier_init")}
    full = kg[arrives[0]]["barrier"]
    assert full == opts["full"] and inits[full] == 1
    issuers = [x for x in kg.descendants(main) if kg[x].get("tag") == "cb-issue"]
    assert len(issuers) == 1 and set(ops_in(kg, main, "tma_load")) <= set(kg.descendants(issuers[0]))
    # the threads read the slots with plain loads: a refill starts with a proxy fence (cb-fence-refill)
    assert [kg.op(c) for c in kg.children(issuers[0])][:2] == ["fence_proxy_async", "mbarrier_arrive_expect_tx"]
    # one elected init block and one block sync before the loop, one sync and one inval block after
    # it, for the full and the empty barriers together
    mine = {full, opts.get("empty")}
    for op, part in (("mbarrier_init", "pre-prologue"), ("mbarrier_inval", "post-epilogue")):
        blocks = {list(kg.ancestors(x))[1] for x in kg.nodes(op) if kg[x]["barrier"] in mine}
        assert len(blocks) == 1 and all(kg[b].get("part") == part for b in blocks)
        syncs = [x for x in kg.nodes("syncthreads") if kg[x].get("part") == part]
        assert len(syncs) == len(loops_by_var(kg))
    invals = {kg[x]["barrier"] for x in kg.nodes("mbarrier_inval")}
    if war == "mbarrier":
        empty = opts["empty"]
        assert inits[empty] == 256
        assert {full, empty} <= invals
    else:
        assert full in invals
        assert any(kg[x].get("stage") == "war" for x in ops_in(kg, main, "syncthreads"))
    loads = ops_in(kg, main, "tma_load")
    assert len(loads) == BUFFERS.get(name, 1)
    assert sum(kg[x]["bytes"] * BOXES_PER_STAGE.get(name, 1) for x in loads) == EXPECT_TX[name]

    # slot and parity terms: a main loop that stays a loop carries them in registers (cb-rotate-slots;
    # their values are the interpreter's to check), an unrolled one has them as terms of i
    span = range(0, max(n - P, 1))
    waits = [w for w in ops_in(kg, main, "mbarrier_wait") if kg[w]["barrier"] == full]
    assert len(waits) == 1  # one per stage and iteration, whatever the number of buffers
    if kg[main]["kind"] == "serial":
        names = {f"cb_{r}_{main}" for r in ("slot", "phase", "pslot", "pphase")}
        assert {x["dst"] for x in map(kg.__getitem__, ops_in(kg, main, "assign"))} >= names
        for ld in loads + arrives:
            assert str(kg[ld]["slot"]) == f"cb_pslot_{main}"
        assert (str(kg[waits[0]]["slot"]), str(kg[waits[0]]["parity"])) == (f"cb_slot_{main}", f"cb_phase_{main}")
    else:
        for ld in loads + arrives:
            assert values(kg[ld]["slot"], var, span) == [(i + P) % S for i in span]
        for w in waits:
            assert values(kg[w]["slot"], var, span) == [i % S for i in span]
            assert values(kg[w]["parity"], var, span) == [(i // S) % 2 for i in span]
    if P:
        tail = range(n - P, n)
        for w in ops_in(kg, parts["epilogue"], "mbarrier_wait"):
            assert values(kg[w]["slot"], var, tail) == [i % S for i in tail]
            assert values(kg[w]["parity"], var, tail) == [(i // S) % 2 for i in tail]
        for ld in ops_in(kg, parts["prologue"], "tma_load"):
            assert values(kg[ld]["slot"], var, range(P)) == list(range(P))
