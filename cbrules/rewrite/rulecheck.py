"""Static checks of graph rules, before any graph is seen: every pattern element, guard, action and
template of a rule against the op, relation, action and function tables (:mod:`cbrules.rewrite.schema`),
with every variable bound before its use. Each problem is a :class:`RuleError` at ``file:line:col``
with a "did you mean" where it helps; the reader (:mod:`cbrules.rewrite.rulefile`) collects them all.
"""
from __future__ import annotations

import difflib
import heapq
import re
from typing import TYPE_CHECKING, Iterable, Optional

from ..ir.ops import OPS, SCOPES
from .schema import (ACTIONS, FUNCTIONS, NODE_FUNCTIONS, RELATIONS, STRUCTURAL_KEYS, VARIADIC_RELATIONS,
                     split_keys)
from .schema import settable as _settable
from ..sexpr import Atom, Expr, Pos, RuleError, SList, variables

if TYPE_CHECKING:
    from .rulefile import GraphRule

VALUE_PATTERN_HEADS = ("one-of", "not", "absent")
FILTER_HEADS = ("not", "any-of")


# difflib compares a word with each choice in about 2 us to 20 us: a file of thousands of unknown
# names against thousands of rules would take minutes. One suggestion looks at most at
# SUGGESTION_CHOICES choices of about the word's length; a caller with many errors suggests
# for the first SUGGESTIONS only (see :class:`Suggester`).
SUGGESTION_CHOICES = 500
SUGGESTIONS = 20


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``word``, or "" when none is close."""
    word, pool = str(word), list(choices)
    if len(pool) > SUGGESTION_CHOICES:  # a close match has a close length (ratio >= 0.6), most often the same start
        pool = heapq.nsmallest(SUGGESTION_CHOICES, pool, key=lambda c: (abs(len(c) - len(word)), c[:1] != word[:1]))
    close = difflib.get_close_matches(word, pool, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Suggester:
    """:func:`did_you_mean` for the first :data:`SUGGESTIONS` calls, then nothing: one file with
    thousands of unknown names gets its errors in time linear in their number."""

    def __init__(self) -> None:
        self.left = SUGGESTIONS

    def __call__(self, word: str, choices: Iterable[str]) -> str:
        if self.left <= 0:
            return ""
        self.left -= 1
        return did_you_mean(word, choices)


class UnboundVariable(RuleError):
    """A ?variable used where nothing binds it."""


class _Bound(set):
    """The ?variables bound so far in a rule, with the op of the node each names where known
    (``_`` for any op), so ``(set ?n :key ...)`` can be checked against the op's attributes."""

    def __init__(self, *args):
        super().__init__(*args)
        self.ops: dict[str, str] = {}

    def bind(self, var: str, op: str) -> None:
        self.add(var)
        self.ops.setdefault(var, op)


def _bind(bound: set, var: str, op: str = "_") -> None:
    if isinstance(bound, _Bound):
        bound.bind(var, op)
    else:
        bound.add(var)


def check_rule(r: GraphRule, errors: list[RuleError]) -> None:
    """Check every element, guard and action of ``r``, each error to ``errors``; a failed element
    still binds its ?variables, so one mistake is not reported again at every later use."""
    bound = _Bound()
    broken_match = False  # then an unbound variable later is most likely the same mistake
    for items, check in ((r.match, _check_match_element), (r.where, _check_value), (r.rewrite, _check_action)):
        for el in items:
            try:
                check(el, bound)
            except RuleError as e:
                if not (broken_match and isinstance(e, UnboundVariable)):
                    errors.append(e)
                broken_match |= items is r.match
                for v in variables(el):
                    _bind(bound, v)




def _no_attribute(where: Pos, op: str, key: str, allowed: Iterable[str]) -> RuleError:
    """\"op X has no attribute :k\", with the op's attributes and the closest one."""
    allowed = sorted(allowed)
    return RuleError(where, f"op {op!r} has no attribute :{key}" + did_you_mean(key, allowed)
                     + f"; its attributes: {', '.join(':' + a for a in allowed)} (see `cbrules ops`)")


def _expect_list(e: Expr, what: str) -> SList:
    if not isinstance(e, SList) or not len(e):
        raise RuleError(e.pos, f"expected {what}, got {e}")
    return e


