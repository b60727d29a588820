"""Bridge between index/predicate terms and egglog: load rule forms, simplify terms, extract.

:func:`simplify` works on an e-graph holding the egglog forms of the rule files (loaded by
:mod:`cbrules.rewrite.eggload`, each form on its own, so egglog's errors point at the user's file,
line and column, and kept between calls), inserts every term and the range facts of its names
with one seed rule (each distinct node once), runs the rulesets under round,
time and size budgets, and extracts every term's cheapest form with one reused extractor.
Rule files are egglog text: loading them never executes Python, and only declarations
(:data:`EGGLOG_ALLOWED`) are accepted, so loading computes nothing and touches no file; the bridge
alone runs the rulesets. A run that exceeds a budget leaves every term unchanged and emits an
:class:`EggBudgetWarning`.

``rules/index.rules`` declares what the bridge relies on: the ``Idx`` datatype, the ``lo``/``hi``
range functions and the ``ranges`` ruleset. Every declared ruleset runs, ``ranges`` first.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from egglog import bindings as eb

from ..ir.terms import Term, call, const, name
from ..shipped import RULES
from .eggload import (EGGLOG_ALLOWED, EggRuleError, EggPanic, fatal, load_forms, Loaded,  # noqa: F401 (public here too)
                      forms_from_file, load_check)
from .schema import EGGLOG_REFUSED, EggForm  # noqa: F401  (public here too)

SHIPPED_RULES = RULES / "index.rules"
SORT, RANGES_RULESET = "Idx", "ranges"
_I64 = (-(2 ** 63), 2 ** 63 - 1)
# the bridge's own declarations, added after the rule files' (`$`: no name a rule file can declare):
# the table each term is filed in, and the ruleset of the one rule that inserts them
_ROOT, _SEED = "$cbrules_root", "$cbrules_seed"
_SPAN = eb.PanicSpan()
_SCALE = 1000  # extraction cost units per declared :cost unit (literal size breaks ties)
_PASSES = 16  # runs of one ruleset per round; ranges converge in about term-depth passes


class EggBudgetWarning(RuntimeWarning):
    """An egglog run hit a budget (nodes, iterations or time); every term was left unchanged."""


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
    """Outcome of :func:`simplify`; on failure ``error`` (or on a budget hit ``budget``) is set and
    every term maps to itself."""

    terms: dict[Term, Term]
    rule_matches: dict[str, int] = field(default_factory=dict)
    iterations: int = 0
    seconds: float = 0.0
    error: str | None = None
    budget: str | None = None  # the budget hit, in words; then every term maps to itself


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
    """Terms to the actions of one seed rule and back; other parts travel as ``(Opaque key)`` and
    return whole.

    Every distinct node is bound once to a rule-local variable and every term is filed under its
    index in the bridge's root table: egglog's cost is per node inserted, shared or not, and the
    index terms of a kernel share most of their nodes (matmul: about 1,200 nodes, 180 distinct).
    """

    def __init__(self) -> None:
        self.opaque: dict[str, Term] = {}
        self.names: set[str] = set()  # the names the terms mention, for the range facts
        self.actions: list = []
        self._keys: dict[Term, str] = {}
        self._vars: dict[tuple, str] = {}  # structural key of a node -> the name of its variable
        self._objs: dict[str, eb.Var] = {}  # that name -> the variable
        self._done: dict[int, tuple[Term, str]] = {}  # id -> (term, name): terms share subterms

    def root(self, index: int, t: Term) -> None:
        """File ``t`` under ``index`` in the root table."""
        self.actions.append(eb.Set(_SPAN, _ROOT, [_lit(eb.Int(index))], self._objs[self.expr(t)]))

    def expr(self, t: Term) -> str:
        """The name of the rule-local variable bound to ``t``'s node (bound here if new)."""
        got = self._done.get(id(t))
        if got is None or got[0] is not t:
            got = self._done[id(t)] = (t, self._node(t))
        return got[1]

    def _node(self, t: Term) -> str:
        # the key names the node by its head and its children's variables; the egglog call is
        # built only for a node not seen before (most occurrences are shared subterms)
        op, v, arity = t.op, t.value, len(t.args)
        if op == "const" and isinstance(v, bool):
            key = ("Bool", v)
        elif op == "const" and isinstance(v, int) and _I64[0] <= v <= _I64[1]:
            key = ("Num", v)
        elif op == "name":
            key = ("Name", str(v))
        else:
            fn = (_CALLS.get(v) if op == "call" and arity == 2 else _BINARY.get(op) if arity == 2
                  else _UNARY.get(op) if arity == 1 else None)
            if fn:
                key = (fn, *[self.expr(a) for a in t.args])
            else:
                if t not in self._keys:
                    self._keys[t] = f"#{len(self._keys)} {t}"
                    self.opaque[self._keys[t]] = t
                key = ("Opaque", self._keys[t])
        var = self._vars.get(key)
        if var is None:
            head = key[0]
            if head == "Bool":
                call = _app(head, _lit(eb.Bool(v)))
            elif head == "Num":
                call = _app(head, _lit(eb.Int(v)))
            elif head in ("Name", "Opaque"):
                if head == "Name":
                    self.names.add(key[1])
                call = _app(head, _lit(eb.String(key[1])))
            else:
                call = _app(head, *[self._objs[k] for k in key[1:]])
            var = self._vars[key] = f"n{len(self._vars)}"
            self._objs[var] = eb.Var(_SPAN, var)
            self.actions.append(eb.Let(_SPAN, var, call))
        return var

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


