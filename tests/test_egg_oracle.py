"""egglog earns its place: the rules' oracle (provably-equal / provably-le under range facts), one
barrier operation per stage, ranges per loop, one simplification per lowering with a cache,
stages="auto", and refusals with codes."""
import math

import numpy as np

import pytest

from cbrules.ir.limits import MAX_SHARED_BYTES, SM_SHARED_BYTES

from cbrules import api
from cbrules.reference import interp
from cbrules.rewrite import engine, rulefile
from cbrules.ir.builder import Kernel, circular_buffer, threadIdx
from cbrules.rewrite.egg import Oracle, Range, SHIPPED_RULES, forms_from_file
from cbrules.kernels import KERNELS, SEED_MATRIX
from cbrules.rewrite.match import Matcher
from cbrules.sexpr import read
from cbrules.ir.terms import Term, parse
from cbrules.rewrite.values import Env, evaluate
from rulekit import write_rules

FORMS = forms_from_file(SHIPPED_RULES)


# ------------------------------------------------------------------ the oracle
@pytest.mark.parametrize("a, b, ranges, equal", [
    ("(i + 3) % 3", "i % 3", {"i": Range(0, None)}, True),
    ("(i + 3) % 3", "i % 3", {}, False),  # i may be negative: C's % truncates
    ("i % 4", "i", {"i": Range(0, 3)}, True),
    ("i % 4", "i", {"i": Range(0, 4)}, False),
    ("(i + 2) / 3 % 2", "0", {"i": Range(0, 0)}, True),
])
def test_oracle_decides_equality_under_ranges(a, b, ranges, equal):
    assert Oracle(FORMS).decide(Term("==", (parse(a), parse(b))), ranges) is equal


def test_oracle_decides_order_and_caches():
    o = Oracle(FORMS)
    le = Term("<=", (parse("i % 4"), parse("3")))
    assert o.decide(le, {"i": Range(0, None)})
    assert not o.decide(Term("<=", (parse("i % 4"), parse("2"))), {"i": Range(0, None)})
    asked = o.asked
    assert o.decide(le, {"i": Range(0, None), "unrelated": Range(5, 6)})  # only the term's names key the cache
    assert o.asked == asked


def guard(text, decide=None, **bindings):
    return evaluate(read(text)[0], Env({"?" + k: v for k, v in bindings.items()}, lambda n: {}, decide))


def test_provably_guards_without_egglog():
    # equal terms and constants need no oracle; anything else without one is "not proven"
    assert guard("(provably-equal ?a ?b)", a=parse("i % 4"), b=parse("i % 4")) is True
    assert guard("(provably-le ?a 4)", a=parse("3")) is True
    assert guard("(provably-le ?a 2)", a=parse("3")) is False
    assert guard("(provably-equal ?a ?b)", a=parse("(i + 4) % 4"), b=parse("i % 4")) is False
    asked = []
    assert guard("(provably-equal ?a ?b)", lambda t: asked.append(t) or True,
                 a=parse("(i + 4) % 4"), b=parse("i % 4")) is True
    assert asked == [Term("==", (parse("(i + 4) % 4"), parse("i % 4")))]
    with pytest.raises(Exception, match="provably-equal"):
        guard("(provably-equal ?a ?b)", a="text", b=parse("i"))


def copy_kernel():
    k = Kernel("k", block=64)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    with k.loop("i", 8) as i:
        k.store(out, (i + 8) % 8 * 64 + threadIdx.x, k.load(x, i % 8 * 64 + threadIdx.x))
    return k


def test_a_rule_asks_the_oracle_in_its_where(tmp_path):
    """The store's and the load's index terms differ as text but egglog proves them equal under
    i in [0, 8): the rule fires; with a bound that breaks the proof it does not."""
    folder = tmp_path / "r"
    write_rules(folder, "(phases p)\n(graph-rule same-index :phase p "
                ":match ((load ?l :index ?a) (store ?s :index ?b)) :where ((provably-equal ?a ?b)) "
                ':rewrite ((set ?s :tag "same")))\n')
    rs = rulefile.load(rulefile.rule_dirs([folder]))
    out = engine.lower(copy_kernel().graph, rs).graph
    assert [out[n].get("tag") for n in out.nodes("store")] == ["same"]
    assert out[out.nodes("store")[0]]["index"] == out[out.nodes("load")[0]]["index"]  # one simplification


