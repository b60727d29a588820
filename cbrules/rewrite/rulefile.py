"""Reading and checking rule files (``*.rules``).

A rule file is a list of top-level forms:

* egglog declarations (``datatype``, ``function``, ``ruleset``, ``rewrite``, ``rule`` ...; see
  :data:`cbrules.rewrite.schema.EGGLOG_FORMS`) pass to egglog unchanged; egglog commands that run rules or
  touch files (``run``, ``output``, ``include`` ...) are refused;
* ``(phases A B ...)`` declares phases in order; ``(phase NAME :after A)`` / ``:before A`` adds one;
* ``(disable RULE ...)`` switches shipped rules off (from a user folder);
* ``(vocabulary KIND "word" ...)`` declares words rules read that no rule writes;
* ``(option NAME :type T ...)`` declares a circular-buffer option (only in the shipped
  ``options.rules``: :mod:`cbrules.ir.option_schema`; its refusals are checked against the rules);
* ``(graph-rule NAME :doc S :phase P :after (R ...) :match (...) :where (...) :rewrite (...))``.

Every problem is reported as ``file:line:col: message`` with a "did you mean" where it helps.
Nothing here executes Python from the files. Only regular files inside the named folders are read
(a symlink may not lead out of its folder), with the reader's size, encoding and nesting bounds.
"""
from __future__ import annotations

import functools
import heapq
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

from ..ir import option_schema
from ..shipped import RULES, shown
from ..userio import printable
from .anchors import anchor_of
from .plan import watched_ops
from .rulecheck import Suggester, key_pos, check_rule, did_you_mean
from .rulelint import rechecks
from .schema import EGGLOG_FORMS, EGGLOG_REFUSED, EggForm, split_keys
from ..sexpr import Atom, Elements, Expr, Pos, RuleError, RulePathError, SList, read, read_file, source_text
from .vocabulary import Vocabulary, check as check_vocabulary

SHIPPED = RULES
ENV_VAR = "CBRULES_RULES"
OWN_HEADS = ("graph-rule", "phases", "phase", "disable", "vocabulary", "option")
MAX_PHASES = 1000  # the shipped rules use 5; placing a phase scans the list
RULE_KEYS = ("doc", "phase", "after", "match", "where", "rewrite")


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
        """``file:line`` of the rule, its file as :func:`cbrules.shipped.shown` shows it."""
        return f"{shown(self.pos.file)}:{self.pos.line}"

    # what the engine derives from the rule as a whole, once per rule (not once per lowering)
    @functools.cached_property
    def anchor(self):
        """The rule's anchor (:func:`cbrules.rewrite.anchors.anchor_of`), or None."""
        return anchor_of(self.match, self.where)

    @functools.cached_property
    def watched(self) -> Optional[frozenset]:
        """The ops whose changes may give the rule new matches (:func:`cbrules.rewrite.plan.watched_ops`)."""
        return watched_ops(self.match, self.where)


@dataclass
class RuleSet:
    """Everything loaded from the rule folders: graph rules by phase, egglog forms, phase order."""

    rules: list[GraphRule] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    egg_forms: list[EggForm] = field(default_factory=list)
    disabled: dict[str, Pos] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    phase_pos: dict[str, Pos] = field(default_factory=dict)  # where each phase is declared
    vocabulary: Vocabulary = field(default_factory=Vocabulary)  # words declared by (vocabulary ...)
    options: dict = field(default_factory=dict)  # the (option ...) forms read: name -> Option
    _order: dict = field(default_factory=dict, repr=False, compare=False)  # phase -> (stamp, rules)
    _rechecks: list = field(default_factory=list, repr=False, compare=False)  # [(stamp, phase -> rules)]

    def copy(self) -> "RuleSet":
        """A rule set whose lists and tables can change without changing this one (the rules, frozen,
        are shared)."""
        return RuleSet(list(self.rules), list(self.phases), list(self.egg_forms), dict(self.disabled),
                       list(self.files), dict(self.phase_pos), self.vocabulary.copy(), dict(self.options), dict(self._order),
                       list(self._rechecks))  # both caches carry their stamp: a changed copy recomputes them

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

    def rechecks(self) -> dict[str, tuple[frozenset, list[GraphRule]]]:
        """Per phase holding user rules that set what a shipped validation phase read before them:
        those rules' names and the validation rules the engine runs again after the phase
        (:func:`.rulelint.rechecks`)."""
        stamp = (tuple(self.rules), tuple(self.disabled), tuple(self.phases))
        if not self._rechecks or self._rechecks[0][0] != stamp:
            self._rechecks[:] = [(stamp, rechecks(self, SHIPPED))]
        return self._rechecks[0][1]


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
    """The ``*.rules`` files to read for ``folder`` (the files directly in a folder, or one rule file),
    sorted; refuses paths that are not rules (see :class:`RulePathError`). Sub-folders are not read:
    a folder is one rule set, so ``--rules .`` does not also pick up a copy or a backup below it (pass
    ``--rules`` once per folder). A symlinked rule file must lead inside its folder (a file named
    directly: inside the folder that holds the link), judged from the paths alone, before the file is
    opened. Regularity of each file is checked again when it is opened."""
    root = _checked_path(folder, "the rule folders")
    if not root.exists():
        raise RulePathError(str(root), "rule folder does not exist")
    if root.is_file():
        if root.suffix != ".rules":  # nor echo the first words of any other file in an error
            raise RulePathError(str(root), "not a rule file: a rule file's name ends in .rules")
        _check_link(root, root.parent)
        return [root]
    if not root.is_dir():
        raise RulePathError(str(root), "not a folder or a regular file (a FIFO, device or socket?)")
    files = []
    try:
        names = os.listdir(root)
    except OSError as e:
        raise RulePathError(str(root), f"cannot list the rule folder: {e.strerror or e}") from None
    for n in names:
        f = root / n
        if n.endswith(".rules") and not (f.is_dir() and not f.is_symlink()):
            _check_link(f, root)
            files.append(f)
    return sorted(files)