@dataclass
class _Budgets:
    iterations: int
    deadline: float  # time.perf_counter() value
    time_limit_s: float
    max_nodes: int
    rows: int = 0  # e-graph rows at the previous check

    def exceeded(self, eg: eb.EGraph, grew: bool = True) -> str | None:
        """Which budget the next run could pass, in words, or None; ``grew``: the e-graph may
        have changed since the last check (a run that updated nothing leaves its size as checked).

        egglog cannot be stopped inside a run, so the node budget also refuses a run that would
        pass it if the e-graph grew as much as in the previous run (a rule joining new terms with
        each other grows it quadratically: 10, 100, 10^4, 10^8 rows)."""
        if time.perf_counter() > self.deadline:
            return f"time budget of {self.time_limit_s:g} s"
        if not grew:
            return None  # the size passed the last check and the previous run changed nothing
        rows, before = _size(eg), self.rows
        self.rows = rows
        growth = rows / before if before else 1.0
        if rows > self.max_nodes or rows * growth > self.max_nodes:
            return (f"node budget of {self.max_nodes} e-graph rows (it holds {rows}"
                    + (f", {growth:.1f} times as many as before the last run)" if growth > 1 else ")"))
        return None


_interrupt_ends_process = False


def interrupt_ends_process(on: bool) -> None:
    """With ``on``, Ctrl-C (SIGINT) during an egglog run ends the process at once, killed by the
    signal (a shell reports exit status 130), instead of being held until the run ends.

    egglog neither checks for signals nor reliably releases the GIL inside a run, so Python's
    handler cannot raise KeyboardInterrupt before the run returns, which may be never. The command
    line turns this on; a program lowering in-process keeps Python's handler (off by default)."""
    global _interrupt_ends_process
    _interrupt_ends_process = bool(on)


