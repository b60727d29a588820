"""Bridge between index/predicate terms and egglog: load rule forms, simplify terms, extract.

:func:`simplify` builds one e-graph per call: it loads the egglog forms of the rule files (each
form on its own, so egglog's errors point at the user's file, line and column), adds every term
under a unique ``let`` name, asserts the range facts of names, runs the rulesets under round,
time and size budgets, and extracts every term's cheapest form with one reused extractor.
Rule files are egglog text: loading them never executes Python.

``rules/index.rules`` declares what the bridge relies on: the ``Idx`` datatype, the ``lo``/``hi``
range functions and the ``ranges`` ruleset. Every declared ruleset runs, ``ranges`` first.
"""
from __future__ import annotations

import os
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence, Union

from egglog import bindings as eb

from .terms import Term, call, const, name

SHIPPED_RULES = Path(__file__).resolve().parent.parent / "rules" / "index.rules"
SORT, RANGES_RULESET = "Idx", "ranges"
_I64 = (-(2 ** 63), 2 ** 63 - 1)
_LET_PREFIX = "$cbrules_t"  # `$`: egglog warns about globals without it; prefix avoids user names
_SPAN = eb.PanicSpan()
_SCALE = 1000  # extraction cost units per declared :cost unit (literal size breaks ties)
_PASSES = 16  # runs of one ruleset per round; ranges converge in about term-depth passes


@dataclass(frozen=True)
class EggForm:
    """One egglog form: its exact source text and where it starts (1-based line and column)."""

    text: str
    file: str
    line: int
    col: int


@dataclass(frozen=True)
class Range:
    """Inclusive integer bounds of a name; ``None`` means unknown."""

    lo: int | None
    hi: int | None


# Hard facts about CUDA builtins, asserted besides the caller's (egglog keeps the tighter bound).
BUILTIN_RANGES: dict[str, Range] = {
    f"{b}.{axis}": r for axis in "xyz" for b, r in (
        ("threadIdx", Range(0, 1023)), ("blockDim", Range(1, 1024)),
        ("blockIdx", Range(0, 2 ** 31 - 2)), ("gridDim", Range(1, 2 ** 31 - 1)))}


@dataclass
class SimplifyResult:
    """Outcome of :func:`simplify`; on failure ``error`` is set and every term maps to itself."""

    terms: dict[Term, Term]
    rule_matches: dict[str, int] = field(default_factory=dict)
    iterations: int = 0
    seconds: float = 0.0
    error: str | None = None


class EggRuleError(Exception):
    """An egglog form that does not parse or type-check; the message starts ``file:line:col:``."""

    def __init__(self, file: str, line: int, col: int, detail: str, egglog_message: str = ""):
        super().__init__(f"{file}:{line}:{col}: {detail}")
        self.file, self.line, self.col, self.detail = file, line, col, detail
        self.egglog_message = egglog_message


class _EggPanic(Exception):
    """egglog panicked (a Rust panic) while loading ``form``."""

    def __init__(self, form: EggForm, panic: BaseException):
        super().__init__(f"{form.file}:{form.line}:{form.col}: egglog panicked: {panic}")
        self.form, self.panic = form, panic


def _fatal(e: BaseException) -> bool:
    return isinstance(e, (KeyboardInterrupt, SystemExit))


# ------------------------------------------------------------------------------------- loading

# egglog heads messages with spans, "In 3:13-19 of f.rules: <snippet>" or "In 3:3-4:14 of ...";
# thanks to the padding in _load its line:col are the user's (columns count characters).
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
        at = (int(m[1]), int(m[2]))
        # a shadowing error also names the earlier definition: keep the span inside this form
        # (egglog names the file by its base name only)
        mine = m[4] in (None, os.path.basename(form.file))
        if where is None and mine and (form.line, form.col) <= at <= (last_line, last_col):
            where = at
        rest = m[5]
        i += 1 + (int(m[3]) - at[0] if m[3] else 0)  # skip the rest of a multi-line snippet
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
class _Loaded:
    costs: dict[str, int] = field(default_factory=dict)  # constructor -> declared :cost
    rulesets: list[str] = field(default_factory=list)  # in declaration order; "" = default
    rule_keys: set = field(default_factory=set)

    def note(self, cmd: object) -> None:
        variants = cmd.variants if isinstance(cmd, eb.Datatype) else []
        if isinstance(cmd, eb.Datatypes):
            variants = [v for _, _, sub in cmd.datatypes if isinstance(sub, eb.SubVariants)
                        for v in sub.variants]
        self.costs.update({v.name: v.cost for v in variants if v.cost is not None})
        if isinstance(cmd, eb.Constructor) and cmd.cost is not None:
            self.costs[cmd.name] = cmd.cost
        new = [cmd.name] if isinstance(cmd, eb.AddRuleset) else [rs for rs, _ in _rule_keys(cmd) if rs == ""]
        self.rulesets += [rs for rs in new if rs not in self.rulesets]


