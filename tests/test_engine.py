"""Matcher relations, every action, the driver's bounds and transactionality, user folders."""
import re

import pytest

from cbrules import api
from cbrules.rewrite import engine, rulefile
from cbrules.ir.builder import Kernel, threadIdx
from cbrules.rewrite.match import Matcher
from cbrules.sexpr import read
from cbrules.schedule import linear_order, print_program, schedule
from cbrules.ir.terms import parse
from cbrules.rewrite.values import NodeRef
from rulekit import two_reader_loop, write_rules
from hostile import within




def kernel():
    """Two loads from one shared buffer inside a loop, a store, a sync."""
    return two_reader_loop(stage_hint=1)


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
    out = run_rules(tmp_path, kernel(), body).graph
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
def test_a_growing_rule_ends_in_the_per_rule_bound_within_seconds(tmp_path):
    # each application adds a node the rule matches again: without a bound it never ends
    body = rule("grow", "(for ?L) (syncthreads ?s :child-of ?L)", "(insert-after ?s (syncthreads))")
    kg = kernel()
    bound = engine.rule_bound(len(kg))
    for debug in (True, False):
        with within(20), pytest.raises(engine.LoweringError) as e:
            write_rules(tmp_path / "rules", "(phases p)\n" + body)
            engine.lower(kg, rulefile.load([tmp_path / "rules"]), debug=debug)
        msg = str(e.value)
        assert f"phase 'p': rule grow (" in msg and f"more than {bound} times" in msg, msg
        assert f"a graph of {len(kg)} nodes" in msg and "add a guard" in msg
        assert re.search(rf"rules still firing: grow \(\S*test\.rules:2\) {bound} times", msg), msg


def test_the_bound_is_per_rule_and_grows_with_the_graph(tmp_path):
    # one application per load, three rules, on a graph with more loads than the fixed part of the bound
    k = Kernel("many", block=64)
    n = k.symbol("N")
    x = k.tensor("x", (n,))
    for _ in range(engine.RULE_FIRINGS_EXTRA + 10):
        k.load(x, threadIdx.x)
    body = "".join(rule(f"tag{i}", "(load ?l)", f'(set ?l :tag "seen{i}")') for i in range(3))
    res = run_rules(tmp_path, k.graph, body)
    assert sum(r.rule.startswith("tag") for r in res.trace.records) == 3 * (engine.RULE_FIRINGS_EXTRA + 10)


def test_the_time_limit_names_the_rules_still_firing(tmp_path):
    body = rule("grow", "(for ?L) (syncthreads ?s :child-of ?L)", "(insert-after ?s (syncthreads))")
    with within(20), pytest.raises(engine.LoweringError, match=r"ran past its time limit of 0 s.*rules still "
                                   r"firing: .*larger time_limit"):
        run_rules(tmp_path, kernel(), body, time_limit=0)


def test_an_exponential_match_ends_at_the_time_limit(tmp_path):
    # eight unrelated node patterns: n**8 candidate bindings, every one rejected by the guard
    pats = " ".join(f"(_ ?n{i})" for i in range(8))
    body = rule("slow", pats, '(set ?n0 :tag "x")', where="(= 1 2)")
    with within(30), pytest.raises(engine.LoweringError, match=r"time limit of 1 s at step 0 while matching rule slow"):
        run_rules(tmp_path, kernel(), body, time_limit=1)


def test_move_into_itself_or_a_descendant_is_refused(tmp_path):
    for target in ("?L", "?i"):
        body = rule("m", "(for ?L) (if ?i :in ?L)" if target == "?i" else "(for ?L)", f"(move ?L :into {target})")
        kg = kernel()
        if target == "?i":
            body = rule("w", "(for ?L) (syncthreads ?s :child-of ?L) (no (if) :in ?L)",
                        '(wrap ?s (if :pred (lt 1 2)))') + body
        with within(20), pytest.raises(engine.LoweringError, match=r"rule m \(\S*test\.rules:\d+\), step \d+ failed "
                                       r"on .*: move \?L :into \S+ would put #\d+ for\(var=i\).* inside itself"):
            run_rules(tmp_path, kg, body)