@contextlib.contextmanager
def _native_run() -> Iterator[None]:
    """The signal's default action (end the process) for SIGINT while egglog runs, if asked for."""
    if not _interrupt_ends_process or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_rules(eg: eb.EGraph, rulesets: Sequence[str], budgets: _Budgets,
               matches: dict[str, int]) -> tuple[int, str | None]:
    """Run rounds until every ruleset has run once since the last change; return how many rounds
    ran and the budget hit, if any.

    A round runs every ruleset in declaration order (``ranges`` first), each to a fixpoint
    capped at ``_PASSES`` runs, so later rulesets see the earlier ones' normal forms. A ruleset
    whose last run changed nothing and that has seen no change since is skipped: egglog matches
    only what is new since a rule last ran (semi-naive), so that run would find no match. Every
    run is a single egglog iteration and the budgets are checked before each one, since egglog
    cannot be interrupted inside a run.
    """
    order = sorted(rulesets, key=lambda rs: rs != RANGES_RULESET)  # stable: keeps file order
    rounds, grew, settled = 0, True, set()  # settled: rulesets that ran since the last change, finding none
    while rounds < budgets.iterations:
        rounds += 1
        for ruleset in order:
            if ruleset in settled:
                continue
            for _ in range(_PASSES):
                hit = budgets.exceeded(eg, grew)
                if hit:
                    return rounds, hit
                with _native_run():
                    out = eg.run_program(eb.RunSchedule(eb.Run(_SPAN, eb.RunConfig(ruleset))))
                report = out[0].report
                for rule, n in report.num_matches_per_rule.items():
                    matches[rule] = matches.get(rule, 0) + n
                grew = report.updated
                if not report.updated:
                    settled.add(ruleset)
                    break
                settled.clear()
            if len(settled) == len(order):
                return rounds, None  # saturated: no ruleset has anything new to match
    return rounds, f"iteration budget of {budgets.iterations} rounds (still rewriting)"


def _range_facts(names: set[str], ranges: Mapping[str, Range]) -> list[eb.Set]:
    facts = []
    for nm in sorted(names):
        for r in (BUILTIN_RANGES.get(nm), ranges.get(nm)):
            for fn, bound in (("lo", r and r.lo), ("hi", r and r.hi)):
                if bound is not None and _I64[0] <= bound <= _I64[1]:
                    key = _app("Name", _lit(eb.String(nm)))
                    facts.append(eb.Set(_SPAN, fn, [key], _lit(eb.Int(bound))))
    return facts


def _extract(eg: eb.EGraph, enc: _Encoder, terms: Sequence[Term], costs: Mapping[str, int]) -> dict[Term, Term]:
    """Cheapest form of every term (filed under its index), with one extractor (costs computed once)."""
    # Among equally cheap forms prefer small constants (`(k + 1) % 4` over `(k + 9) % 4`) and
    # non-negative ones (`i - 1` over `i + -1`): literal size adds less than one node's cost.
    def base_cost(sort: str, v: eb.Value) -> int:
        n = eg.value_to_i64(v) if sort == "i64" else 0
        return _SCALE + abs(n).bit_length() + (8 if n < 0 else 0)

    model = eb.CostModel(lambda _fn, head, kids: head + sum(kids),
                         lambda fn, _args: _SCALE * costs.get(fn, 1),
                         lambda _sort, _v, kids: sum(kids), base_cost)
    extractor = eb.Extractor([SORT], eg, model)
    # every term's e-class from one snapshot of the root table (a lookup per term costs ten times more)
    roots = {eg.value_to_i64(row.inputs[0]): row.output for row in eg.freeze().functions[_ROOT].rows}
    dag, memo, out = eb.TermDag(), {}, {}
    for i, t in enumerate(terms):
        try:
            got = enc.term(dag, extractor.extract_best(eg, dag, roots[i], SORT)[1], memo)
            out[t] = t if got == t else got  # unchanged: the caller's own term, so `is` tells
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            out[t] = t  # unextractable (all its nodes subsumed) or a shape with no term
    return out


