"""The egglog step of lowering: the graph's terms simplified once, after the last phase, and the
range facts that egglog (and the rules' ``provably-*`` guards) reason under.

Each loop's variable is renamed after its loop for egglog (``i`` in loop #12 is ``i@12``), so the
prologue, main loop and epilogue, which share a variable name, each get their own range. A term
set simplified before under the same ranges and rules costs a lookup (lowering the same kernel
again: the checker, the CLI, the benchmarks).
"""
from __future__ import annotations

import functools

from ..ir.graph import BUILTINS, KernelGraph
from ..ir.ops import OPS
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
def _oracle(forms: tuple):
    """One oracle per rule set, so its answers are shared by every lowering with those rules."""
    from .egg import Oracle
    return Oracle(forms)


_SIMPLIFIED: dict = {}  # (terms, ranges, forms) -> SimplifyResult, most recent last
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
    again (the checker, the benchmarks, every CLI query) costs a lookup. Results that hit a budget
    or failed are not kept, so their warning shows every time."""
    from .egg import simplify
    key = _Key((tuple(dict.fromkeys(terms)), tuple(sorted(ranges.items())), tuple(forms)))
    if key in _SIMPLIFIED:
        _SIMPLIFIED[key] = _SIMPLIFIED.pop(key)
        return _SIMPLIFIED[key]
    result = simplify(terms, ranges, forms)
    if result.error is None and result.budget is None:
        _SIMPLIFIED[key] = result
        while len(_SIMPLIFIED) > _SIMPLIFIED_MAX:
            del _SIMPLIFIED[next(iter(_SIMPLIFIED))]
    return result


def _loop_names(kg: KernelGraph) -> tuple[dict[int, dict[str, Term]], dict]:
    """Per node, its enclosing loops' variables renamed after the loop (``i`` in loop #12 becomes
    ``i@12``), and the range of each renamed variable from its own loop's bounds. The prologue,
    main loop and epilogue share a variable name but not a range: per loop, the prologue's
    ``i % S`` (i < P < S) folds to ``i`` and its parity to 0."""
    from .egg import Range
    scoped: dict[int, dict[str, Term]] = {}
    ranges: dict = {}

    def walk(n: int, outer: dict[str, Term]) -> None:
        scoped[n] = outer
        d = kg[n]
        inner = outer
        if d["op"] == "for":
            scoped_name = f"{d['var']}@{n}"
            inner = {**outer, d["var"]: Term("name", (), scoped_name)}
            lo, hi = _const(substitute(d["start"], outer)), _const(substitute(d["stop"], outer))
            if lo is None or hi is None or hi > lo:  # an empty loop (a short trip count's main loop) says nothing
                ranges[scoped_name] = Range(lo, None if hi is None else hi - 1)
        for c in kg.children(n):
            walk(c, inner)
    walk(kg.root, {})
    return scoped, ranges


def _const(t: Term):
    """The int value of a constant term (None when it names something or is no int)."""
    try:
        v = evaluate(t, {})
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    except KeyError:
        return None


def _scoper():
    """``substitute`` for the loop renaming, memoised per (term, scope) and returning the term
    itself when it mentions none of the scope's variables: most terms of a lowered graph are
    shared between nodes and many mention no loop variable."""
    memo: dict[tuple[int, int], tuple[Term, Term]] = {}

    def scope(t: Term, mapping: dict[str, Term]) -> Term:
        key = (id(t), id(mapping))
        got = memo.get(key)
        if got is None or got[0] is not t:
            mine = t
            if mapping and not mapping.keys().isdisjoint(t.names()):
                mine = substitute(t, mapping)
            got = memo[key] = (t, mine)
        return got[1]
    return scope


def simplify_terms(kg: KernelGraph, forms: tuple) -> tuple[set[int], dict]:
    """Replace every term of ``kg`` (in place) by egglog's simplest form of it under the graph's
    range facts, each loop's variable renamed after its loop for the question; return the nodes
    changed and egglog's matches per rule."""
    scoped, loop_ranges = _loop_names(kg)
    back = {str(t.value): name_term(var) for m in scoped.values() for var, t in m.items()}
    scope = _scoper()
    sites = []
    for n in kg.nodes():
        d = kg[n]
        for k in OPS[d["op"]].terms:
            v = d.get(k)
            if isinstance(v, Term):
                sites.append((n, k, None, v, scope(v, scoped[n])))
            elif isinstance(v, tuple):
                sites.extend((n, k, i, x, scope(x, scoped[n])) for i, x in enumerate(v) if isinstance(x, Term))
    ranges = {k: r for k, r in term_ranges(kg).items() if k not in {v for m in scoped.values() for v in m}}
    result = _simplify_cached([s[4] for s in sites], {**ranges, **loop_ranges}, forms)
    changed = set()
    for n, k, i, t, mine in sites:
        out = result.terms.get(mine, mine)
        if out is mine:  # unchanged (egglog hands back the term it got): renaming back gives ``t``
            continue
        new = substitute(out, back)
        if new != t:
            changed.add(n)
            if i is None:
                kg[n][k] = new
            else:
                kg[n][k] = kg[n][k][:i] + (new,) + kg[n][k][i + 1:]
    return changed, dict(result.rule_matches)
