"""Matcher relations, every action, the driver's fixpoint bound and transactionality, user folders."""
import pytest

from cbrules import api, engine, rulefile
from cbrules.builder import Kernel, threadIdx
from cbrules.match import Matcher
from cbrules.sexpr import read
from cbrules.schedule import linear_order, print_program, schedule
from cbrules.terms import parse
from cbrules.values import NodeRef
from rulekit import write_rules


def kernel():
    """Two loads from one shared buffer inside a loop, a store, a sync."""
    k = Kernel("k", block=64)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    s = k.alloc("s", "shared", "float32", (64,))
    with k.loop("i", 8, stage_hint=1) as i:
        v = k.load(x, i * 64 + threadIdx.x)
        k.store(s, threadIdx.x, v)
        k.syncthreads()
        a = k.load(s, threadIdx.x)
        b = k.load(s, 63 - threadIdx.x)
        k.store(out, i * 64 + threadIdx.x, k.add(a, b))
        k.syncthreads()
    return k.graph


def matches(kg, text, guards=""):
    els = tuple(read(text))
    gs = tuple(read(guards))
    return list(Matcher(kg).matches(els, gs))


def ids(kg, op):
    return kg.nodes(op)


# ------------------------------------------------------------------ matcher
def test_node_patterns_and_value_patterns():
    kg = kernel()
    (loop,) = ids(kg, "for")
    assert len(matches(kg, "(load ?l)")) == 3
    assert len(matches(kg, "(load ?l :src s)")) == 2
    assert len(matches(kg, "(load ?l :src (one-of s x))")) == 3
    assert len(matches(kg, "(load ?l :src (not s))")) == 1
    assert len(matches(kg, "(for ?L :annotations (:stage_hint ?h))")) == 1
    assert matches(kg, "(for ?L :annotations (:stage_hint ?h))")[0]["?h"] == 1
    assert matches(kg, "(for ?L :annotations (:missing ?h))") == []
    assert len(matches(kg, "(for ?L :part (absent))")) == 1
    b = matches(kg, "(for ?L :var ?v :stop ?n)")[0]
    assert b["?L"] == NodeRef(loop) and b["?v"] == "i" and b["?n"] == parse("8")
    # a bound variable compares instead of binding
    assert len(matches(kg, "(load ?a :src ?b) (load ?c :src ?b)")) == 5  # s,s pairs (4) + x,x (1)


def test_guards():
    kg = kernel()
    assert len(matches(kg, "(for ?L :stop ?n)", "(>= ?n 8)")) == 1
    assert matches(kg, "(for ?L :stop ?n)", "(> ?n 8)") == []
    assert len(matches(kg, "(load ?l :src ?b)", '(= ?b "s") (has ?l dst)')) == 2


def test_relations():
    kg = kernel()
    (loop,) = ids(kg, "for")
    order = [c for c in linear_order(kg) if kg.parent(c) == loop]
    assert len(matches(kg, "(for ?L) (inside ?n ?L)")) == len(kg.descendants(loop))
    assert len(matches(kg, "(for ?L) (child ?n ?L)")) == len(kg.children(loop))
    # first/last reader of the shared buffer in the loop body, in schedule order
    first = matches(kg, "(for ?L) (first-reader ?c :of s :in ?L)")[0]["?c"].id
    last = matches(kg, "(for ?L) (last-reader ?c :of s :in ?L)")[0]["?c"].id
    readers = [c for c in order if kg.op(c) == "load" and kg[c]["src"] == "s"]
    assert (first, last) == (readers[0], readers[-1])
    assert len(matches(kg, "(reads ?n s)")) == 2 and len(matches(kg, "(writes ?n s)")) == 1
    assert matches(kg, "(for ?L) (no (syncthreads) :in ?L)") == []
    assert len(matches(kg, "(for ?L) (no (fence_proxy_async) :in ?L)")) == 1
    assert matches(kg, "(for ?L) (count ?k (syncthreads) :in ?L)")[0]["?k"] == 2
    assert matches(kg, "(for ?L) (count 3 (load) :in ?L)") != []
    kg[readers[0]]["bytes"] = 5
    kg[readers[1]]["bytes"] = 7
    assert matches(kg, "(for ?L) (sum ?t bytes (load ?x :src s) :in ?L)")[0]["?t"] == 12


