"""The words rules hand each other: the values of the ``:tag``, ``:stage`` and ``:part`` attributes, and
the option keys of a loop's annotations (``circular_buffer``, ``tma_store``).

Rules mark nodes for later rules with these words (a wgmma_commit tagged ``cb-mma-waited``, a loop of
part ``consumer``). A rule *writes* a word when a template, a ``set`` or a ``clone :set`` gives it, and
*reads* it when a pattern pins the attribute to it (``:tag "cb-mma"``, ``(one-of ...)``, ``(not ...)``,
a clone's ``:keep`` or ``:substitute`` filter). Words written outside the rules (by the builder) are
declared in a rule file with ``(vocabulary KIND "word" ...)``. An option key is read where a pattern
names it (``:annotations (:circular_buffer (:prefetch ?P))``) and written by ``set-option`` or a
``(dict "circular_buffer" (dict "key" ...))``; the keys the builder's ``circular_buffer(...)`` records
(the options of :mod:`cbrules.ir.option_schema`) are known from the start.

A word a pattern reads that no rule writes and no file declares can never match (or, under ``not``,
always holds): :func:`check` reports it at its position with the closest known word, when the rule
files are loaded, so a typo in a handle is an error instead of a rule that silently never fires.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from ..ir import option_schema
from .rulecheck import Suggester
from ..sexpr import Atom, Expr, RuleError, SList

WORDS = ("tag", "stage", "part")  # attributes whose values are handles
ANNOTATIONS = ("circular_buffer", "tma_store")  # a loop's annotations whose keys are options
KINDS = WORDS + ANNOTATIONS
_FILTERS = ("keep", "substitute")  # clone keys whose values are node patterns: reads


@dataclass
class Vocabulary:
    """The words of each kind: declared by ``(vocabulary ...)`` forms, or written by rules."""

    declared: dict[str, set] = field(default_factory=lambda: {k: set() for k in KINDS} | {
        "circular_buffer": set(option_schema.names())})

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
    """(kind, word, where, read) of every :tag / :stage / :part value inside ``e``, and (read) of every
    option key a pattern of a loop's annotations names."""
    if not isinstance(e, SList):
        return
    items, values = e.items, set()
    for i, x in enumerate(items):
        if i in values:
            continue
        if isinstance(x, Atom) and x.kind == "kw" and i + 1 < len(items):
            if x.value in WORDS:
                values.add(i + 1)
                yield from ((x.value, w, at, read) for w, at in _words(items[i + 1], read))
            elif x.value in ANNOTATIONS and read and isinstance(items[i + 1], SList):
                values.add(i + 1)  # (:circular_buffer (:stages ?S ...)): the keys a pattern names
                for k in items[i + 1].items:
                    if isinstance(k, Atom) and k.kind == "kw":
                        yield x.value, k.value, k, True
            elif x.value in _FILTERS:  # a node pattern, whatever the context
                values.add(i + 1)
                yield from _uses(items[i + 1], True)
        elif isinstance(x, SList):
            yield from _option_writes(x) if not read else ()
            yield from _uses(x, read)


def _option_writes(e: SList) -> Iterator[tuple[str, str, Expr, bool]]:
    """Option keys an action or value writes: (set-option ?L "NAME" :key V ...), and the keys of a
    (dict "k" V ...) given as annotation NAME in (dict "NAME" ...) or (assoc X "NAME" ...)."""
    head, items = e.head(), e.items
    if head == "set-option" and len(items) > 2 and isinstance(items[2], Atom) and items[2].value in ANNOTATIONS:
        yield from ((items[2].value, k.value, k, False) for k in items[3:] if isinstance(k, Atom) and k.kind == "kw")
    pairs = items[1:] if head == "dict" else items[2:4] if head == "assoc" else ()
    for name, value in zip(pairs[::2], pairs[1::2]):
        if isinstance(name, Atom) and name.value in ANNOTATIONS and isinstance(value, SList) \
                and value.head() == "dict":
            yield from ((name.value, k.value, k, False) for k in value.items[1::2] if isinstance(k, Atom))


def uses(rule) -> list[tuple[str, str, Expr, bool]]:
    """(kind, word, where, read) of a graph rule's words: its :match reads, its :rewrite writes (but
    for the filters of a clone, which read)."""
    out = [u for el in rule.match for u in _uses(el, True)]
    return out + [u for a in rule.rewrite if isinstance(a, SList) for u in (*_option_writes(a), *_uses(a, False))]


def check(rules, vocabulary: Vocabulary, errors: list) -> None:
    """Append a :class:`RuleError` to ``errors`` for each word a rule reads that none writes or declares."""
    found = [(r, u) for r in rules for u in uses(r)]
    known = {k: set(vocabulary.declared[k]) for k in KINDS}
    for _, (kind, word, _, read) in found:
        if not read:
            known[kind].add(word)
    # sorted by text: a mutated rule may write a number where a word belongs (it is reported, not a crash)
    suggest, choices = Suggester(), {k: sorted(v, key=str) for k, v in known.items()}  # bounded: thousands load fast
    for r, (kind, word, at, read) in found:
        if read and word not in known[kind]:
            what = f":{kind} {at}" if kind in WORDS else f"option :{word} of {kind}"
            errors.append(RuleError(at.pos, f"rule {r.name}: no rule writes {what} and no (vocabulary "
                                            f"{kind} ...) declares it, so this pattern never matches (or, under "
                                            f"not, always does)" + suggest(word, choices[kind])))
