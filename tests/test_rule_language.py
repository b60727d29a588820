"""The rule language: order relations, distinct bindings, a wait's :backoff, unmodelled functions."""
import numpy as np
import pytest

from cbrules import api
from cbrules.reference import interp
from cbrules.check import Checker
from cbrules.kernels import get
from cbrules.rewrite.match import Matcher
from cbrules.rewrite.rulefile import load, rule_dirs
from cbrules.sexpr import RuleError, read
from cbrules.ir.terms import DEVICE_FUNCTIONS, Term, call
from cbrules.ir.verify import GraphError
from cbrules.reference.vterms import CACHE, Lanes, compile_term
from rulekit import two_reader_loop, write_rules


def body():
    """load, store, sync, load, load, store, sync -- in this schedule order inside loop i."""
    return two_reader_loop()


def matches(kg, text, var_ops=None):
    """Each binding of the :match elements in ``text`` as a tuple of (var, op) in binding order."""
    out = []
    for b in Matcher(kg).matches(tuple(read(text)), ()):
        out.append(tuple((k, kg.op(v.id)) for k, v in b.items()))
    return out


def test_next_is_the_sibling_right_after_in_schedule_order():
    kg = body()
    got = matches(kg, "(syncthreads ?s) (next ?s ?n)")
    assert got == [(("?s", "syncthreads"), ("?n", "load"))]  # the last sync has no next sibling
    assert matches(kg, "(store ?w) (next ?p ?w)") == [(("?w", "store"), ("?p", "load")),
                                                      (("?w", "store"), ("?p", "add"))]
    # both free: every adjacent pair of every scope (the kernel's body included)
    pairs = matches(kg, "(next ?a ?b) (syncthreads ?a)")
    assert pairs == [(("?a", "syncthreads"), ("?b", "load"))]


def test_before_and_between_stay_within_one_scope():
    kg = body()
    firsts = matches(kg, "(syncthreads ?s) (before ?s ?t) (syncthreads ?t)")
    assert len(firsts) == 1  # the first sync is before the second, never the other way
    inside = matches(kg, "(syncthreads ?s) (syncthreads ?t) (before ?s ?t) (between ?s ?t ?x)")
    assert [b[2][1] for b in inside] == ["load", "load", "add", "store"]
    # a node of the kernel body and one inside the loop share no scope
    assert matches(kg, "(for ?L) (syncthreads ?s) (before ?L ?s)") == []
    assert matches(kg, "(alloc ?a) (for ?L) (before ?a ?L)") != []


def test_distinct_bindings():
    kg = body()
    same_or_not = matches(kg, "(syncthreads ?a) (syncthreads ?b)")
    assert len(same_or_not) == 4  # without distinct, ?a and ?b may be one node
    assert len(matches(kg, "(syncthreads ?a) (syncthreads ?b) (distinct ?a ?b)")) == 2
    assert len(matches(kg, "(load ?a) (load ?b) (load ?c) (distinct ?a ?b ?c)")) == 6


