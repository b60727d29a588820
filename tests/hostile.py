"""What hostile-input tests accept (the documented named errors), a scan of generated CUDA, and the
Hypothesis strategies of hostile term text and saved-trace values that the fuzz tests draw from."""
from __future__ import annotations

import re
import signal
from contextlib import contextmanager
from typing import Iterator

from hypothesis import strategies as st

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


# ------------------------------------------------------------------------------ strategies (issue 28)
_TERM_PIECES = ["x", "i", "7", "2.5f", "true", "min(", "max(", "ceil_div(", "elect_one()", "swizzle(", "(", ")", ",",
                "-", "!", "+", "*", "/", "%", "<", "<=", "==", "&&", "||", "threadIdx.x", "99999999999999999999999",
                "$", "\u00e9", "\n", "printf("]


@st.composite
def hostile_term_text(draw) -> str:
    """Term text made of term pieces, sometimes one piece repeated thousands of times (a literal of
    thousands of digits, nesting thousands deep, a chain thousands long)."""
    pieces = draw(st.lists(st.sampled_from(_TERM_PIECES), max_size=30))
    if draw(st.booleans()):
        at = draw(st.integers(0, len(pieces)))
        pieces[at:at] = [draw(st.sampled_from(["(", "-", "!", "min(", "x + ", "1"]))] * draw(
            st.sampled_from([150, 250, 5000, 60_000]))
    return " ".join(pieces)


# JSON values as a saved trace holds them, tagged values and text that must not be printed included
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=8),
              st.sampled_from(["\n", "\x1b[2J", "#2", "cb-main", "build", "rule"])),
    lambda kids: st.one_of(st.lists(kids, max_size=3),
                           st.dictionaries(st.sampled_from(["tuple", "dict", "term", "param", "by", "x"]), kids,
                                           max_size=2)),
    max_leaves=8)


def json_places(doc) -> list:
    """Every (container, key) of a JSON document that holds a value, in a fixed order."""
    out, stack = [], [doc]
    while stack:
        x = stack.pop()
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        for k, v in items:
            out.append((x, k))
            stack.append(v)
    return out