def _check_node_pattern(e: Expr, bound: set[str], binds: bool = True) -> None:
    e = _expect_list(e, "a node pattern (OP ?var :attr pattern ...)")
    op = e.head()
    if op in FILTER_HEADS:
        for sub in e.items[1:]:
            _check_node_pattern(sub, bound, binds)
        return
    if op != "_" and op not in OPS:
        raise RuleError(e.pos, f"unknown op {op!r}" + did_you_mean(str(op), list(OPS) + list(RELATIONS)))
    pos, keys = split_keys(e.items, 1)
    for p in pos:
        if not (isinstance(p, Atom) and p.kind == "var"):
            raise RuleError(p.pos, f"in a node pattern, positional items must be ?variables, got {p}")
        if binds:
            _bind(bound, p.value, op)
    allowed = set(STRUCTURAL_KEYS) | _attributes(op)
    for k, v in keys.items():
        if k not in allowed:
            raise _no_attribute(key_pos(e, k), op, k, allowed)
        if k in STRUCTURAL_KEYS:
            _check_value(v, bound)
        else:
            _check_literal(op, k, v)  # a literal no value of the attribute can equal would never match
            _check_value_pattern(v, bound, binds)


def _attributes(op: str) -> set[str]:
    """The attributes a node of ``op`` may have (``_``: any op)."""
    return set(OPS[op].attributes) if op != "_" else {a for s in OPS.values() for a in s.attributes}


def key_pos(form: SList, key: str) -> Pos:
    """Where ``:key`` is written in ``form`` (errors about a key point at the key, not its value)."""
    for x in form.items:
        if isinstance(x, Atom) and x.kind == "kw" and x.value == key:
            return x.pos
    return form.pos


def _check_value_pattern(p: Expr, bound: set[str], binds: bool) -> None:
    if isinstance(p, Atom):
        if p.kind == "var" and binds:
            bound.add(p.value)
        return
    head = p.head()
    if head in VALUE_PATTERN_HEADS:
        for sub in p.items[1:]:
            _check_value_pattern(sub, bound, binds)
        return
    if p.items and isinstance(p.items[0], Atom) and p.items[0].kind == "kw":
        _, keys = split_keys(p.items, 0)
        for v in keys.values():
            _check_value_pattern(v, bound, binds)
        return
    raise RuleError(p.pos, f"unknown value pattern {p}; use ?x, _, a literal, (one-of ...), (not ...), "
                    "(absent) or (:key pattern ...)")


def _check_match_element(e: Expr, bound: set[str]) -> None:
    e = _expect_list(e, "a node pattern or relation")
    head = e.head()
    if head not in RELATIONS:
        _check_node_pattern(e, bound)
        return
    npos, required, optional = RELATIONS[head]
    pos, keys = split_keys(e.items, 1)
    if len(pos) != npos and not (head in VARIADIC_RELATIONS and len(pos) > npos):
        more = " or more" if head in VARIADIC_RELATIONS else ""
        raise RuleError(e.pos, f"relation {head} takes {npos}{more} positional argument(s), got {len(pos)}")
    for k in required:
        if k not in keys:
            raise RuleError(e.pos, f"relation {head} needs :{k}")
    for k, v in keys.items():
        if k not in required + optional:
            raise RuleError(key_pos(e, k), f"relation {head} has no key :{k}" + did_you_mean(k, required + optional))
        _check_value(v, bound)
    if head == "no" and len([k for k in keys if k in ("in", "around")]) != 1:
        raise RuleError(e.pos, "(no PATTERN :in ?scope) or (no PATTERN :around ?node)")
    if head in ("no", "count", "sum", "collect", "nearest"):
        pat_at = {"no": 0, "count": 1, "sum": 2, "collect": 2, "nearest": 1}[head]
        _check_node_pattern(pos[pat_at], set(bound), binds=True)
        if head == "nearest" and isinstance(pos[0], Atom) and pos[0].kind == "var":
            inner = pos[1].head() if isinstance(pos[1], SList) else "_"
            _bind(bound, pos[0].value, inner if inner in OPS else "_")
        elif head != "no":
            _check_value_pattern(pos[0], bound, True)
        return
    if head in ("next", "before", "between", "distinct"):
        _check_order_relation(head, pos, bound)
        return
    if head in ("reads", "writes"):
        _check_value(pos[1], bound)
    elif head in ("inside", "child"):
        _check_value(pos[1], bound)
    for p in pos[:1]:
        if isinstance(p, Atom) and p.kind == "var":
            _bind(bound, p.value)


def _check_order_relation(head: str, pos: list, bound: set) -> None:
    """next/before bind either side; between needs its two ends bound; distinct compares bound ones."""
    for p in pos:
        if not (isinstance(p, Atom) and p.kind == "var"):
            raise RuleError(p.pos, f"relation {head} takes ?variables, got {p}")
    if head in ("between", "distinct"):
        for p in pos[:2] if head == "between" else pos:
            if p.value not in bound:
                raise UnboundVariable(p.pos, f"relation {head}: {p.value} must be bound by an earlier element"
                                      + did_you_mean(p.value, bound))
    binds = {"next": pos, "before": pos, "between": pos[2:], "distinct": []}[head]
    for p in binds:
        if p.value not in bound:
            _bind(bound, p.value)


