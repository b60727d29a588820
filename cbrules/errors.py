"""The common base of cbrules' named errors.

A user or hostile-input error is a subclass of :class:`CbrulesError` whose message names the node,
rule (file:line:col) or value at fault and the fix; the command line prints such an error as one
line. Anything else reaching the command line is a bug in cbrules.
"""
from __future__ import annotations


class CbrulesError(Exception):
    """A named error caused by the kernel, the rules or the options the user gave."""


class CliError(CbrulesError):
    """A user error in the command line or the files it names: printed to stderr, exit code 2."""