@pytest.mark.parametrize("element, message", [
    ("(between ?a ?b ?x)", "relation between: ?a must be bound by an earlier element"),
    ("(for ?a) (distinct ?a)", "relation distinct takes 2 or more positional argument(s), got 1"),
    ('(for ?a) (next ?a "x")', "relation next takes ?variables"),
    ("(for ?a) (distinct ?a ?z)", "relation distinct: ?z must be bound"),
])
def test_order_relations_are_checked(tmp_path, element, message):
    write_rules(tmp_path / "bad", f"(phase p :after cb-pipeline)\n(graph-rule r :phase p :match ({element}) "
                ":rewrite ((fail \"x\")))\n")
    with pytest.raises(RuleError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        load(rule_dirs([tmp_path / "bad"]))


PEEPHOLE = """
    (disable cb-one-wait-per-stage)
    (phase tidy :after cb-pipeline)
    (graph-rule drop-repeated-wait
      :doc "a wait right after an identical wait (same barrier, slot and parity) returns at once: drop it"
      :phase tidy
      :match ((mbarrier_wait ?first :barrier ?bar :slot ?s :parity ?p)
              (next ?first ?again)
              (mbarrier_wait ?again :barrier ?bar :slot ?s :parity ?p))
      :rewrite ((erase ?again)))
"""
UNSOUND = PEEPHOLE.replace("(next ?first ?again)\n", "")


def waits(kg):
    return [n for n in kg.nodes() if kg.op(n) == "mbarrier_wait"]


def test_the_duplicate_wait_peephole_is_sound(tmp_path):
    # without cb-one-wait-per-stage (which the peephole folder disables) pointwise waits once per
    # buffer (x and y) on the same barrier slot and parity
    assert len(waits(api.lower(get("pointwise").build(stages=3)))) == 2
    write_rules(tmp_path / "off", "(disable cb-one-wait-per-stage)")
    assert len(waits(api.lower(get("pointwise").build(stages=3), rules=[tmp_path / "off"]))) == 4
    write_rules(tmp_path / "peephole", PEEPHOLE)
    tidy = api.lower(get("pointwise").build(stages=3), rules=[tmp_path / "peephole"])
    assert len(waits(tidy)) == 2  # one per part that reads (main, epilogue)
    checker = Checker(blocks="sample", rules=[tmp_path / "peephole"])
    spec = get("pointwise")
    assert [checker.check(spec, t, 2).status for t in (2, 3, 5)] == ["ok", "ok", "ok"]
    # without the order relation ?again may be ?first itself: every wait goes, and the checker says so
    write_rules(tmp_path / "unsound", UNSOUND)
    broken = api.lower(get("pointwise").build(stages=3), rules=[tmp_path / "unsound"])
    assert waits(broken) == []
    bad = Checker(blocks="sample", rules=[tmp_path / "unsound"]).check(spec, 3, 2)
    assert bad.status == "FAIL" and "RawHazard" in bad.detail


BACKOFF = """
    (phase backoff :after cb-pipeline)
    (graph-rule consumer-wait-backoff
      :doc "consumers sleep 32 ns between polls of a full barrier"
      :phase backoff
      :match ((mbarrier_wait ?w :stage "consumer" :backoff (absent)))
      :rewrite ((set ?w :backoff 32)))
"""


def test_a_wait_backoff_reaches_the_cuda_and_the_interpreter(tmp_path):
    write_rules(tmp_path / "backoff", BACKOFF)
    src = api.generate(get("single_dim").build(stages=3), rules=[tmp_path / "backoff"]).text
    assert src.count("cb_mbar_wait_backoff(cb_smem_addr(&cb_full_2[i % 3]), i / 3") == 2  # main, epilogue
    assert "__nanosleep(ns);" in src
    plain = api.generate(get("single_dim").build(stages=3)).text
    assert "backoff" not in plain  # the helper is emitted only where a wait uses it
    checker = Checker(blocks="sample", rules=[tmp_path / "backoff"])
    assert [checker.check(get("single_dim"), t, 2).status for t in (0, 1, 2, 5)] == ["ok", "ok", "ok", "ok"]


def test_a_backoff_out_of_range_is_refused_by_the_rule_and_the_graph_checks(tmp_path):
    write_rules(tmp_path / "bad", BACKOFF.replace(":backoff 32", ":backoff 2000000"))
    with pytest.raises(Exception, match=r"backoff.*2000000 is above 1000000"):
        api.lower(get("single_dim").build(stages=3), rules=[tmp_path / "bad"])
    kg = api.lower(get("single_dim").build(stages=3))
    kg[waits(kg)[0]]["backoff"] = -1
    with pytest.raises(GraphError, match="backoff must be int"):
        kg.verify()
    with pytest.raises(interp.InterpError, match=r"mbarrier_wait :backoff -1 is below 0"):
        n = 256 * 8
        interp.run(kg, {"x": np.zeros(n, np.float32), "out": np.zeros(n, np.float32)}, blocks=[0])


def test_every_device_function_is_modelled_by_the_interpreter():
    lane = np.arange(64)
    for name, fn in DEVICE_FUNCTIONS.items():
        args = {"swizzle": [300, 2, 128], "byte_perm": [0x33221100, 0x77665544, 0x1054]}.get(
            name, [1, 3][:fn.arity])  # elect_warp(1): warp 1 of the two
        chosen = (lane == 32) if name == "elect_warp" else (lane == 0)

        def elect(mask, *warp):  # the interpreter's election: the first thread of the warp asked for
            return mask & (lane == 32 * (warp[0] if warp else 0))
        got = compile_term(call(name, *args))({CACHE: {}}, Lanes(np.ones(64, bool), elect))
        want = fn.host(*args) if fn.host is not None else chosen  # elections: the elected thread only
        assert np.array_equal(got, want), name


def test_an_unmodelled_function_is_a_named_interpreter_error():
    kg = api.lower(get("single_dim").build(stages=3))
    ifs = [n for n in kg.nodes() if kg.op(n) == "if"]
    kg[ifs[0]]["pred"] = Term("call", (), "cb_mystery")  # past every check, as a future table entry would be
    with pytest.raises(interp.UnmodelledTerm, match=r"no function 'cb_mystery'.*cannot run this kernel"):
        interp.prepare(kg)
