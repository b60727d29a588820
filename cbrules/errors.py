"""The common base of cbrules' named errors.

A user or hostile-input error is a subclass of :class:`CbrulesError` whose message names the node,
rule (file:line:col) or value at fault and the fix; the command line prints such an error as one
line. Anything else reaching the command line is a bug in cbrules.
"""
from __future__ import annotations

import difflib
from typing import Iterable


class CbrulesError(Exception):
    """A named error caused by the kernel, the rules or the options the user gave."""


class CliError(CbrulesError):
    """A user error in the command line or the files it names: printed to stderr, exit code 2."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the choice closest to ``word``, or nothing when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
