"""The boundary to what a user names and hands in: files read and written, and their text printed.

Files named on the command line or in the API (kernel files, rule files, saved traces, outputs) may be
anything: a FIFO nobody writes blocks a reader for ever, one nobody reads blocks a writer, and a
device may never end. So a file is read only when it is a regular file (checked before it is opened,
and again on the open descriptor), and written only when it is a regular file or a device such as
``/dev/null`` -- never a FIFO or a socket, opened without blocking. A refusal is an :class:`OSError`
(:class:`NotRegularFile`) whose ``strerror`` says why, so that each caller's own ``cannot read FILE:
...`` message names it.

Text that comes from such files (file names, rule names, ``(fail "...")`` messages, a saved
trace's fields) is printed through :func:`printable`: a newline, carriage return or terminal escape
in it cannot forge a line of output or drive the terminal.
"""
from __future__ import annotations

import errno
import os
import stat

class NotRegularFile(OSError):
    """A file refused for its kind (FIFO, device, socket, folder); ``strerror`` names the kind."""


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object) -> str:
    """``text`` (made a ``str``) with every character that is not printable -- newlines, carriage
    returns, ESC and the other C0/C1 controls, line and paragraph separators -- written as a Python
    escape (``\\n``, ``\\x1b``, ``\\u2028``), so that it prints as one line that drives no terminal.
    Text that needs no escaping is returned as it is."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else _ESCAPES.get(c) or
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000
                    else f"\\U{ord(c):08x}") for c in s)


def _refusal(mode: int, what: str) -> NotRegularFile | None:
    """The error for a file of ``mode`` that may not be ``what`` (read: only regular files)."""
    if stat.S_ISREG(mode):
        return None
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else \
        "a folder" if stat.S_ISDIR(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
        "not a regular file"
    return NotRegularFile(errno.EINVAL, f"{kind}; cbrules reads only regular files ({what})")


def check_readable(path: str | os.PathLike, what: str) -> None:
    """Raise :class:`OSError` unless ``path`` is a regular file (following symlinks), without opening it:
    a FIFO, device, socket or folder is refused by its kind."""
    bad = _refusal(os.stat(path).st_mode, what)
    if bad:
        raise bad


def read_regular(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path`` (the caller refuses ``limit + 1``).
    Anything but a regular file is refused before it is opened, and once more on the open descriptor
    (opened without blocking: a FIFO swapped in between does not wait for a writer)."""
    check_readable(path, what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
                 | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        bad = _refusal(os.fstat(fd).st_mode, what)
        if bad:
            raise bad
        return f.read(limit + 1)


def _unwritable(mode: int, what: str) -> NotRegularFile | None:
    """The error for a file of ``mode`` that may not receive ``what``: a FIFO, socket or folder."""
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISDIR(mode):
        kind = _refusal(mode, what).strerror.split(";")[0]
        return NotRegularFile(errno.EINVAL, f"{kind}; cbrules writes {what} only to a regular file or a device")
    return None


def write_text(path: str | os.PathLike, text: str, what: str) -> None:
    """Write ``text`` (UTF-8) to ``path``: a regular file (created or truncated) or a device such as
    ``/dev/null``. A FIFO or socket is refused: opened for writing without blocking (a FIFO nobody
    reads fails at once), its kind is checked before one byte is written."""
    bad = _unwritable(os.stat(path).st_mode, what) if os.path.exists(path) else None
    if bad:
        raise bad
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0),
                     0o666)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO with no reader, swapped in after the check above
            raise _unwritable(stat.S_IFIFO, what) from None
        raise
    with os.fdopen(fd, "wb") as f:
        mode = os.fstat(fd).st_mode
        bad = _unwritable(mode, what)
        if bad:
            raise bad
        if stat.S_ISREG(mode):
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)  # a device may take its time: only the open had to be non-blocking
        f.write(text.encode("utf-8"))
