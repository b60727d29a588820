"""What hostile-input tests accept: the documented named errors, and a scan of generated CUDA."""
from __future__ import annotations

import re
import signal
from contextlib import contextmanager
from typing import Iterator

from cbrules.errors import CbrulesError

# every named error of cbrules derives from CbrulesError (tests/test_hostile_cli.py checks the CLI
# prints each as one line); anything else escaping is a bug
NAMED_ERRORS: tuple = (CbrulesError,)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def identifiers_in_body(source: str) -> set[str]:
    """Identifier tokens of the kernel itself (after the prelude), comments and strings left out."""
    body = source[source.index('extern "C"'):]
    body = re.sub(r"//[^\n]*", "", body)
    body = re.sub(r'"(?:\\.|[^"\\])*"', "", body)
    return set(_IDENT.findall(body))


class TookTooLong(AssertionError):
    """The time bound of a hostile-input test passed: such input must never hang."""


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail (instead of hanging) when the block runs longer than ``seconds`` (POSIX alarm)."""
    def ring(*_):
        raise TookTooLong(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