def simplify(terms: Sequence[Term], ranges: Mapping[str, Range], forms: Sequence[EggForm], *,
             iterations: int = 20, time_limit_s: float = 2.0, max_nodes: int = 200_000) -> SimplifyResult:
    """Simplify ``terms`` with the egglog ``forms`` in one e-graph, using range facts of names.

    Budgets: ``iterations`` rounds, ``time_limit_s`` seconds and ``max_nodes`` e-graph rows,
    checked before every single-iteration run. A run that has not saturated when it hits one
    keeps every term unchanged (never half-simplified), sets ``budget`` and emits an
    :class:`EggBudgetWarning` naming the budget. Raises :class:`EggRuleError` when a form does
    not parse or type-check. If egglog fails while running (a Rust panic, a failing primitive),
    every term maps to itself, ``error`` is set and a ``RuntimeWarning`` is emitted.
    """
    start = time.perf_counter()
    result = SimplifyResult({t: t for t in terms})  # every term to itself until extracted
    unique = list(result.terms)
    key = tuple(forms)
    try:
        eg, info = _base(key)
        eg.run_program(eb.Push(1))  # the terms, facts and rewrites of this call are popped below
    except EggRuleError:
        raise
    except BaseException as e:
        if fatal(e):
            raise
        return _failed(result, e, start)
    try:
        enc = _Encoder()
        for i, t in enumerate(unique):
            enc.root(i, t)
        # one rule without a query, run once: a top-level command per term costs several times more
        named = enc.names | (set(ranges) if info.rules_mention_names else set())  # names a rule builds too
        seed = enc.actions + _range_facts(named, ranges)
        eg.run_program(eb.RuleCommand(eb.Rule(_SPAN, seed, [], "", _SEED)),
                       eb.RunSchedule(eb.Run(_SPAN, eb.RunConfig(_SEED))))
        budgets = _Budgets(iterations, start + time_limit_s, time_limit_s, max_nodes)
        result.iterations, result.budget = _run_rules(eg, info.rulesets, budgets, result.rule_matches)
        if result.budget:
            warnings.warn(f"egglog stopped at its {result.budget}; {len(unique)} term(s) left unsimplified",
                          EggBudgetWarning, stacklevel=2)
        else:
            result.terms = _extract(eg, enc, unique, info.costs)
        eg.run_program(eb.Pop(_SPAN, 1))
    except BaseException as e:  # pyo3's PanicException derives from BaseException
        _BASES.pop(key, None)  # a run that failed may have left the e-graph in any state
        if fatal(e):
            raise
        return _failed(result, e, start)
    result.seconds = time.perf_counter() - start
    return result


_BASES: dict = {}  # forms -> (e-graph holding just the loaded declarations, what they declare)
_BASES_MAX = 4


def _base(forms: tuple) -> tuple[eb.EGraph, Loaded]:
    """An e-graph with ``forms`` loaded, kept between calls: loading (about 20 ms for the shipped
    rules) costs more than simplifying a kernel's terms, so each call pushes, works, and pops."""
    if forms not in _BASES:
        eg = eb.EGraph()
        try:
            info = load_forms(eg, forms)
            eg.run_program(*eg.parse_program(f"(function {_ROOT} (i64) {SORT} :merge old) (ruleset {_SEED})", None))
        except EggPanic as e:
            raise RuntimeError(str(e)) from e
        _BASES[forms] = (eg, info)
        while len(_BASES) > _BASES_MAX:
            del _BASES[next(iter(_BASES))]
    return _BASES[forms]


def _failed(result: SimplifyResult, e: BaseException, start: float) -> SimplifyResult:
    result.terms = {t: t for t in result.terms}
    result.error = f"egglog failed, terms left unchanged: {type(e).__name__}: {e}"
    warnings.warn(result.error, RuntimeWarning, stacklevel=3)
    result.seconds = time.perf_counter() - start
    return result


class Oracle:
    """Decides predicates for the rules' guards (``provably-equal``, ``provably-le``): a predicate
    holds when egglog simplifies it to ``true`` under the range facts. Answers are cached by the
    predicate and the ranges of its names, so a guard asked again on every match costs one lookup;
    an undecided (or budget-stopped) predicate is false, which a guard treats as "not proven"."""

    def __init__(self, forms: Sequence[EggForm]):
        self.forms = tuple(forms)
        self._cache: dict[tuple, bool] = {}
        self.asked = 0  # predicates sent to egglog (cache misses), for the cost figures

    def decide(self, pred: Term, ranges: Mapping[str, Range]) -> bool:
        """True when ``pred`` is proven true for every value of its names within ``ranges``."""
        key = (pred, tuple(sorted((n, ranges[n]) for n in pred.names() if n in ranges)))
        if key not in self._cache:
            self.asked += 1
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", EggBudgetWarning)
                warnings.simplefilter("ignore", RuntimeWarning)
                out = simplify([pred], dict(key[1]), self.forms, time_limit_s=0.5)
            self._cache[key] = out.error is None and out.budget is None and out.terms[pred] == const(True)
        return self._cache[key]