def test_order_relations():
    k = Kernel("k", block=64)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    with k.loop("i", 8) as i:
        a = k.load(x, i * 64 + threadIdx.x)
        b = k.load(x, i * 64 + 1)
        k.store(out, i * 64 + threadIdx.x, k.add(a, b))
    kg = k.graph
    la, lb = kg.nodes("load")
    (st,) = kg.nodes("store")

    def rel(text, **b):
        from cbrules.rewrite.values import NodeRef
        return list(Matcher(kg).matches(tuple(read(text)), (), {k: NodeRef(v) for k, v in b.items()}))

    assert rel("(before ?a ?b)", **{"?a": la, "?b": st}) and not rel("(before ?a ?b)", **{"?a": st, "?b": la})
    assert rel("(independent ?a ?b)", **{"?a": la, "?b": lb})  # two loads of one tensor: either order
    assert rel("(ordered ?a ?b)", **{"?a": st, "?b": lb}) and not rel("(independent ?a ?b)", **{"?a": la, "?b": st})
    assert not rel("(before ?a ?b)", **{"?a": la, "?b": la})


# ------------------------------------------------------------------ one operation per stage
@pytest.mark.parametrize("name", ["pointwise", "matmul"])
@pytest.mark.parametrize("war", ["sync", "mbarrier"])
def test_two_buffers_one_wait_one_expect_tx_one_init(name, war):
    src = api.generate(KERNELS[name].build(stages=3, war=war)).text
    main = src[src.index("// main"):src.index("// epilogue")]
    full = [ln for ln in main.splitlines() if "cb_mbar_wait(cb_smem_addr(&cb_full" in ln]
    assert len(full) == 1, main  # one wait per stage per iteration
    assert main.count("cb_mbar_arrive_expect_tx(") == 1 and "8192)" in main  # both tiles' bytes
    assert main.count("cb_elect_one()") == (2 if war == "mbarrier" else 1)  # refill wait + issue
    pre = src[:src.index("// prologue")]
    assert pre.count("if (cb_elect_one()) {  // pre-prologue") == 1
    assert pre.count("__syncthreads();  // pre-prologue") == 1
    assert pre.count("cb_mbar_init(cb_smem_addr") == (2 if war == "mbarrier" else 1)
    assert src.count("__syncthreads();  // post-epilogue") == 1
    assert src.count("if (cb_elect_one()) {  // post-epilogue") == 1
    assert src.count("cb_mbar_inval(cb_smem_addr") == (2 if war == "mbarrier" else 1)


@pytest.mark.parametrize("registers", [None, (40, 232)])
def test_warp_specialized_one_init_one_sync_one_inval(registers):
    src = api.generate(KERNELS["matmul"].build(stages=3, warp_specialize=True, registers=registers)).text
    # full and empty initialised in one elected loop over the stages, before the roles part
    assert src.count("cb_mbar_init(cb_smem_addr") == 2 and src.count("if (cb_elect_one()) {  // pre-prologue") == 1
    assert src.count("__syncthreads();  // pre-prologue") == 1
    # one consumers' named-barrier sync before the loop and one after it, then one inval block
    assert src.count("cb_bar_sync(2, 256);  // pre-prologue") == 1
    assert src.count("cb_bar_sync(2, 256);  // post-epilogue") == 1
    assert src.count("if (cb_elect_one()) {  // post-epilogue") == 1 and src.count("cb_mbar_inval(cb_smem_addr") == 2


def test_loop_whose_second_load_depends_on_the_body_gets_its_own_issue_block():
    """A load whose coordinate comes from a register computed in the body cannot join the first
    load's elected block without reordering the body: it is issued from a block of its own, and
    the full barrier expects an arrival from each."""
    k = Kernel("k", block=256)
    n = k.symbol("N")
    x, y, out = k.tensor("x", (n,)), k.tensor("y", (n,)), k.tensor("out", (n,))
    xm, ym = k.tensor_map(x, box=(256,)), k.tensor_map(y, box=(256,))
    tx, ty = k.alloc("tx", "shared", "float32", (256,)), k.alloc("ty", "shared", "float32", (256,))
    with k.loop("i", 8, circular_buffer=circular_buffer(2)) as i:
        k.tma_load(xm, (i * 256,), tx)
        a = k.load(tx, threadIdx.x)
        k.tma_load(ym, (i * 256,), ty)
        b = k.load(ty, threadIdx.x)
        k.store(out, i * 256 + threadIdx.x, k.add(a, b))
    g = api.lower(k)
    inits = {g[m]["count"] for m in g.nodes("mbarrier_init")}
    issuers = [m for m in g.nodes("if") if g[m].get("tag") == "cb-issue" and g[g.parent(m)].get("part") == "main"]
    assert inits == {len(issuers)} and len(issuers) in (1, 2)
    rng = np.random.default_rng(0)
    args = {"x": rng.standard_normal(8 * 256, dtype=np.float32), "y": rng.standard_normal(8 * 256, dtype=np.float32),
            "out": np.full(8 * 256, np.nan, np.float32)}
    np.testing.assert_array_equal(interp.run(g, args)["out"], args["x"] + args["y"])


