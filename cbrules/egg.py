"""Bridge between index/predicate terms and egglog: load rule forms, simplify terms, extract.

:func:`simplify` builds one e-graph per call: it loads the egglog forms of the rule files (each
form on its own, so egglog's errors point at the user's file, line and column), adds every term
under a unique ``let`` name, asserts the range facts of names, runs the rulesets under an
iteration and wall-clock budget, and extracts every term's cheapest form with one reused
extractor. Loading rule files never executes Python: forms are egglog text.

The datatype, range functions and rulesets the bridge relies on live in ``rules/index.rules``
(``Idx``, ``lo``/``hi``, ruleset ``ranges``); every other declared ruleset is run after them.
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
SORT = "Idx"
RANGES_RULESET = "ranges"
_I64 = (-(2 ** 63), 2 ** 63 - 1)
_LET_PREFIX = "$cbrules_t"  # `$`: egglog warns about globals without it; prefix avoids user names
_SPAN = eb.PanicSpan()
_SCALE = 1000  # extraction cost units per declared :cost unit
_PASSES = 16  # runs of one ruleset per round; ranges converge in ~term-depth passes

# Hard facts about CUDA builtins; the caller's tighter bounds merge in (lo: max, hi: min).
BUILTIN_RANGES: dict[str, "Range"] = {}


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


for _axis in "xyz":
    BUILTIN_RANGES[f"threadIdx.{_axis}"] = Range(0, 1023)
    BUILTIN_RANGES[f"blockDim.{_axis}"] = Range(1, 1024)
    BUILTIN_RANGES[f"blockIdx.{_axis}"] = Range(0, 2 ** 31 - 2)
    BUILTIN_RANGES[f"gridDim.{_axis}"] = Range(1, 2 ** 31 - 1)


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
    """egglog panicked (a Rust panic) while loading a form; carries the form's position."""


def _fatal(e: BaseException) -> bool:
    return isinstance(e, (KeyboardInterrupt, SystemExit))


# ------------------------------------------------------------------------------------- loading

# egglog prefixes messages with spans like "In 3:13-19 of f.rules: <snippet>" or "In 3:3-4:14 ...";
# with the padding below its line:col are the user's real ones (columns count characters).
_HEADER = re.compile(r"^\s*(?:Panic:\s*)?In (\d+):(\d+)-(?:(\d+):)?(\d+)(?: of [^\n]*?)?: ?(.*)$")


def _rule_error(form: EggForm, context: str) -> EggRuleError:
    last_line = form.line + form.text.count("\n")
    last_col = len(form.text.rsplit("\n", 1)[-1]) + (form.col - 1 if last_line == form.line else 0)

    def inside(line: int, col: int) -> bool:
        return (form.line, form.col) <= (line, col) <= (last_line, last_col)

    where, details, rest = None, [], ""
    lines = context.split("\n")
    i = 0
    while i < len(lines):
        m = _HEADER.match(lines[i])
        if m:
            l1, c1 = int(m[1]), int(m[2])
            if where is None and inside(l1, c1):
                where = (l1, c1)
            rest = m[5]
            i += 1 + (int(m[3]) - l1 if m[3] else 0)  # skip the rest of a multi-line snippet
            continue
        if lines[i].strip():
            details.append(lines[i].strip())
        i += 1
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
    costs: dict[str, int] = field(default_factory=dict)
    rulesets: list[str] = field(default_factory=list)
    rule_keys: set = field(default_factory=set)


def _load(eg: eb.EGraph, forms: Sequence[EggForm]) -> _Loaded:
    info = _Loaded()
    for form in forms:
        # pad so that egglog's own line:col are positions in the user's file
        padded = "\n" * (form.line - 1) + " " * (form.col - 1) + form.text
        try:
            cmds = eg.parse_program(padded, filename=form.file)
        except eb.EggSmolError as e:
            raise _rule_error(form, e.context) from None
        for cmd in cmds:
            for key in _rule_keys(cmd):
                # egglog panics on a duplicate rule name; say so at the form instead
                if key in info.rule_keys:
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
            raise _EggPanic(f"{form.file}:{form.line}:{form.col}: egglog panicked: {e}") from e
        for cmd in cmds:
            _note(cmd, info)
    return info


def _note(cmd: object, info: _Loaded) -> None:
    """Remember constructor costs (for extraction) and rulesets (for the schedule)."""
    variants = []
    if isinstance(cmd, eb.Datatype):
        variants = cmd.variants
    elif isinstance(cmd, eb.Datatypes):
        variants = [v for _, _, sub in cmd.datatypes if isinstance(sub, eb.SubVariants) for v in sub.variants]
    elif isinstance(cmd, eb.Constructor) and cmd.cost is not None:
        info.costs[cmd.name] = cmd.cost
    elif isinstance(cmd, eb.AddRuleset) and cmd.name not in info.rulesets:
        info.rulesets.append(cmd.name)
    for key in _rule_keys(cmd):
        if key[0] == "" and "" not in info.rulesets:
            info.rulesets.append("")  # rules without :ruleset run in the default ruleset
    for v in variants:
        if v.cost is not None:
            info.costs[v.name] = v.cost


def load_check(forms: Sequence[EggForm]) -> None:
    """Parse and type-check ``forms`` in a fresh e-graph; raise :class:`EggRuleError` on the first bad one."""
    try:
        _load(eb.EGraph(), forms)
    except _EggPanic as e:
        file_line_col, _, detail = str(e).partition(": ")
        file, line, col = file_line_col.rsplit(":", 2)
        raise EggRuleError(file, int(line), int(col), detail) from None