def test_match_order_is_deterministic():
    kg = kernel()
    a = [b["?l"].id for b in matches(kg, "(load ?l)")]
    assert a == sorted(a)


# ------------------------------------------------------------------ actions, through the driver
def run_rules(tmp_path, kg, body, phases="(phases p)", **kw):
    folder = tmp_path / "rules"
    write_rules(folder, phases + "\n" + body)
    return engine.lower(kg, rulefile.load([folder]), debug=True, **kw)


def rule(name, match, rewrite, where=""):
    return f"(graph-rule {name} :phase p :match ({match}) {':where (' + where + ')' if where else ''} :rewrite ({rewrite}))\n"


def ops_in(kg, scope):
    return [kg.op(c) for c in linear_order(kg) if kg.parent(c) == scope]


def test_insert_before_after_entry_exit(tmp_path):
    body = (rule("a", "(for ?L) (first-reader ?c :of s :in ?L)", "(insert-before ?c (fence_proxy_async))")
            + rule("b", "(for ?L) (last-reader ?c :of s :in ?L)", "(insert-after ?c (fence_mbarrier_init))")
            + rule("c", "(for ?L)", "(insert-at-entry ?L (bar_sync :id 1 :count 64)) (insert-at-exit ?L (bar_sync :id 2 :count 64))"))
    out = run_rules(tmp_path, kernel(), body).graph
    (loop,) = ids(out, "for")
    seq = [(out.op(c), out[c].get("src"), out[c].get("id")) for c in linear_order(out) if out.parent(c) == loop]
    names = [s[0] for s in seq]
    assert names[0] == "bar_sync" and seq[0][2] == 1 and names[-1] == "bar_sync" and seq[-1][2] == 2
    i = names.index("fence_proxy_async")
    assert seq[i + 1][:2] == ("load", "s")
    # "after" orders against the anchor and anything it conflicts with; register-only work may move
    j = names.index("fence_mbarrier_init")
    last_read = max(k for k, s in enumerate(seq) if s[:2] == ("load", "s"))
    assert last_read < j < names.index("store", last_read)


def test_erase_keeps_order_around(tmp_path):
    out = run_rules(tmp_path, kernel(), rule("e", "(for ?L) (syncthreads ?s :child-of ?L)", "(erase ?s)")).graph
    assert ids(out, "syncthreads") == []
    out.verify()


def test_set_and_let(tmp_path):
    body = rule("s", "(for ?L :stop ?n)", "(let ?m (* ?n 2)) (set ?L :stop ?m :tag \"doubled\")",
                where="(not (has ?L :tag))")
    out = run_rules(tmp_path, kernel(), body).graph
    (loop,) = ids(out, "for")
    assert out[loop]["stop"] == parse("16") and out[loop]["tag"] == "doubled"


def test_replace_and_wrap_and_move(tmp_path):
    body = (rule("r", "(load ?c :src s)",
                 "(replace ?c (load :dst (attr ?c dst) :tag \"new\" :src \"s\" :index (+ (var \"threadIdx.x\") 1) :dtype \"float32\"))",
                 where="(not (has ?c :tag))")
            + rule("w", "(store ?st :dst out)", "(wrap ?st (if :pred (lt (var \"threadIdx.x\") 32) :tag \"w\"))",
                   where="(not (has ?st :tag))")
            + rule("m", "(if ?i :tag \"w\") (syncthreads ?s) (for ?L)", "(move ?s :into ?i :at exit) (set ?s :tag \"moved\")",
                   where="(not (has ?s :tag))"))
    out = run_rules(tmp_path, kernel(), body, max_steps=10).graph
    loads = [out[n] for n in ids(out, "load")]
    assert any(d.get("tag") == "new" and d["index"] == parse("threadIdx.x + 1") for d in loads)
    (iff,) = ids(out, "if")
    assert ops_in(out, iff) == ["store", "syncthreads", "syncthreads"] and out[iff]["pred"] == parse("threadIdx.x < 32")