# ------------------------------------------------------------------ ranges per loop, egglog once
def test_prologue_slot_and_parity_fold_to_constants():
    src = api.generate(KERNELS["pointwise"].build(stages=3, war="mbarrier")).text
    pro = src[src.index("// prologue"):src.index("// main")]
    assert "cb_full_3[j]" in pro and "j % 3" not in pro and "cb_mbar_wait(cb_smem_addr(&cb_empty_3[j]), 0)" in pro



@pytest.mark.parametrize("war", ["sync", "mbarrier"])
def test_main_loop_carries_its_slots_and_phase_bits(war):
    """Strength reduction as rules: a main loop with a symbolic trip count steps registers instead
    of computing i % S and (i / S) % 2; the interpreter's protocol checks hold it to the formulas."""
    k = KERNELS["pointwise"].build(stages=3, war=war)
    src = api.generate(k).text
    main = src[src.index("for (int j = 0; j < cb_ceil_div(N, 256) - 2"):src.index("// epilogue")]
    assert "% 3" not in main and "/ 3" not in main, main
    for reg in ("cb_slot_", "cb_phase_", "cb_pslot_", "cb_pphase_"):
        assert f"{reg}" in main
    assert main.count(" == 3) {") == 2  # consumer and producer wrap at S
    rng = np.random.default_rng(1)
    shape = (6, 256 * 7 - 100)
    args = {"x": rng.standard_normal(shape, dtype=np.float32), "y": rng.standard_normal(shape, dtype=np.float32),
            "out": np.full(shape, np.nan, np.float32)}
    np.testing.assert_array_equal(interp.run(api.lower(k), args)["out"], args["x"] + args["y"])


def test_egglog_runs_once_per_lowering_and_is_cached():
    k = KERNELS["single_dim"].build(stages=3)
    g = api.lower(k, debug=True)
    assert [r.rule for r in g.trace.records].count("egglog") == 1
    assert g.trace.records[-1].rule == "egglog"
    engine.SIMPLIFIED.clear()
    api.lower(k)
    assert len(engine.SIMPLIFIED) == 1
    again = api.lower(k)
    assert len(engine.SIMPLIFIED) == 1 and api.generate(k).text == api.generate(k).text
    assert again.kernel()["name"] == "single_dim"