def _check_value(e: Expr, bound: set[str]) -> None:
    if isinstance(e, Atom):
        if e.kind == "var" and e.value not in bound:
            raise UnboundVariable(e.pos, f"unbound variable {e.value}" + did_you_mean(e.value, bound))
        return
    if not len(e):
        return
    head = e.head()
    if head is None:
        raise RuleError(e.pos, f"expected (FUNCTION args...), got {e}")
    # names and device functions reach the CUDA text: refuse literal ones here, with positions
    # (values computed at run time are checked when the rule runs, in cbrules.rewrite.values)
    from ..ir.names import BUILTINS, RULES, problem
    from ..ir.terms import DEVICE_FUNCTIONS, call_problem
    n = len(e) - 1
    if head in NODE_FUNCTIONS:
        want = 1 if head in ("id", "names") else 2
        if n != want:
            raise RuleError(e.pos, f"({head} ...) takes {want} argument(s), got {n}: "
                            + (f"({head} ?node)" if want == 1 else f"({head} ?node KEY)"))
        _check_value(e.items[1], bound)
        return
    if head not in FUNCTIONS:
        raise RuleError(e.pos, f"unknown function {head!r}" + did_you_mean(head, list(FUNCTIONS) + list(NODE_FUNCTIONS)))
    lo, hi, _ = FUNCTIONS[head]
    if n < lo or (hi is not None and n > hi):
        want = f"{lo}" if lo == hi else f"{lo}..{hi if hi is not None else 'n'}"
        raise RuleError(e.pos, f"({head} ...) takes {want} argument(s), got {n}")
    first = e.items[1] if n else None
    if isinstance(first, Atom) and first.kind != "var" and head in ("call", "var"):
        literal = {"true": True, "false": False, "nil": None}.get(first.value, first.value) \
            if first.kind == "sym" else first.value
        if head == "call":
            why = call_problem(literal, n - 1)
            if why:
                hint = did_you_mean(str(literal), DEVICE_FUNCTIONS) if literal not in DEVICE_FUNCTIONS else ""
                raise RuleError(first.pos, f"(call ...): {why}{hint}")
        elif literal not in BUILTINS and problem(literal, RULES):
            why, fix = problem(literal, RULES)  # type: ignore[misc]
            raise RuleError(first.pos, f"(var ...): name {literal!r} {why}; {fix}")
    if head in ("option", "option-default", "limit") and isinstance(first, Atom) and first.kind == "str":
        _check_table_name(head, first, e.items[2] if n > 1 else None)
    for a in e.items[1:]:
        _check_value(a, bound)


def _check_table_name(head: str, first: Atom, second: Optional[Expr]) -> None:
    """A literal limit or option a rule reads names one the tables declare (:data:`cbrules.ir.limits.RULE_LIMITS`,
    the options schema), and ``(option NAME KEY)`` a key that option has."""
    from ..ir import option_schema
    from ..ir.limits import RULE_LIMITS
    known = list(RULE_LIMITS) if head == "limit" else list(option_schema.names())
    if first.value not in known:
        what, where = ("limit", "the limits are") if head == "limit" else \
            ("circular-buffer option", "the options (rules/options.rules) are")
        raise RuleError(first.pos, f"({head} {first} ...): no {what} {first.value!r}" + did_you_mean(first.value, known)
                        + f"; {where} {', '.join(known)}")
    if head == "option" and isinstance(second, Atom) and second.kind == "str":
        try:
            option_schema.value_of(first.value, second.value)
        except ValueError as e:
            raise RuleError(second.pos, f"(option {first} {second}): {e}") from None


def _check_template(t: Expr, bound: set[str]) -> None:
    t = _expect_list(t, "a node template (OP :attr value ...)")
    op = t.head()
    if op not in OPS or op == "kernel":
        raise RuleError(t.pos, f"unknown op {op!r} in template" + did_you_mean(str(op), [o for o in OPS if o != "kernel"]))
    pos, keys = split_keys(t.items, 1)
    spec = OPS[op]
    for k, v in keys.items():
        if k == "as":
            if not (isinstance(v, Atom) and v.kind == "var"):
                raise RuleError(v.pos, ":as takes a ?variable")
            continue
        if k not in spec.attributes:
            raise _no_attribute(key_pos(t, k), op, k, spec.attributes)
        _check_literal(op, k, v)
        _check_value(v, bound)
    missing = [k for k in spec.required if k not in keys and k not in spec.defaults]
    if missing:
        raise RuleError(t.pos, f"template {op} lacks :{', :'.join(missing)}")
    if pos and op not in SCOPES:
        raise RuleError(pos[0].pos, f"op {op!r} is not a scope and cannot hold child templates")
    for child in pos:
        _check_template(child, bound)
    if "as" in keys:
        _bind(bound, keys["as"].value, op)


