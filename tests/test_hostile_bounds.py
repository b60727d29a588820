"""Hostile rules that would run without end or grow without bound: each is refused by name (or
stopped) within seconds -- a cartesian egglog join, Ctrl-C inside an egglog run, a rule that copies
a loop into itself, thousands of unknown names, values that grow without bound, an interpreter
loop of 2e9 trips."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cbrules import api
from cbrules.kernels import get
from cbrules.rewrite import engine, rulefile
from cbrules.rewrite.egg import EggRuleError
from cbrules.rewrite.eggload import MAX_JOIN_PARTS
from hostile import within
from rulekit import write_rules

ROOT = Path(__file__).resolve().parent.parent


def _star(parts_shared: bool, n: int = 6) -> str:
    """An egglog rule joining ``n`` Add atoms: on one shared variable, or on none (a product)."""
    atoms = " ".join(f"(= a{j} (Add {'x' if parts_shared else f'x{j}'} y{j}))" for j in range(n))
    args = " ".join(f"a{j}" for j in range(n))
    return (f"(relation many ({' '.join(['Idx'] * n)}))\n"
            f"(rule ({atoms})\n      ((many {args})) :ruleset fold :name \"join\")\n")


def test_cartesian_egglog_join_is_refused_at_its_line(tmp_path):
    write_rules(tmp_path / "r", _star(parts_shared=False))
    with within(10), pytest.raises(EggRuleError) as e:
        rulefile.load(rulefile.rule_dirs([tmp_path / "r"]), check_egglog=True)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'r' / 'test.rules'}:2:1: rule 'join' joins 6 parts"), msg
    assert f"at most {MAX_JOIN_PARTS}" in msg and "shared variable" in msg


@pytest.mark.parametrize("parts", [MAX_JOIN_PARTS, MAX_JOIN_PARTS + 1])
def test_join_bound_is_exact(tmp_path, parts):
    write_rules(tmp_path / "r", _star(parts_shared=False, n=parts))
    load = lambda: rulefile.load(rulefile.rule_dirs([tmp_path / "r"]), check_egglog=True)  # noqa: E731
    if parts <= MAX_JOIN_PARTS:
        load()
    else:
        with pytest.raises(EggRuleError, match=f"joins {parts} parts"):
            load()


def test_join_through_a_primitive_is_still_a_product(tmp_path):
    """`!=` filters the product after egglog enumerates it, so it links nothing."""
    write_rules(tmp_path / "r", "(relation p (Idx Idx Idx))\n(rule ((= a (Num x)) (= b (Num y)) (= c (Num z)) "
                "(!= x y) (!= y z)) ((p a b c)) :ruleset fold :name \"filtered\")\n")
    with pytest.raises(EggRuleError, match="joins 3 parts"):
        rulefile.load(rulefile.rule_dirs([tmp_path / "r"]), check_egglog=True)


_MANY_TERMS = textwrap.dedent('''
    from cbrules.ir.builder import Kernel, threadIdx
    OUTPUTS = ("out",)
    def build():
        k = Kernel("many", block=64)
        n = k.symbol("N")
        x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
        k.grid(1)
        for j in range(40):  # forty index terms sharing threadIdx.x: the connected join finds 40**6 rows
            k.store(out, threadIdx.x * 41 + j, k.load(x, threadIdx.x * 41 + j))
        return k
''')


def test_ctrl_c_inside_an_egglog_run_ends_the_command(tmp_path):
    """A connected join (allowed) whose one egglog run never ends: SIGINT stops the command at
    once, with the status of an interrupt (130; killed by SIGINT inside the run)."""
    write_rules(tmp_path / "r", _star(parts_shared=True))
    (tmp_path / "many.py").write_text(_MANY_TERMS)
    env = {k: v for k, v in os.environ.items() if k != rulefile.ENV_VAR} | {"PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "cbrules.cli", "lower", str(tmp_path / "many.py"), "--rules",
                          str(tmp_path / "r")], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)  # imports, the rules and the phases take about 1.3 s; then egglog runs forever
        assert p.poll() is None, ("ended before the interrupt", p.returncode, p.stderr.read())
        p.send_signal(signal.SIGINT)
        sent = time.monotonic()
        code = p.wait(timeout=10)
        assert time.monotonic() - sent < 3.0
        assert code in (130, -signal.SIGINT), (code, p.stderr.read())
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_interrupt_setting_is_off_after_a_command():
    """`main` run in-process leaves Python's own SIGINT handler to its caller."""
    from cbrules.cli import main
    from cbrules.rewrite import egg
    assert main(["lower", "single_dim"]) == 0
    assert not egg._interrupt_ends_process
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