# ------------------------------------------------------------------ stages="auto"
def _auto_model(stage_bytes: int, threads: int, once: int = 0) -> int:
    """The S the occupancy model picks (before the trip count): blocks an SM holds at S stages
    (none where a block's S stages and its ``once`` other bytes pass the block's limit), the bytes
    they keep in flight, the fewest stages reaching 128 KB, else the most in flight."""
    in_flight = {}
    for s in (2, 3, 4):
        need = s * stage_bytes + once
        blocks = 0 if need > MAX_SHARED_BYTES else min(32, 2048 // threads, SM_SHARED_BYTES // (need + 1024))
        in_flight[s] = blocks * (s - 1) * stage_bytes
    enough = [s for s in (2, 3, 4) if in_flight[s] >= 131072]
    return enough[0] if enough else max((2, 3, 4), key=lambda s: in_flight[s])  # ties: fewer stages


@pytest.mark.parametrize("name", SEED_MATRIX)
def test_auto_stages_from_bytes_in_flight_blocks_and_trip_count(name):
    sp = KERNELS[name]
    g = api.lower(sp.build(sp.default_shape, stages="auto", prefetch="auto"), debug=True)
    threads = math.prod(g.kernel()["block"])
    for rec in (r for r in g.trace.records if r.rule == "cb-auto-stages"):
        b = rec.bindings
        stage_bytes = int(b["?stage_bytes"])
        assert int(b["?in_flight_at_3"]) == int(b["?blocks_at_3"]) * 2 * stage_bytes  # the trace explains S
        trips = [] if b["?trip_count"] == "unknown" else [int(b["?trip_count"])]
        bounds = [_auto_model(stage_bytes, threads, int(b["?once"]))] + trips
        assert int(b["?S"]) == max(2, min(bounds))
    mains = [n for n in g.nodes("for") if g[n].get("part") == "main"]
    assert mains
    for m in mains:
        cb = g[m]["annotations"]["circular_buffer"]
        assert 2 <= cb["stages"] <= 4 and cb["prefetch"] == cb["stages"] - 1


@pytest.mark.parametrize("stage_bytes, threads, want", [
    (1024, 256, 4),     # 8 blocks an SM keep 24 KB in flight at S=4: the most there is
    (16384, 256, 3),    # outer_sum's 128x32 tiles: 4 blocks at S=3 reach 128 KB, S=4 would hold 3
    (32768, 512, 3),    # normalize 32768^2: 2 blocks at S=3 keep 128 KB, S=4 leaves one block (96 KB)
    (65536, 256, 3),    # one block an SM at S=2 and at S=3 (193 KB): S=3 keeps 128 KB in flight
    (40000, 1024, 4),   # two blocks by threads: 2 x 3 x 40000 at S=4
    (200000, 256, 2),   # no S fits: nothing in flight, the fewest stages (cb-auto-reject-no-fit refuses it)
])
def test_auto_stages_model(stage_bytes, threads, want):
    assert _auto_model(stage_bytes, threads) == want


@pytest.mark.parametrize("kernel, params, want", [
    ("multi_dim", dict(rows=48, tma_store=True), 2),  # the staging buffer: S=4 would need 295,040 B
    ("matmul_tc", dict(bm=256, bn=128), 3),           # S=4 would need 263,168 B
    ("matmul_tc", {}, 4),                             # 230,400 B at S=4: the tightest fit
])
def test_auto_stages_count_every_shared_buffer_and_fit(kernel, params, want):
    """auto counts the staging buffers, barriers and padding too, and picks an S that fits: the
    largest that does for these (the model's choice among the S that fit)."""
    k = KERNELS[kernel].factory(stages="auto", prefetch="auto", **params)
    src = api.generate(k)
    assert src.shared_bytes <= MAX_SHARED_BYTES
    g = api.lower(k)
    assert {g[n]["annotations"]["circular_buffer"]["stages"] for n in g.nodes("for")
            if "circular_buffer" in (g[n].get("annotations") or {})} == {want}
    with pytest.raises(Exception):  # one more stage would not fit (codegen or the kernel refuses it)
        api.generate(KERNELS[kernel].factory(stages=want + 1, **params))


def test_auto_stages_refuse_by_name_when_two_stages_do_not_fit():
    from cbrules.rewrite.engine import LoweringError
    with pytest.raises(LoweringError) as e:
        api.lower(KERNELS["multi_dim"].factory(stages="auto", rows=200))
    assert e.value.code == "auto-stages-no-fit" and "204800 a stage" in str(e.value)


def test_auto_is_the_only_word_stages_take():
    from cbrules.ir.builder import BuildError
    with pytest.raises(BuildError):
        circular_buffer("many")


def test_cli_stages_auto(capsys):
    from cbrules.cli import main
    assert main(["lower", "matmul", "--stages", "auto"]) == 0
    assert main(["check", "single_dim", "--stages", "auto"]) != 0
    assert "--stages auto" in capsys.readouterr().err
    assert main(["lower", "matmul", "--stages", "three"]) == 2  # argparse's usage error
    assert "neither an integer nor auto" in capsys.readouterr().err


# ------------------------------------------------------------------ refusals carry codes
def test_fail_code_reaches_the_lowering_error(tmp_path):
    folder = tmp_path / "r"
    write_rules(folder, "(phases p)\n(graph-rule no-loops :phase p :match ((for ?L)) "
                ':rewrite ((fail :code my-code "loop {?L} refused")))\n')
    with pytest.raises(engine.LoweringError, match="refused") as e:
        engine.lower(copy_kernel().graph, rulefile.load(rulefile.rule_dirs([folder])))
    assert e.value.code == "my-code" and e.value.rule == "no-loops"


def test_every_shipped_refusal_has_a_code():
    rs = rulefile.load()
    for r in rs.rules:
        for a in r.rewrite:
            if a.head() == "fail":
                assert any(getattr(x, "value", None) == "code" for x in a.items), r.name
