"""Value patterns: how one attribute value is matched in a rule's ``:match`` -- ``?x`` (bind, or compare
when bound; terms compare by value), ``_``, a literal, ``(one-of a b)``, ``(not P)``, ``(absent)``, and
``(:key P ...)`` for dictionary attributes such as annotations -- and the explanation of the first key
that fails (for ``why-not``)."""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..ir.terms import Term, as_term
from .schema import split_keys, split_keys_once
from ..sexpr import Atom, Expr, SList, derived

MISSING = object()

def short_text(v: Any, limit: int = 80) -> str:
    if isinstance(v, str):
        text = f'"{v}"'
    elif isinstance(v, dict):
        text = "{" + ", ".join(f"{k}: {short_text(x, limit)}" for k, x in v.items()) + "}"
    else:
        text = str(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def first_miss(path: str, p: Expr, value: Any, b: dict) -> str:
    """Expected vs actual at the innermost key of a (:key P ...) pattern that fails."""
    if isinstance(p, SList) and p.items and isinstance(p.items[0], Atom) and p.items[0].kind == "kw" \
            and isinstance(value, dict):
        _, keys = split_keys(p.items, 0)
        for k, sub in keys.items():
            got = value.get(k, MISSING)
            nb = match_value(sub, got, b)
            if nb is None:
                return first_miss(f"{path} :{k}", sub, got, b)
            b = nb
    return f"{path}: wants {p}, has {'nothing' if value is MISSING else short_text(value)}"


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, (Term, int)) and isinstance(b, (Term, int)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return as_term(a) == as_term(b)
    return a == b


def match_value(p: Expr, value: Any, b: dict) -> Optional[dict]:
    """Match one attribute value against a value pattern; returns extended bindings or None."""
    return compiled(p)(value, b)


def compiled(p: Expr) -> Callable[[Any, dict], Optional[dict]]:
    """``p`` as a function of (value, bindings) doing what :func:`_interpret` does, kept on the
    pattern's text: the matcher tries each pattern of a rule on every candidate node, and reading the
    pattern's text again each time was most of the cost."""
    memo = derived(p)
    fn = memo.get("pattern")
    if fn is None:
        fn = memo["pattern"] = _compile(p)
    return fn


def _compile(p: Expr) -> Callable[[Any, dict], Optional[dict]]:
    if isinstance(p, Atom):
        if p.kind == "var":
            name = p.value

            def var(value: Any, b: dict) -> Optional[dict]:
                if name in b:
                    return b if value is not MISSING and _equal(b[name], value) else None
                return None if value is MISSING else {**b, name: value}
            return var
        if p.kind == "sym" and p.value == "_":
            return lambda value, b: b if value is not MISSING else None
        lit = {"true": True, "false": False}.get(p.value, p.value) if p.kind == "sym" else p.value
        if isinstance(lit, str):  # what _equal does for text: MISSING equals no text
            return lambda value, b: b if lit == value else None
        return lambda value, b: b if value is not MISSING and _equal(lit, value) else None
    head = p.head()
    if head == "absent":
        return lambda value, b: b if value is MISSING or value is None else None
    if head == "not" and len(p.items) == 2:
        inner = compiled(p.items[1])
        return lambda value, b: b if inner(value, b) is None else None
    if head == "one-of":
        alts = [compiled(alt) for alt in p.items[1:]]

        def one_of(value: Any, b: dict) -> Optional[dict]:
            for f in alts:
                r = f(value, b)
                if r is not None:
                    return r
            return None
        return one_of
    if head == "not" or not (p.items and isinstance(p.items[0], Atom) and p.items[0].kind == "kw"):
        # malformed or odd forms: _interpret raises (or not) where it always did
        return lambda value, b: _interpret(p, value, b)
    subs: list = []  # (key, its function) once the pattern is first tried on a dictionary

    def dictionary(value: Any, b: dict) -> Optional[dict]:
        if not isinstance(value, dict):
            return None
        if not subs:
            subs.extend((k, compiled(sub)) for k, sub in split_keys_once(p, 0)[1].items())
        for k, f in subs:
            b = f(value.get(k, MISSING), b)
            if b is None:
                return None
        return b
    return dictionary


def _interpret(p: Expr, value: Any, b: dict) -> Optional[dict]:
    if isinstance(p, Atom):
        return compiled(p)(value, b)
    head = p.head()
    if head == "one-of":
        for alt in p.items[1:]:
            r = match_value(alt, value, b)
            if r is not None:
                return r
        return None
    if head == "not":
        return b if match_value(p.items[1], value, b) is None else None
    if head == "absent":
        return b if value is MISSING or value is None else None
    # (:key P ...) -- a dictionary attribute
    if not isinstance(value, dict):
        return None
    _, keys = split_keys_once(p, 0)
    for k, sub in keys.items():
        b = match_value(sub, value.get(k, MISSING), b)
        if b is None:
            return None
    return b