def forms_from_file(path: Union[str, os.PathLike]) -> list[EggForm]:
    """Split an egglog-only rule file into top-level forms (``;`` comments and strings understood)."""
    text = Path(path).read_text(encoding="utf-8")
    forms: list[EggForm] = []
    depth, start, line, col = 0, (0, 1, 1), 1, 1
    state = "code"  # code | comment | string | escape
    for i, c in enumerate(text):
        if state == "comment":
            state = "code" if c == "\n" else state
        elif state == "escape":
            state = "string"
        elif state == "string":
            state = "code" if c == '"' else "escape" if c == "\\" else state
        elif c == ";":
            state = "comment"
        elif c == '"':
            state = "string"
        elif c == "(":
            if depth == 0:
                start = (i, line, col)
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
_BACK = {v: k for k, v in _BINARY.items()}


def _app(fn: str, *args: object) -> eb.Call:
    return eb.Call(_SPAN, fn, list(args))


def _lit(v: object) -> eb.Lit:
    return eb.Lit(_SPAN, v)


class _Encoder:
    """Terms to egglog expressions; unsupported parts become ``(Opaque key)`` and come back whole."""

    def __init__(self) -> None:
        self.opaque: dict[str, Term] = {}
        self._keys: dict[Term, str] = {}

    def expr(self, t: Term) -> eb.Call:
        v = t.value
        if t.op == "const" and isinstance(v, bool):
            return _app("Bool", _lit(eb.Bool(v)))
        if t.op == "const" and isinstance(v, int) and _I64[0] <= v <= _I64[1]:
            return _app("Num", _lit(eb.Int(v)))
        if t.op == "name":
            return _app("Name", _lit(eb.String(str(v))))
        if t.op == "call" and v in _CALLS and len(t.args) == 2:
            return _app(_CALLS[v], *map(self.expr, t.args))
        if t.op in _BINARY and len(t.args) == 2:
            return _app(_BINARY[t.op], *map(self.expr, t.args))
        if t.op in _UNARY and len(t.args) == 1:
            return _app(_UNARY[t.op], self.expr(t.args[0]))
        key = self._keys.get(t)
        if key is None:
            key = self._keys[t] = f"#{len(self._keys)} {t}"
            self.opaque[key] = t
        return _app("Opaque", _lit(eb.String(key)))

    def term(self, dag: eb.TermDag, tid: int, memo: dict[int, Term]) -> Term:
        """The term for extracted node ``tid``; raises KeyError/TypeError on unknown shapes."""
        if tid in memo:
            return memo[tid]
        node = dag.get(tid)
        if not isinstance(node, eb.TermApp):
            raise TypeError(f"unexpected egglog node {node!r}")
        fn, args = node.name, node.args
        if fn in ("Num", "Bool", "Name", "Opaque"):
            lit = dag.get(args[0])
            val = lit.value.value
            out = (const(val) if fn in ("Num", "Bool") else name(val) if fn == "Name"
                   else self.opaque[val])
        else:
            kids = tuple(self.term(dag, a, memo) for a in args)
            if fn in _BACK and len(kids) == 2:
                out = Term(_BACK[fn], kids)
            elif fn in ("Neg", "Not") and len(kids) == 1:
                out = Term("-" if fn == "Neg" else "!", kids)
            elif fn in ("Min", "Max", "CeilDiv") and len(kids) == 2:
                out = call({"Min": "min", "Max": "max", "CeilDiv": "ceil_div"}[fn], *kids)
            else:
                raise KeyError(f"no term for egglog constructor {fn!r}")
        memo[tid] = out
        return out


# ------------------------------------------------------------------------------------ simplify

def _run_ruleset(eg: eb.EGraph, ruleset: str) -> eb.RunReport:
    run = eb.RunSchedule(eb.Run(_SPAN, eb.RunConfig(ruleset)))
    return eg.run_program(run)[0].report


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
                report = _run_ruleset(eg, ruleset)
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
    # Node costs are scaled so that literal size only breaks ties: among equally cheap forms,
    # prefer small constants (`(k + 1) % 4` over `(k + 9) % 4`) and non-negative ones (`i - 1`).
    def base_cost(sort: str, v: eb.Value) -> int:
        if sort != "i64":
            return _SCALE
        n = eg.value_to_i64(v)
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
            # unextractable (every node subsumed) or a shape with no term: keep the original
            out[t] = t
    return out


def simplify(terms: Sequence[Term], ranges: Mapping[str, Range], forms: Sequence[EggForm], *,
             iterations: int = 20, time_limit_s: float = 2.0, max_nodes: int = 200_000) -> SimplifyResult:
    """Simplify ``terms`` with the egglog ``forms`` in one e-graph, using range facts of names.

    Rewriting stops after ``iterations`` rounds, after ``time_limit_s`` seconds (checked between
    rounds) or once the e-graph holds more than ``max_nodes`` rows, whichever comes first.

    Raises :class:`EggRuleError` when a form does not parse or type-check. If egglog fails while
    running (a Rust panic or a failing primitive), the result maps every term to itself, sets
    ``error`` and emits a warning.
    """
    start = time.perf_counter()
    unique = list(dict.fromkeys(terms))
    result = SimplifyResult({t: t for t in unique})
    try:
        eg = eb.EGraph()
        info = _load(eg, forms)
        enc = _Encoder()
        lets = {t: f"{_LET_PREFIX}{i}" for i, t in enumerate(unique)}
        cmds = [eb.ActionCommand(eb.Let(_SPAN, lets[t], enc.expr(t))) for t in unique]
        names = {n for t in unique for n in t.names()} | set(ranges)
        eg.run_program(*cmds, *_range_facts(names, ranges))
        deadline = start + time_limit_s
        result.iterations = _run_rules(eg, info.rulesets, iterations, deadline, max_nodes,
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
