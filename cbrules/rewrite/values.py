"""The value language of rule files: guards (``:where``), ``let`` and attribute values.

An expression is a literal, a pattern variable, or ``(FN args...)`` with FN from :data:`FUNCTIONS`.
Arithmetic on ints folds to ints (C semantics for ``/`` and ``%``); as soon as a term is involved it
builds a term, so ``(% (+ ?i ?P) ?S)`` is an index term the egglog rules later simplify.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ..ir.names import IdentifierError, check_term_name
from ..ir import option_schema
from ..ir.limits import RULE_LIMITS
from ..ir.ops import DTYPE_BYTES, term_values
from ..sexpr import Atom, Expr, RuleError, derived
from ..ir.terms import (DeviceFunctionError, Term, as_term, call, coefficient, const, divisor,
                        evaluate as eval_term, name, substitute)


@dataclass(frozen=True)
class NodeRef:
    """A pattern variable bound to a graph node (distinct from ints)."""

    id: int

    def __init__(self, id: int):
        self.__dict__["id"] = id  # as Term's: the matcher makes one per candidate it binds

    def __str__(self) -> str:
        return f"#{self.id}"


def _is_term(*xs) -> bool:
    return any(isinstance(x, Term) for x in xs)


def _const_value(x):
    """An int for ints and constant terms, else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, Term):
        if x.op == "name":  # what most index terms hold: decided without an exception
            return None
        if x.op == "const":
            v = x.value
            return v if isinstance(v, int) and not isinstance(v, bool) else None
        if next(x.names(), None) is not None:  # a name has no value here: evaluating it would raise
            return None
        try:
            v = eval_term(x, {})
            return v if isinstance(v, int) and not isinstance(v, bool) else None
        except (KeyError, ZeroDivisionError):
            return None
    return None


# Bits an integer a rule computes may have: twice int64's, room for an intermediate product; a rule
# that squares its own result (a `let` chain, a value fed back each firing) doubles its bits each
# time, and Python's integers grow until memory runs out.
MAX_VALUE_BITS = 128


def _checked_bits(op: str, a: int, b: int) -> None:
    bits = a.bit_length() + b.bit_length() if op == "*" else max(a.bit_length(), b.bit_length()) + 1
    if bits > MAX_VALUE_BITS:
        raise ValueError(f"{a} {op} {b} would be an integer of up to {bits} bits, more than the {MAX_VALUE_BITS} a "
                         "rule value may have; a rule probably squares or doubles its own result: guard it")


def _arith(op: str) -> Callable:
    def fn(*xs):
        if Term in map(type, xs):  # a term among them (a type test in C: every value a template computes asks)
            values = [_const_value(x) for x in xs]
            if None not in values:
                xs = values  # constants fold now, not in egglog
            else:
                t = as_term(xs[0])
                for x in xs[1:]:
                    t = Term(op, (t, as_term(x)))
                return t
        acc = xs[0]
        for x in xs[1:]:
            if op in "+-*" and isinstance(acc, int) and isinstance(x, int):
                _checked_bits(op, acc, x)
            acc = eval_term(Term(op, (const(acc), const(x))), {})
        return acc
    return fn


_C_OPS = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "=": "==", "!=": "!="}
_PY_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "=": operator.eq,
               "!=": operator.ne}


def _compare(op: str) -> Callable:
    """Compare values; terms not known at lowering time give a predicate term instead of a bool
    (a guard treats such an undecided comparison as false)."""
    def fn(a, b):
        if _is_term(a, b):
            ca, cb = _const_value(a), _const_value(b)
            if ca is None or cb is None:
                if op in ("=", "!=") and as_term(a) == as_term(b):
                    return op == "="
                return Term(_C_OPS[op], (as_term(a), as_term(b)))
            a, b = ca, cb
        return _PY_COMPARE[op](a, b)
    return fn


def _product(xs) -> Any:
    return _arith("*")(*xs) if xs else 1


