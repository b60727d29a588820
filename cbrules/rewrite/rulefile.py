"""Reading and checking rule files (``*.rules``).

A rule file is a list of top-level forms:

* egglog declarations (``datatype``, ``function``, ``ruleset``, ``rewrite``, ``rule`` ...; see
  :data:`cbrules.rewrite.schema.EGGLOG_FORMS`) pass to egglog unchanged; egglog commands that run rules or
  touch files (``run``, ``output``, ``include`` ...) are refused;
* ``(phases A B ...)`` declares phases in order; ``(phase NAME :after A)`` / ``:before A`` adds one;
* ``(disable RULE ...)`` switches shipped rules off (from a user folder);
* ``(graph-rule NAME :doc S :phase P :after (R ...) :match (...) :where (...) :rewrite (...))``.

Every problem is reported as ``file:line:col: message`` with a "did you mean" where it helps.
Nothing here executes Python from the files. Only regular files inside the named folders are read
(a symlink may not lead out of its folder), with the reader's size, encoding and nesting bounds.
"""
from __future__ import annotations

import difflib
import heapq
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from ..ir.ops import OPS, SCOPES
from ..shipped import RULES
from .schema import (ACTIONS, EGGLOG_FORMS, EGGLOG_REFUSED, FUNCTIONS, NODE_FUNCTIONS, RELATIONS,
                     STRUCTURAL_KEYS, VARIADIC_RELATIONS, EggForm, split_keys)
from .schema import settable as _settable
from .sexpr import Atom, Expr, Pos, RuleError, RulePathError, SList, read, read_file, source_text

SHIPPED = RULES
ENV_VAR = "CBRULES_RULES"
OWN_HEADS = ("graph-rule", "phases", "phase", "disable")
MAX_PHASES = 1000  # the shipped rules use 5; placing a phase scans the list
RULE_KEYS = ("doc", "phase", "after", "match", "where", "rewrite")
VALUE_PATTERN_HEADS = ("one-of", "not", "absent")
FILTER_HEADS = ("not", "any-of")


class RuleErrors(RuleError):
    """Several errors in the rule files, all reported at once: ``errors`` holds each (a
    :class:`RuleError` with its ``file:line:col``); the message has one line per error."""

    def __init__(self, errors: list[RuleError]):
        Exception.__init__(self, "\n".join(map(str, errors)))
        self.errors = errors
        self.pos = errors[0].pos
        self.detail = "; ".join(e.detail for e in errors)


def _raise_all(errors: list[RuleError]) -> None:
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise RuleErrors(errors)


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


@dataclass(frozen=True)
class GraphRule:
    """One graph rule as read from its file."""

    name: str
    phase: str
    match: tuple
    where: tuple
    rewrite: tuple
    pos: Pos
    doc: str = ""
    after: tuple = ()

    @property
    def at(self) -> str:
        """``file:line`` of the rule, relative to the working directory when it lies below it."""
        rel = os.path.relpath(self.pos.file)
        return f"{self.pos.file if rel.startswith('..') else rel}:{self.pos.line}"


@dataclass
class RuleSet:
    """Everything loaded from the rule folders: graph rules by phase, egglog forms, phase order."""

    rules: list[GraphRule] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    egg_forms: list[EggForm] = field(default_factory=list)
    disabled: dict[str, Pos] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    phase_pos: dict[str, Pos] = field(default_factory=dict)  # where each phase is declared
    _order: dict = field(default_factory=dict, repr=False, compare=False)  # phase -> (stamp, rules)

    def active(self) -> list[GraphRule]:
        return [r for r in self.rules if r.name not in self.disabled]

    def by_name(self) -> dict[str, GraphRule]:
        return {r.name: r for r in self.rules}

    def in_phase(self, phase: str) -> list[GraphRule]:
        """Active rules of a phase: ``:after`` respected, otherwise file order.

        Computed once per phase and cached (recomputed if ``rules`` or ``disabled`` change);
        raises :class:`RuleError` on an ``:after`` cycle."""
        stamp = (tuple(self.rules), tuple(self.disabled))
        cached = self._order.get(phase)
        if cached is None or cached[0] != stamp:
            cached = self._order[phase] = (stamp, _topological([r for r in self.active() if r.phase == phase]))
        return list(cached[1])