def _load(eg: eb.EGraph, forms: Sequence[EggForm]) -> _Loaded:
    info = _Loaded()
    for form in forms:
        # pad so that egglog's own line:col are positions in the user's file
        padded = "\n" * (form.line - 1) + " " * (form.col - 1) + form.text
        try:
            cmds = eg.parse_program(padded, filename=form.file)
        except eb.EggSmolError as e:
            raise _rule_error(form, e.context) from None
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
            if _fatal(e):
                raise
            raise _EggPanic(form, e) from e
        for cmd in cmds:
            info.note(cmd)
    return info


def load_check(forms: Sequence[EggForm]) -> None:
    """Parse and type-check ``forms`` in a fresh e-graph; raise :class:`EggRuleError` at the first bad one."""
    try:
        _load(eb.EGraph(), forms)
    except _EggPanic as e:
        raise EggRuleError(e.form.file, e.form.line, e.form.col, f"egglog panicked: {e.panic}") from None


def forms_from_file(path: Union[str, os.PathLike]) -> list[EggForm]:
    """Split an egglog-only rule file into top-level forms (``;`` comments and strings understood)."""
    text = Path(path).read_text(encoding="utf-8")
    forms: list[EggForm] = []
    depth, start, line, col, state = 0, (0, 1, 1), 1, 1, "code"  # state: code|comment|string|escape
    for i, c in enumerate(text):
        if state != "code":
            state = {"comment": "code" if c == "\n" else "comment", "escape": "string",
                     "string": "code" if c == '"' else "escape" if c == "\\" else "string"}[state]
        elif c in ';"':
            state = "comment" if c == ";" else "string"
        elif c == "(":
            start = (i, line, col) if depth == 0 else start
            depth += 1
        elif c == ")":
            if depth == 0:
                raise EggRuleError(str(path), line, col, "unexpected ')'")
            depth -= 1
            if depth == 0:
                forms.append(EggForm(text[start[0]:i + 1], str(path), start[1], start[2]))
        elif depth == 0 and not c.isspace():
            raise EggRuleError(str(path), line, col, f"unexpected {c!r} outside a form")
        line, col = (line + 1, 1) if c == "\n" else (line, col + 1)
    if depth or state in ("string", "escape"):
        raise EggRuleError(str(path), start[1], start[2], "form is not closed before the end of the file")
    return forms


# ------------------------------------------------------------------------------- term encoding

_BINARY = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div", "%": "Mod", "<": "Lt", "<=": "Le",
           ">": "Gt", ">=": "Ge", "==": "Eq", "!=": "Ne", "&&": "And", "||": "Or"}
_UNARY = {"-": "Neg", "!": "Not"}
_CALLS = {"min": "Min", "max": "Max", "ceil_div": "CeilDiv"}
# built from each table on its own: "-" is both Sub and Neg
_BACK = ({v: ("op", k) for k, v in _BINARY.items()} | {v: ("op", k) for k, v in _UNARY.items()}
         | {v: ("call", k) for k, v in _CALLS.items()})


def _app(fn: str, *args: object) -> eb.Call:
    return eb.Call(_SPAN, fn, list(args))


def _lit(v: object) -> eb.Lit:
    return eb.Lit(_SPAN, v)


class _Encoder:
    """Terms to egglog expressions and back; other parts travel as ``(Opaque key)`` and return whole."""

    def __init__(self) -> None:
        self.opaque: dict[str, Term] = {}
        self._keys: dict[Term, str] = {}

    def expr(self, t: Term) -> eb.Call:
        v, arity = t.value, len(t.args)
        if t.op == "const" and isinstance(v, bool):
            return _app("Bool", _lit(eb.Bool(v)))
        if t.op == "const" and isinstance(v, int) and _I64[0] <= v <= _I64[1]:
            return _app("Num", _lit(eb.Int(v)))
        if t.op == "name":
            return _app("Name", _lit(eb.String(str(v))))
        fn = (_CALLS.get(v) if t.op == "call" and arity == 2 else _BINARY.get(t.op) if arity == 2
              else _UNARY.get(t.op) if arity == 1 else None)
        if fn:
            return _app(fn, *map(self.expr, t.args))
        if t not in self._keys:
            self._keys[t] = key = f"#{len(self._keys)} {t}"
            self.opaque[key] = t
        return _app("Opaque", _lit(eb.String(self._keys[t])))

    def term(self, dag: eb.TermDag, tid: int, memo: dict[int, Term]) -> Term:
        """The term for extracted node ``tid``; KeyError/TypeError/AttributeError on other shapes."""
        if tid not in memo:
            node = dag.get(tid)
            if node.name in ("Num", "Bool", "Name", "Opaque"):
                v = dag.get(node.args[0]).value.value
                memo[tid] = (const(v) if node.name in ("Num", "Bool") else name(v) if node.name == "Name"
                             else self.opaque[v])
            else:
                kind, op = _BACK[node.name]
                kids = [self.term(dag, a, memo) for a in node.args]
                memo[tid] = call(op, *kids) if kind == "call" else Term(op, tuple(kids))
        return memo[tid]


# ------------------------------------------------------------------------------------ simplify

