"""The egglog step of lowering: the graph's terms simplified once, after the last phase, and the
range facts that egglog (and the rules' ``provably-*`` guards) reason under.

Each loop's variable is told apart by its loop (``i`` in loop #12 is ``i@12``), so the prologue,
main loop and epilogue, which share a variable name, each get their own range; each term is then
asked in its own names (:func:`_questioner`), so the same question from many loops is asked once. A
term set simplified before under the same ranges and rules costs a lookup (lowering the same kernel
again: the checker, the CLI, repeated lowerings).
"""
from __future__ import annotations

import functools

from ..ir.graph import BUILTINS, KernelGraph
from ..ir.ops import OPS, SCOPES
from ..ir.terms import Term, evaluate, substitute
from ..ir.terms import name as name_term


def term_ranges(kg: KernelGraph) -> dict:
    """Inclusive value ranges of names: loop variables from their bounds, builtins from the launch
    shape, symbols (extents) non-negative. A name bound by several loops gets the union."""
    from .egg import Range
    bx, by, bz = kg.kernel()["block"]
    ranges: dict[str, Range] = {f"threadIdx.{a}": Range(0, d - 1) for a, d in zip("xyz", (bx, by, bz))}
    ranges.update({f"blockIdx.{a}": Range(0, None) for a in "xyz"})
    ranges.update({p.name: Range(0, None) for p in kg.params().values() if p.kind == "symbol" and p.dtype == "int32"})

    loops: dict[str, list] = {}
    for n in kg.nodes("for"):
        d = kg[n]
        lo = _const(d["start"])
        hi = _const(d["stop"])
        loops.setdefault(d["var"], []).append(Range(lo, None if hi is None else hi - 1))
    for var, rs in loops.items():
        los = [r.lo for r in rs]
        his = [r.hi for r in rs]
        ranges[var] = Range(None if None in los else min(los), None if None in his else max(his))
    return {k: v for k, v in ranges.items() if k not in BUILTINS or v.lo is not None}


@functools.lru_cache(maxsize=8)
def oracle_for(forms: tuple):
    """One oracle per rule set, so its answers are shared by every lowering with those rules."""
    from .egg import Oracle
    return Oracle(forms)


SIMPLIFIED: dict = {}  # (terms, ranges, forms) -> SimplifyResult, most recent last
_SIMPLIFIED_MAX = 256


class _Key:
    """A result cache key whose hash is computed once: hashing a term walks all of it, and a key
    holds every term of a kernel (matmul: about 1,200 nodes)."""

    __slots__ = ("parts", "_hash")

    def __init__(self, parts: tuple):
        self.parts, self._hash = parts, hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self._hash == other._hash and self.parts == other.parts


def _simplify_cached(terms: list, ranges: dict, forms: tuple):
    """egglog's result for this term set under these ranges and forms; lowering the same kernel
    again (the checker, every CLI query) costs a lookup. Results that hit a budget
    or failed are not kept, so their warning shows every time."""
    from .egg import simplify
    key = _Key((tuple(dict.fromkeys(terms)), tuple(sorted(ranges.items())), tuple(forms)))
    if key in SIMPLIFIED:
        SIMPLIFIED[key] = SIMPLIFIED.pop(key)
        return SIMPLIFIED[key]
    result = simplify(terms, ranges, forms)
    if result.error is None and result.budget is None:
        SIMPLIFIED[key] = result
        while len(SIMPLIFIED) > _SIMPLIFIED_MAX:
            del SIMPLIFIED[next(iter(SIMPLIFIED))]
    return result


def _loop_names(kg: KernelGraph) -> tuple[dict[int, dict[str, Term]], dict, set]:
    """Per node, its enclosing loops' variables renamed after the loop (``i`` in loop #12 becomes
    ``i@12``), the range of each renamed variable from its own loop's bounds, and the variables
    renamed. The prologue, main loop and epilogue share a variable name but not a range: per loop, the
    prologue's ``i % S`` (i < P < S) folds to ``i`` and its parity to 0. Nodes of one scope share one
    mapping; an explicit stack, children in any order (each node's mapping is its scopes' alone)."""
    from .egg import Range
    scoped: dict[int, dict[str, Term]] = {}
    ranges: dict = {}
    renamed: set[str] = set()
    nodes = kg.node_table
    stack: list[tuple[int, dict[str, Term]]] = [(kg.root, {})]
    while stack:
        n, outer = stack.pop()
        scoped[n] = outer
        d = nodes[n]
        inner = outer
        if d["op"] == "for":
            scoped_name = f"{d['var']}@{n}"
            inner = {**outer, d["var"]: Term("name", (), scoped_name)}
            lo, hi = _const(substitute(d["start"], outer)), _const(substitute(d["stop"], outer))
            if lo is None or hi is None or hi > lo:  # an empty loop (a short trip count's main loop) says nothing
                ranges[scoped_name] = Range(lo, None if hi is None else hi - 1)
        if d["op"] not in SCOPES:  # most nodes: nothing inside
            continue
        kids = kg.children(n)
        if kids and inner is not outer:  # a variable some node is inside: its range is per loop
            renamed.add(d["var"])
        stack.extend((c, inner) for c in kids)
    return scoped, ranges, renamed


