"""The egglog bridge: shipped index algebra, range guards, error positions, panics, speed."""
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from cbrules.rewrite import egg
from cbrules.rewrite.egg import EggRuleError, Range, forms_from_file, load_check, simplify
from cbrules.ir.terms import Term, const, evaluate, name, parse
from cbrules.sexpr import MAX_DEPTH

LIMIT = 30000  # evaluation points per term; every point of the ranges when there are fewer
RANGES = {"i": Range(0, 100), "k": Range(0, 1000)}


@pytest.fixture(scope="module")
def forms():
    return forms_from_file(egg.SHIPPED_RULES)


def _hide_calls(t: Term) -> Term:
    """Replace host-unevaluable calls (elect_one()) by names, so equivalence can still be checked."""
    if t.op == "call" and t.value not in ("min", "max", "ceil_div"):
        return name(f"@{t}")
    return Term(t.op, tuple(_hide_calls(a) for a in t.args), t.value) if t.args else t


def _points(names, ranges, limit=LIMIT, rng=random.Random(0)):
    axes = []
    for n in sorted(names):
        if n.startswith("@"):
            axes.append([False, True])
            continue
        r = ranges.get(n) or egg.BUILTIN_RANGES.get(n) or Range(None, None)
        lo = r.lo if r.lo is not None else (r.hi - 60 if r.hi is not None else -30)
        hi = r.hi if r.hi is not None else lo + 60
        axes.append(range(lo, hi + 1))
    size = 1
    for a in axes:
        size *= len(a)
    if size <= limit:
        yield from (dict(zip(sorted(names), p)) for p in itertools.product(*axes))
    else:
        for _ in range(limit):
            yield dict(zip(sorted(names), (rng.choice(a) for a in axes)))


def assert_equivalent(orig: Term, new: Term, ranges) -> None:
    """Evaluate both terms at every point of the names' ranges (C semantics for / and %)."""
    a, b = _hide_calls(orig), _hide_calls(new)
    for env in _points(set(a.names()) | set(b.names()), ranges):
        try:
            want = evaluate(a, env)
        except ZeroDivisionError:
            continue  # undefined in the original: anything goes
        assert evaluate(b, env) == want, f"{orig} -> {new} differs at {env}"


def run(forms, texts, ranges=RANGES, **kw):
    terms = [parse(t) for t in texts]
    res = simplify(terms, ranges, forms, **kw)
    assert res.error is None
    for t in terms:
        assert_equivalent(t, res.terms[t], ranges)
    return res, [res.terms[t] for t in terms]


@pytest.mark.parametrize("text, ranges, want", [
    ("((i % 4) + 1) % 4", RANGES, "(i + 1) % 4"),
    ("(k + 9) % 4", RANGES, "(k + 1) % 4"),
    ("i % 4", {"i": Range(0, 3)}, "i"),
    ("i / 4", {"i": Range(0, 3)}, "0"),
    ("(2 + 3) * 4", {}, "20"),
    ("i + 0", RANGES, "i"),
    ("i * 1 - 0", {}, "i"),
    ("i - i", {}, "0"),
    ("i - 1 + 3", {}, "i + 2"),
    ("i < N", {"i": Range(0, 9), "N": Range(10, None)}, "true"),
    ("i >= N", {"i": Range(0, 9), "N": Range(10, None)}, "false"),
    ("true && i < N", {"i": Range(0, 9), "N": Range(10, None)}, "true"),
    ("!(i < N)", {}, "i >= N"),
    ("min(i, 200)", RANGES, "i"),
    ("((i % 4) + 1) % 4", {}, "((i % 4) + 1) % 4"),
    ("((i % 4) + 1) % 4", {"i": Range(-5, 100)}, "((i % 4) + 1) % 4"),
    ("(i + 9) % 4", {"i": Range(-5, 100)}, "(i + 9) % 4"),
    ("i % 4", {"i": Range(-3, 3)}, "i % 4"),
])
def test_simplifies(forms, text, ranges, want):
    _, (got,) = run(forms, [text], ranges)
    assert got == parse(want), f"{text} -> {got}, wanted {want}"


