"""Loading egglog text from rule files: the forms a rule file may hold (declarations only,
:data:`EGGLOG_ALLOWED`), each loaded on its own so egglog's parse and type errors point at the user's
``file:line:col`` (:class:`EggRuleError`), and the splitting of an egglog-only file into forms.
Loading computes nothing and touches no file; :mod:`cbrules.rewrite.egg` runs the rulesets.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Iterator, Sequence, Union

from egglog import bindings as eb

from ..errors import CbrulesError
from .schema import EGGLOG_FORMS, EggForm
from ..sexpr import MAX_DEPTH, RuleError, read_file

# The egglog forms a rule file may hold: declarations only. Each one adds sorts, tables, rulesets
# or rules to the e-graph and computes nothing when loaded (a rule fires only when the bridge
# runs its ruleset, under the budgets of `simplify`); none of them names a file.
EGGLOG_ALLOWED: dict[str, type] = {
    "datatype": eb.Datatype,  # a sort and its constructors
    "datatype*": eb.Datatypes,  # mutually recursive datatypes
    "sort": eb.Sort,  # a sort name, or a container sort of declared sorts
    "function": eb.FunctionCommand,  # a table filled only by rule actions; :merge is a pure expression
    "constructor": eb.Constructor,  # a term-building table
    "relation": eb.Relation,  # a table without output
    "ruleset": eb.AddRuleset,  # a name rules are added to
    "rewrite": eb.RewriteCommand,  # pattern, replacement, :when facts: queries and pure primitives
    "birewrite": eb.BiRewriteCommand,
    "rule": eb.RuleCommand,  # query and actions; _check_commands refuses any action kind not below
}
# Parts of a rule's query that share no variable: each is one more factor of a product egglog
# enumerates in a run that cannot be interrupted (every shipped rule has one part). Two parts
# square the e-graph at worst, which the node budget sees between runs; three or more can pass
# any budget inside one run (six parts over 20 terms: 6.4e7 rows, minutes and gigabytes).
MAX_JOIN_PARTS = 2
# What a rule's actions may do: add, set, merge or retire rows, bind a name, or fail the run
# (a failing run is caught by `simplify`, which then keeps every term). egglog actions cannot
# read or write files; the list stays explicit so a new kind of action is refused until reviewed.
_ACTIONS = (eb.Let, eb.Set, eb.Union, eb.Change, eb.Panic, eb.Expr_)
assert set(EGGLOG_ALLOWED) == set(EGGLOG_FORMS), "the reader and the bridge accept the same egglog forms"


class EggRuleError(CbrulesError):
    """An egglog form that does not parse or type-check; the message starts ``file:line:col:``."""

    def __init__(self, file: str, line: int, col: int, detail: str, egglog_message: str = ""):
        super().__init__(f"{file}:{line}:{col}: {detail}")
        self.file, self.line, self.col, self.detail = file, line, col, detail
        self.egglog_message = egglog_message


class EggPanic(Exception):
    """egglog panicked (a Rust panic) while loading ``form``."""

    def __init__(self, form: EggForm, panic: BaseException):
        super().__init__(f"{form.file}:{form.line}:{form.col}: egglog panicked: {panic}")
        self.form, self.panic = form, panic


def fatal(e: BaseException) -> bool:
    return isinstance(e, (KeyboardInterrupt, SystemExit))


# ------------------------------------------------------------------------------------- loading

# egglog heads messages with spans, "In 3:13-19 of f.rules: <snippet>" or "In 3:3-4:14 of ...",
# line:col within the form's own text (columns count characters).
_HEADER = re.compile(r"^\s*(?:Panic:\s*)?In (\d+):(\d+)-(?:(\d+):)?\d+(?: of ([^\n]*?))?: ?(.*)$")


def _rule_error(form: EggForm, context: str) -> EggRuleError:
    last_line = form.line + form.text.count("\n")
    last_col = len(form.text.rsplit("\n", 1)[-1]) + (form.col - 1 if last_line == form.line else 0)
    where, details, rest, lines, i = None, [], "", context.split("\n"), 0
    while i < len(lines):
        m = _HEADER.match(lines[i])
        if not m:
            details += [lines[i].strip()] if lines[i].strip() else []
            i += 1
            continue
        rel = (int(m[1]), int(m[2]))
        at = (rel[0] + form.line - 1, rel[1] + (form.col - 1 if rel[0] == 1 else 0))
        # a shadowing error also names the earlier definition: keep the span inside this form
        # (egglog names the file by its base name only)
        mine = m[4] in (None, os.path.basename(form.file))
        if where is None and mine and (form.line, form.col) <= at <= (last_line, last_col):
            where = at
        rest = m[5]
        i += 1 + (int(m[3]) - rel[0] if m[3] else 0)  # skip the rest of a multi-line snippet
    line, col = where or (form.line, form.col)
    return EggRuleError(form.file, line, col, details[0] if details else rest or context, context)


def _rule_keys(cmd: object) -> list[tuple[str, str]]:
    """(ruleset, rule name) pairs a command adds; unnamed rules are named by their text."""
    if isinstance(cmd, (eb.RewriteCommand, eb.BiRewriteCommand)):
        return [(cmd.name, cmd.rewrite.name or str(cmd))]
    if isinstance(cmd, eb.RuleCommand):
        return [(cmd.rule.ruleset, cmd.rule.name or str(cmd))]
    return []


@dataclass
class Loaded:
    costs: dict[str, int] = field(default_factory=dict)  # constructor -> declared :cost
    rulesets: list[str] = field(default_factory=list)  # in declaration order; "" = default
    rule_keys: set = field(default_factory=set)
    # a rule mentions `(Name ...)`: it might build a name no term mentions, which then needs its
    # range facts; otherwise names no term mentions stay apart from every term and need none
    rules_mention_names: bool = False
    tables: set = field(default_factory=set)  # constructors, functions and relations declared so far

    def note(self, cmd: object) -> None:
        variants = cmd.variants if isinstance(cmd, eb.Datatype) else []
        if isinstance(cmd, eb.Datatypes):
            variants = [v for _, _, sub in cmd.datatypes if isinstance(sub, eb.SubVariants)
                        for v in sub.variants]
        self.costs.update({v.name: v.cost for v in variants if v.cost is not None})
        self.tables.update(v.name for v in variants)
        if isinstance(cmd, (eb.Constructor, eb.FunctionCommand, eb.Relation)):
            self.tables.add(cmd.name)
        if isinstance(cmd, eb.Constructor) and cmd.cost is not None:
            self.costs[cmd.name] = cmd.cost
        new = [cmd.name] if isinstance(cmd, eb.AddRuleset) else [rs for rs, _ in _rule_keys(cmd) if rs == ""]
        self.rulesets += [rs for rs in new if rs not in self.rulesets]


def load_forms(eg: eb.EGraph, forms: Sequence[EggForm]) -> Loaded:
    info = Loaded()
    for form in forms:
        _check_nesting(form)  # egglog's parser recurses per level: deep text crashes the process
        try:
            cmds = eg.parse_program(form.text, filename=form.file)
        except eb.EggSmolError as e:
            raise _rule_error(form, e.context) from None
        _check_commands(form, cmds)
        _check_join(form, cmds[0], info.tables)
        for key in (k for cmd in cmds for k in _rule_keys(cmd)):
            if key in info.rule_keys:  # egglog would panic; say where instead
                raise EggRuleError(form.file, form.line, form.col,
                                   f"rule {key[1]!r} is already defined in ruleset {key[0] or '(default)'!r}")
            info.rule_keys.add(key)
        try:
            eg.run_program(*cmds)
        except eb.EggSmolError as e:
            raise _rule_error(form, e.context) from None
        except BaseException as e:
            if fatal(e):
                raise
            raise EggPanic(form, e) from e
        for cmd in cmds:
            info.note(cmd)
        if _rule_keys(cmds[0]) and "(Name" in form.text:
            info.rules_mention_names = True
    return info


@functools.lru_cache(maxsize=8192)  # the same forms load again after every phase
def _check_nesting(form: EggForm) -> None:
    for _ in _top_level(form.text, form.file, form.line, form.col):
        pass  # raises on nesting past MAX_DEPTH


def _check_commands(form: EggForm, cmds: Sequence[object]) -> None:
    """Exactly one allowed declaration, whose rule actions (if any) are all of allowed kinds.

    The reader already refused other heads; this holds even where egglog reads a form's text
    differently from the reader (one form must parse to one command)."""
    def refuse(detail: str) -> EggRuleError:
        return EggRuleError(form.file, form.line, form.col, detail)

    if len(cmds) != 1:
        raise refuse(f"egglog read this form as {len(cmds)} commands; write one declaration per form")
    cmd = cmds[0]
    if type(cmd) not in EGGLOG_ALLOWED.values():
        raise refuse(f"egglog command {type(cmd).__name__} is not allowed in rule files; only the "
                     f"declarations {', '.join(EGGLOG_ALLOWED)} are")
    actions = cmd.rule.head if isinstance(cmd, eb.RuleCommand) else []
    for a in actions:
        if not isinstance(a, _ACTIONS):
            raise refuse(f"rule action {type(a).__name__} is not allowed in rule files")


def _query(cmd: object) -> list:
    """The expressions a rule or rewrite matches: its query facts (a rewrite's pattern and ``:when``)."""
    if isinstance(cmd, eb.RuleCommand):
        facts, extra = cmd.rule.body, []
    elif isinstance(cmd, (eb.RewriteCommand, eb.BiRewriteCommand)):
        facts, extra = cmd.rewrite.conditions, [[cmd.rewrite.lhs]]
    else:
        return []
    return extra + [[f.left, f.right] if isinstance(f, eb.Eq) else [f.expr] for f in facts]


def join_parts(cmd: object, tables: set) -> int:
    """How many variable-disjoint parts the query of a rule or rewrite has: the atoms that read a
    table (a constructor, function or relation), joined where they share a variable. Primitive
    atoms (``!=``, ``<``, ``+``) filter or compute, so they join nothing here: egglog enumerates
    the product of the parts before such a filter runs."""
    parent: dict[str, str] = {}

    def find(v: str) -> str:
        while parent.setdefault(v, v) != v:
            v = parent[v]
        return v

    def walk(e: object, names: set, reads: list) -> None:
        if isinstance(e, eb.Var):
            names.add(e.name)
        elif isinstance(e, eb.Call):
            reads += [e.name] if e.name in tables else []
            for a in e.args:
                walk(a, names, reads)

    firsts = []
    for atom in _query(cmd):
        names, reads = set(), []
        for e in atom:
            walk(e, names, reads)
        if reads and names:  # an atom without variables matches one row at most
            first, *rest = sorted(names)
            for v in rest:
                parent[find(v)] = find(first)
            firsts.append(first)
    return len({find(v) for v in firsts})


def _check_join(form: EggForm, cmd: object, tables: set) -> None:
    """Refuse a query that is a cartesian product: egglog enumerates every combination of its
    parts inside one run, which nothing can stop (k parts over n rows: n**k matches)."""
    parts = join_parts(cmd, tables)
    if parts > MAX_JOIN_PARTS:
        key = _rule_keys(cmd)[0][1]
        raise EggRuleError(form.file, form.line, form.col,
                           f"rule {key!r} joins {parts} parts that share no variable (a cartesian product: "
                           f"egglog would try every combination of their rows in one run that cannot be stopped); "
                           f"at most {MAX_JOIN_PARTS} is allowed: link every table atom of the query to the others "
                           "through a shared variable, or split the rule")


def load_check(forms: Sequence[EggForm]) -> None:
    """Parse and type-check ``forms`` in a fresh e-graph; raise :class:`EggRuleError` at the first bad one.

    Only declarations load (see :data:`EGGLOG_ALLOWED`), so this runs no rules and ends quickly."""
    try:
        load_forms(eb.EGraph(), forms)
    except EggPanic as e:
        raise EggRuleError(e.form.file, e.form.line, e.form.col, f"egglog panicked: {e.panic}") from None


def forms_from_file(path: Union[str, os.PathLike]) -> list[EggForm]:
    """Split an egglog-only rule file into top-level forms (``;`` comments and strings understood).

    The file is read as strict UTF-8 with the reader's size and nesting bounds."""
    try:
        text = read_file(path)
    except RuleError as e:
        raise EggRuleError(str(path), e.pos.line, e.pos.col, e.detail) from None
    return [EggForm(text[i:j], str(path), line, col) for i, j, line, col in _top_level(text, str(path))]


def _top_level(text: str, file: str, line: int = 1, col: int = 1) -> Iterator[tuple[int, int, int, int]]:
    """(start, end, line, col) of each top-level form of ``text``, which starts at ``line``:``col``;
    raises :class:`EggRuleError` on unbalanced or too deeply nested parentheses."""
    depth, start, state = 0, (0, line, col), "code"  # state: code|comment|string|escape
    for i, c in enumerate(text):
        if state != "code":
            state = {"comment": "code" if c == "\n" else "comment", "escape": "string",
                     "string": "code" if c == '"' else "escape" if c == "\\" else "string"}[state]
        elif c in ';"':
            state = "comment" if c == ";" else "string"
        elif c == "(":
            start = (i, line, col) if depth == 0 else start
            depth += 1
            if depth > MAX_DEPTH:
                raise EggRuleError(file, line, col, f"lists nested deeper than {MAX_DEPTH} levels; split the form")
        elif c == ")":
            if depth == 0:
                raise EggRuleError(file, line, col, "unexpected ')'")
            depth -= 1
            if depth == 0:
                yield start[0], i + 1, start[1], start[2]
        elif depth == 0 and not c.isspace():
            raise EggRuleError(file, line, col, f"unexpected {c!r} outside a form")
        line, col = (line + 1, 1) if c == "\n" else (line, col + 1)
    if depth or state in ("string", "escape"):
        raise EggRuleError(file, start[1], start[2], "form is not closed before the end of the file")