def _topological(rules: list[GraphRule]) -> list[GraphRule]:
    """``rules`` with every rule after those its ``:after`` names (among ``rules``); ties in file
    order. Kahn's algorithm with a heap: O(n log n + edges)."""
    index = {r.name: i for i, r in enumerate(rules)}
    waits = [0] * len(rules)
    followers: list[list[int]] = [[] for _ in rules]
    for i, r in enumerate(rules):
        for j in {index[a.value] for a in r.after if isinstance(a, Atom) and a.value in index}:
            waits[i] += 1
            followers[j].append(i)
    ready = [i for i, n in enumerate(waits) if n == 0]
    heapq.heapify(ready)
    done: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        done.append(i)
        for k in followers[i]:
            waits[k] -= 1
            if waits[k] == 0:
                heapq.heappush(ready, k)
    if len(done) < len(rules):
        raise _cycle_error([r for i, r in enumerate(rules) if waits[i]], index, rules)
    return [rules[i] for i in done]


def _cycle_error(stuck: list[GraphRule], index: dict[str, int], rules: list[GraphRule]) -> RuleError:
    """Name one actual cycle among the rules left waiting (followed through their ``:after``)."""
    waiting = {r.name for r in stuck}
    path, seen, r = [], {}, stuck[0]
    while r.name not in seen:
        seen[r.name] = len(path)
        path.append(r)
        r = next(rules[index[a.value]] for a in r.after
                 if isinstance(a, Atom) and a.value in waiting)
    cycle = path[seen[r.name]:] + [r]
    return RuleError(cycle[0].pos, "the :after lists form a cycle (each rule runs after the next): " + " -> ".join(
        f"{c.name} ({c.pos})" for c in cycle) + "; remove one of these :after entries")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _checked_path(p: str | os.PathLike, source: str) -> Path:
    # Path("") is ".": an empty entry would silently load every rule file below the working directory
    if not os.fspath(p):
        raise RulePathError("", f"empty rule folder path (from {source}); name a folder, e.g. '.' for the "
                            "working directory")
    return Path(p)


def rule_dirs(extra: Sequence[str | os.PathLike] = ()) -> list[Path]:
    """The shipped folder, then folders from ``$CBRULES_RULES`` (path-separated; empty entries are
    skipped), then ``extra`` (an empty path there is a :class:`RulePathError`)."""
    dirs = [SHIPPED]
    dirs += [Path(p) for p in os.environ.get(ENV_VAR, "").split(os.pathsep) if p]
    dirs += [_checked_path(p, "the extra rule folders") for p in extra]
    return dirs


def rule_files(folder: str | os.PathLike) -> list[Path]:
    """The ``*.rules`` files to read for ``folder`` (a folder, searched recursively without following
    symlinked folders, or one rule file), sorted; refuses paths that are not rules (see
    :class:`RulePathError`). Regularity of each file is checked again when it is opened."""
    root = _checked_path(folder, "the rule folders")
    if not root.exists():
        raise RulePathError(str(root), "rule folder does not exist")
    if root.is_file():
        if root.suffix != ".rules":  # nor echo the first words of any other file in an error
            raise RulePathError(str(root), "not a rule file: a rule file's name ends in .rules")
        return [root]
    if not root.is_dir():
        raise RulePathError(str(root), "not a folder or a regular file (a FIFO, device or socket?)")
    real_root = os.path.realpath(root)
    files = []
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            if n.endswith(".rules"):
                f = Path(dirpath) / n
                if f.is_symlink() and os.path.commonpath([real_root, os.path.realpath(f)]) != real_root:
                    raise RulePathError(str(f), f"symlink to {os.path.realpath(f)}, outside the rule folder "
                                        f"{root}; copy the file into the folder instead")
                files.append(f)
    return sorted(files)


def load(dirs: Optional[Sequence[str | os.PathLike]] = None, *, check_egglog: bool = False) -> RuleSet:
    """Read and check every ``*.rules`` file under ``dirs`` (default: :func:`rule_dirs`)."""
    rs = RuleSet()
    errors: list[RuleError] = []
    seen: set[str] = set()
    for d in (rule_dirs() if dirs is None else dirs):
        for f in rule_files(d):
            real = os.path.realpath(f)
            if real not in seen:  # a folder named twice (e.g. the shipped one) is read once
                seen.add(real)
                _read_file(rs, f, errors)
    _check_names(rs, errors)
    for phase in rs.phases:
        try:
            rs.in_phase(phase)  # refuses :after cycles now, and caches each phase's order
        except RuleError as e:
            errors.append(e)
    _raise_all(errors)
    if check_egglog:
        from .egg import load_check
        load_check(rs.egg_forms)
    return rs


def from_texts(texts: dict[str, str]) -> RuleSet:
    """The graph rules, phases and disables of rule files given as ``{path: text}`` (e.g. as a
    saved trace recorded them), read and checked as :func:`load` reads files; nothing is opened."""
    rs = RuleSet()
    errors: list[RuleError] = []
    for path, text in texts.items():
        _read_text(rs, text, Path(path), errors)
    _raise_all(errors)
    return rs


