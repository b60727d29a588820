"""Reader and checker errors, each with its exact line:col."""
import re

import pytest

from cbrules.rewrite import rulefile
from cbrules.rewrite.egg import EggRuleError
from cbrules.sexpr import RuleError, read
from rulekit import load_only, write_rules

GOOD = """
(phases tag)
(graph-rule r1
  :doc "fine"
  :phase tag
  :match ((for ?L) (syncthreads ?s :child-of ?L))
  :rewrite ((insert-before ?s (fence_proxy_async))))
"""


def error_at(tmp_path, text, line, col, *needles, exc=RuleError):
    path = write_rules(tmp_path / "r", text)
    with pytest.raises(exc) as e:
        rulefile.load([tmp_path / "r"], check_egglog=True)
    msg = str(e.value)
    assert msg.startswith(f"{path}:{line}:{col}:"), msg
    for n in needles:
        assert n in msg, msg
    return msg


def test_good_file_loads(tmp_path):
    write_rules(tmp_path / "r", GOOD)
    rs = load_only(tmp_path / "r")
    assert [r.name for r in rs.rules] == ["r1"] and rs.phases == ["tag"]
    assert rs.rules[0].at.endswith("test.rules:2")


def test_unclosed_bracket_points_where_it_opened(tmp_path):
    error_at(tmp_path, "(phases tag)\n(graph-rule r1\n  :phase tag\n  :match ((for ?L)\n", 2, 1, "unclosed '('",
             "innermost unclosed '(' is at line 4, column 10")


def test_stray_close_paren(tmp_path):
    error_at(tmp_path, "(phases tag))\n", 1, 13, "unexpected ')'")


def test_unterminated_string(tmp_path):
    error_at(tmp_path, '(phases tag)\n(graph-rule r :doc "oops\n', 2, 20, "unterminated string")


def test_unknown_op_with_did_you_mean(tmp_path):
    error_at(tmp_path, GOOD.replace("(syncthreads ?s", "(syncthread ?s"), 5, 20, "unknown op 'syncthread'",
             "did you mean 'syncthreads'")


def test_unknown_attribute(tmp_path):
    error_at(tmp_path, GOOD.replace("(for ?L)", "(for ?L :vra i)"), 5, 19, "no attribute :vra", "did you mean 'var'")


def test_unknown_rule_key(tmp_path):
    error_at(tmp_path, GOOD.replace(":doc", ":dco"), 3, 3, "unknown key :dco", "did you mean 'doc'")


def test_unbound_variable(tmp_path):
    error_at(tmp_path, GOOD.replace("(insert-before ?s", "(insert-before ?t"), 6, 28, "unbound variable ?t")


def test_unknown_after(tmp_path):
    error_at(tmp_path, GOOD.replace(':doc "fine"', ':doc "fine" :after (r0)'), 3, 23, "unknown rule r0")


def test_duplicate_rule_name(tmp_path):
    error_at(tmp_path, GOOD + GOOD.replace("(phases tag)", ""), 9, 1, "duplicate rule name 'r1'", "test.rules:2:1")


def test_unknown_action(tmp_path):
    error_at(tmp_path, GOOD.replace("(insert-before ?s", "(insert-befor ?s"), 6, 13, "unknown action 'insert-befor'",
             "did you mean 'insert-before'")


def test_wrong_arity(tmp_path):
    error_at(tmp_path, GOOD.replace("(insert-before ?s (fence_proxy_async))", "(erase ?s ?L)"), 6, 13,
             "action erase takes 1 argument(s), got 2")
    error_at(tmp_path, GOOD.replace(":match ((for ?L)", ":where ((> 1)) :match ((for ?L)"), 5, 11,
             "(> ...) takes 2 argument(s), got 1")


def test_unknown_phase(tmp_path):
    error_at(tmp_path, GOOD.replace(":phase tag", ":phase tga"), 2, 1, "unknown phase 'tga'", "did you mean 'tag'")


def test_template_missing_attribute(tmp_path):
    error_at(tmp_path, GOOD.replace("(fence_proxy_async)", "(mbarrier_wait :barrier \"b\")"), 6, 31,
             "template mbarrier_wait lacks :slot, :parity")


def test_unknown_top_level_form(tmp_path):
    error_at(tmp_path, "(graph-rul x)\n", 1, 1, "unknown top-level form 'graph-rul'", "did you mean 'graph-rule'")


def test_disable_unknown_rule(tmp_path):
    error_at(tmp_path, GOOD + "(disable r2)\n", 7, 10, "disable: unknown rule 'r2'")


def test_egglog_error_maps_to_the_users_line(tmp_path):
    text = "(phases tag)\n\n   (datatype Q (Leaf i64))\n   (rewrite (Leaf x y) (Leaf x))\n"
    error_at(tmp_path, text, 4, 13, "Arity mismatch", exc=EggRuleError)  # egglog's own span, in the user's file


def test_reader_keeps_positions():
    (form,) = read('(a :k ?v "s" 12\n  (b 1.5))', "f.rules")
    assert form.pos.line == 1 and form[4].value == 12 and form[5].pos.line == 2 and form[5].pos.col == 3
    assert [x.kind for x in form.items[:4]] == ["sym", "kw", "var", "str"]


