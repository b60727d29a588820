"""The circular-buffer options declared once (rules/options.rules, cbrules.ir.option_schema): the schema's
reader refuses a malformed form at its position; the builder, the command line, `check` and the rules take
the options from it; and it is the only place an option's default is written."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cbrules import api, cli, options
from cbrules.check import Checker
from cbrules.ir import option_schema
from cbrules.ir.builder import BuildError, circular_buffer
from cbrules.kernels import get
from cbrules.rewrite import rulefile
from cbrules.rewrite.engine import LoweringError
from cbrules.sexpr import RuleError, read, read_file

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = option_schema.SCHEMA_FILE
GOOD = '(option depth :type int :min 2 :default 3 :doc "d")\n'


def _refused(text: str) -> RuleError:
    with pytest.raises(RuleError) as e:
        option_schema.read_schema(text, "s.rules")
    return e.value


@pytest.mark.parametrize("text, line, col, needle", [
    ('(option depth :doc "d")', 1, 1, "missing :type"),
    ('(option depth :type int :doc "d" :dfault 3)', 1, 34, "unknown key :dfault (did you mean :default?)"),
    ('(option depth :type float :doc "d")', 1, 21, ":type float is not one of int, bool, word, pair, count"),
    ('(option depth :type int :doc d)', 1, 30, ":doc takes text in quotes"),
    ('(option depth :type int :doc "d" :choices ("a"))', 1, 43, ":choices is for word options"),
    ('(option mode :type word :doc "d")', 1, 1, "add :choices"),
    ('(option depth :type int :doc "d" :min 4 :max 2)', 1, 46, ":max 2 is below :min 4"),
    ('(option depth :type int :doc "d" :min "2")', 1, 39, ":min takes an integer"),
    ('(option groups :type count :doc "d")', 1, 1, "add :true N"),
    ('(option depth :type int :doc "d" :default (* 2 3))', 1, 43, "is not (+ A B), (- A B) or (if A B C)"),
    ('(option depth :type int :doc "d" :default dpth)', 1, 43, "names dpth, which is not an option (did you mean depth?)"),
    ('(option a :type int :doc "d" :default b)\n(option b :type int :doc "d" :default (+ a 1))', 1, 39,
     "depends on itself"),
    (GOOD + GOOD, 2, 1, "option depth is already declared at s.rules:1:1"),
    ('(option depth :type int :doc "d" :refusals ((few-stages)))', 1, 45, "a refusal is (CODE RULE)"),
    ('(option depth :type int :doc "d" :help "h")', 1, 40, "give the option a :flag too"),
    ('(option depth :type int :doc "d" :flag "-d")', 1, 40, "is not a long option"),
    ('(option 3 :type int)', 1, 1, "an option needs a name"),
    ('(option depth :type int :doc "d" :min)', 1, 34, "key :min has no value"),
])
def test_a_malformed_option_is_refused_at_its_position(text, line, col, needle):
    e = _refused(text)
    assert (e.pos.line, e.pos.col) == (line, col), str(e)
    assert needle in str(e), str(e)


def test_the_shipped_schema_reads_and_declares_what_the_builder_records():
    opts = option_schema.options()
    assert list(opts) == ["stages", "prefetch", "war", "warp_specialize", "registers", "strict_trip_count",
                          "pingpong"]
    assert option_schema.default("prefetch", {"stages": 5}) == 4
    assert option_schema.default("war", {}) == "sync" and option_schema.default("war", {"warp_specialize": True}) == \
        "mbarrier"
    assert option_schema.default("prefetch") == option_schema.default("stages") - 1  # absent: its own default


def test_a_rule_folder_cannot_declare_an_option(tmp_path):
    (tmp_path / "mine.rules").write_text('\n(option war :type word :choices ("sync") :doc "d" :default "sync")\n')
    with pytest.raises(RuleError) as e:
        rulefile.load(rulefile.rule_dirs([tmp_path]))
    assert e.value.pos.line == 2 and "only the shipped rules/options.rules" in str(e.value)
    assert "(set-option ?L \"circular_buffer\" :war \"mbarrier\")" in str(e.value)  # the fix: a rule of its own


def _shipped_with(schema_text: str):
    sources = [(f, schema_text if f == SCHEMA else read_file(f)) for f in rulefile.rule_files(rulefile.SHIPPED)]
    with pytest.raises(RuleError) as e:
        rulefile._parsed(sources)
    return str(e.value)


def test_each_refusal_the_schema_names_is_a_rule_failing_with_that_code():
    text = read_file(SCHEMA)
    wrong_code = _shipped_with(text.replace("(few-stages cb-reject-few-stages)", "(few-stage cb-reject-few-stages)"))
    assert "rule cb-reject-few-stages" in wrong_code and "does not fail with :code few-stage (its codes: few-stages)" \
        in wrong_code and "options.rules:" in wrong_code
    no_rule = _shipped_with(text.replace("(war-mode cb-reject-war-mode)", "(war-mode cb-reject-war-mod)"))
    assert "names rule cb-reject-war-mod, which no rule file defines" in no_rule and "cb-reject-war-mode" in no_rule


@pytest.mark.parametrize("value, needle", [
    ('(option "stagse" "min")', "no circular-buffer option 'stagse' (did you mean 'stages'?); the options (rules/options.rules) are stages, "),
    ('(option "stages" "mni")', "the keys a rule reads are min, max, true, choices and default"),
    ('(option "prefetch" "default")', "computed from other options"),
    ('(option-default "wr" ?cb)', "did you mean 'war'?"),
    ('(limit "shared-bytes")', "no limit 'shared-bytes'"),
])
def test_rules_check_refuses_an_unknown_option_or_limit_at_its_position(tmp_path, value, needle):
    (tmp_path / "mine.rules").write_text(
        "(phase mine :before cb-check)\n(graph-rule r :phase mine\n  :match ((for ?L :annotations (:circular_buffer ?cb)))\n"
        f"  :rewrite ((let ?x {value})))\n")
    with pytest.raises(RuleError) as e:
        rulefile.load(rulefile.rule_dirs([tmp_path]))
    assert e.value.pos.line == 4 and needle in str(e.value), str(e.value)


def test_the_builder_checks_types_from_the_schema():
    assert circular_buffer(3, pingpong=True)["pingpong"] == option_schema.option("pingpong").true
    assert circular_buffer(3, registers=[40, 232], warp_specialize=True)["registers"] == (40, 232)
    with pytest.raises(BuildError, match=r'circular_buffer\(\.\.\.\): circular_buffer war must be "sync" or "mbarrier"'):
        circular_buffer(3, war=1)
    with pytest.raises(BuildError, match=r'pass a whole number \(or "auto": the rules choose\)'):
        circular_buffer(3, prefetch=1.5)
    with pytest.raises(BuildError, match="pingpong must be True or a count from 2 to 4"):
        circular_buffer(3, pingpong="two")


def test_the_command_line_takes_the_schema_flags():
    (sub,) = [a for a in cli.parser()._actions if a.dest == "command"]
    for command in ("lower", "compile", "run", "trace", "check"):
        flags = sub.choices[command]._option_string_actions
        for opt in option_schema.options().values():
            if opt.flag is None:  # (--pingpong is matmul_tc's ping-pong variant, a kernel of its own)
                continue
            action = flags[opt.flag]
            assert action.help == opt.help_text and "{" not in action.help
            assert list(action.choices or ()) == list(opt.choices)
    args = cli.parser().parse_args(["lower", "single_dim", "--stages", "auto", "--prefetch", "auto"])
    assert (args.stages, args.prefetch) == ("auto", "auto")


def test_the_refusals_read_their_bounds_from_the_schema(monkeypatch):
    real = option_schema.value_of
    monkeypatch.setattr(option_schema, "value_of", lambda n, k: 4 if (n, k) == ("stages", "min") else real(n, k))
    with pytest.raises(LoweringError) as e:
        api.lower(get("single_dim").build(stages=3))
    assert e.value.code == "few-stages" and "needs stages >= 4, got 3; ask for stages=4 or more" in str(e.value)
    assert "rule cb-reject-few-stages (rules/circular_buffer.rules:" in str(e.value)


def test_check_lowers_with_a_rule_folders_default(tmp_path):
    (tmp_path / "war.rules").write_text(
        "(phase my-defaults :before cb-check)\n(graph-rule my-war :phase my-defaults\n"
        "  :match ((for ?L :annotations (:circular_buffer (:war (absent)))))\n"
        "  :rewrite ((set-option ?L \"circular_buffer\" :war \"mbarrier\")))\n")
    spec = get("single_dim")
    checker = Checker(blocks="sample", rules=[tmp_path])
    assert checker.check(spec, 5, 3).ok
    lowered = [g for g in checker._lowered.values() if not isinstance(g, Exception)]
    assert lowered and all(options.effective(g.kg if hasattr(g, "kg") else g.graph)[0][1]["war"] == "mbarrier"
                           for g in lowered)


# ---------------------------------------------------------------- the schema is the only place a default is written

def _default_values() -> dict[str, set]:
    """Each option's default values, over the values of the bool options its default may read."""
    out = {}
    for name, opt in option_schema.options().items():
        seen = {option_schema.default(name, {b: v for b in option_schema.names()
                                             if option_schema.option(b).type == "bool"}) for v in (False, True)}
        out[name] = {v for v in seen if v not in (None, False, True)}  # not given: nothing to write
    return out


