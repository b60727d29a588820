"""What lowering keeps instead of reading again must be what reading again gives: the effects a
placement grows instead of re-reading (``KernelGraph.joined``), the scopes' resource indexes, what
terms keep about themselves, and rule values compiled into closures (``values.compiled``)."""
from __future__ import annotations

import math

import pytest

from synthetic import synthetic
from cbrules import api
from cbrules.ir.attributes import term_problem
from cbrules.ir.graph import KernelGraph
from cbrules.ir.ops import effects as own_effects
from cbrules.ir.terms import Term, const, extent, name, substitute
from cbrules.kernels import KERNELS
from cbrules.sexpr import RuleError, read
from cbrules.rewrite.values import Env, NodeRef, compiled, evaluate


def _true_effects(kg: KernelGraph, n: int) -> tuple[frozenset, frozenset]:
    """A node's reads and writes with everything inside it, read from its attributes alone."""
    reads, writes = set(), set()
    for m in [n, *kg.descendants(n)]:
        r, w = own_effects(kg.op(m), kg[m])
        reads |= r
        writes |= w
    return frozenset(reads), frozenset(writes)


def _check_kept(kg: KernelGraph) -> int:
    """Compare every remembered effect and every scope's resource index with a fresh read; return
    how many were compared."""
    compared = 0
    for n, (r, w) in list(kg._scope_effects.items()):
        if n in kg:
            assert (frozenset(r), frozenset(w)) == _true_effects(kg, n), kg.describe(n)
            compared += 1
    for scope in list(kg._resources):
        if scope not in kg:
            continue
        users, writers = kg.sibling_resources(scope)
        want_users: dict[str, set] = {}
        want_writers: dict[str, set] = {}
        for c in kg.children(scope):
            r, w = _true_effects(kg, c)
            for res in r | w:
                want_users.setdefault(res, set()).add(c)
            for res in w:
                want_writers.setdefault(res, set()).add(c)
        assert {k: v for k, v in users.items() if v} == want_users, kg.describe(scope)
        assert {k: v for k, v in writers.items() if v} == want_writers, kg.describe(scope)
        seen = kg._resources[scope].seen  # what the index last read of each child: what a change is compared with
        assert {c: (frozenset(r), frozenset(w)) for c, (r, w) in seen.items()} == \
            {c: _true_effects(kg, c) for c in kg.children(scope)}, kg.describe(scope)
        compared += 1
    return compared


@pytest.mark.parametrize("kernel", ["single_dim", "two_pass", "matmul", "matmul_tc", "many loops"])
def test_remembered_effects_and_resource_indexes_are_what_a_fresh_read_gives(kernel, monkeypatch):
    checked = []
    forget = KernelGraph.keep_derived

    def check_then_forget(self, keep=True):
        if not keep and self._scope_effects is not None and self._resources is not None:
            checked.append(_check_kept(self))
        forget(self, keep)
    monkeypatch.setattr(KernelGraph, "keep_derived", check_then_forget)
    k = synthetic("many loops", 160) if kernel == "many loops" else KERNELS[kernel].build(KERNELS[kernel].default_shape)
    api.lower(k)
    assert checked and max(checked) > 20  # the lowering kept facts, and they were compared


def test_a_term_keeps_its_names_size_and_verdict_and_they_are_what_a_fresh_term_gives():
    def fresh():
        return (name("i") * 4 + name("j")) % const(3) + name("i")
    t = fresh()
    assert list(t.names()) == list(t.names()) == ["i", "j", "i"]
    assert extent(t) == extent(fresh()) == (9, 4)
    assert term_problem(t) is None and t.__dict__["_fine"] is True
    assert term_problem(t) is None  # answered from the mark
    inf = Term("+", (name("x"), const(math.inf)))
    assert term_problem(inf, finite=False) is None and inf.__dict__["_fine"] is False
    assert "infinite or NaN" in term_problem(inf)  # marked fine only where infinities are allowed
    assert inf.__dict__["_fine"] is False
    assert t == fresh() and hash(t) == hash(fresh())  # what a term keeps is no part of its value


def test_substitute_hands_back_the_same_term_where_nothing_is_replaced():
    t = (name("i") + 1) * name("n")
    assert substitute(t, {"k": name("q")}) is t
    s = substitute(t, {"i": name("i") + 2})
    assert s == (name("i") + 2 + 1) * name("n") and s.args[1] is t.args[1]


_EXPRESSIONS = [
    "3", "\"text\"", "true", "nil", "?i", "?S", "(+ 1 2 3)", "(% (var ?v) ?S)", "(% (+ (var ?v) ?P) ?S)",
    "(+ ?P 1)", "(- ?N ?P)", "(* (% (var ?v) ?S) (/ 256 2))", "(= (+ ?P 1) ?S)", "(< ?P ?S)",
    "(str \"cb_slot_\" (id ?L))", "(if (= (+ ?P 1) ?S) (var ?slot) (% (+ (var ?v) 1) ?S))",
    "(and (> ?P 0) (< ?P ?S))", "(tuple ?S 4)", "(prepend ?S (tuple 256))", "(nth (tuple 1 2 3) -1)",
    "(get (dict \"a\" 1) \"a\")", "(max (- ?N ?P) 0)", "(min 3 ?P)", "(not (known ?N))", "(int ?S)",
    # errors: the same message at the same place either way
    "?unbound", "(+ ?P \"x\")", "(nth (tuple) 3)", "(var \"no way\")", "(/ ?P 0)", "(call \"system\" 1)",
    # as deep as the reader takes (MAX_DEPTH 128): compiled without a recursion error, the same value
    "(+ 1 " * 120 + "?P" + ")" * 120, "(% (var ?v) " * 60 + "?S" + ")" * 60,
]


@pytest.mark.parametrize("text", _EXPRESSIONS)
def test_a_compiled_value_is_what_evaluating_gives(text):
    e = read(text, "<test>")[0]
    env = Env({"?i": 7, "?S": 3, "?P": 2, "?N": name("N"), "?v": "i", "?slot": "cb_slot_4", "?L": NodeRef(4)},
              lambda n: {"op": "for", "var": "i"})

    def outcome(fn):
        try:
            return "value", fn()
        except RuleError as x:
            return "error", str(x)
    got, want = outcome(lambda: compiled(e)(env)), outcome(lambda: evaluate(e, env))
    assert got == want
    assert compiled(e) is compiled(e)  # compiled once per expression