def test_actions_refuse_the_kernel_node_and_non_scopes(tmp_path):
    cases = [("(kernel ?k) (for ?L)", "(move ?k :into ?L)", "is the kernel node"),
             ("(kernel ?k)", "(wrap ?k (if :pred (lt 1 2)))", "is the kernel node"),
             ("(kernel ?k)", "(clone ?k)", "is the kernel node"),
             ("(kernel ?k)", "(insert-before ?k (syncthreads))", "is the kernel node"),
             ("(for ?L) (syncthreads ?s :child-of ?L)", "(move ?L :into ?s)", "needs a scope"),
             ("(syncthreads ?s)", "(insert-at-entry ?s (syncthreads))", "needs a scope"),
             ("(syncthreads ?s)", "(wrap ?s (syncthreads))", "needs a scope template"),
             ("(for ?L)", '(move ?L :into ?L :at "middle")', "inside itself"),
             ("(kernel ?k) (for ?L)", '(move ?L :into ?k :at "middle")', "move :at takes entry or exit")]
    kg = kernel()
    before = print_program(schedule(kg))
    for match, action, why in cases:
        with within(20), pytest.raises(engine.LoweringError, match=re.escape(why)):
            run_rules(tmp_path, kg, rule("bad", match, action))
    assert print_program(schedule(kg)) == before


def test_add_edge_refuses_cycles_self_edges_and_non_siblings(tmp_path):
    cases = [("(for ?L) (first-reader ?a :of s :in ?L) (last-reader ?b :of s :in ?L)", "(add-edge ?b ?a)",
              "would make the order cyclic"),
             ("(for ?L) (syncthreads ?s :child-of ?L)", "(add-edge ?s ?s)", "cannot run before itself"),
             ("(for ?L) (syncthreads ?s :child-of ?L)", "(add-edge ?L ?s)", "are not in the same scope")]
    for match, action, why in cases:
        with within(20), pytest.raises(engine.LoweringError, match=r"rule bad \(\S*test\.rules:2\).*" + re.escape(why)):
            run_rules(tmp_path, kernel(), rule("bad", match, action))


def test_a_rule_doubling_a_term_ends_in_a_named_error(tmp_path):
    # a new syncthreads each time, and the loop bound doubled each time: 2**100 nodes without a cap
    body = (rule("double", "(for ?L :stop ?n) (syncthreads ?s :child-of ?L)", '(set ?L :stop (+ ?n ?n (var "N")))')
            + rule("grow", "(for ?L) (syncthreads ?s :child-of ?L)", "(insert-after ?s (syncthreads))"))
    with within(20), pytest.raises(engine.LoweringError, match=r"rule double .*:stop would be a value of \d+ parts "
                                   r"\(term nodes, characters, elements\), more than \d+ for a graph of \d+ nodes; a rule "
                                   r"probably grows it"):
        run_rules(tmp_path, kernel(), body)
    # the same with text
    body = (rule("double", "(for ?L) (syncthreads ?s :child-of ?L)", "(set ?L :tag (str (attr ?L tag) (attr ?L tag)))")
            + rule("grow", "(for ?L) (syncthreads ?s :child-of ?L)", "(insert-after ?s (syncthreads))"))
    with within(20), pytest.raises(engine.LoweringError, match=r"rule double .*:tag would be a value of \d+ parts"):
        run_rules(tmp_path, kernel(), body)
    # the same through set-option: the annotations it sets are bounded as set's values are
    grown = '(get (get (attr ?L annotations) "note") "v" "x")'
    body = (rule("double", "(for ?L) (syncthreads ?s :child-of ?L)", f'(set-option ?L "note" :v (str {grown} {grown}))')
            + rule("grow", "(for ?L) (syncthreads ?s :child-of ?L)", "(insert-after ?s (syncthreads))"))
    with within(20), pytest.raises(engine.LoweringError, match=r"rule double .*:annotations would be a value of \d+ parts"):
        run_rules(tmp_path, kernel(), body)