def _check_link(f: Path, inside: Path) -> None:
    """Refuse the rule file ``f`` when it is a symlink that leads out of the folder ``inside`` (it
    is not opened: its text could end up in the error)."""
    if not f.is_symlink():
        return
    real, real_root = os.path.realpath(f), os.path.realpath(inside)
    if os.path.commonpath([real_root, real]) != real_root:
        raise RulePathError(str(f), f"symlink to {printable(real)}, outside the rule folder {printable(inside)}; "
                            "copy the file into the folder instead")


def rule_set(rules: Union[None, "RuleSet", Sequence[str | os.PathLike]] = None) -> "RuleSet":
    """A rule set: given as is, or loaded from the shipped folder, ``$CBRULES_RULES`` and the extra
    folders in ``rules``."""
    if isinstance(rules, RuleSet):
        return rules
    return load(rule_dirs(rules or ()))


def load(dirs: Optional[Sequence[str | os.PathLike]] = None, *, check_egglog: bool = False) -> RuleSet:
    """Read and check every ``*.rules`` file under ``dirs`` (default: :func:`rule_dirs`)."""
    sources: list[tuple[Path, str]] = []
    seen: set[str] = set()
    for d in (rule_dirs() if dirs is None else dirs):
        for f in rule_files(d):
            real = os.path.realpath(f)
            if real not in seen:  # a folder named twice (e.g. the shipped one) is read once
                seen.add(real)
                sources.append((f, read_file(f)))
    # Files are read every time (an edit shows at once), but the same texts parse to the same rules,
    # and parsing and checking them is most of a small kernel's lowering time.
    key = tuple((str(f), text) for f, text in sources)
    rs = _LOADED.get(key)
    if rs is None:
        rs = _parsed(sources)
        # what every lowering asks of the set, computed once here so that its copies inherit it
        for phase in rs.phases:
            rs.in_phase(phase)
        rs.rechecks()
        if len(_LOADED) >= _LOADED_MAX:
            del _LOADED[next(iter(_LOADED))]
        _LOADED[key] = rs
    rs = rs.copy()
    if check_egglog:
        from .eggload import load_check
        load_check(rs.egg_forms)
    return rs


_LOADED: dict = {}  # the (path, text) of every file read -> the checked RuleSet they gave
_LOADED_MAX = 8


def _parsed(sources: list[tuple[Path, str]]) -> RuleSet:
    """The checked rule set of the files' texts (every error in one :class:`RuleError`)."""
    rs = RuleSet()
    errors: list[RuleError] = []
    for f, text in sources:
        _read_text(rs, text, f, errors)
    _check_names(rs, errors)
    _check_refusals(rs, errors)
    check_vocabulary(rs.rules, rs.vocabulary, errors)
    for phase in rs.phases:
        try:
            rs.in_phase(phase)  # refuses :after cycles now, and caches each phase's order
        except RuleError as e:
            errors.append(e)
    _raise_all(errors)
    return rs


def from_texts(texts: dict[str, str]) -> RuleSet:
    """The graph rules, phases and disables of rule files given as ``{path: text}`` (e.g. as a
    saved trace recorded them), read and checked as :func:`load` reads files; nothing is opened."""
    rs = RuleSet()
    errors: list[RuleError] = []
    for path, text in texts.items():
        _read_text(rs, text, Path(path), errors, schema=True)  # as recorded: its options were the shipped ones
    _raise_all(errors)
    return rs


def _is_schema(path: Path) -> bool:
    """Whether ``path`` is the shipped options schema (the one file that may declare options)."""
    return os.path.realpath(path) == os.path.realpath(option_schema.SCHEMA_FILE)