def _min_max(fn_name: str) -> Callable:
    def fn(*xs):
        if _is_term(*xs):
            vals = [_const_value(x) for x in xs]
            if None in vals:  # min/max of the device take two operands: nest them
                t = as_term(xs[0])
                for x in xs[1:]:
                    t = call(fn_name, t, x)
                return t
            xs = vals
        return min(xs) if fn_name == "min" else max(xs)
    return fn


# name -> (min arity, max arity or None, implementation); ``and``/``or``/``if`` are lazy (in _apply)
FUNCTIONS: dict[str, tuple[int, int | None, Callable | None]] = {
    "+": (1, None, _arith("+")), "-": (1, None, _arith("-")), "*": (1, None, _arith("*")),
    "/": (2, 2, _arith("/")), "%": (2, 2, _arith("%")),
    "min": (1, None, _min_max("min")), "max": (1, None, _min_max("max")),
    "<": (2, 2, _compare("<")), "<=": (2, 2, _compare("<=")), ">": (2, 2, _compare(">")),
    ">=": (2, 2, _compare(">=")), "=": (2, 2, _compare("=")), "!=": (2, 2, _compare("!=")),
    "and": (0, None, None), "or": (0, None, None), "not": (1, 1, lambda x: not x), "if": (3, 3, None),
    "str": (0, None, lambda *xs: "".join(str(x) for x in xs)),
    "tuple": (0, None, lambda *xs: tuple(xs)),
    "prepend": (2, 2, lambda x, t: (x, *t)), "append": (2, 2, lambda t, x: (*t, x)),
    "concat": (0, None, lambda *ts: tuple(x for t in ts for x in t)),
    "product": (1, 1, _product), "len": (1, 1, len), "nth": (2, 2, lambda t, i: t[i]),
    "dict": (0, None, lambda *kv: dict(zip(kv[::2], kv[1::2]))),
    "assoc": (3, 3, lambda d, k, v: {**(d or {}), k: v}),
    "set-nth": (3, 3, lambda t, i, v: tuple(v if j == (i % len(t)) else x for j, x in enumerate(t))),
    "get": (2, 3, lambda d, k, *default: (d or {}).get(k, *default) if default else (d or {}).get(k)),
    "bytes-of": (1, 1, lambda dtype: DTYPE_BYTES[dtype]),
    "limit": (1, 1, lambda what: _limit(what)),  # a hardware limit by name (cbrules.ir.limits.RULE_LIMITS)
    # a circular-buffer option's bound or words (min, max, true, choices, a literal default), and its default
    # for a loop's options (a dict), from the options schema (rules/options.rules, cbrules.ir.option_schema)
    "option": (2, 2, lambda name, key: _option(option_schema.value_of, name, key)),
    "option-default": (2, 2, lambda name, given: _option(option_schema.default, name, given or {})),
    "known": (1, 1, lambda x: _const_value(x) is not None),
    "int": (1, 1, lambda x: _const_value(x)),
    "term": (1, 1, lambda x: as_term(x)),
    # only identifiers (or builtins) become names, only the device-function table is callable:
    # nothing a rule computes reaches the CUDA text unchecked
    "var": (1, 1, lambda s: name(check_term_name(s, "(var ...)"))),
    "call": (1, None, lambda fn, *args: call(fn, *args)),
    "lt": (2, 2, lambda a, b: Term("<", (as_term(a), as_term(b)))),
    "eq": (2, 2, lambda a, b: Term("==", (as_term(a), as_term(b)))),
    "all": (0, None, lambda *xs: _conj(xs)),
    "is-none": (1, 1, lambda x: x is None),
    "is-tuple": (1, 1, lambda x: isinstance(x, tuple)),
    "is-int": (1, 1, lambda x: isinstance(x, int) and not isinstance(x, bool)),
    "member": (2, 2, lambda x, xs: x in xs),
    # linear facts of index terms, decided from their structure (cbrules.ir.terms): the integer
    # coefficient of a name (nil when the term is not linear in it), the term with a name replaced,
    # whether a term is a multiple of an int for every value of its names, and whether it uses any
    # of a tuple of names
    "coefficient": (2, 2, lambda t, v: coefficient(as_term(t), check_term_name(v, "(coefficient ...)"))),
    "substitute": (3, 3, lambda t, v, x: substitute(as_term(t), {check_term_name(v, "(substitute ...)"): as_term(x)})),
    "multiple-of": (2, 2, lambda t, k: k > 0 and (divisor(as_term(t)) % k == 0)),
    "mentions": (2, 2, lambda t, names: not set(as_term(t).names()).isdisjoint(names)),
    # proven by egglog under the range facts (see ORACLE_FUNCTIONS): evaluated in `evaluate`
    "provably-equal": (2, 2, None), "provably-le": (2, 2, None),
}


