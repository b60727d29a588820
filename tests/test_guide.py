"""The rule author's guide (rules/README.md): its tutorial and worked examples run as written."""
import re
import runpy
from pathlib import Path

import pytest

from cbrules import api
from cbrules.cli import main
from cbrules.kernels import get
from cbrules.ir.ops import OPS
from cbrules.rewrite.rulefile import SHIPPED, load, rule_dirs
from cbrules.sexpr import RuleError

GUIDE = SHIPPED / "README.md"


def examples() -> dict[str, str]:
    """``folder/file`` -> text of every code block the guide marks with ``<!-- file: ... -->``."""
    text = GUIDE.read_text()
    return dict(re.findall(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```", text, re.S))


def folder(tmp_path: Path, name: str) -> Path:
    """The example folder ``name`` written under ``tmp_path``."""
    for path, text in examples().items():
        if path.startswith(name + "/"):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(text)
    return tmp_path / name


def test_the_guide_holds_its_examples():
    assert set(examples()) == {"backoff/backoff.rules", "backoff/test_backoff.py", "war-default/war.rules",
                               "peephole/peephole.rules", "no-war/no-war.rules"}


def test_the_op_table_lists_every_op_with_its_attributes():
    rows = {}
    for line in GUIDE.read_text().splitlines():
        m = re.match(r"\| ((?:`[a-z_0-9]+` ?)+) \| (.*?) \| (.*?) \|", line)
        if m:
            for op in re.findall(r"`([a-z_0-9]+)`", m.group(1)):
                rows[op] = (m.group(2), m.group(3))
    assert set(rows) >= set(OPS)
    for op, spec in OPS.items():
        def cell(keys):
            return " ".join(f"`:{k}`" + ("*" if k in spec.terms else "") for k in keys) or "-"
        assert rows[op] == (cell(spec.required), cell(spec.optional)), op


def test_tutorial_backoff(tmp_path, monkeypatch, capsys):
    mine = folder(tmp_path, "backoff")
    (tmp_path / "mine").symlink_to(mine)  # the tutorial calls its folder mine
    monkeypatch.chdir(tmp_path)
    assert main(["rules", "check", "mine"]) == 0
    assert "cb-pipeline, backoff," in capsys.readouterr().out  # the tutorial's phase comes last
    assert main(["trace", "single_dim", "log", "--rule", "consumer-wait-backoff", "--rules", "mine"]) == 0
    assert len([x for x in capsys.readouterr().out.splitlines() if "[backoff] consumer-wait-backoff" in x]) == 2
    test = runpy.run_path(str(mine / "test_backoff.py"))
    test["test_consumer_waits_back_off"]()
    # the misspelling the tutorial shows, at the position it shows
    (tmp_path / "typo").mkdir()
    (tmp_path / "typo" / "backoff.rules").write_text((mine / "backoff.rules").read_text().replace(":backoff 32",
                                                                                                  ":backof 32"))
    with pytest.raises(RuleError) as e:
        load(rule_dirs(["typo"]))
    assert str(e.value).startswith("typo/backoff.rules:6:21: op 'mbarrier_wait' has no attribute :backof "
                                   "(did you mean 'backoff'?); its attributes: ")


def test_example_war_default(tmp_path, capsys):
    war = folder(tmp_path, "war-default")
    assert main(["lower", "single_dim", "--rules", str(war)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == \
        "effective options: loop i: stages=3 prefetch=2 (rule default) war=mbarrier (rule default)"
    assert main(["lower", "single_dim", "--rules", str(war), "--war", "sync"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "effective options: loop i: stages=3 prefetch=2 (rule default) war=sync"
    assert "cb_empty" not in out


def test_example_peephole(tmp_path, capsys):
    tidy = folder(tmp_path, "peephole")
    waits = lambda kg: [n for n in kg.nodes() if kg.op(n) == "mbarrier_wait"]  # noqa: E731
    assert len(waits(api.lower(get("pointwise").build(stages=3)))) == 2  # the shipped rules: one a stage
    off = tmp_path / "off"
    off.mkdir()
    (off / "off.rules").write_text("(disable cb-one-wait-per-stage)\n")
    assert len(waits(api.lower(get("pointwise").build(stages=3), rules=[off]))) == 4  # a wait per buffer
    assert len(waits(api.lower(get("pointwise").build(stages=3), rules=[tidy]))) == 2  # the peephole's work
    assert main(["check", "pointwise", "--stages", "2", "--sample", "--rules", str(tidy)]) == 0
    assert "0 failed" in capsys.readouterr().out


def test_example_disabled_rule_is_caught(tmp_path, capsys):
    no_war = folder(tmp_path, "no-war")
    assert main(["check", "single_dim", "--stages", "2", "--sample", "--rules", str(no_war)]) == 1
    out = capsys.readouterr().out
    assert "WarHazard: " in out and "9 trip counts: 3 ok, 6 failed" in out