_GROW = """
    (phase grow :after cb-rotate)
    (graph-rule grow-loop-into-itself
      :doc "wraps the outermost loop in a copy of itself at every firing: the graph doubles each time"
      :phase grow
      :match ((kernel ?K) (for ?L) (child ?L ?K))
      :rewrite ((clone ?L :as ?M) (move ?L :into ?M :at exit)))
"""


def test_rule_that_doubles_the_graph_stops_at_the_size_bound(tmp_path):
    write_rules(tmp_path / "r", _GROW)
    kernel = get("single_dim").build()
    with within(10), pytest.raises(engine.LoweringError) as e:
        api.lower(kernel, rules=[tmp_path / "r"])
    msg, bound = str(e.value), engine.graph_bound(len(kernel.graph))
    assert "rule grow-loop-into-itself" in msg and "test.rules:2)" in msg, msg
    assert f"past the bound of {bound} for an input of {len(kernel.graph)} nodes" in msg, msg
    assert not e.value.timed_out


@pytest.mark.parametrize("kind", ["disable", "after", "tag"])
def test_thousands_of_unknown_names_get_their_errors_in_linear_time(tmp_path, kind, monkeypatch):
    """Every unknown name is an error; only the first SUGGESTIONS look for a close name, each among
    at most SUGGESTION_CHOICES choices (difflib on all pairs took 98 s for 9,000 :after names)."""
    import difflib
    from cbrules.rewrite import rulecheck
    n = 3000 if kind == "disable" else 1000
    if kind == "disable":
        text = "".join(f"(disable no-such-rule-{i:05d})\n" for i in range(n))
    elif kind == "tag":  # handles no rule writes (rewrite.vocabulary), with thousands of words that some do
        text = "(vocabulary tag " + " ".join(f'"w{i:05d}"' for i in range(5000)) + ")\n" + "".join(
            f'(graph-rule r{i:05d} :phase cb-rotate :match ((if ?p :tag "t{i:05d}")) :rewrite ((erase ?p)))\n'
            for i in range(n))
    else:
        text = "".join(f"(graph-rule r{i:05d} :phase cb-rotate :after (missing-{i:05d}) :match ((for ?L)) "
                       ":where ((= 1 2)) :rewrite ((erase ?L)))\n" for i in range(n))
    write_rules(tmp_path / "r", text)
    compared = []
    real = difflib.get_close_matches
    monkeypatch.setattr(difflib, "get_close_matches",
                        lambda w, pool, **kw: compared.append(len(pool)) or real(w, pool, **kw))
    with within(10), pytest.raises(rulefile.RuleErrors) as e:
        rulefile.load(rulefile.rule_dirs([tmp_path / "r"]))
    assert len(e.value.errors) == n
    assert len(compared) == rulecheck.SUGGESTIONS and max(compared) <= rulecheck.SUGGESTION_CHOICES
    assert "(did you mean" not in str(e.value.errors[-1])


def test_a_close_name_is_still_suggested_among_many():
    from cbrules.rewrite.rulecheck import did_you_mean
    choices = [f"rule-{i:05d}" for i in range(20000)] + ["cb-pipeline-main"]
    assert did_you_mean("cb-pipeline-mian", choices) == " (did you mean 'cb-pipeline-main'?)"


def _chain(step: str, n: int = 39, first: str = "9223372036854775807") -> str:
    lets = " ".join(f"(let ?v{j + 1} {step.format(f'?v{j}')})" for j in range(n))
    return f"""
        (phase chain :after cb-rotate)
        (graph-rule let-chain
          :doc "a value that doubles in size at every let"
          :phase chain
          :match ((kernel ?K :name ?nm))
          :where ((!= ?nm "done"))
          :rewrite ((let ?v0 {first}) {lets} (set ?K :name "done")))
    """


@pytest.mark.parametrize("step, needle", [
    ("(* {0} {0})", "would be an integer of up to 252 bits, more than the 128"),  # 63 bits squared, squared
    ("(concat {0} {0})", "(let ?v"),  # a tuple doubling: the size bound of a set value
    ("(str {0} {0})", "(let ?v"),
])
def test_let_chain_that_doubles_a_value_is_refused_at_its_step(tmp_path, step, needle):
    first = "(tuple 1 2 3)" if "concat" in step else '"abcdefgh"' if "str" in step else "9223372036854775807"
    write_rules(tmp_path / "r", _chain(step, first=first))
    with within(10), pytest.raises(engine.LoweringError) as e:
        api.lower(get("single_dim").build(), rules=[tmp_path / "r"])
    msg = str(e.value)
    assert needle in msg and "let-chain" in msg, msg
    assert "test.rules:7:" in msg, msg  # the :rewrite line, where the let is