def test_a_value_too_deep_is_refused_also_on_counted_subterms():
    """Terms are counted once (their size and height remembered): a value built on a counted term
    is refused past MAX_VALUE_DEPTH levels as one counted from scratch."""
    from cbrules.rewrite.action_values import MAX_VALUE_DEPTH, check_bounded
    from cbrules.sexpr import RuleError, read
    from cbrules.ir.terms import Term, const, name
    expr = read("(+ ?n 1)")[0]
    t = name("N")
    for _ in range(MAX_VALUE_DEPTH):
        t = Term("+", (t, const(1)))
    check_bounded("stop", t, expr, 10)  # counted, and just within the bound
    for deeper in (Term("+", (t, const(1))), (1, Term("-", (t,)))):
        with pytest.raises(RuleError, match=f"nested more than {MAX_VALUE_DEPTH} deep"):
            check_bounded("stop", deeper, expr, 10)


def test_remove_edge_never_removes_a_contains_edge(tmp_path):
    body = rule("cut", "(for ?L) (syncthreads ?s :child-of ?L)", "(remove-edge ?L ?s)")
    out = run_rules(tmp_path, kernel(), body).graph
    (loop,) = ids(out, "for")
    assert all(out.parent(s) == loop for s in ids(out, "syncthreads"))


def test_a_rule_setting_a_step_of_zero_is_refused_naming_it(tmp_path):
    # a loop that never ends on the device: verify names the node and the rule that set the step
    body = rule("zero", "(for ?L :step ?s)", "(set ?L :step 0)", where="(not (= ?s 0))")
    with within(20), pytest.raises(engine.LoweringError, match=r"rule zero .*has step 0: a loop's step must be"):
        run_rules(tmp_path, kernel(), body)


def test_a_rule_raising_an_unexpected_python_error_is_a_lowering_error(tmp_path, monkeypatch):
    # a bug inside the matcher (here a planted ZeroDivisionError) names the rule, never a raw traceback
    real = Matcher.matches

    def broken(self, elements, guards, *rest):
        if any("load" in str(e) for e in elements):
            raise ZeroDivisionError("planted")
        return real(self, elements, guards, *rest)
    monkeypatch.setattr(Matcher, "matches", broken)
    body = rule("total", "(kernel ?k) (sum ?t bytes (load ?x) :in ?k)", '(set ?k :tag "t")')
    with within(20), pytest.raises(engine.LoweringError, match=r"rule total \(\S*test\.rules:\d+\) failed while "
                                   r"matching: ZeroDivisionError"):
        run_rules(tmp_path, kernel(), body)


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


def test_a_failure_without_debug_leaves_the_graph_untouched(tmp_path):
    # without debug mode the engine rewrites its private copy in place: the caller's graph must not change
    kg = kernel()
    before = print_program(schedule(kg)), sorted(kg.g.nodes(data=True), key=str), kg.depends_edges()
    write_rules(tmp_path / "rules", "(phases p)\n" + rule("half", "(for ?L) (syncthreads ?s :child-of ?L)",
                                                            "(erase ?s) (move ?L :into ?L)"))
    with pytest.raises(engine.LoweringError, match="inside itself") as e:
        engine.lower(kg, rulefile.load([tmp_path / "rules"]))
    assert e.value.trace is None
    assert (print_program(schedule(kg)), sorted(kg.g.nodes(data=True), key=str), kg.depends_edges()) == before


def test_phase_order_is_computed_once_a_phase(monkeypatch):
    rules = api.load_rules()
    calls = []
    real = type(rules).in_phase
    monkeypatch.setattr(type(rules), "in_phase", lambda self, phase: calls.append(phase) or real(self, phase))
    from cbrules.kernels import KERNELS
    engine.lower(KERNELS["matmul"].build(stages=3).graph, rules, simplify=False)
    assert calls == rules.phases


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
    # the kernel fences its barrier init and each refill; the user rule adds one before the loop's sync
    assert plain.split('extern "C"')[1].count("cb_fence_proxy_async();") == 2
    body = changed.split('extern "C"')[1]
    assert "cb_fence_proxy_async();  // fence-each-sync @ " in body
    assert body.index("cb_fence_proxy_async();  // fence-each-sync") < body.index("__syncthreads();",
                                                                                body.index("cb_mbar_wait"))


