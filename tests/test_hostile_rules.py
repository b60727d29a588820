"""Hostile rule folders: each case ends in a named error, at its position, within seconds.

Cases that would reach egglog if the checks failed (file commands, unbounded runs, deep nesting
that crashes egglog's parser) run in a subprocess with a timeout, so a crash or a hang fails the
test instead of killing pytest.
"""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cbrules import api
from cbrules.rewrite import rulefile
from cbrules.rewrite.egg import EGGLOG_REFUSED, EggRuleError
from cbrules.sexpr import MAX_DEPTH, RuleError, RulePathError
from rulekit import write_rules

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 60  # generous: every case takes about a second


def isolated(args, tmp_path, env=None, timeout=TIMEOUT_S):
    """Run ``python ARGS`` in ``tmp_path``; a crash (signal) or a hang fails the test."""
    full_env = {k: v for k, v in os.environ.items() if k != rulefile.ENV_VAR}
    full_env.update({"PYTHONPATH": str(ROOT), **(env or {})})
    try:
        p = subprocess.run([sys.executable, *args], cwd=tmp_path, env=full_env, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args} did not finish within {timeout} s")
    assert p.returncode >= 0, f"{args} died of signal {-p.returncode}: {p.stderr[-2000:]}"
    return p


def rules_check(folder, tmp_path, *needles):
    """``cbrules rules check FOLDER`` fails with one line naming file:line:col and ``needles``."""
    p = isolated(["-m", "cbrules.cli", "rules", "check", str(folder)], tmp_path)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr
    return p.stderr


# ------------------------------------------------------------------------ egglog commands refused

@pytest.mark.parametrize("form, needle", [
    ('(output "{target}" (Num 1))', "may not read, write or include files"),
    ('(input lo "{target}")', "may not read, write or include files"),
    ('(include "{target}")', "may not read, write or include files"),
    ("(run 100000000)", "runs every ruleset itself"),
    ("(run-schedule (repeat 100000000 (run)))", "runs every ruleset itself"),
])
def test_egglog_commands_are_refused_with_position(tmp_path, form, needle):
    target = tmp_path / "created.txt"
    folder = tmp_path / "evil"
    path = write_rules(folder, "; a growing rule that (run ...) would apply forever\n"
                       "(rule ((= e (Add a b))) ((Add e e)))\n\n  " + form.format(target=target) + "\n")
    head = form[1:].split()[0].rstrip(")")
    rules_check(folder, tmp_path, f"{path.name}:4:3: egglog form ({head} ...) is not allowed", needle)
    assert not target.exists()


@pytest.mark.parametrize("head", sorted(EGGLOG_REFUSED))
def test_every_refused_egglog_head_is_a_rule_error(tmp_path, head):
    """The reader refuses them: nothing reaches egglog (load() without check_egglog never calls it)."""
    path = write_rules(tmp_path / "r", f"(phases p)\n  ({head} x)\n")
    with pytest.raises(RuleError) as e:
        rulefile.load([tmp_path / "r"])
    assert str(e.value).startswith(f"{path}:2:3: egglog form ({head} ...) is not allowed in rule files: ")
    assert EGGLOG_REFUSED[head] in str(e.value)


