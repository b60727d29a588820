"""S-expression reader with source positions, for rule files.

Atoms keep their file, line and column so every later error (checker, matcher, actions, egglog)
can point at the user's text. Strings are double-quoted with backslash escapes; ``;`` starts a
comment. The reader never evaluates anything. Files are read as bytes: only regular files of at
most :data:`MAX_FILE_BYTES`, strict UTF-8 without NUL bytes, lists nested at most
:data:`MAX_DEPTH` deep; anything else is a :class:`RuleError` at its position.
"""
from __future__ import annotations

import gc
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .errors import CbrulesError
from .userio import NotRegularFile, printable, read_regular

# Bounds applied before anything else (egglog included) sees the text: the shipped rules nest 8
# deep and are 20 KiB; egglog's parser overflows its stack near 10,000 levels.
MAX_DEPTH = 128
MAX_FILE_BYTES = 4 * 2 ** 20
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}
_INT = re.compile(r"[-+]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?", re.ASCII)


@dataclass(frozen=True)
class Pos:
    """A place in a rule file (1-based line and column)."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{printable(self.file)}:{self.line}:{self.col}"  # a file name prints as one line


class RuleError(CbrulesError):
    """An error in a rule file, located at ``pos``; the message starts with ``file:line:col``."""

    def __init__(self, pos: Pos, message: str):
        super().__init__(f"{pos}: {message}")
        self.pos = pos
        self.detail = message


class RulePathError(RuleError):
    """A rule folder or file that cannot be read as rules: an empty path, a missing folder, not a
    regular file, a symlink leading out of its folder, too large; the message starts with the path."""

    def __init__(self, path: str, message: str):
        Exception.__init__(self, f"{printable(path) if path else repr(path)}: {message}")
        self.pos = Pos(path, 0, 0)
        self.detail = message


@dataclass(frozen=True)
class Atom:
    """A symbol, keyword (``:phase``), pattern variable (``?x``), string or number."""

    value: Union[str, int, float]
    kind: str  # sym | kw | var | str | int | float
    pos: Pos
    memo: Optional[dict] = field(default=None, compare=False, repr=False, hash=False)  # see derived()

    def __str__(self) -> str:
        if self.kind == "str":  # escaped as written, so a message never holds a raw control character
            return '"' + "".join(_ESCAPES.get(c, c if c.isprintable() else f"\\u{{{ord(c):x}}}")
                                 for c in self.value) + '"'
        return f":{self.value}" if self.kind == "kw" else str(self.value)


@dataclass(frozen=True)
class SList:
    """A parenthesised list; ``end`` is the position of its closing parenthesis, ``span`` the
    character offsets of its text in what was read."""

    items: tuple
    pos: Pos
    end: Pos
    span: tuple[int, int] = (0, 0)
    memo: Optional[dict] = field(default=None, compare=False, repr=False, hash=False)  # see derived()

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def head(self) -> str | None:
        """The leading symbol's name, if the list starts with a symbol."""
        return self.items[0].value if self.items and isinstance(self.items[0], Atom) \
            and self.items[0].kind == "sym" else None

    def __str__(self) -> str:
        return "(" + " ".join(str(x) for x in self.items) + ")"


Expr = Union[Atom, SList]


def variables(e: Expr) -> tuple:
    """The pattern variables (``?x``) ``e`` names, in text order (repeats kept); kept on a list's text."""
    if isinstance(e, Atom):
        return (e.value,) if e.kind == "var" else ()
    memo = derived(e)
    got = memo.get("variables")
    if got is None:
        got = memo["variables"] = tuple(v for x in e.items for v in variables(x))
    return got


class Elements(tuple):
    """A rule's ``:match`` elements: a tuple that also keeps what the matcher derives from them as a
    whole (see :func:`derived`)."""


def derived(text: Any) -> dict:
    """What the rewrite layer derives from a piece of rule text (an expression, a rule's elements), kept
    on that text: compiled the first time it is needed and then for as long as the rule lives -- no
    table keyed by ``id()`` that outlives its rules or must be flushed. A plain tuple keeps nothing (a
    fresh dict: derived again each time)."""
    memo = getattr(text, "memo", None)
    if memo is None:
        memo = {}
        try:
            object.__setattr__(text, "memo", memo)  # frozen text: the memo is not part of its value
        except AttributeError:
            pass
    return memo


