"""The circular-buffer options, declared once: the ``(option ...)`` forms of the shipped
``rules/options.rules``, read here into :class:`Option` records.

Everything that names an option takes it from these records: the builder's ``circular_buffer(...)``
(the keys it records, the type checks of what it is given), the command line (flags, help, choices),
``cbrules check`` (the defaults it builds with), the rules (their bounds with ``(option "NAME" "KEY")``,
the defaults they fill in with ``(option-default "NAME" ?options)``) and ``cbrules rules check`` (the
refusal each option names). A form is checked as it is read; a malformed one is a
:class:`~cbrules.sexpr.RuleError` at its ``file:line:col`` with the fix. Reading the file runs nothing.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any, Mapping, Optional

from ..shipped import RULES
from ..sexpr import Atom, Expr, Pos, RuleError, SList, read, read_file

SCHEMA_FILE = RULES / "options.rules"
TYPES = ("int", "bool", "word", "pair", "count")  # see rules/options.rules
KEYS = ("type", "doc", "auto", "choices", "min", "max", "true", "default", "flag", "metavar", "help", "refusals")
LITERALS = {"true": True, "false": False, "none": None}
OPERATORS = {"+": 2, "-": 2, "if": 3}  # what a :default expression may use, with its operand count
MAX_DEFAULT_DEPTH = 8  # a :default nests this deep at most (the shipped ones: 2)
AUTO = "auto"  # stages/prefetch chosen by the rules (cb-auto-stages, cb-auto-prefetch)


@dataclass(frozen=True)
class Option:
    """One option as its ``(option ...)`` form declares it."""

    name: str
    type: str
    doc: str
    pos: Pos
    auto: bool = False
    choices: tuple = ()
    min: Optional[int] = None
    max: Optional[int] = None
    true: Optional[int] = None  # count: what True stands for
    default: Optional[Expr] = None  # None: no value when not given
    flag: Optional[str] = None
    metavar: Optional[str] = None  # the flag's value as its help names it (a pair: e.g. P,C)
    help: str = ""
    refusals: tuple = ()  # ((code, rule name, where the schema names them), ...)

    @property
    def help_text(self) -> str:
        """:attr:`help` with ``{min}``, ``{max}``, ``{choices}`` and ``{true}`` filled in."""
        return self.help.replace("{min}", str(self.min)).replace("{max}", str(self.max)) \
            .replace("{choices}", ", ".join(self.choices)).replace("{true}", str(self.true))

    @property
    def constant_default(self) -> bool:
        """Whether the default is a literal (not computed from other options)."""
        return self.default is None or (isinstance(self.default, Atom) and self.default.kind != "sym") or \
            (isinstance(self.default, Atom) and self.default.value in LITERALS)

    def type_problem(self, value: Any) -> Optional[str]:
        """Why ``value`` is not of this option's type (the ranges are the rules' to check), else None."""
        if value is None and self.type not in ("bool", "count"):
            return None  # absent
        if self.auto and value == AUTO:
            return None
        if self.type == "int":
            if isinstance(value, bool) or not _is_int(value):
                auto = f' (or "{AUTO}": the rules choose)' if self.auto else ""
                return f"must be an int, got {value!r} ({type(value).__name__}); pass a whole number{auto}"
        elif self.type == "bool":
            if not isinstance(value, bool):
                return f"must be True or False, got {value!r}"
        elif self.type == "word":
            if not isinstance(value, str):
                return f"must be {' or '.join(_quoted(c) for c in self.choices)}, got {value!r}"
        elif self.type == "count":
            if value is not True and (isinstance(value, bool) or not _is_int(value)):
                return f"must be True or a count from {self.min} to {self.max} (True is {self.true}), got {value!r}"
        return None  # pair: the rules check the pair and its counts (a list is taken as a tuple)

    def normalized(self, value: Any) -> Any:
        """``value`` as the rules read it: True as its count, a list as a tuple, an int-like as an int."""
        if self.type == "count" and value is True:
            return self.true
        if self.type == "pair" and isinstance(value, list):
            return tuple(value)
        if self.type == "int" and value != AUTO and value is not None:
            return int(value.__index__())
        return value


def _is_int(value: Any) -> bool:
    try:
        value.__index__()  # numpy ints too
        return True
    except (AttributeError, TypeError):
        return False


def _quoted(word: str) -> str:
    return '"' + word + '"'


def _fix(name: str) -> str:
    return (f"; write (option {name} :type T :doc \"...\" ...) with :type one of {', '.join(TYPES)} "
            f"(rules/options.rules describes every key)")


def parse_option(form: SList) -> Option:
    """The :class:`Option` an ``(option NAME :key value ...)`` form declares; a :class:`RuleError` at the
    first malformed part."""
    items = form.items
    if len(items) < 2 or not isinstance(items[1], Atom) or items[1].kind != "sym" or not items[1].value.isidentifier():
        raise RuleError(form.pos, "an option needs a name (a Python identifier): (option NAME :type T :doc \"...\" ...)")
    name = items[1].value
    keys: dict[str, Expr] = {}
    rest = items[2:]
    for i in range(0, len(rest), 2):
        k = rest[i]
        if not (isinstance(k, Atom) and k.kind == "kw"):
            raise RuleError(k.pos, f"option {name}: expected a :key, got {k}")
        if k.value not in KEYS:
            close = get_close_matches(k.value, KEYS, 1)
            raise RuleError(k.pos, f"option {name}: unknown key :{k.value}" + (f" (did you mean :{close[0]}?)" if close
                                                                             else "") + f"; the keys are :{', :'.join(KEYS)}")
        if k.value in keys:
            raise RuleError(k.pos, f"option {name}: key :{k.value} given twice")
        if i + 1 >= len(rest):
            raise RuleError(k.pos, f"option {name}: key :{k.value} has no value")
        keys[k.value] = rest[i + 1]
    for required in ("type", "doc"):
        if required not in keys:
            raise RuleError(form.pos, f"option {name}: missing :{required}" + _fix(name))
    kind = _word(keys["type"], name, "type", sym=True)
    if kind not in TYPES:
        raise RuleError(keys["type"].pos, f"option {name}: :type {kind} is not one of {', '.join(TYPES)}")
    out: dict[str, Any] = {"name": name, "type": kind, "doc": _word(keys["doc"], name, "doc"), "pos": form.pos}
    if "auto" in keys:
        out["auto"] = _literal(keys["auto"], name, "auto", (bool,))
        if kind != "int":
            raise RuleError(keys["auto"].pos, f"option {name}: :auto is for int options (\"{AUTO}\" in place of a number)")
    for bound in ("min", "max", "true"):
        if bound in keys:
            out[bound] = _literal(keys[bound], name, bound, (int,))
            if kind not in ("int", "count"):
                raise RuleError(keys[bound].pos, f"option {name}: :{bound} is for int and count options")
    if "true" in keys and kind != "count":
        raise RuleError(keys["true"].pos, f"option {name}: :true is for count options (the count True stands for)")
    if kind == "count" and "true" not in keys:
        raise RuleError(form.pos, f"option {name}: a count option says what True stands for: add :true N")
    if out.get("min") is not None and out.get("max") is not None and out["min"] > out["max"]:
        raise RuleError(keys["max"].pos, f"option {name}: :max {out['max']} is below :min {out['min']}")
    if "choices" in keys:
        v = keys["choices"]
        if kind != "word":
            raise RuleError(v.pos, f"option {name}: :choices is for word options")
        if not isinstance(v, SList) or not v.items or not all(isinstance(c, Atom) and c.kind == "str" for c in v.items):
            raise RuleError(v.pos, f"option {name}: :choices takes a list of words in quotes, e.g. (\"sync\" \"mbarrier\")")
        out["choices"] = tuple(c.value for c in v.items)
    elif kind == "word":
        raise RuleError(form.pos, f"option {name}: a word option lists its words: add :choices (\"a\" \"b\" ...)")
    if "default" in keys:
        out["default"] = _default(keys["default"], name, 0)
    if "flag" in keys:
        flag = _word(keys["flag"], name, "flag")
        if not (flag.startswith("--") and flag[2:].replace("-", "").isalnum() and flag[2:3].isalpha()):
            raise RuleError(keys["flag"].pos, f"option {name}: :flag {flag!r} is not a long option, e.g. \"--{name.replace('_', '-')}\"")
        out["flag"] = flag
    if "help" in keys:
        out["help"] = _word(keys["help"], name, "help")
    if "metavar" in keys:
        out["metavar"] = _word(keys["metavar"], name, "metavar")
    for key in ("help", "metavar"):
        if key in keys and "flag" not in keys:
            raise RuleError(keys[key].pos, f"option {name}: :{key} is the command line's: give the option a :flag too")
    if "refusals" in keys:
        out["refusals"] = _refusals(keys["refusals"], name)
    return Option(**out)


def _word(v: Expr, name: str, key: str, sym: bool = False) -> str:
    if not isinstance(v, Atom) or v.kind != ("sym" if sym else "str"):
        raise RuleError(v.pos, f"option {name}: :{key} takes {'a name' if sym else 'text in quotes'}, got {v}")
    return v.value


def _literal(v: Expr, name: str, key: str, types: tuple) -> Any:
    value = LITERALS.get(v.value, v) if isinstance(v, Atom) and v.kind == "sym" else v.value if isinstance(v, Atom) else v
    if isinstance(value, bool) != (bool in types) or not isinstance(value, types):
        want = "true or false" if bool in types else "an integer"
        raise RuleError(v.pos, f"option {name}: :{key} takes {want}, got {v}")
    return value


def _default(v: Expr, name: str, depth: int) -> Expr:
    """A :default expression, checked for its form (its option names are checked once all are read)."""
    if depth > MAX_DEFAULT_DEPTH:
        raise RuleError(v.pos, f"option {name}: :default nests deeper than {MAX_DEFAULT_DEPTH}; write a simpler one")
    if isinstance(v, Atom):
        if v.kind in ("int", "str") or (v.kind == "sym" and v.value.isidentifier()):
            return v
        raise RuleError(v.pos, f"option {name}: :default takes an int, a \"word\", true, false, none, an option's name "
                        f"or (+ A B), (- A B), (if A B C) of those; got {v}")
    op = v.head()
    if op not in OPERATORS or len(v.items) != OPERATORS[op] + 1:
        raise RuleError(v.pos, f"option {name}: :default {v} is not (+ A B), (- A B) or (if A B C) of literals and "
                        "option names")
    for x in v.items[1:]:
        _default(x, name, depth + 1)
    return v


def _refusals(v: Expr, name: str) -> tuple:
    if not isinstance(v, SList):
        raise RuleError(v.pos, f"option {name}: :refusals takes a list of (CODE RULE) pairs")
    out = []
    for r in v.items:
        if not (isinstance(r, SList) and len(r.items) == 2 and all(isinstance(x, Atom) and x.kind == "sym" for x in r.items)):
            raise RuleError(r.pos, f"option {name}: a refusal is (CODE RULE), the code the rule's (fail :code CODE ...) "
                            f"gives and the rule's name, e.g. (few-stages cb-reject-few-stages); got {r}")
        out.append((r.items[0].value, r.items[1].value, r.pos))
    return tuple(out)


def read_schema(text: str, file: str) -> dict[str, Option]:
    """The options of a schema file's text, checked: each form, each name declared once, each :default
    naming declared options without a cycle. Forms other than ``(option ...)`` are left to the rule reader."""
    options: dict[str, Option] = {}
    for form in read(text, file):
        if isinstance(form, SList) and form.head() == "option":
            opt = parse_option(form)
            if opt.name in options:
                raise RuleError(form.pos, f"option {opt.name} is already declared at {options[opt.name].pos}; "
                                "declare each option once")
            options[opt.name] = opt
    check_defaults(options)
    return options


def check_defaults(options: Mapping[str, Option]) -> None:
    """Every name a :default uses is a declared option, and no default depends on itself."""
    def names(e: Expr):
        if isinstance(e, Atom):
            if e.kind == "sym" and e.value not in LITERALS:
                yield e
        else:
            for x in e.items[1:]:
                yield from names(x)

    uses = {}
    for opt in options.values():
        if opt.default is None:
            continue
        uses[opt.name] = [a.value for a in names(opt.default)]
        for a in names(opt.default):
            if a.value not in options:
                close = get_close_matches(a.value, list(options), 1)
                raise RuleError(a.pos, f"option {opt.name}: :default names {a.value}, which is not an option"
                                + (f" (did you mean {close[0]}?)" if close else "") + f"; the options are {', '.join(options)}")
    for start in uses:
        todo, seen = list(uses[start]), set()
        while todo:
            n = todo.pop()
            if n == start:
                raise RuleError(options[start].default.pos, f"option {start}: its :default depends on itself "
                                "(through the defaults of the options it names); give one of them a literal default")
            if n not in seen:
                seen.add(n)
                todo += uses.get(n, [])


def default_of(options: Mapping[str, Option], name: str, given: Mapping[str, Any]) -> Any:
    """The default of option ``name`` for a loop whose given options are ``given`` (an option not given
    counts as its own default)."""
    def value(e: Expr) -> Any:
        if isinstance(e, Atom):
            if e.kind != "sym":
                return e.value
            if e.value in LITERALS:
                return LITERALS[e.value]
            got = given.get(e.value)
            return got if got is not None else default_of(options, e.value, given)
        op, args = e.head(), e.items[1:]
        if op == "if":
            return value(args[1]) if value(args[0]) else value(args[2])
        a, b = value(args[0]), value(args[1])
        if not (_is_int(a) and _is_int(b)) or isinstance(a, bool) or isinstance(b, bool):
            raise ValueError(f"option {name}: its default {e} needs numbers, got {a!r} and {b!r}")
        return a + b if op == "+" else a - b
    opt = options[name]
    return None if opt.default is None else value(opt.default)


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, Option]:
    return read_schema(read_file(SCHEMA_FILE), str(SCHEMA_FILE))


def options() -> dict[str, Option]:
    """The shipped options, by name, in the order the schema declares them (read once a process)."""
    return dict(_shipped())


def option(name: str) -> Option:
    """The shipped option ``name``; a KeyError naming the options for any other."""
    got = _shipped().get(name)
    if got is None:
        raise KeyError(f"no circular-buffer option {name!r}; the options are {', '.join(_shipped())}")
    return got


def names() -> tuple[str, ...]:
    """The options' names: the keys ``circular_buffer(...)`` may record."""
    return tuple(_shipped())


def flags() -> dict[str, str]:
    """Option name -> its command-line flag, for the options the command line takes (those with :flag)."""
    return {o.name: o.flag for o in _shipped().values() if o.flag}


def default(name: str, given: Mapping[str, Any] = {}) -> Any:
    """The shipped default of option ``name`` for a loop whose given options are ``given``."""
    option(name)
    return default_of(_shipped(), name, given)


def value_of(name: str, key: str) -> Any:
    """What ``(option "NAME" "KEY")`` reads in a rule: ``min``, ``max``, ``true``, ``choices`` (a tuple)
    or a literal ``default``; a ValueError naming what exists for anything else."""
    opt = option(name)
    if key == "default":
        if not opt.constant_default:
            raise ValueError(f"option {name}'s default is computed from other options ({opt.default}); read it with "
                             f"(option-default \"{name}\" ?options)")
        return default(name)
    if key not in ("min", "max", "true", "choices"):
        raise ValueError(f"(option \"{name}\" {key!r}): the keys a rule reads are min, max, true, choices and default")
    got = getattr(opt, key)
    if got is None or got == ():
        raise ValueError(f"option {name} has no :{key} ({opt.pos})")
    return got