def test_term_builders_lt_and_eq():
    """(lt A B) and (eq A B) build C comparison terms (an if's predicate), never a lowering-time truth value."""
    from cbrules.rewrite.values import Env, evaluate
    env = Env({"?w": 8}, lambda n: {})
    lt, eq = (evaluate(read(text)[0], env) for text in ('(lt (var "threadIdx.x") 288)',
                                                        '(eq (/ (var "threadIdx.x") 32) ?w)'))
    assert str(lt) == "threadIdx.x < 288" and str(eq) == "threadIdx.x / 32 == 8"
    assert eq == parse("threadIdx.x / 32 == 8")


@pytest.mark.parametrize("builder", ["lt", "eq"])
def test_term_builders_refuse_hostile_operands_by_name(tmp_path, builder):
    """An operand of (lt ...) / (eq ...) that is no term, or a name that is no C identifier or is unbound
    in the kernel, ends in a named error (the rule file's, or lowering's with the kernel unchanged),
    never a traceback or a predicate in the CUDA."""
    from cbrules.errors import CbrulesError
    cases = [('(var "x; y")', "is not a C identifier"), ("(dict)", "expression text"),
             ("(tuple 1 2)", "expression text"), ('"text"', "which is not a loop variable in scope")]
    for i, (operand, why) in enumerate(cases):
        body = rule("w", "(for ?L) (syncthreads ?s :child-of ?L)",
                    f'(wrap ?s (if :pred ({builder} {operand} 1) :tag "w"))')
        with within(20), pytest.raises(CbrulesError, match=re.escape(why)):
            run_rules(tmp_path / str(i), kernel(), body)


def test_a_long_literal_passing_in_a_large_graph_is_checked_again_in_a_small_one(tmp_path):
    """A template's literal values are checked once and remembered, but only those within the value
    bound of a graph of any size: the bound grows with the graph (16 parts a node), so a long literal
    text a large graph allows is refused again, by name, in a small one lowered with the same rules."""
    from cbrules.rewrite.action_values import MAX_VALUE_SIZE, VALUE_PARTS_PER_NODE
    text = "t" * (MAX_VALUE_SIZE + 1000)
    folder = tmp_path / "rules"
    write_rules(folder, "(phases p)\n" + rule("mark", "(kernel ?K :tag (absent))",
                                            f'(insert-at-entry ?K (syncthreads :tag "{text}")) (set ?K :tag "done")'))
    rules = rulefile.load([folder])
    large, small = Kernel("large", block=64), kernel()
    n = large.symbol("N")
    x, out = large.tensor("x", (n,)), large.tensor("out", (n,))
    for i in range(40):
        large.store(out, threadIdx.x + i, large.load(x, threadIdx.x + i))
    assert MAX_VALUE_SIZE + VALUE_PARTS_PER_NODE * len(large.graph) > len(text) + 1 > \
        MAX_VALUE_SIZE + VALUE_PARTS_PER_NODE * len(small)
    lowered = engine.lower(large.graph, rules).graph
    assert [lowered[s]["tag"] for s in lowered.nodes("syncthreads")] == [text]
    with pytest.raises(engine.LoweringError, match=r"rule mark .*:tag would be a value of \d+ parts"):
        engine.lower(small, rules)


def test_move_before_a_statement_and_its_refusals(tmp_path):
    kg = kernel()
    for match, action, why in [
            ("(kernel ?k) (for ?L)", "(move ?L :before ?k)", "the kernel node has no place"),
            ("(kernel ?k) (for ?L)", "(move ?L :into ?k :before ?L)", "one of them"),
            ("(for ?L)", "(move ?L :before ?L)", "inside itself"),
            ("(for ?L) (syncthreads ?s :child-of ?L)", "(move ?L :before ?s)", "inside itself"),
            ("(kernel ?k) (for ?L) (syncthreads ?s :child-of ?L)", "(move ?s :before ?L :at entry)", "takes no :at")]:
        with within(20), pytest.raises(engine.LoweringError, match=re.escape(why)):
            run_rules(tmp_path, kg, rule("bad", match, action))