def _const(t: Term):
    """The int value of a constant term (None when it names something or is no int)."""
    if t.op != "const" and next(t.names(), None) is not None:  # names something: no value here
        return None
    try:
        v = evaluate(t, {})
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    except KeyError:
        return None


def _questioner(loop_ranges: dict, kept: set, asked_ranges: dict):
    """Each term as the question egglog is asked: every name it mentions except those of ``kept``
    (builtins and symbols: one range for the whole kernel) renamed in order of first mention after its
    position, and a loop variable also after its loop's range (``v0@0:1``, the range put into
    ``asked_ranges``; a register has none: ``v1@``), with the map back to the graph's names. The same
    question from many loops (each of 1,000 loops' prologue slot, its own registers aside) is then
    asked once: a term's simplest form depends only on the term and on its names' ranges, and the
    renaming is one to one within a term. Equal questions come back as one object (found by a key of
    nested tuples, which Python compares and hashes without a call per part), so the questions are
    told apart, hashed and answered once each, not once a term of the graph."""
    questions: dict[tuple, Term] = {}  # a question's key -> the question
    names: dict[str, Term] = {}  # the name terms, one object each
    qnames: dict[tuple, str] = {}  # (place of first mention[, the range's bounds]) -> question name

    def name_of(text: str) -> Term:
        got = names.get(text)
        if got is None:
            got = names[text] = name_term(text)
        return got

    def question(t: Term, mapping: dict[str, Term]) -> tuple[Term, dict]:
        canon: dict[str, str] = {}
        back: dict[str, Term] = {}
        for var in t.names():
            if var in canon or (var in kept and var not in mapping):
                continue
            scoped = mapping.get(var)
            r = None if scoped is None else loop_ranges.get(scoped.value)
            at = (len(canon),) if r is None else (len(canon), r.lo, r.hi)
            qname = qnames.get(at)
            if qname is None:
                qname = qnames[at] = f"v{at[0]}@" + ("" if r is None else f"{_bound(r.lo)}:{_bound(r.hi)}")
                if r is not None:
                    asked_ranges[qname] = r
            canon[var] = qname
            back[qname] = name_of(var)
        key = _key(t, canon)
        q = questions.get(key)
        if q is None:
            q = questions[key] = substitute(t, {v: name_of(qn) for v, qn in canon.items()}) if canon else t
        return q, back
    question.asked = questions  # type: ignore[attr-defined]
    return question


def _key(t: Term, canon: dict[str, str]) -> tuple:
    """``t`` with its names renamed by ``canon`` as nested tuples: equal exactly when the renamed terms
    are (terms compare their op, operands and value the same way)."""
    value = canon.get(t.value, t.value) if t.op == "name" and isinstance(t.value, str) else t.value
    return (t.op, value, *[_key(a, canon) for a in t.args]) if t.args else (t.op, value)


def _bound(b) -> str:
    return "" if b is None else str(b)


def _asked(t: Term, kept: set, loops: dict) -> bool:
    """Whether egglog is asked for ``t``'s simplest form: not for a constant, nor for a lone name it knows
    nothing of (a register: neither kept with a range nor a loop's variable); about half of a kernel's terms."""
    return t.op != "const" and not (t.op == "name" and t.value not in kept and t.value not in loops)


def simplify_terms(kg: KernelGraph, forms: tuple) -> tuple[set[int], dict]:
    """Replace every term of ``kg`` (in place) by egglog's simplest form of it under the graph's
    range facts, each term asked in its own names with its loop variables' ranges; return the nodes
    changed and egglog's matches per rule."""
    scoped, loop_ranges, renamed = _loop_names(kg)  # loop variables: their ranges are per loop
    ranges = {k: r for k, r in term_ranges(kg).items() if k not in renamed}
    asked_ranges: dict = {}
    kept = set(ranges) | set(BUILTINS)  # names with one range for the whole kernel, asked as they are
    question = _questioner(loop_ranges, kept, asked_ranges)
    sites = []
    nodes = kg.node_table
    for n in kg.nodes():
        d, loops = nodes[n], scoped[n]
        for k in OPS[d["op"]].terms:
            v = d.get(k)
            if isinstance(v, Term):
                if _asked(v, kept, loops):
                    sites.append((n, k, None, v, *question(v, loops)))
            elif isinstance(v, tuple):
                sites.extend((n, k, i, x, *question(x, loops)) for i, x in enumerate(v)
                             if isinstance(x, Term) and _asked(x, kept, loops))
    asked = list(question.asked.values())  # each question once, in the order first asked
    result = _simplify_cached(asked, {**ranges, **asked_ranges}, forms)
    # each question's answer, None when it is the question itself: a site's term is its question
    # renamed back one to one (question names are not identifiers: they cannot meet a kept name), so
    # the site changes exactly when its question's answer differs from the question
    answers = {}
    for q in asked:
        out = result.terms.get(q, q)
        answers[id(q)] = None if out is q or out == q else out
    changed = set()
    for n, k, i, t, asked_q, back in sites:
        out = answers[id(asked_q)]
        if out is None:
            continue
        new = substitute(out, back) if back else out
        changed.add(n)
        if i is None:
            kg[n][k] = new
        else:
            kg[n][k] = kg[n][k][:i] + (new,) + kg[n][k][i + 1:]
    return changed, dict(result.rule_matches)
