"""The egglog bridge: shipped index algebra, range guards, error positions, panics, speed."""
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbrules import egg
from cbrules.egg import EggRuleError, Range, forms_from_file, load_check, simplify
from cbrules.terms import Term, const, evaluate, name, parse

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
    texts = ["elect_one() && i < 4", "x * 2.5", "exp(i + 0)", "elect_one()"]
    _, got = run(forms, texts)
    assert got == [parse(t) for t in texts]


def test_duplicates_and_shared_subterms(forms):
    t = parse("(i + 0) % 4")
    res = simplify([t, t, parse("i + 0")], RANGES, forms)
    assert res.terms == {t: parse("i % 4"), parse("i + 0"): parse("i")}


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


def test_budgets_bound_the_run(forms):
    t = parse("((i % 4) + 1) % 4")
    assert simplify([t], RANGES, forms, iterations=1).iterations == 1
    for res in (simplify([t], RANGES, forms, time_limit_s=0.0), simplify([t], RANGES, forms, max_nodes=1)):
        assert res.error is None and res.iterations == 1 and res.terms == {t: t}


def test_builtin_ranges_and_caller_ranges_merge(forms):
    _, got = run(forms, ["threadIdx.x < 1024", "blockIdx.x >= 0"], {})
    assert got == [const(True), const(True)]
    _, got = run(forms, ["threadIdx.x / 128", "threadIdx.x % 2048"], {"threadIdx.x": Range(0, 127)})
    assert got == [const(0), name("threadIdx.x")]


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