def test_clone_with_keep_substitute_and_set(tmp_path):
    body = rule("split", "(for ?L :var ?v :stop ?n :part (absent))",
                "(clone ?L :as ?P :set (:part \"prologue\" :stop 2) :keep (load ?x :src x))"
                " (clone ?L :as ?M :set (:part \"main\") :substitute ((load ?y :src x) ?v (+ (var ?v) 2)))"
                " (erase ?L)")
    out = run_rules(tmp_path, kernel(), body).graph
    loops = ids(out, "for")
    parts = {out[n]["part"]: n for n in loops}
    assert set(parts) == {"prologue", "main"}
    pro, main = parts["prologue"], parts["main"]
    assert ops_in(out, pro) == ["load"] and out[pro]["stop"] == parse("2")
    shifted = [out[c] for c in out.children(main) if out.op(c) == "load" and out[c]["src"] == "x"][0]
    assert shifted["index"] == parse("(i + 2) * 64 + threadIdx.x")
    other = [out[c] for c in out.children(main) if out.op(c) == "store" and out[c]["dst"] == "out"][0]
    assert other["index"] == parse("i * 64 + threadIdx.x")  # not in the substituted set
    assert linear_order(out).index(pro) < linear_order(out).index(main)  # clones keep program order
    assert out[out.children(main)[0]]["origin"]["from"] in kernel().nodes()
    out.verify()


def test_add_and_remove_edge(tmp_path):
    body = rule("e", "(for ?L) (first-reader ?a :of s :in ?L) (last-reader ?b :of s :in ?L)",
                "(remove-edge ?a ?b) (add-edge ?b ?a) (set ?a :tag \"done\") (set ?b :tag \"done\")",
                where="(not (has ?a :tag))")
    out = run_rules(tmp_path, kernel(), body).graph
    a, b = [n for n in ids(out, "load") if out[n]["src"] == "s"]
    assert (b, a) in out.depends_edges() and (a, b) not in out.depends_edges()


def test_fail_gives_a_named_error(tmp_path):
    body = rule("refuse", "(for ?L :stop ?n)", '(fail "loop {?L} runs {?n} times: too few")', where="(< ?n 100)")
    with pytest.raises(engine.LoweringError, match=r"loop #\d+ for\(var=i\).* runs 8 times: too few \[rule refuse"):
        run_rules(tmp_path, kernel(), body)


# ------------------------------------------------------------------ driver
def test_fixpoint_bound_names_the_rules_still_firing(tmp_path):
    body = rule("grow", "(for ?L) (syncthreads ?s :child-of ?L)", "(insert-after ?s (syncthreads))")
    with pytest.raises(engine.LoweringError, match=r"still rewriting after 20 applications; rules still firing: grow"):
        run_rules(tmp_path, kernel(), body, max_steps=20)


def test_failed_application_leaves_the_graph_untouched(tmp_path):
    kg = kernel()
    before = print_program(schedule(kg)), sorted(kg.g.nodes(data=False)), kg.depends_edges()
    # erases a node, then fails on a bad value: nothing of it may survive
    body = rule("half", "(for ?L) (syncthreads ?s :child-of ?L)", "(erase ?s) (set ?L :stop (nth (tuple) 3))")
    with pytest.raises(engine.LoweringError, match="the kernel as built is unchanged") as e:
        run_rules(tmp_path, kg, body)
    assert (print_program(schedule(kg)), sorted(kg.g.nodes(data=False)), kg.depends_edges()) == before
    # in debug mode the trace ends with the graph as it was before the failed application
    from cbrules import trace as tr
    assert len(tr.final_graph(e.value.trace).nodes("syncthreads")) == 2