def _atom(text: str, pos: Pos) -> Atom:
    if text.startswith(":") and len(text) > 1:
        return Atom(text[1:], "kw", pos)
    if text.startswith("?") and len(text) > 1:
        return Atom(text, "var", pos)
    # plain ASCII decimal only: Python's int()/float() would also take "1_0", other scripts'
    # digits, "nan" and "inf", none of which is a number in C
    if _INT.fullmatch(text):
        if len(text.lstrip("+-")) > 19:  # more than a 64-bit integer can hold; int() of a huge one is slow
            raise RuleError(pos, f"number {text[:20]}... has {len(text.lstrip('+-'))} digits; integers in rules "
                            "fit in 64 bits (at most 19 digits)")
        return Atom(int(text), "int", pos)
    if _FLOAT.fullmatch(text):
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise RuleError(pos, f"number {text[:40]} is out of range for a double")
        return Atom(value, "float", pos)
    return Atom(text, "sym", pos)


def decode(data: bytes, file: str) -> str:
    """``data`` as strict UTF-8 text; an invalid byte sequence or a NUL byte is a :class:`RuleError`
    at its line and column."""
    def where(offset: int) -> Pos:
        before = data[:offset].decode("utf-8")  # valid: the first bad byte is at or after offset
        return Pos(file, before.count("\n") + 1, len(before) - before.rfind("\n"))

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RuleError(where(e.start), f"invalid UTF-8 (byte 0x{data[e.start]:02x}); rule files are UTF-8 text"
                        ) from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise RuleError(where(nul), "NUL byte; rule files are text")
    return text


def read_file(path: Union[str, os.PathLike]) -> str:
    """The text of the rule file at ``path``: a regular file of at most :data:`MAX_FILE_BYTES`,
    strict UTF-8 without NUL bytes; anything else is a :class:`RuleError` naming the file."""
    file = str(path)
    try:  # refused before it is opened: a FIFO or device may never end
        data = read_regular(path, MAX_FILE_BYTES, "rule files")
    except NotRegularFile as e:
        raise RulePathError(file, f"not a regular file: {e.strerror}") from None
    except OSError as e:
        raise RulePathError(file, f"cannot read the rule file: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise RulePathError(file, f"rule file larger than {MAX_FILE_BYTES // 2 ** 20} MiB; split it")
    return decode(data, file)


# One token per match, so reading is linear (a 4 MiB file reads in seconds):
# newline | blanks | comment | ( | ) | string (one line, backslash escapes) | atom | a lone quote
_TOKEN = re.compile(r'(\n)|[ \t\r]+|;[^\n]*|(\()|(\))|("(?:[^"\\\n]|\\.)*")|([^()"; \t\r\n]+)|(")')
_ESCAPE = re.compile(r"\\(.)")


def _unescape(m: re.Match) -> str:
    return {"n": "\n", "t": "\t"}.get(m[1], m[1])


def read(text: str, file: str = "<string>") -> list[Expr]:
    """Every top-level expression of ``text``; raises :class:`RuleError` with the position."""
    # Reading makes many small objects and no reference cycles: the cyclic collector would only
    # rescan them (a 4 MiB file reads about four times faster with it paused).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _read(text, file)
    finally:
        if was_enabled:
            gc.enable()


def _read(text: str, file: str) -> list[Expr]:
    out: list[Expr] = []
    stack: list[tuple[Pos, list, int]] = []
    line, line_start = 1, 0

    for m in _TOKEN.finditer(text):
        kind = m.lastindex  # the group matched: 1 newline, 2 (, 3 ), 4 string, 5 atom, 6 lone quote
        if kind is None:
            continue  # blanks, comment
        i = m.start()
        if kind == 1:
            line, line_start = line + 1, i + 1
            continue
        here = Pos(file, line, i - line_start + 1)
        if kind == 2:
            if len(stack) >= MAX_DEPTH:
                raise RuleError(here, f"lists nested deeper than {MAX_DEPTH} levels; split the form")
            stack.append((here, [], i))
            continue
        if kind == 3:
            if not stack:
                raise RuleError(here, "unexpected ')' with no open '('")
            start, items, offset = stack.pop()
            x: Expr = SList(tuple(items), start, here, (offset, i + 1))
        elif kind == 4:
            x = Atom(_ESCAPE.sub(_unescape, m[4][1:-1]), "str", here)
        elif kind == 5:
            x = _atom(m[5], here)
        else:
            spans = "\n" in text[i:]
            raise RuleError(here, "unterminated string" + (" (strings cannot span lines)" if spans else ""))
        (stack[-1][1] if stack else out).append(x)
    if stack:
        outer, inner = stack[0][0], stack[-1][0]
        more = "" if outer == inner else f"; the innermost unclosed '(' is at line {inner.line}, column {inner.col}"
        raise RuleError(outer, f"unclosed '(' opened here (missing ')' before the end of the file){more}")
    return out


def source_text(text: str, form: SList) -> str:
    """The exact text of a form read from ``text`` (for passing egglog forms through unchanged)."""
    return text[form.span[0]:form.span[1]]
