"""S-expression reader with source positions, for rule files.

Atoms keep their file, line and column so every later error (checker, matcher, actions, egglog)
can point at the user's text. Strings are double-quoted with backslash escapes; ``;`` starts a
comment. The reader never evaluates anything.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Pos:
    """A place in a rule file (1-based line and column)."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class RuleError(Exception):
    """An error in a rule file, located at ``pos``; the message starts with ``file:line:col``."""

    def __init__(self, pos: Pos, message: str):
        super().__init__(f"{pos}: {message}")
        self.pos = pos
        self.detail = message


@dataclass(frozen=True)
class Atom:
    """A symbol, keyword (``:phase``), pattern variable (``?x``), string or number."""

    value: Union[str, int, float]
    kind: str  # sym | kw | var | str | int | float
    pos: Pos

    def __str__(self) -> str:
        if self.kind == "str":
            return f'"{self.value}"'
        return f":{self.value}" if self.kind == "kw" else str(self.value)


@dataclass(frozen=True)
class SList:
    """A parenthesised list; ``end`` is the position of its closing parenthesis."""

    items: tuple
    pos: Pos
    end: Pos

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
_DELIMS = set("()\";") | set(" \t\r\n")


def _atom(text: str, pos: Pos) -> Atom:
    if text.startswith(":") and len(text) > 1:
        return Atom(text[1:], "kw", pos)
    if text.startswith("?") and len(text) > 1:
        return Atom(text, "var", pos)
    try:
        return Atom(int(text), "int", pos)
    except ValueError:
        pass
    try:
        return Atom(float(text), "float", pos)
    except ValueError:
        return Atom(text, "sym", pos)


def read(text: str, file: str = "<string>") -> list[Expr]:
    """Every top-level expression of ``text``; raises :class:`RuleError` with the position."""
    out: list[Expr] = []
    stack: list[tuple[Pos, list]] = []
    i, line, col = 0, 1, 1
    n = len(text)

    def emit(x: Expr) -> None:
        (stack[-1][1] if stack else out).append(x)

    while i < n:
        c = text[i]
        here = Pos(file, line, col)
        if c == "\n":
            i, line, col = i + 1, line + 1, 1
        elif c in " \t\r":
            i, col = i + 1, col + 1
        elif c == ";":
            while i < n and text[i] != "\n":
                i += 1
        elif c == "(":
            stack.append((here, []))
            i, col = i + 1, col + 1
        elif c == ")":
            if not stack:
                raise RuleError(here, "unexpected ')' with no open '('")
            start, items = stack.pop()
            emit(SList(tuple(items), start, here))
            i, col = i + 1, col + 1
        elif c == '"':
            j, buf = i + 1, []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    j += 1
                    buf.append({"n": "\n", "t": "\t"}.get(text[j], text[j]))
                elif text[j] == "\n":
                    raise RuleError(here, "unterminated string (strings cannot span lines)")
                else:
                    buf.append(text[j])
                j += 1
            if j >= n:
                raise RuleError(here, "unterminated string")
            emit(Atom("".join(buf), "str", here))
            col += j + 1 - i
            i = j + 1
        else:
            j = i
            while j < n and text[j] not in _DELIMS:
                j += 1
            emit(_atom(text[i:j], here))
            col += j - i
            i = j
    if stack:
        outer, inner = stack[0][0], stack[-1][0]
        more = "" if outer == inner else f"; the innermost unclosed '(' is at line {inner.line}, column {inner.col}"
        raise RuleError(outer, f"unclosed '(' opened here (missing ')' before the end of the file){more}")
    return out


def source_text(text: str, form: SList) -> str:
    """The exact text of a top-level form (for passing egglog forms through unchanged)."""
    lines = text.split("\n")
    first, last = form.pos.line - 1, form.end.line - 1
    if first == last:
        return lines[first][form.pos.col - 1:form.end.col]
    chunk = [lines[first][form.pos.col - 1:]] + lines[first + 1:last] + [lines[last][:form.end.col]]
    return "\n".join(chunk)