def _limit(what: Any) -> int:
    if what not in RULE_LIMITS:
        raise ValueError(f"no limit {what!r}; the limits are {', '.join(RULE_LIMITS)}")
    return RULE_LIMITS[what]


def _option(fn: Callable, name: Any, arg: Any) -> Any:
    try:
        return fn(name, arg)
    except KeyError as e:  # an option the schema does not declare: a ValueError, as a bad limit is
        raise ValueError(e.args[0]) from None


def _conj(xs) -> Term:
    ts = [as_term(x) for x in xs]
    if not ts:
        return const(True)
    t = ts[0]
    for x in ts[1:]:
        t = Term("&&", (t, x))
    return t


# attribute access on bound nodes lives with the graph; the engine supplies it as ``attr``
NODE_FUNCTIONS = ("attr", "has", "id", "names", "param")  # names: the names a node's terms use
# guards decided by egglog under the graph's range facts (the matcher supplies the oracle as
# ``Env.decide``): true only when proven; equal terms and constants are decided without egglog
ORACLE_FUNCTIONS = {"provably-equal": "==", "provably-le": "<="}


class Env:
    """Bindings of pattern variables plus access to node attributes for ``attr``/``has``."""

    def __init__(self, bindings: Mapping[str, Any], node_attrs: Callable[[int], Mapping[str, Any]],
                 decide: Callable[[Term], bool] | None = None):
        self.bindings = bindings  # read only: matcher and actions make one per evaluation, so no copy
        self.node_attrs = node_attrs
        self.decide = decide  # proves a predicate term under the graph's range facts, if given


def _provably(op: str, a: Any, b: Any, decide: Callable[[Term], bool] | None) -> bool:
    """``a op b`` for every value of the names in them: decided structurally or by constants when
    possible, else by the oracle; never true when neither can prove it."""
    if isinstance(a, bool) or isinstance(b, bool) or not all(isinstance(x, (int, Term)) for x in (a, b)):
        raise TypeError(f"needs integers or index terms, got {a!r} and {b!r}")
    ta, tb = as_term(a), as_term(b)
    if ta == tb:
        return True
    ca, cb = _const_value(ta), _const_value(tb)
    if ca is not None and cb is not None:
        return ca == cb if op == "==" else ca <= cb
    return decide is not None and decide(Term(op, (ta, tb)))


def holds(e: Expr, env: Env) -> bool:
    """A guard: true only for a decided true value (an undecided predicate term is not true)."""
    v = compiled(e)(env)
    return v is True or (not isinstance(v, (Term, bool)) and bool(v))


_SYMBOLS = {"true": True, "false": False, "nil": None}


# the functions applied to their evaluated arguments (not lazy, not reading a node, not egglog's)
_PLAIN = {name: fn for name, (_, _, fn) in FUNCTIONS.items()
          if fn is not None and name not in NODE_FUNCTIONS and name not in ORACLE_FUNCTIONS}


