"""What the command line prints, made safe to print: stdout that is closed (``>&-``), full
(``/dev/full``) or cannot encode a character (``PYTHONIOENCODING=ascii``) ends the command with a
named error instead of a traceback; an error's text is escaped so that a file name or a rule's
``(fail "...")`` message cannot forge a line or drive the terminal, and no control character but
newline and tab reaches stdout.
"""
from __future__ import annotations

import contextlib
import re
import sys
from typing import Iterator, TextIO

from .errors import CbrulesError
from .userio import printable

CLOSED_CODE = 141  # the exit code of a closed stdout (as a reader that left, e.g. `| head`)


class OutputError(CbrulesError):
    """stdout cannot take the command's output: closed (exit :data:`CLOSED_CODE`), or a write failed
    (e.g. no space left on the device: exit 1)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


# what no output of the command line holds but a terminal obeys: C0/C1 controls but newline and tab
# (ESC, CR, backspace ...) and the line and paragraph separators
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


class _Guarded:
    """A text stream whose failures are :class:`OutputError` (a closed pipe stays a
    BrokenPipeError: a reader that left is not an error), which writes control characters (but
    newline and tab) escaped, so that no text from a rule file or a name drives the terminal, and
    what the stream's encoding cannot hold as backslash escapes."""

    def __init__(self, stream: TextIO | None):
        self._stream = stream

    def write(self, text: str) -> int:
        stream = self._stream
        if stream is None:
            raise OutputError("stdout is closed (>&-), so the output has nowhere to go; redirect it to a file "
                              "or to /dev/null instead", CLOSED_CODE)
        text = _CONTROLS.sub(lambda m: printable(m.group()), text)
        try:
            try:
                return stream.write(text)
            except UnicodeEncodeError:
                enc = getattr(stream, "encoding", None) or "ascii"
                return stream.write(text.encode(enc, "backslashreplace").decode(enc))
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:  # ValueError: a stream closed under us
            raise OutputError(f"cannot write to stdout: {getattr(e, 'strerror', None) or e}", 1) from None

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:
            raise OutputError(f"cannot write to stdout: {getattr(e, 'strerror', None) or e}", 1) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout() -> Iterator[None]:
    """Within the block, ``sys.stdout`` fails only with :class:`OutputError` (or BrokenPipeError)."""
    previous = sys.stdout
    sys.stdout = _Guarded(previous)
    try:
        yield
    finally:
        sys.stdout = previous


def error_text(e: BaseException) -> str:
    """The text of an error as printed: one line, escaped; or one line per error of a
    :class:`~cbrules.rewrite.rulefile.RuleErrors` (``errors``), or per line of an error whose class
    says its text has lines (``multiline``: NVRTC's log), each escaped."""
    parts = getattr(e, "errors", None)
    if isinstance(parts, list) and parts and all(isinstance(x, BaseException) for x in parts):
        return "\n".join(printable(x) for x in parts)
    if getattr(type(e), "multiline", False) is True:
        return "\n".join(printable(line) for line in str(e).splitlines())
    return printable(e)


def to_stderr(text: str) -> None:
    """Print ``text`` to stderr, escaping what its encoding cannot hold; stderr gone: say nothing."""
    try:
        try:
            print(text, file=sys.stderr)
        except UnicodeEncodeError:
            enc = getattr(sys.stderr, "encoding", None) or "ascii"
            print(text.encode(enc, "backslashreplace").decode(enc), file=sys.stderr)
    except (OSError, ValueError, AttributeError):
        pass  # stderr is gone too: nothing left to tell