def test_output_from_cbrules_rules_is_refused_by_every_loader(tmp_path):
    """Via $CBRULES_RULES (api.load_rules, used by lower/compile/demo) and via --rules."""
    target = tmp_path / "created.txt"
    folder = tmp_path / "evil"
    path = write_rules(folder, f'(output "{target}" (Num 1))\n')
    code = ("from cbrules import api\n"
            "try:\n    api.load_rules()\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    p = isolated(["-c", code], tmp_path, env={rulefile.ENV_VAR: str(folder)})
    assert p.stdout.startswith(f"RuleError {path}:1:1: egglog form (output ...)"), (p.stdout, p.stderr)
    p = isolated(["-m", "cbrules.cli", "rules", "check", "--rules", str(folder)], tmp_path)
    assert p.returncode == 1 and f"{path}:1:1: egglog form (output ...)" in p.stderr, p.stderr
    assert not target.exists()


def test_commands_inside_a_rule_are_only_function_names(tmp_path):
    """An egglog action list holds actions; `(output ...)` there is a call of an unknown function."""
    target = tmp_path / "created.txt"
    folder = tmp_path / "evil"
    write_rules(folder, f'(rule () ((output "{target}" 1)))\n')
    rules_check(folder, tmp_path, "test.rules:1:11: Unbound function output")
    write_rules(folder, '(rule () ((run 100000000)))\n')
    rules_check(folder, tmp_path, "test.rules:1:11: Unbound function run")
    assert not target.exists()


# ----------------------------------------------------------------------------- nesting, size

@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_deep_nesting_is_refused_before_egglog_sees_it(tmp_path, depth):
    folder = tmp_path / "deep"
    write_rules(folder, "(rule () ((Neg " + "(Neg " * depth + "(Num 1)" + ")" * (depth + 3) + "\n")
    col = 1 + len("(rule () (") + (MAX_DEPTH - 2) * len("(Neg ")
    rules_check(folder, tmp_path, f"test.rules:1:{col}: lists nested deeper than {MAX_DEPTH} levels")


def test_deep_graph_rule_nesting(tmp_path):
    folder = tmp_path / "deep"
    write_rules(folder, "(phases p)\n(graph-rule r :phase p :match ((for ?L)) :where (" + "(+ 1 " * 100_000
                + ")" * 100_001 + " :rewrite ())\n")
    with pytest.raises(RuleError, match=f"test.rules:2:.*nested deeper than {MAX_DEPTH}"):
        rulefile.load([folder])


def test_oversized_file(tmp_path):
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "big.rules").write_bytes(b"; padding\n" * 500_000)
    with pytest.raises(RulePathError, match="big.rules: rule file larger than 4 MiB"):
        rulefile.load([folder])


# ----------------------------------------------------------------------------- bytes, files

