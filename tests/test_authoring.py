"""Rule authoring: defaults live in the rules, and the checker reports every mistake of a file."""
import pytest

from cbrules import api, options
from cbrules.ir.builder import circular_buffer
from cbrules.cli import main
from cbrules.kernels import get
from cbrules.rewrite.rulefile import RuleErrors, load, rule_dirs
from cbrules.rewrite.sexpr import RuleError
from rulekit import write_rules

MBARRIER_DEFAULT = """
    (phase my-defaults :before cb-normalize)
    (graph-rule my-war-mbarrier
      :doc "loops that do not choose a WAR protection get empty barriers"
      :phase my-defaults
      :match ((for ?L :annotations ?ann) (for ?L :annotations (:circular_buffer (:war (absent)))))
      :rewrite ((set ?L :annotations (assoc ?ann "circular_buffer"
                                       (assoc (get ?ann "circular_buffer") "war" "mbarrier")))))
"""


def test_the_builder_records_only_the_options_given():
    assert circular_buffer(3) == {"stages": 3}
    assert circular_buffer(3, war="sync") == {"stages": 3, "war": "sync"}
    kg = get("single_dim").build(stages=2).graph
    assert options.requested(kg) == {"stages"}


def test_the_rules_fill_in_the_defaults():
    kg = api.lower(get("single_dim").build(stages=4))
    assert options.effective(kg) == [("i", {"stages": 4, "prefetch": 3, "war": "sync"})]


def test_a_user_folder_changes_a_default_and_an_explicit_option_still_wins(tmp_path):
    write_rules(tmp_path / "mine", MBARRIER_DEFAULT)
    rules = [tmp_path / "mine"]
    by_default = api.lower(get("single_dim").build(stages=3), rules=rules)
    assert options.effective(by_default)[0][1]["war"] == "mbarrier"
    assert any(by_default.op(n) == "mbarrier_arrive" for n in by_default.nodes())
    explicit = api.lower(get("single_dim").build(stages=3, war="sync"), rules=rules)
    assert options.effective(explicit)[0][1]["war"] == "sync"
    assert not any(explicit.op(n) == "mbarrier_arrive" for n in explicit.nodes())