def test_slot_division_stays_correct(forms):
    res, (got,) = run(forms, ["(i + 4) / 4 % 2"])
    assert got == parse("(i / 4 + 1) % 2")
    assert res.iterations >= 1 and res.seconds > 0


def test_opaque_terms_round_trip(forms):
    texts = ["elect_one() && i < 4", "x * 2.5", "elect_one()"]
    _, got = run(forms, texts)
    assert got == [parse(t) for t in texts]


def test_duplicates_and_shared_subterms(forms):
    t = parse("(i + 0) % 4")
    res = simplify([t, t, parse("i + 0")], RANGES, forms)
    assert res.terms == {t: parse("i % 4"), parse("i + 0"): parse("i")}



def test_each_distinct_node_is_inserted_once(forms):
    # equal subterms built separately (distinct objects) share one seed-rule variable each;
    # egglog's cost is per node inserted, so a kernel's terms cost their distinct nodes
    texts = ["(i * 4 + 1) % 8", "(i * 4 + 1) / 8", "i * 4 + 1", "(i * 4 + 1) % 8"]
    terms = [parse(t) for t in texts]
    enc = egg._Encoder()
    for n, t in enumerate(dict.fromkeys(terms)):
        enc.root(n, t)
    lets = [a for a in enc.actions if a.__class__.__name__ == "Let"]
    assert len(lets) == 8  # i, 4, i*4, 1, i*4+1, 8, the % and the /
    assert enc.names == {"i"}
    res = simplify(terms, RANGES, forms)
    assert res.terms == {t: simplify([t], RANGES, forms).terms[t] for t in terms}


def test_rule_match_counts(forms):
    res, _ = run(forms, ["((i % 4) + 1) % 4", "(2 + 3) * 4"])
    assert res.rule_matches.get("mod-add-mod-l", 0) >= 1
    assert res.rule_matches.get("fold-add", 0) >= 1


def test_broken_form_names_file_line_col(tmp_path, forms):
    path = tmp_path / "mine.rules"
    path.write_text("; my rules\n(ruleset mine)\n\n  (rewrite (Add x)\n      x :ruleset mine)\n")
    user = forms_from_file(path)
    assert [(f.line, f.col) for f in user] == [(2, 1), (4, 3)]
    with pytest.raises(EggRuleError) as e:
        load_check(forms + user)
    assert str(e.value).startswith(f"{path}:4:12: ")
    assert "Arity mismatch" in str(e.value)
    with pytest.raises(EggRuleError, match=f"^{path}:4:12: "):
        simplify([parse("i")], {}, forms + user)


def test_error_inside_multiline_form(tmp_path, forms):
    path = tmp_path / "m.rules"
    path.write_text('(rewrite (Add x (Num 0))\n         (Nope x)\n         :ruleset index :name "z")\n')
    with pytest.raises(EggRuleError, match=f"^{path}:2:10: .*Unbound function Nope"):
        load_check(forms + forms_from_file(path))


def test_parse_errors_and_duplicate_rule_names(tmp_path, forms):
    path = tmp_path / "p.rules"
    path.write_text('\n(rewrite (Add x y) x :bogus 1)\n')
    with pytest.raises(EggRuleError, match=f"^{path}:2:1: parse error"):
        load_check(forms + forms_from_file(path))
    path.write_text('(rewrite (Add x (Num 0)) x :ruleset index :name "add-zero-r")\n')
    with pytest.raises(EggRuleError, match=f"^{path}:1:1: rule 'add-zero-r' is already defined"):
        load_check(forms + forms_from_file(path))
    path.write_text("(ruleset a))\n")
    with pytest.raises(EggRuleError, match=f"^{path}:1:12: unexpected"):
        forms_from_file(path)