def _read_file(rs: RuleSet, path: Path, errors: list[RuleError]) -> None:
    """Read one file into ``rs``; every error of a form goes to ``errors`` and reading goes on
    with the next form (a syntax error ends the file)."""
    _read_text(rs, read_file(path), path, errors)


def _read_text(rs: RuleSet, text: str, path: Path, errors: list[RuleError]) -> None:
    rs.files.append(str(path))
    try:
        forms = read(text, str(path))
    except RulePathError:
        raise
    except RuleError as e:
        errors.append(e)
        return
    for form in forms:
        try:
            _read_form(rs, form, text, path, errors)
        except RuleError as e:
            errors.append(e)


def _read_form(rs: RuleSet, form: Expr, text: str, path: Path, errors: list[RuleError]) -> None:
    if not isinstance(form, SList) or not form.head():
        raise RuleError(form.pos, f"a top-level form must be a list starting with a name, got {form}")
    head = form.head()
    if head in EGGLOG_FORMS:
        rs.egg_forms.append(EggForm(source_text(text, form), str(path), form.pos.line, form.pos.col))
    elif head in EGGLOG_REFUSED:
        raise RuleError(form.pos, f"egglog form ({head} ...) is not allowed in rule files: {EGGLOG_REFUSED[head]}")
    elif head == "graph-rule":
        rs.rules.append(_graph_rule(form, errors))
    elif head == "phases":
        for a in form.items[1:]:
            _declare_phase(rs, a)
            rs.phases.append(a.value)
    elif head == "phase":
        _add_phase(rs, form)
    elif head == "disable":
        for a in form.items[1:]:
            rs.disabled[_name(a)] = a.pos
    else:
        raise RuleError(form.pos, f"unknown top-level form {head!r}" + did_you_mean(
            head, tuple(EGGLOG_FORMS) + OWN_HEADS))


def _declare_phase(rs: RuleSet, a: Expr) -> str:
    name = _name(a)
    if len(rs.phase_pos) >= MAX_PHASES:
        raise RuleError(a.pos, f"more than {MAX_PHASES} phases; merge phases (rules of one phase are "
                        "ordered with :after)")
    if name in rs.phase_pos:
        raise RuleError(a.pos, f"phase {name!r} is already declared at {rs.phase_pos[name]}; declare each "
                        "phase once (to place a phase of your own, give it a new name)")
    rs.phase_pos[name] = a.pos
    return name


def _name(a: Expr) -> str:
    if not isinstance(a, Atom) or a.kind != "sym":
        raise RuleError(a.pos, f"expected a name, got {a}")
    return a.value


def _add_phase(rs: RuleSet, form: SList) -> None:
    pos, keys = split_keys(form.items, 1)
    if len(pos) != 1 or len(keys) > 1:
        raise RuleError(form.pos, "(phase NAME :after P) or (phase NAME :before P)")
    if not keys:
        rs.phases.append(_declare_phase(rs, pos[0]))
        return
    (k, v), = keys.items()
    if k not in ("after", "before"):
        raise RuleError(_key_pos(form, k), f"unknown key :{k} in phase" + did_you_mean(k, ("after", "before")))
    anchor = _name(v)
    if anchor not in rs.phases:
        raise RuleError(v.pos, f"unknown phase {anchor!r}" + did_you_mean(anchor, rs.phases))
    name = _declare_phase(rs, pos[0])
    i = rs.phases.index(anchor)
    rs.phases.insert(i + 1 if k == "after" else i, name)