def _rule_default_writes(text: str, file: str, defaults: dict) -> list[str]:
    """Where a rule writes an option key's default itself: a literal default value set on a loop's
    circular_buffer options, or an absent option filled in with anything but (option-default ...). A loop
    a rule makes (a (for ...) template) is left out: its options are the configuration that rule needs
    (mma.rules' loops of one trip), not defaults of options a user left out."""
    found = []

    def walk(e, rule):
        if not hasattr(e, "items"):
            return
        head = e.head()
        if head == "for":
            return
        pairs = []
        if head == "set-option" and len(e.items) > 2 and getattr(e.items[2], "value", None) == "circular_buffer":
            pairs = [(k.value, v) for k, v in zip(e.items[3::2], e.items[4::2]) if getattr(k, "kind", "") == "kw"]
        if head == "dict" and rule is not None:
            pairs = [(k.value, v) for k, v in zip(e.items[1::2], e.items[2::2]) if getattr(k, "kind", "") == "str"]
        for key, value in pairs:
            literal = getattr(value, "value", None) if not hasattr(value, "items") else None
            if key in defaults and literal in defaults[key] and not isinstance(literal, bool):
                found.append(f"{file}:{value.pos.line}: rule {rule} writes {key}={literal!r}, a default")
        for x in e.items:
            walk(x, rule)

    for form in read(text, file):
        if form.head() != "graph-rule":
            continue
        name = form.items[1].value
        src = text[form.span[0]:form.span[1]]
        walk(form, name)
        for key in defaults:
            if f":{key} (absent)" in src and f":{key} " in src.split(":rewrite", 1)[1] \
                    and f'(option-default "{key}"' not in src:
                found.append(f"{file}:{form.pos.line}: rule {name} fills in an absent {key} without (option-default ...)")
    return found