def test_rule_loading_never_executes_python():
    import cbrules.rewrite.egg as eg
    import cbrules.rewrite.eggload as el
    import cbrules.rewrite.rulecheck as rc
    import cbrules.rewrite.rulefile as rf
    import cbrules.rewrite.schema as sc
    import cbrules.sexpr as sx
    import cbrules.rewrite.values as va
    for mod in (rf, rc, sc, sx, va, eg, el):
        src = open(mod.__file__).read()
        assert not re.search(r"(?<!re\.)\b(eval|exec|pickle|compile)\(|\bimport pickle", src), mod.__name__


def test_shipped_rules_check_clean():
    rs = rulefile.load(check_egglog=True)
    assert rs.egg_forms


# ------------------------------------------------------------------------- phases and :after order

def test_phase_declared_twice_names_both_places(tmp_path):
    error_at(tmp_path, "(phases a b a)\n", 1, 13, "phase 'a' is already declared at", "test.rules:1:9")
    error_at(tmp_path, "(phases a)\n(phase a :after a)\n", 2, 8, "phase 'a' is already declared at", "test.rules:1:9")
    error_at(tmp_path, "(phases a b)\n(phase b :before a)\n", 2, 8, "phase 'b' is already declared at")


def test_phase_declared_again_in_another_folder(tmp_path):
    write_rules(tmp_path / "one", "(phases a)\n")
    two = write_rules(tmp_path / "two", "; the second folder\n(phases b a)\n")
    with pytest.raises(RuleError) as e:
        rulefile.load([tmp_path / "one", tmp_path / "two"])
    assert str(e.value).startswith(f"{two}:2:11: phase 'a' is already declared at {tmp_path / 'one'}")


def test_phase_placement(tmp_path):
    write_rules(tmp_path / "r", "(phases a c)\n(phase b :after a)\n(phase z :before a)\n(phase last)\n")
    assert load_only(tmp_path / "r").phases == ["z", "a", "b", "c", "last"]


def _chain(names_after):
    return "(phases p)\n" + "".join(
        f"(graph-rule {n} :phase p :after ({' '.join(after)}) :match ((for ?L)) :rewrite ((erase ?L)))\n"
        for n, after in names_after)


def test_after_cycle_is_an_error_at_load(tmp_path):
    msg = error_at(tmp_path, _chain([("a", ["c"]), ("b", ["a"]), ("c", ["b"]), ("d", ["a"])]), 2, 1,
                   "the :after lists form a cycle")
    assert re.search(r"a \(.*test.rules:2:1\) -> c \(.*:4:1\) -> b \(.*:3:1\) -> a", msg), msg
    error_at(tmp_path, _chain([("a", []), ("b", ["b"])]), 3, 1, "cycle", "b (")


def test_after_cycle_among_disabled_rules_is_broken(tmp_path):
    write_rules(tmp_path / "r", _chain([("a", ["b"]), ("b", ["a"])]) + "(disable b)\n")
    assert [r.name for r in load_only(tmp_path / "r").in_phase("p")] == ["a"]


def test_in_phase_respects_after_then_file_order(tmp_path):
    write_rules(tmp_path / "r", _chain([("a", ["d"]), ("b", []), ("c", ["a", "b"]), ("d", []), ("e", [])]))
    rs = load_only(tmp_path / "r")
    assert [r.name for r in rs.in_phase("p")] == ["b", "d", "a", "c", "e"]
    rs.disabled["d"] = rs.rules[3].pos  # the cached order follows changes to the set
    assert [r.name for r in rs.in_phase("p")] == ["a", "b", "c", "e"]


def test_thousand_inert_rules_load_and_order_quickly(tmp_path):
    """Ordering is linear: 1,000 rules, each :after the previous one (the worst case for file order)."""
    import time
    rules = [(f"r{i}", [f"r{i + 1}"] if i < 999 else []) for i in range(1000)]
    write_rules(tmp_path / "r", _chain(rules))
    start = time.perf_counter()
    rs = load_only(tmp_path / "r")
    order = [r.name for r in rs.in_phase("p")]
    assert time.perf_counter() - start < 10  # generous bound; about 0.1 s on a laptop, was minutes
    assert order == [f"r{i}" for i in reversed(range(1000))]


def test_reloading_the_same_texts_gives_an_independent_copy_and_an_edit_is_read(tmp_path):
    # load() reuses the parsed rules of texts it has read before: a change to one loaded set must not
    # reach the next load, and an edited file must be parsed again
    path = write_rules(tmp_path / "r", GOOD)
    first = rulefile.load([tmp_path / "r"])
    first.disabled["r1"] = first.rules[0].pos
    first.rules.clear()
    again = rulefile.load([tmp_path / "r"])
    assert [r.name for r in again.rules] == ["r1"] and not again.disabled
    assert [r.name for r in again.in_phase("tag")] == ["r1"]
    path.write_text(GOOD.replace("r1", "r2"))
    assert [r.name for r in rulefile.load([tmp_path / "r"]).rules] == ["r2"]
    path.write_text(GOOD.replace(":phase tag", ":phase nowhere"))
    with pytest.raises(RuleError):
        rulefile.load([tmp_path / "r"])