@pytest.mark.parametrize("data, line, col, needle", [
    (b"(phases p)\n(phases \xff)\n", 2, 9, "invalid UTF-8 (byte 0xff)"),
    (b"(phases p)\n(phases \xc3\xa9 \xe2\x82)\n", 2, 11, "invalid UTF-8"),
    (b"(phases p)\n  (ph\x00ases q)\n", 2, 6, "NUL byte"),
])
def test_bytes_that_are_not_utf8_text(tmp_path, data, line, col, needle):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "x.rules").write_bytes(data)
    with pytest.raises(RuleError) as e:
        rulefile.load([folder])
    assert str(e.value).startswith(f"{folder / 'x.rules'}:{line}:{col}: {needle}"), str(e.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_fifo_is_refused_without_blocking(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    os.mkfifo(folder / "x.rules")
    code = ("import sys\nfrom cbrules.rewrite import rulefile\n"
            "for d in (sys.argv[1], sys.argv[1] + '/x.rules'):\n"
            "    try:\n        rulefile.load([d])\n"
            "    except rulefile.RulePathError as e:\n        print(e)\n")
    p = isolated(["-c", code, str(folder)], tmp_path, timeout=30)
    lines = p.stdout.splitlines()
    assert len(lines) == 2 and all("x.rules: not a regular file" in x or "not a folder or a regular file" in x
                                   for x in lines), (p.stdout, p.stderr)


def test_symlink_out_of_the_folder_is_refused(tmp_path):
    outside = write_rules(tmp_path / "elsewhere", "(phases p)\n", "secret.rules")
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "x.rules").symlink_to(outside)
    with pytest.raises(RulePathError, match="x.rules: symlink to .*outside the rule folder"):
        rulefile.load([folder])
    inside = write_rules(folder / "sub", "(phases p)\n", "real.txt")
    (folder / "x.rules").unlink()
    (folder / "x.rules").symlink_to(inside)  # inside the folder: fine
    assert rulefile.load([folder]).phases == ["p"]


def test_symlinked_folders_are_not_followed(tmp_path):
    write_rules(tmp_path / "elsewhere", "(phases p)\n")
    folder = tmp_path / "r"
    write_rules(folder, "(phases q)\n")
    (folder / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert rulefile.load([folder]).phases == ["q"]


def test_empty_folder_path_is_an_error(tmp_path, monkeypatch):
    write_rules(tmp_path, "(phases stray)\n")  # would be loaded if "" meant the working directory
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RulePathError, match="empty rule folder path"):
        rulefile.rule_dirs([""])
    with pytest.raises(RulePathError, match="empty rule folder path"):
        rulefile.load([""])
    with pytest.raises(RulePathError, match="empty rule folder path"):
        api.load_rules([""])
    p = isolated(["-m", "cbrules.cli", "rules", "check", "--rules", ""], tmp_path)
    assert p.returncode != 0 and "rule folder" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_missing_folder(tmp_path):
    with pytest.raises(RulePathError, match="nope: rule folder does not exist"):
        rulefile.load([tmp_path / "nope"])


# ------------------------------------------------------------------------- malformed forms

RULE = "(graph-rule r :phase p :match ((for ?L) (syncthreads ?s :child-of ?L)) :rewrite ((erase ?s)))"


def with_rule(**keys):
    """The rule above with keys replaced (value None removes the key)."""
    parts = {"phase": "p", "match": "((for ?L) (syncthreads ?s :child-of ?L))", "rewrite": "((erase ?s))"}
    parts.update(keys)
    return "(graph-rule r " + " ".join(f":{k} {v}" for k, v in parts.items() if v is not None) + ")"


MALFORMED = [
    ("(phase q :after (x))", "expected a name"),
    ("(phase q :after)", "has no value"),
    ("(phase q :after p :before p)", "(phase NAME :after P)"),
    ("(phase q :around p)", "unknown key :around"),
    ("(phase (q) :after p)", "expected a name"),
    ("(phase 1 :after p)", "expected a name"),
    ("(phase q :after nowhere)", "unknown phase 'nowhere'"),
    ("(phase)", "(phase NAME :after P)"),
    ("(phases (x))", "expected a name"),
    ("(phases 1)", "expected a name"),
    ('(phases "q")', "expected a name"),
    ("(phases 2.5)", "expected a name"),
    ("(disable (x))", "expected a name"),
    ("(disable 7)", "expected a name"),
    ("(disable nothing)", "unknown rule 'nothing'"),
    ("(graph-rule)", "graph-rule needs a name"),
    ("(graph-rule 1)", "graph-rule needs a name"),
    ("(graph-rule (r))", "graph-rule needs a name"),
    ("(graph-rule r :phase)", "has no value"),
    ("(graph-rule r p)", "expected a :key"),
    ("(graph-rule r (x) 1)", "expected a :key"),
    (with_rule(phase="(x)"), "expected a name"),
    (with_rule(phase="1"), "expected a name"),
    (with_rule(doc="(x)"), ":doc takes a string"),
    (with_rule(doc="1"), ":doc takes a string"),
    (with_rule(after="x"), ":after takes a list"),
    (with_rule(after="((x))"), ":after takes rule names"),
    (with_rule(after="(1)"), ":after takes rule names"),
    (with_rule(after="(r2)"), "unknown rule r2"),
    (with_rule(match="x"), ":match takes a list"),
    (with_rule(match="(x)"), "expected a node pattern"),
    (with_rule(match="(())"), "expected a node pattern"),
    (with_rule(match="((1))"), "unknown op"),
    (with_rule(match="((for (x)))"), "positional items must be ?variables"),
    (with_rule(match="((for ?L :var (x)))"), "unknown value pattern"),
    (with_rule(match="((for ?L :var))"), "has no value"),
    (with_rule(match="((for ?L) (child))"), "relation child takes"),
    (with_rule(where="((attr))"), "attr"),
    (with_rule(where="((nope 1))"), "unknown function 'nope'"),
    (with_rule(where="(((x)))"), "expected (FUNCTION args...)"),
    (with_rule(rewrite="x"), ":rewrite takes a list"),
    (with_rule(rewrite="(x)"), "expected an action"),
    (with_rule(rewrite="((let ?x))"), "action let takes"),
    (with_rule(rewrite="((let (x) 1))"), "(let ?var VALUE)"),
    (with_rule(rewrite="((clone ?L :as (x)))"), ":as takes a ?variable"),
    (with_rule(rewrite="((clone ?L :set (1 2)))"), ":set takes (:key value ...)"),
    (with_rule(rewrite="((clone ?L :set x))"), "expected (:key value ...)"),
    (with_rule(rewrite="((insert-before ?s (fence_proxy_async :as (x))))"), ":as takes a ?variable"),
    (with_rule(rewrite="((insert-before ?s 1))"), "expected a node template"),
    ("x", "must be a list starting with a name"),
    ("()", "must be a list starting with a name"),
    ("((x))", "must be a list starting with a name"),
    ("(1 2)", "must be a list starting with a name"),
    ("(graph-rul x)", "unknown top-level form"),
    ("(phases " + "9" * 50 + ")", "has 50 digits"),
    ("(phases 1e999)", "out of range"),
]


@pytest.mark.parametrize("form, needle", MALFORMED)
def test_malformed_forms_are_rule_errors(tmp_path, form, needle):
    path = write_rules(tmp_path / "r", "(phases p)\n" + form + "\n")
    try:
        rulefile.load([tmp_path / "r"])
    except RuleError as e:  # never AttributeError, IndexError, TypeError ...
        assert str(e).startswith(f"{path}:2:"), str(e)
        assert needle in str(e), str(e)
    else:
        pytest.fail(f"{form} loaded")


def test_random_mutations_of_the_shipped_rules_end_in_rule_errors(tmp_path):
    """Token-level mutations of the shipped graph rules: loading ends in a RuleError or succeeds."""
    import random
    import re
    text = (ROOT / "rules" / "circular_buffer.rules").read_text()
    tokens = re.findall(r'\(|\)|"(?:[^"\\]|\\.)*"|[^\s()";]+|;[^\n]*|\s+', text)
    junk = ["(x)", "()", "1", '"s"', ":k", "?v", "(attr)", "(1 2)", ":phase", ":as", "(let)", "(:a)", "_",
            "(var)", "(one-of)", "2.5", ":after", "(phases)", ")", "("]
    rng = random.Random(10)
    (tmp_path / "r").mkdir()
    start = time.perf_counter()
    for _ in range(150):
        t = list(tokens)
        for _ in range(rng.randint(1, 3)):
            i = rng.choice([i for i, x in enumerate(t) if x.strip() and not x.startswith(";")])
            t[i] = rng.choice(["", f" {rng.choice(junk)} ", f" {rng.choice(junk)} {t[i]}"])
        (tmp_path / "r" / "x.rules").write_text("".join(t))
        try:
            rulefile.load([tmp_path / "r"])
        except RuleError:
            pass
    assert time.perf_counter() - start < 60


# ------------------------------------------------------------------------ budgets of egglog runs

def test_growing_user_rules_stop_at_a_budget_with_terms_unchanged(tmp_path):
    """A rule that adds terms forever, one that squares the e-graph each run: a named warning,
    every term unchanged, within seconds (in a subprocess: egglog cannot be interrupted)."""
    folder = tmp_path / "grow"
    write_rules(folder, textwrap.dedent("""
        (ruleset grow)
        (rule ((= e (Add a b))) ((Add e e)) :ruleset grow :name "double")
        (rule ((= x (Add a b)) (= y (Add c d))) ((Add x y)) :ruleset grow :name "square")
    """))
    code = textwrap.dedent(f"""
        import warnings
        from cbrules.rewrite import rulefile
        from cbrules.rewrite.egg import EggBudgetWarning, simplify
        from cbrules.ir.terms import parse
        rs = rulefile.load(rulefile.rule_dirs([{str(folder)!r}]), check_egglog=True)
        terms = [parse(f"i{{k}} + {{k}}") for k in range(10)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = simplify(terms, {{}}, rs.egg_forms)
        assert res.terms == {{t: t for t in terms}}, res.terms
        assert [w.category for w in caught] == [EggBudgetWarning], caught
        print(res.budget)
    """)
    p = isolated(["-c", code], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "node budget of 200000 e-graph rows" in p.stdout, p.stdout


def test_load_check_never_runs_rules(tmp_path):
    """`rules check` loads declarations only: a rule that would grow forever is never applied."""
    folder = tmp_path / "grow"
    write_rules(folder, '(rule () ((Num 1)))\n(rule ((= e (Num n)) (= m (+ n 1))) ((Num m)) :name "count")\n')
    p = isolated(["-m", "cbrules.cli", "rules", "check", "--rules", str(folder)], tmp_path, timeout=30)
    assert p.returncode == 0 and p.stdout.startswith("ok:"), (p.stdout, p.stderr)


def test_egglog_form_read_as_two_commands_is_refused(tmp_path):
    """Defence in depth: one form must be one egglog command whatever the reader thought."""
    from cbrules.rewrite.egg import EggForm, load_check
    target = tmp_path / "created.txt"
    with pytest.raises(EggRuleError, match=r"^f.rules:3:1: egglog read this form as 2 commands"):
        load_check([EggForm(f'(ruleset a) (output "{target}" (Num 1))', "f.rules", 3, 1)])
    with pytest.raises(EggRuleError, match=r"^f.rules:1:1: egglog command Input is not allowed"):
        load_check([EggForm('(input lo "/etc/passwd")', "f.rules", 1, 1)])
    assert not target.exists()