def evaluate(e: Expr, env: Env) -> Any:
    """Value of a rule-file expression under ``env``; errors carry the expression's position."""
    if isinstance(e, Atom):
        if e.kind == "var":
            if e.value not in env.bindings:
                raise RuleError(e.pos, f"unbound variable {e.value}")
            return env.bindings[e.value]
        if e.kind == "sym":
            return _SYMBOLS.get(e.value, e.value)
        return e.value
    items = e.items  # what e.head() and len(e) read, without their calls (this runs for every value)
    if not items:
        return ()
    head = items[0].value if isinstance(items[0], Atom) and items[0].kind == "sym" else None
    args = items[1:]
    try:
        plain = _PLAIN.get(head)
        if plain is not None:  # most values: a function of its evaluated arguments
            return plain(*[evaluate(a, env) for a in args])
        if head in ("and", "or"):
            for a in args:
                v = evaluate(a, env)
                if bool(v) != (head == "and"):
                    return v
            return head == "and"
        if head == "if":
            return evaluate(args[1] if evaluate(args[0], env) else args[2], env)
        if head in ORACLE_FUNCTIONS:
            return _provably(ORACLE_FUNCTIONS[head], evaluate(args[0], env), evaluate(args[1], env), env.decide)
        if head in NODE_FUNCTIONS:
            node = evaluate(args[0], env)
            if not isinstance(node, NodeRef):
                raise RuleError(e.pos, f"({head} ...) needs a node, got {node!r}")
            if head == "id":
                return node.id
            if head == "names":
                attrs = env.node_attrs(node.id)
                return tuple(sorted({n for t in term_values(attrs["op"], attrs) for n in t.names()}))
            key = args[1].value if isinstance(args[1], Atom) else evaluate(args[1], env)
            attrs = env.node_attrs(node.id)
            if head == "param":  # (param ?K NAME): the kernel parameter NAME as a dict, nil if none
                key = evaluate(args[1], env)
                p = next((p for p in attrs.get("params", ()) if p.name == key), None)
                return None if p is None else {"name": p.name, "kind": p.kind, "dtype": p.dtype}
            return (key in attrs and attrs[key] is not None) if head == "has" else attrs.get(key)
        raise RuleError(e.pos, f"unknown function {head!r}")  # every known one is handled above
    except RuleError:
        raise
    except Exception as x:
        raise _failed(e.pos, head, x) from None


def _failed(pos, head: Optional[str], x: Exception) -> RuleError:
    """The error for function ``head`` raising ``x`` at ``pos``: a name or call that may not reach CUDA
    says why; any other (a wrong value reaching a function) says where and with what."""
    if isinstance(x, IdentifierError):
        return RuleError(pos, str(x))
    if isinstance(x, DeviceFunctionError):
        return RuleError(pos, f"({head} ...): {x}")
    return RuleError(pos, f"({head} ...) failed: {x}")


def compiled(e: Expr) -> Callable[[Env], Any]:
    """``e`` as a function of an :class:`Env` that gives what :func:`evaluate` gives (the same values,
    the same errors): the literals, variables and plain functions of the expression read once, so
    that evaluating it again costs the calls alone (kept on the expression's text: rule files are
    parsed once, and an action's values and a rule's guards are evaluated once per application or
    match). Lazy, node and oracle functions are evaluated by :func:`evaluate`."""
    memo = derived(e)
    fn = memo.get("value")
    if fn is None:
        fn = memo["value"] = _compile(e)
    return fn


def _compile(e: Expr) -> Callable[[Env], Any]:
    if isinstance(e, Atom):
        if e.kind == "var":
            var, pos = e.value, e.pos

            def bound(env: Env) -> Any:
                b = env.bindings
                if var not in b:
                    raise RuleError(pos, f"unbound variable {var}")
                return b[var]
            return bound
        value = _SYMBOLS.get(e.value, e.value) if e.kind == "sym" else e.value
        return lambda env: value
    items = e.items
    head = items[0].value if items and isinstance(items[0], Atom) and items[0].kind == "sym" else None
    plain = _PLAIN.get(head)
    if plain is None:  # (), lazy, node and oracle functions, unknown heads: as evaluate reads them
        return lambda env: evaluate(e, env)
    args = [_compile(a) for a in items[1:]]
    pos = e.pos

    def apply(env: Env) -> Any:
        try:
            return plain(*[a(env) for a in args])
        except RuleError:
            raise
        except Exception as x:
            raise _failed(pos, head, x) from None
    return apply
