"""The words rules hand each other: the values of the ``:tag``, ``:stage`` and ``:part`` attributes.

Rules mark nodes for later rules with these words (a wgmma_commit tagged ``cb-mma-waited``, a loop of
part ``consumer``). A rule *writes* a word when a template, a ``set`` or a ``clone :set`` gives it, and
*reads* it when a pattern pins the attribute to it (``:tag "cb-mma"``, ``(one-of ...)``, ``(not ...)``,
a clone's ``:keep`` or ``:substitute`` filter). Words written outside the rules (by the builder) are
declared in a rule file with ``(vocabulary KIND "word" ...)``.

A word a pattern reads that no rule writes and no file declares can never match (or, under ``not``,
always holds): :func:`check` reports it at its position with the closest known word, when the rule
files are loaded, so a typo in a handle is an error instead of a rule that silently never fires.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from .sexpr import Atom, Expr, RuleError, SList
from ..errors import did_you_mean

KINDS = ("tag", "stage", "part")
FORM = "vocabulary"
_FILTERS = ("keep", "substitute")  # clone keys whose values are node patterns: reads


@dataclass
class Vocabulary:
    """The words of each kind: declared by ``(vocabulary ...)`` forms, or written by rules."""

    declared: dict[str, set] = field(default_factory=lambda: {k: set() for k in KINDS})

    def copy(self) -> "Vocabulary":
        return Vocabulary({k: set(v) for k, v in self.declared.items()})

    def declare(self, form: SList) -> None:
        """Read ``(vocabulary KIND "word" ...)``."""
        items = form.items[1:]
        if not items or not isinstance(items[0], Atom) or items[0].value not in KINDS or items[0].kind == "str":
            got = items[0] if items else "nothing"
            raise RuleError(form.pos, f"(vocabulary KIND \"word\" ...) declares words of {', '.join(KINDS)}; "
                                      f"got {got}")
        for w in items[1:]:
            if not (isinstance(w, Atom) and w.kind == "str"):
                raise RuleError(w.pos, f"(vocabulary {items[0].value} ...) takes words in quotes, got {w}")
            self.declared[items[0].value].add(w.value)


def _words(v: Expr, read: bool) -> Iterator[tuple[str, Expr]]:
    """The literal words of an attribute's value: a pattern's literal, one-of or not (read), or every
    string in an expression (written)."""
    if isinstance(v, Atom):
        if v.kind == "str":
            yield v.value, v
    elif isinstance(v, SList):
        if read and v.head() not in ("one-of", "not"):
            return
        for x in v.items[1:] if read else v.items:
            yield from _words(x, read)


def _uses(e: Expr, read: bool) -> Iterator[tuple[str, str, Expr, bool]]:
    """(kind, word, where, read) of every :tag / :stage / :part value inside ``e``."""
    if not isinstance(e, SList):
        return
    items, values = e.items, set()
    for i, x in enumerate(items):
        if i in values:
            continue
        if isinstance(x, Atom) and x.kind == "kw" and i + 1 < len(items):
            if x.value in KINDS:
                values.add(i + 1)
                yield from ((x.value, w, at, read) for w, at in _words(items[i + 1], read))
            elif x.value in _FILTERS:  # a node pattern, whatever the context
                values.add(i + 1)
                yield from _uses(items[i + 1], True)
        elif isinstance(x, SList):
            yield from _uses(x, read)


def uses(rule) -> list[tuple[str, str, Expr, bool]]:
    """(kind, word, where, read) of a graph rule's words: its :match reads, its :rewrite writes (but
    for the filters of a clone, which read)."""
    out = [u for el in rule.match for u in _uses(el, True)]
    return out + [u for a in rule.rewrite for u in _uses(a, False)]


def check(rules, vocabulary: Vocabulary, errors: list) -> None:
    """Append a :class:`RuleError` to ``errors`` for each word a rule reads that none writes or declares."""
    found = [(r, u) for r in rules for u in uses(r)]
    known = {k: set(vocabulary.declared[k]) for k in KINDS}
    for _, (kind, word, _, read) in found:
        if not read:
            known[kind].add(word)
    for r, (kind, word, at, read) in found:
        if read and word not in known[kind]:
            errors.append(RuleError(at.pos, f"rule {r.name}: no rule writes :{kind} {at} and no (vocabulary "
                                            f"{kind} ...) declares it, so this pattern never matches (or, under "
                                            f"not, always does)" + did_you_mean(word, sorted(known[kind]))))