def test_no_rule_writes_an_options_default_itself():
    defaults = _default_values()
    assert defaults["war"] == {"sync", "mbarrier"} and defaults["stages"] == {3}
    found = [f for p in sorted(rulefile.rule_files(rulefile.SHIPPED)) if p != SCHEMA
             for f in _rule_default_writes(p.read_text(), p.name, defaults)]
    assert not found, "\n".join(found)


def test_the_rule_scan_would_see_a_default_written():
    defaults = _default_values()
    bad = ('(graph-rule d :phase p :match ((for ?L :annotations (:circular_buffer (:war (absent)))))\n'
           '  :rewrite ((set-option ?L "circular_buffer" :war "sync")))\n'
           '(graph-rule e :phase p :match ((for ?L)) :rewrite ((set ?L :annotations (dict "circular_buffer" '
           '(dict "stages" 3)))))\n'
           '(graph-rule f :phase p :match ((tma_load ?ld)) :rewrite ((wrap ?ld (for :var "o" :start 0 :stop 1 :kind "serial" '
           ':annotations (dict "circular_buffer" (dict "stages" 1 "war" "sync"))))))\n')
    assert len(_rule_default_writes(bad, "x.rules", defaults)) == 3  # d twice (a literal, no option-default), e


def _python_default_writes(source: str, file: str, defaults: dict) -> list[str]:
    """Where Python code writes an option's default: a default value given to, assigned to, compared
    into or keyed by a name of that option (``stages=3``, ``war = war or "sync"``, ``{"war": "sync"}``),
    or the warp-specialized choice of war (``"mbarrier" if ws else "sync"``)."""
    found = []

    def constants(node):
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and not isinstance(n.value, bool)}

    def hit(name, node, line):
        if name in defaults and constants(node) & defaults[name]:
            found.append(f"{file}:{line}: {name} = {ast.unparse(node)[:60]}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg:
            hit(node.arg, node.value, node.value.lineno)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    hit(t.id, node.value, node.lineno)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    hit(k.value, v, v.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)):
            args = node.args
            positional = args.posonlyargs + args.args
            for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults):
                hit(a.arg, d, d.lineno)
            for a, d in zip(args.kwonlyargs, args.kw_defaults):
                if d is not None:
                    hit(a.arg, d, d.lineno)
        elif isinstance(node, ast.IfExp) and {ast.literal_eval(x) for x in (node.body, node.orelse)
                                              if isinstance(x, ast.Constant)} == defaults["war"]:
            found.append(f"{file}:{node.lineno}: {ast.unparse(node)[:60]}")
    return found


def test_no_python_module_writes_an_options_default_itself():
    """cbrules.kernels is left out: a built-in kernel's ``stages`` parameter is the S its author tuned it for
    (matmul_tc 4, attention by head size), not the option's default."""
    defaults = _default_values()
    files = [p for p in sorted([*ROOT.glob("cbrules/**/*.py"), *ROOT.glob("codegen/*.py")])
             if "kernels" not in p.relative_to(ROOT).parts and p.name != "option_schema.py"]
    assert len(files) > 40
    found = [f for p in files for f in _python_default_writes(p.read_text(), str(p.relative_to(ROOT)), defaults)]
    assert not found, "\n".join(found)


def test_the_python_scan_would_see_a_default_written():
    defaults = _default_values()
    bad = ("war = war or ('mbarrier' if warp_specialize else 'sync')\n"
           "stages = a.stages if a.stages is not None else 3\n"
           "kernel = spec.build(stages=3)\n"
           "def f(x, war='sync'):\n    return {'war': 'mbarrier'}\n")
    assert len(_python_default_writes(bad, "x.py", defaults)) == 6