def test_lower_and_check_print_the_effective_options(tmp_path, capsys):
    write_rules(tmp_path / "mine", MBARRIER_DEFAULT)
    assert main(["lower", "single_dim", "--stages", "2", "--rules", str(tmp_path / "mine")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "effective options: loop i: stages=2 prefetch=1 (rule default) war=mbarrier (rule default)"
    assert main(["lower", "single_dim", "--stages", "2", "--war", "sync", "--rules", str(tmp_path / "mine")]) == 0
    assert "war=sync\n" in capsys.readouterr().out
    assert main(["check", "single_dim", "--stages", "2", "--sample", "--rules", str(tmp_path / "mine")]) == 0
    out = capsys.readouterr().out
    assert "single_dim: options given: --stages 2;" in out and "war=mbarrier (rule default)" in out


SILENT_MISTAKES = """
    (phase extra :after cb-pipeline)
    (graph-rule parity-typo
      :phase extra
      :match ((mbarrier_wait ?c))
      :rewrite ((set ?c :parrity 1)))
    (graph-rule unbound-message
      :phase extra
      :match ((for ?L))
      :rewrite ((fail "loop {?bb} is bad")))
    (graph-rule unknown-call
      :phase extra
      :match ((for ?L :kind "serial"))
      :rewrite ((insert-at-entry ?L (syncthreads :tag (call "__nanosleep" 32)))))
    (graph-rule any-op-typo
      :phase extra
      :match ((_ ?n :stage "war"))
      :rewrite ((set ?n :stagee "x")))
"""


def test_every_silent_mistake_is_reported_at_once_with_its_position(tmp_path):
    path = write_rules(tmp_path / "bad", SILENT_MISTAKES)
    with pytest.raises(RuleErrors) as e:
        load(rule_dirs([tmp_path / "bad"]))
    lines = str(e.value).splitlines()
    assert [x.split(": ")[0] for x in lines] == [f"{path}:5:21", f"{path}:9:19", f"{path}:13:57", f"{path}:17:21"]
    assert "op 'mbarrier_wait' has no attribute :parrity (did you mean 'parity'?); its attributes: " \
           ":backoff, :barrier, :parity, :part, :slot, :stage, :tag" in lines[0]
    assert "{?bb}, but ?bb is not bound" in lines[1]
    assert "'__nanosleep' is not a device function" in lines[2]
    assert "op '_' has no attribute :stagee (did you mean 'stage'?)" in lines[3]


def test_one_mistake_is_not_reported_again_as_unbound_variables(tmp_path):
    path = write_rules(tmp_path / "bad", """
        (phase extra :after cb-pipeline)
        (graph-rule r :phase extra :match ((fro ?L)) :rewrite ((erase ?L) (set ?L :tag "x")))
    """)
    with pytest.raises(RuleError) as e:
        load(rule_dirs([tmp_path / "bad"]))
    assert not isinstance(e.value, RuleErrors)
    assert str(e.value).startswith(f"{path}:2:36: unknown op 'fro' (did you mean 'for'?)")


def test_names_phases_and_disables_are_all_reported(tmp_path):
    path = write_rules(tmp_path / "bad", """
        (disable cb-prologe)
        (graph-rule a :phase cb-stag :match ((for ?L)) :rewrite ((erase ?L)))
        (graph-rule a :phase cb-stage :after (cb-mian) :match ((for ?L)) :rewrite ((erase ?L)))
    """)
    with pytest.raises(RuleErrors) as e:
        load(rule_dirs([tmp_path / "bad"]))
    text = str(e.value)
    for needle in (f"{path}:3:1: duplicate rule name 'a'", f"{path}:2:1: rule a: unknown phase 'cb-stag' "
                   "(did you mean 'cb-stage'?)", "unknown rule cb-mian (did you mean 'cb-main'?)",
                   f"{path}:1:10: disable: unknown rule 'cb-prologe' (did you mean 'cb-prologue'?)"):
        assert needle in text


def test_rules_check_dir_includes_the_shipped_rules_and_says_so(tmp_path, capsys):
    write_rules(tmp_path / "mine", MBARRIER_DEFAULT)  # refers to the shipped phase cb-normalize
    assert main(["rules", "check", str(tmp_path / "mine")]) == 0
    out = capsys.readouterr().out
    assert "checked: the shipped rules (" in out and f"together with {tmp_path / 'mine'}" in out
    assert "my-defaults" in out
    assert main(["rules", "check", "rules"]) == 0  # the shipped folder named again is read once
    write_rules(tmp_path / "bad", SILENT_MISTAKES)
    assert main(["rules", "check", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cbrules: RuleErrors: ") and len(err.splitlines()) == 4


def test_setting_what_a_node_is_is_a_check_error(tmp_path):
    path = write_rules(tmp_path / "bad", """
        (phase extra :after cb-pipeline)
        (graph-rule r :phase extra :match ((syncthreads ?s)) :rewrite ((set ?s :op "for")))
    """)
    with pytest.raises(RuleError) as e:
        load(rule_dirs([tmp_path / "bad"]))
    assert str(e.value).startswith(f"{path}:2:72: a rule cannot set :op") and "(replace ?n TEMPLATE)" in str(e.value)


def test_clone_set_keys_are_the_cloned_scopes_attributes(tmp_path):
    path = write_rules(tmp_path / "bad", """
        (phase extra :after cb-pipeline)
        (graph-rule r :phase extra :match ((for ?L :part "main")) :rewrite ((clone ?L :set (:prat "x"))))
    """)
    with pytest.raises(RuleError) as e:
        load(rule_dirs([tmp_path / "bad"]))
    assert str(e.value).startswith(f"{path}:2:85: op 'for' has no attribute :prat (did you mean 'part'?)")