def _size(eg: eb.EGraph) -> int:
    return sum(n for _, n in eg.run_program(eb.PrintSize(_SPAN, None))[0].sizes)


def _run_rules(eg: eb.EGraph, rulesets: Sequence[str], iterations: int, deadline: float,
               max_nodes: int, matches: dict[str, int]) -> int:
    """Run rounds until one changes nothing; return how many ran.

    A round runs every ruleset in declaration order (``ranges`` first), each to a fixpoint
    capped at ``_PASSES`` runs, so later rulesets see the earlier ones' normal forms. The
    budgets (rounds, time, e-graph size) are checked between runs: egglog cannot be interrupted.
    """
    order = sorted(rulesets, key=lambda rs: rs != RANGES_RULESET)  # stable: keeps file order
    rounds = 0
    while rounds < iterations:
        rounds += 1
        changed = False
        for ruleset in order:
            for _ in range(_PASSES):
                if time.perf_counter() > deadline or _size(eg) > max_nodes:
                    return rounds
                out = eg.run_program(eb.RunSchedule(eb.Run(_SPAN, eb.RunConfig(ruleset))))
                report = out[0].report
                for rule, n in report.num_matches_per_rule.items():
                    matches[rule] = matches.get(rule, 0) + n
                if not report.updated:
                    break
                changed = True
        if not changed:
            break
    return rounds


def _range_facts(names: set[str], ranges: Mapping[str, Range]) -> list[eb.ActionCommand]:
    facts = []
    for nm in sorted(names):
        for r in (BUILTIN_RANGES.get(nm), ranges.get(nm)):
            for fn, bound in (("lo", r and r.lo), ("hi", r and r.hi)):
                if bound is not None and _I64[0] <= bound <= _I64[1]:
                    key = _app("Name", _lit(eb.String(nm)))
                    facts.append(eb.ActionCommand(eb.Set(_SPAN, fn, [key], _lit(eb.Int(bound)))))
    return facts


def _extract(eg: eb.EGraph, enc: _Encoder, lets: dict[Term, str], costs: Mapping[str, int]) -> dict[Term, Term]:
    """Cheapest form of every let-bound term, with one extractor (costs computed once)."""
    # Among equally cheap forms prefer small constants (`(k + 1) % 4` over `(k + 9) % 4`) and
    # non-negative ones (`i - 1` over `i + -1`): literal size adds less than one node's cost.
    def base_cost(sort: str, v: eb.Value) -> int:
        n = eg.value_to_i64(v) if sort == "i64" else 0
        return _SCALE + abs(n).bit_length() + (8 if n < 0 else 0)

    model = eb.CostModel(lambda _fn, head, kids: head + sum(kids),
                         lambda fn, _args: _SCALE * costs.get(fn, 1),
                         lambda _sort, _v, kids: sum(kids), base_cost)
    extractor = eb.Extractor([SORT], eg, model)
    dag, memo, out = eb.TermDag(), {}, {}
    for t, let in lets.items():
        try:
            sort, value = eg.eval_expr(eb.Var(_SPAN, let))
            out[t] = enc.term(dag, extractor.extract_best(eg, dag, value, sort)[1], memo)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            out[t] = t  # unextractable (all its nodes subsumed) or a shape with no term
    return out


def simplify(terms: Sequence[Term], ranges: Mapping[str, Range], forms: Sequence[EggForm], *,
             iterations: int = 20, time_limit_s: float = 2.0, max_nodes: int = 200_000) -> SimplifyResult:
    """Simplify ``terms`` with the egglog ``forms`` in one e-graph, using range facts of names.

    Rewriting stops after ``iterations`` rounds, ``time_limit_s`` seconds (checked between
    runs) or once the e-graph holds more than ``max_nodes`` rows, whichever comes first.
    Raises :class:`EggRuleError` when a form does not parse or type-check. If egglog fails while
    running (a Rust panic, a failing primitive), every term maps to itself, ``error`` is set
    and a warning is emitted.
    """
    start = time.perf_counter()
    unique = list(dict.fromkeys(terms))
    result = SimplifyResult({t: t for t in unique})
    try:
        eg = eb.EGraph()
        info = _load(eg, forms)
        enc = _Encoder()
        lets = {t: f"{_LET_PREFIX}{i}" for i, t in enumerate(unique)}
        names = {n for t in unique for n in t.names()} | set(ranges)
        eg.run_program(*[eb.ActionCommand(eb.Let(_SPAN, lets[t], enc.expr(t))) for t in unique],
                       *_range_facts(names, ranges))
        result.iterations = _run_rules(eg, info.rulesets, iterations, start + time_limit_s, max_nodes,
                                       result.rule_matches)
        result.terms = _extract(eg, enc, lets, info.costs)
    except EggRuleError:
        raise
    except BaseException as e:  # pyo3's PanicException derives from BaseException
        if _fatal(e):
            raise
        result.terms = {t: t for t in unique}
        result.error = f"egglog failed, terms left unchanged: {type(e).__name__}: {e}"
        warnings.warn(result.error, RuntimeWarning, stacklevel=2)
    result.seconds = time.perf_counter() - start
    return result