def test_forms_from_file_bounds_nesting_and_bytes(tmp_path):
    path = tmp_path / "d.rules"
    path.write_text("(ruleset a)\n (rule () (" + "(Neg " * 10_000 + "))\n")
    with pytest.raises(EggRuleError, match=f"^{path}:2:.*nested deeper than {MAX_DEPTH} levels"):
        forms_from_file(path)
    path.write_bytes(b"(ruleset a)\n(ruleset \xfe)\n")
    with pytest.raises(EggRuleError, match=f"^{path}:2:10: invalid UTF-8"):
        forms_from_file(path)


@pytest.mark.parametrize("head, text", [
    ("datatype", "(datatype Q (Leaf i64))"), ("datatype*", "(datatype* (Q (Leaf i64)))"),
    ("sort", "(sort Q)"), ("function", "(function f (i64) i64 :merge new)"),
    ("constructor", "(constructor C (i64) Q)"), ("relation", "(relation R (i64))"), ("ruleset", "(ruleset r)"),
    ("rewrite", "(rewrite (Leaf x) (Leaf x))"), ("birewrite", "(birewrite (Leaf x) (Leaf x))"),
    ("rule", "(rule () ((Leaf 1)))"),
])
def test_allowed_heads_are_the_declaration_commands(head, text):
    """The allow-list is tied to egglog's own parse: each head parses to exactly its command class."""
    from egglog import bindings as eb
    assert set(egg.EGGLOG_ALLOWED) == {"datatype", "datatype*", "sort", "function", "constructor", "relation",
                                       "ruleset", "rewrite", "birewrite", "rule"}
    (cmd,) = eb.EGraph().parse_program(text)
    assert type(cmd) is egg.EGGLOG_ALLOWED[head]


def test_refused_heads_parse_to_other_commands():
    from egglog import bindings as eb
    allowed = set(egg.EGGLOG_ALLOWED.values())
    for text in ['(output "x" 1)', '(input f "x")', '(include "x")', "(run 1)", "(run-schedule (run))",
                 "(push)", "(pop)", "(print-size)", "(let a 1)", "(check (= 1 1))", "(extract 1)"]:
        (cmd,) = eb.EGraph().parse_program(text)
        assert type(cmd) not in allowed, text


def test_forms_from_file_handles_comments_and_strings(tmp_path):
    path = tmp_path / "c.rules"
    path.write_text('; (not a form\n(a "x ) ; y" ; )\n b) (c)\n')
    got = forms_from_file(path)
    assert [(f.text, f.line, f.col) for f in got] == [('(a "x ) ; y" ; )\n b)', 2, 1), ("(c)", 3, 5)]


def test_panic_leaves_terms_unchanged(forms, monkeypatch):
    class FakePanic(BaseException):
        pass

    def boom(*_a, **_k):
        raise FakePanic("egglog exploded")

    monkeypatch.setattr(egg, "_run_rules", boom)
    t = parse("i + 0")
    with pytest.warns(RuntimeWarning, match="egglog exploded"):
        res = simplify([t], RANGES, forms)
    assert res.terms == {t: t}
    assert "egglog exploded" in res.error