def _graph_rule(form: SList, errors: list[RuleError]) -> GraphRule:
    if len(form) < 2 or not isinstance(form[1], Atom) or form[1].kind != "sym":
        raise RuleError(form.pos, "graph-rule needs a name: (graph-rule NAME :phase P :match (...) :rewrite (...))")
    name = form[1].value
    keys: dict[str, Expr] = {}
    items = form.items[2:]
    for i in range(0, len(items), 2):
        k = items[i]
        if not isinstance(k, Atom) or k.kind != "kw":
            raise RuleError(k.pos, f"rule {name}: expected a :key, got {k}")
        if k.value not in RULE_KEYS:
            raise RuleError(k.pos, f"rule {name}: unknown key :{k.value}" + did_you_mean(k.value, RULE_KEYS))
        if k.value in keys:
            raise RuleError(k.pos, f"rule {name}: key :{k.value} given twice")
        if i + 1 >= len(items):
            raise RuleError(k.pos, f"rule {name}: key :{k.value} has no value")
        keys[k.value] = items[i + 1]
    for required in ("phase", "match", "rewrite"):
        if required not in keys:
            raise RuleError(form.pos, f"rule {name}: missing :{required}")
    for k in ("match", "where", "rewrite", "after"):
        if k in keys and not isinstance(keys[k], SList):
            raise RuleError(keys[k].pos, f"rule {name}: :{k} takes a list")
    doc = keys.get("doc")
    if doc is not None and not (isinstance(doc, Atom) and doc.kind == "str"):
        raise RuleError(doc.pos, f'rule {name}: :doc takes a string, e.g. :doc "what the rule does"')
    for a in keys.get("after", ()):
        if not (isinstance(a, Atom) and a.kind == "sym"):
            raise RuleError(a.pos, f"rule {name}: :after takes rule names, got {a}")
    rule = GraphRule(name, _name(keys["phase"]), tuple(keys["match"]), tuple(keys.get("where", ())),
                     tuple(keys["rewrite"]), form.pos, doc.value if doc is not None else "",
                     tuple(keys.get("after", ())))
    _check_rule(rule, errors)
    return rule


# ---------------------------------------------------------------------------- static checks
def _check_rule(r: GraphRule, errors: list[RuleError]) -> None:
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
                for v in _vars_in(el):
                    _bind(bound, v)


def _vars_in(e: Expr) -> list[str]:
    if isinstance(e, Atom):
        return [e.value] if e.kind == "var" else []
    return [v for x in e.items for v in _vars_in(x)]


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
            raise _no_attribute(_key_pos(e, k), op, k, allowed)
        if k in STRUCTURAL_KEYS:
            _check_value(v, bound)
        else:
            _check_value_pattern(v, bound, binds)


def _attributes(op: str) -> set[str]:
    """The attributes a node of ``op`` may have (``_``: any op)."""
    return set(OPS[op].attributes) if op != "_" else {a for s in OPS.values() for a in s.attributes}


def _key_pos(form: SList, key: str) -> Pos:
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
            raise RuleError(_key_pos(e, k), f"relation {head} has no key :{k}" + did_you_mean(k, required + optional))
        _check_value(v, bound)
    if head == "no" and len([k for k in keys if k in ("in", "around")]) != 1:
        raise RuleError(e.pos, "(no PATTERN :in ?scope) or (no PATTERN :around ?node)")
    if head in ("no", "count", "sum", "nearest"):
        pat_at = {"no": 0, "count": 1, "sum": 2, "nearest": 1}[head]
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
    for a in e.items[1:]:
        _check_value(a, bound)


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
            raise _no_attribute(_key_pos(t, k), op, k, spec.attributes)
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
                raise RuleError(_key_pos(a, k), f"action {head} has no key :{k}" + did_you_mean(k, allowed))
    if head == "set":
        _check_set_keys(a, pos[0], keys, bound)
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
            _settable(k, Atom(k, "kw", _key_pos(a, k)))
        if k not in allowed:
            raise _no_attribute(_key_pos(a, k), op, k, allowed)


def _check_message(msg: Expr, bound: set) -> None:
    """Every ``{?x}`` in a literal ``(fail "...")`` message names a bound variable."""
    if isinstance(msg, Atom) and msg.kind == "str":
        for name in re.findall(r"\{(\?[\w-]+)\}", msg.value):
            if name not in bound:
                raise RuleError(msg.pos, f"(fail ...): the message uses {{{name}}}, but {name} is not bound"
                                + did_you_mean(name, bound) + "; bind it in :match or with (let ...), or drop it")


def _check_names(rs: RuleSet, errors: list[RuleError]) -> None:
    """Rule names unique; phases, ``:after`` and ``disable`` naming what exists."""
    seen: dict[str, GraphRule] = {}
    for r in rs.rules:
        if r.name in seen:
            errors.append(RuleError(r.pos, f"duplicate rule name {r.name!r} (first defined at {seen[r.name].pos})"))
        seen.setdefault(r.name, r)
    for r in rs.rules:
        if r.phase not in rs.phases:
            errors.append(RuleError(r.pos, f"rule {r.name}: unknown phase {r.phase!r}" + did_you_mean(
                r.phase, rs.phases) + "; declare it with (phases ...) or (phase NAME :after P)"))
        for a in r.after:
            if a.value not in seen:
                errors.append(RuleError(a.pos, f"rule {r.name}: :after names unknown rule {a}"
                                        + did_you_mean(str(a), seen)))
    for name, pos in rs.disabled.items():
        if name not in seen:
            errors.append(RuleError(pos, f"disable: unknown rule {name!r}" + did_you_mean(name, seen)))