def test_a_rule_fires_once_per_set_of_nodes(tmp_path):
    body = rule("tag", "(load ?l)", '(set ?l :tag "seen")')
    res = run_rules(tmp_path, kernel(), body)
    assert sum(1 for r in res.trace.records if r.rule == "tag") == 3


def test_phases_run_in_order_and_after_orders_rules(tmp_path):
    body = ("(graph-rule second :phase q :match ((for ?L)) :rewrite ((insert-at-exit ?L (fence_proxy_async))))\n"
            "(graph-rule b :phase p :after (a) :match ((for ?L)) :rewrite ((insert-at-exit ?L (bar_sync :id 2 :count 64))))\n"
            "(graph-rule a :phase p :match ((for ?L)) :rewrite ((insert-at-exit ?L (bar_sync :id 1 :count 64))))\n")
    res = run_rules(tmp_path, kernel(), body, phases="(phases p q)")
    assert [r.rule for r in res.trace.records if r.rule != "egglog"] == ["a", "b", "second"]


def test_user_folder_adds_phase_and_disables_a_rule(tmp_path, monkeypatch):
    base = tmp_path / "base"
    write_rules(base, "(phases p)\n" + rule("a", "(for ?L)", "(insert-at-exit ?L (fence_proxy_async))"))
    user = tmp_path / "user"
    write_rules(user, "(phase late :after p)\n(disable a)\n"
                "(graph-rule b :phase late :match ((for ?L)) :rewrite ((insert-at-exit ?L (fence_mbarrier_init))))\n")
    rs = rulefile.load([base, user])
    assert rs.phases == ["p", "late"] and [r.name for r in rs.active()] == ["b"]
    out = engine.lower(kernel(), rs).graph
    assert ids(out, "fence_proxy_async") == [] and len(ids(out, "fence_mbarrier_init")) == 1
    monkeypatch.setenv("CBRULES_RULES", str(base))
    assert base in rulefile.rule_dirs()


def test_egglog_simplifies_terms_written_by_rules(tmp_path):
    body = rule("slot", "(for ?L :var ?v) (load ?l :src s :index ?ix)",
                '(set ?l :index (+ ?ix (* (% (+ (% (var ?v) 4) 1) 4) 64)) :tag "slot")', where="(not (has ?l :tag))")
    folder = tmp_path / "rules"
    write_rules(folder, "(phases p)\n" + body)
    out = engine.lower(kernel(), rulefile.load(rulefile.rule_dirs([folder]))).graph
    idx = [out[n]["index"] for n in ids(out, "load") if out[n]["src"] == "s"]
    assert all("(i + 1) % 4" in str(t) and "% 4 + 1" not in str(t) for t in idx), idx


def test_user_rule_as_data_changes_the_cuda(tmp_path):
    from cbrules.kernels.exp1d import exp1d_tma
    plain = api.generate(exp1d_tma()).text
    folder = tmp_path / "mine"
    write_rules(folder, "(phases extra)\n(graph-rule fence-each-sync :phase extra "
                ":match ((for ?L) (syncthreads ?s :child-of ?L)) :rewrite ((insert-before ?s (fence_proxy_async))))\n")
    changed = api.generate(exp1d_tma(), rules=[folder], annotate=True).text
    assert "cb_fence_proxy_async();" not in plain.split('extern "C"')[1]
    body = changed.split('extern "C"')[1]
    assert "cb_fence_proxy_async();  // fence-each-sync @ " in body
    assert body.index("cb_fence_proxy_async();") < body.index("__syncthreads();", body.index("cb_mbar_wait"))