def _check_action(a: Expr, bound: set[str]) -> None:
    a = _expect_list(a, "an action")
    head = a.head()
    if head not in ACTIONS:
        raise RuleError(a.pos, f"unknown action {head!r}" + did_you_mean(str(head), ACTIONS))
    lo, hi, allowed, first_template = ACTIONS[head]
    pos, keys = split_keys(a.items, 1)
    if len(pos) < lo or (hi is not None and len(pos) > hi):
        want = f"{lo}" if lo == hi else f"at least {lo}"
        raise RuleError(a.pos, f"action {head} takes {want} argument(s), got {len(pos)}")
    if head == "let":
        if not (isinstance(pos[0], Atom) and pos[0].kind == "var"):
            raise RuleError(pos[0].pos, "(let ?var VALUE)")
        _check_value(pos[1], bound)
        bound.add(pos[0].value)
        return
    if allowed is not None:
        for k, v in keys.items():
            if k not in allowed:
                raise RuleError(key_pos(a, k), f"action {head} has no key :{k}" + did_you_mean(k, allowed))
    if head == "set":
        _check_set_keys(a, pos[0], keys, bound)
    if head == "set-option" and isinstance(bound, _Bound) and isinstance(pos[0], Atom) \
            and bound.ops.get(pos[0].value, "_") not in ("_", "for"):
        raise RuleError(pos[0].pos, f"set-option {pos[0]}: {pos[0]} is bound to a {bound.ops[pos[0].value]} node; "
                                    "options are a loop's (for) annotations")
    if head == "fail":
        _check_message(pos[0], bound)
    for i, p in enumerate(pos):
        if first_template is not None and i >= first_template:
            _check_template(p, bound)
        else:
            _check_value(p, bound)
    for k, v in keys.items():
        if k == "as":
            if not (isinstance(v, Atom) and v.kind == "var"):
                raise RuleError(v.pos, f"action {head}: :as takes a ?variable, got {v}")
            bound.add(v.value)
        elif k in ("keep",):
            _check_node_pattern(v, set(bound), binds=True)
        elif k == "substitute":
            sub = _expect_list(v, "(FILTER NAME TERM)")
            if len(sub) != 3:
                raise RuleError(v.pos, ":substitute takes (FILTER NAME TERM)")
            _check_node_pattern(sub[0], set(bound), binds=True)
            _check_value(sub[1], bound)
            _check_value(sub[2], bound)
        elif k == "set" and head in ("clone",):
            stray, sets = split_keys(_expect_list(v, "(:key value ...)").items, 0)
            if stray:
                raise RuleError(stray[0].pos, f"action clone: :set takes (:key value ...), got {stray[0]}")
            _check_set_keys(v, pos[0], sets, bound)  # the copy has the op of the scope it copies
            for sv in sets.values():
                _check_value(sv, bound)
        else:
            _check_value(v, bound)


def _check_set_keys(a: SList, target: Expr, keys: dict, bound: set) -> None:
    """``(set ?n :key V)``: every key an attribute of the op ``?n`` was bound to."""
    op = bound.ops.get(target.value, "_") if isinstance(bound, _Bound) and isinstance(target, Atom) else "_"
    allowed = _attributes(op)
    for k in keys:
        if k in ("op", "origin"):
            _settable(k, Atom(k, "kw", key_pos(a, k)))
        if k not in allowed:
            raise _no_attribute(key_pos(a, k), op, k, allowed)
        _check_literal(op, k, keys[k])


def _check_literal(op: str, key: str, value: Expr) -> None:
    """A literal of the wrong type or range for its attribute is refused here, at its position,
    not when the rule fires (:func:`cbrules.rewrite.rulelint.literal_problem`)."""
    from .rulelint import literal_problem
    bad = literal_problem(op, key, value)
    if bad:
        raise bad


def _check_message(msg: Expr, bound: set) -> None:
    """Every ``{?x}`` in a literal ``(fail "...")`` message names a bound variable."""
    if isinstance(msg, Atom) and msg.kind == "str":
        for name in re.findall(r"\{(\?[\w-]+)\}", msg.value):
            if name not in bound:
                raise RuleError(msg.pos, f"(fail ...): the message uses {{{name}}}, but {name} is not bound"
                                + did_you_mean(name, bound) + "; bind it in :match or with (let ...), or drop it")
