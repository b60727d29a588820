"""What is kept instead of computed again must be what computing again gives: what terms keep about
themselves, and rule values compiled into closures (``values.compiled``). What the rule engine keeps
about the graph it lowers is tests/test_engine_memory.py's."""
from __future__ import annotations

import math

import pytest

from cbrules.ir.attributes import term_problem
from cbrules.ir.terms import Term, const, extent, name, substitute
from cbrules.sexpr import RuleError, read
from cbrules.rewrite.values import Env, NodeRef, compiled, evaluate


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