def test_rule_integers_within_the_bound_still_compute():
    from cbrules.rewrite.values import FUNCTIONS, MAX_VALUE_BITS
    mul, add = FUNCTIONS["*"][2], FUNCTIONS["+"][2]
    big = (1 << (MAX_VALUE_BITS // 2 - 1)) - 1
    assert mul(big, big) == big * big
    assert add(1 << (MAX_VALUE_BITS - 2), 1) == (1 << (MAX_VALUE_BITS - 2)) + 1
    with pytest.raises(ValueError, match="bits"):
        mul(big << 2, big << 2)


_LONG = """
    (phase long :after cb-rotate)
    (graph-rule main-loop-runs-forever
      :doc "sets the main loop's stop to 2e9"
      :phase long
      :match ((for ?L :part "main" :stop ?s))
      :where ((!= ?s 2000000000))
      :rewrite ((set ?L :stop 2000000000)))
"""


def test_check_of_a_loop_of_2e9_trips_stops_at_the_statement_budget(tmp_path, monkeypatch, capsys):
    from cbrules.cli import main
    from cbrules.reference.interp import STATEMENTS_VAR
    write_rules(tmp_path / "r", _LONG)
    monkeypatch.setenv(STATEMENTS_VAR, "1500")  # the default (20,000) takes 2-10 s a block
    with within(10):
        code = main(["check", "single_dim", "--sample", "--rules", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 1
    assert "InterpBudgetError" in out and "more than 1500 statements" in out, out
    assert "the interpreter's budget" in out and "larger trip counts are not run" in out, out


@pytest.mark.parametrize("text", ["0", "-5", "many", "1e9"])
def test_statement_budget_setting_must_be_a_positive_integer(monkeypatch, text):
    from cbrules.errors import CbrulesError
    from cbrules.reference import interp
    monkeypatch.setenv(interp.STATEMENTS_VAR, text)
    with pytest.raises(CbrulesError, match="give a positive integer"):
        interp.statement_budget()
    monkeypatch.setenv(interp.STATEMENTS_VAR, " 123 ")
    assert interp.statement_budget() == 123


def test_a_slow_lowering_says_on_stderr_what_it_is_doing(monkeypatch, capsys):
    """A progress line every few seconds (here every 0.1 s) tells a slow run from a hang. The
    lowering is made slow on purpose (each egglog step waits 0.3 s), so the test does not depend on
    how fast this machine lowers."""
    import time
    from cbrules import cli_progress
    from cbrules.cli import main
    from cbrules.rewrite import engine
    simplify = engine._simplify

    def slow_simplify(*args, **kwargs):
        time.sleep(0.3)
        return simplify(*args, **kwargs)
    monkeypatch.setattr(engine, "_simplify", slow_simplify)
    monkeypatch.setenv(cli_progress.AFTER_VAR, "0.1")
    monkeypatch.setattr(cli_progress, "EVERY_S", 0.1)
    with within(20):
        assert main(["lower", "single_dim"]) == 0
    err = capsys.readouterr().err
    assert "cbrules: lower: still working after" in err and "lowering: phase " in err, err
    assert "egglog simplification" in err, err


def test_progress_lines_are_off_with_zero(monkeypatch, capsys):
    from cbrules import cli_progress
    from cbrules.cli import main
    monkeypatch.setenv(cli_progress.AFTER_VAR, "0")
    assert main(["lower", "single_dim"]) == 0
    assert "still working" not in capsys.readouterr().err


def test_rules_read_hardware_limits_by_name():
    from cbrules.ir.limits import MAX_SHARED_BYTES, REGISTERS_PER_BLOCK
    from cbrules.rewrite.values import FUNCTIONS
    limit = FUNCTIONS["limit"][2]
    assert limit("shared-bytes-per-block") == MAX_SHARED_BYTES and limit("registers-per-block") == REGISTERS_PER_BLOCK
    with pytest.raises(ValueError, match="the limits are shared-bytes-per-block"):
        limit("shared-bytes")
    text = (ROOT / "rules" / "circular_buffer.rules").read_text() + (ROOT / "rules" / "warp_specialize.rules").read_text()
    assert str(MAX_SHARED_BYTES) not in text and "65536)" not in text  # the limits live in cbrules.ir.limits only