def _read_text(rs: RuleSet, text: str, path: Path, errors: list[RuleError], schema: Optional[bool] = None) -> None:
    rs.files.append(str(path))
    try:
        forms = read(text, str(path))
    except RulePathError:
        raise
    except RuleError as e:
        errors.append(e)
        return
    schema = _is_schema(path) if schema is None else schema
    for form in forms:
        try:
            _read_form(rs, form, text, path, errors, schema)
        except RuleError as e:
            errors.append(e)


def _read_form(rs: RuleSet, form: Expr, text: str, path: Path, errors: list[RuleError], schema: bool) -> None:
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
    elif head == "vocabulary":
        rs.vocabulary.declare(form)
    elif head == "option":
        _declare_option(rs, form, schema)
    else:
        raise RuleError(form.pos, f"unknown top-level form {head!r}" + did_you_mean(
            head, tuple(EGGLOG_FORMS) + OWN_HEADS))


def _declare_option(rs: RuleSet, form: SList, schema: bool) -> None:
    if not schema:
        raise RuleError(form.pos, f"(option ...) declares a circular-buffer option, which only the shipped "
                        f"{shown(option_schema.SCHEMA_FILE)} does (the builder and the command line read only that "
                        "file); to change an option's default, set it from a rule of your own in a phase before "
                        "cb-check, e.g. (set-option ?L \"circular_buffer\" :war \"mbarrier\") on loops where it is "
                        "(absent) (rules/README.md, example 1)")
    opt = option_schema.parse_option(form)
    if opt.name in rs.options:
        raise RuleError(form.pos, f"option {opt.name} is already declared at {rs.options[opt.name].pos}; declare each "
                        "option once")
    rs.options[opt.name] = opt
    rs.vocabulary.declared["circular_buffer"].add(opt.name)


def _check_refusals(rs: RuleSet, errors: list[RuleError]) -> None:
    """The options' defaults name declared options, and each refusal an option names is a rule that fails with
    that code."""
    try:
        option_schema.check_defaults(rs.options)
    except RuleError as e:
        errors.append(e)
    rules = rs.by_name()
    for opt in rs.options.values():
        for code, name, pos in opt.refusals:
            rule = rules.get(name)
            if rule is None:
                errors.append(RuleError(pos, f"option {opt.name}: refusal {code} names rule {name}, which no rule file "
                                        "defines" + did_you_mean(name, rules) + "; name the rule that refuses it"))
            elif code not in _fail_codes(rule):
                have = ", ".join(sorted(_fail_codes(rule))) or "none"
                errors.append(RuleError(pos, f"option {opt.name}: rule {name} ({rule.pos}) does not fail with :code "
                                        f"{code} (its codes: {have}); give the code its (fail :code ...) gives"))


def _fail_codes(rule: GraphRule) -> set:
    """The codes of the ``(fail :code CODE ...)`` actions of a rule."""
    return {str(a.items[i + 1].value) for a in rule.rewrite if isinstance(a, SList) and a.head() == "fail"
            for i, x in enumerate(a.items[:-1]) if isinstance(x, Atom) and x.kind == "kw" and x.value == "code"
            and isinstance(a.items[i + 1], Atom)}


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
        raise RuleError(key_pos(form, k), f"unknown key :{k} in phase" + did_you_mean(k, ("after", "before")))
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
    rule = GraphRule(name, _name(keys["phase"]), Elements(keys["match"]), tuple(keys.get("where", ())),
                     tuple(keys["rewrite"]), form.pos, doc.value if doc is not None else "",
                     tuple(keys.get("after", ())))
    check_rule(rule, errors)
    return rule


def _check_names(rs: RuleSet, errors: list[RuleError]) -> None:
    """Rule names unique; phases, ``:after`` and ``disable`` naming what exists."""
    seen: dict[str, GraphRule] = {}
    suggest = Suggester()
    for r in rs.rules:
        if r.name in seen:
            errors.append(RuleError(r.pos, f"duplicate rule name {r.name!r} (first defined at {seen[r.name].pos})"))
        seen.setdefault(r.name, r)
    for r in rs.rules:
        if r.phase not in rs.phases:
            errors.append(RuleError(r.pos, f"rule {r.name}: unknown phase {r.phase!r}" + suggest(
                r.phase, rs.phases) + "; declare it with (phases ...) or (phase NAME :after P)"))
        for a in r.after:
            if a.value not in seen:
                errors.append(RuleError(a.pos, f"rule {r.name}: :after names unknown rule {a}"
                                        + suggest(str(a), seen)))
    for name, pos in rs.disabled.items():
        if name not in seen:
            errors.append(RuleError(pos, f"disable: unknown rule {name!r}" + suggest(name, seen)))