def test_keyboard_interrupt_is_not_swallowed(forms, monkeypatch):
    monkeypatch.setattr(egg, "_run_rules", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        simplify([parse("i")], RANGES, forms)


@pytest.mark.parametrize("budget, needle", [
    ({"iterations": 1}, "iteration budget of 1 rounds"),
    ({"time_limit_s": 0.0}, "time budget of 0 s"),
    ({"max_nodes": 1}, "node budget of 1 e-graph rows"),
])
def test_a_budget_hit_warns_and_leaves_every_term_unchanged(forms, budget, needle):
    terms = [parse("((i % 4) + 1) % 4"), parse("i + 0")]
    with pytest.warns(egg.EggBudgetWarning, match=needle):
        res = simplify(terms, RANGES, forms, **budget)
    assert res.error is None and needle in res.budget and res.iterations == 1
    assert res.terms == {t: t for t in terms}  # never half-simplified


def test_no_budget_hit_when_saturated(forms, recwarn):
    res = simplify([parse("(i + 0) % 4")], RANGES, forms)
    assert res.budget is None and not [w for w in recwarn if w.category is egg.EggBudgetWarning]


def test_node_budget_refuses_a_run_that_would_explode(forms):
    """A rule joining every sum with every sum squares the e-graph each run (10, 100, 10^4, 10^8):
    the run that would pass the budget is never started."""
    user = [egg.EggForm("(ruleset sq)", "u.rules", 1, 1),
            egg.EggForm('(rule ((= a (Add x y)) (= b (Add u v))) ((Add a b)) :ruleset sq :name "sq")',
                        "u.rules", 2, 1)]
    terms = [parse(f"i{k} + j{k}") for k in range(10)]
    with pytest.warns(egg.EggBudgetWarning, match="node budget of 200000 e-graph rows .* times as many"):
        res = simplify(terms, {}, forms + user)
    assert res.terms == {t: t for t in terms}


def test_builtin_ranges_and_caller_ranges_merge(forms):
    _, got = run(forms, ["threadIdx.x < 1024", "blockIdx.x >= 0"], {})
    assert got == [const(True), const(True)]
    _, got = run(forms, ["threadIdx.x / 128", "threadIdx.x % 2048"], {"threadIdx.x": Range(0, 127)})
    assert got == [const(0), name("threadIdx.x")]


def test_range_facts_reach_a_name_only_a_rule_builds(forms):
    """Names no term mentions get no range facts, unless a rule mentions names: then a name it
    builds (here `m`, bounded by the caller) still carries its range."""
    user = [egg.EggForm('(rule ((= e (Opaque s))) ((union e (Name "m"))) :name "opaque-is-m")', "u.rules", 1, 1)]
    pred = parse("elect_one() < 5")
    assert simplify([pred], {"m": Range(0, 3)}, forms + user).terms[pred] == const(True)
    assert simplify([pred], {"m": Range(0, 9)}, forms + user).terms[pred] != const(True)


def test_user_rules_in_the_default_ruleset_run(tmp_path, forms):
    path = tmp_path / "u.rules"
    path.write_text('(rewrite (Mul x (Num 2)) (Add x x) :name "twice")\n')
    res = simplify([parse("j * 2")], {}, forms + forms_from_file(path))
    assert res.rule_matches.get("twice") == 1


def test_three_hundred_slot_terms_saturate(forms):
    """A kernel's worth of slot terms saturates well inside the bounds (timings live in benchmarks/)."""
    rng = random.Random(1)
    texts = []
    for _ in range(300):
        s, a = rng.choice([2, 3, 4, 8]), rng.randrange(0, 20)
        texts.append(rng.choice([f"(i + {a}) % {s}", f"(i / {s}) % 2", f"((i % {s}) + {a}) % {s}"]))
    res, got = run(forms, texts)
    assert res.error is None and res.iterations < 20
    assert any(g != parse(t) for g, t in zip(got, texts))


# ------------------------------------------------------------------------------- property test

PROP_RANGES = {"i": Range(0, 20), "j": Range(0, 7), "n": Range(1, 9)}
_leaf = st.one_of(st.sampled_from([name("i"), name("j"), name("n")]), st.integers(0, 9).map(const))
_term = st.recursive(_leaf, lambda kids: st.builds(lambda op, a, b: Term(op, (a, b)),
                                                   st.sampled_from("+-*/%"), kids, kids), max_leaves=6)


@seed(20261130)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_term, min_size=1, max_size=6))
def test_property_simplification_preserves_values(forms, terms):
    res = simplify(terms, PROP_RANGES, forms)
    assert res.error is None
    for t in terms:
        assert_equivalent(t, res.terms[t], PROP_RANGES)


def test_subtraction_survives_the_round_trip(forms):
    # "-" is both binary Sub and unary Neg: both must come back from egglog
    _, got = run(forms, ["63 - j + (i % 4 + 1) % 4 * 64", "-(j) + 1"])
    assert got[0] == parse("63 - j + (i + 1) % 4 * 64")
