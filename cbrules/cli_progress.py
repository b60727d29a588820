"""The command line's progress line: a command that lowers or checks and runs for more than a few
seconds says on stderr, every few seconds, what it is doing (the command's step, the lowering's
phase and rule application), so a slow run can be told from a hang.

``CBRULES_PROGRESS_AFTER`` sets the seconds before the first line (default 5; 0 turns the lines
off); each later line follows ``EVERY_S`` seconds after the one before.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Iterator

AFTER_VAR = "CBRULES_PROGRESS_AFTER"
AFTER_S = 5.0
EVERY_S = 10.0


class Task:
    """What the command itself is at (e.g. "check: trip count 4 (5/13)"), set as it goes."""

    now = ""


def _after_s() -> float:
    text = os.environ.get(AFTER_VAR, "").strip()
    try:
        value = float(text) if text else AFTER_S
    except ValueError:
        return AFTER_S  # an unreadable setting keeps the default: the line only informs
    return value if value == value and 0 <= value <= 86400 else AFTER_S


def _line(text: str) -> None:
    try:
        sys.stderr.write(f"cbrules: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # stderr gone: nothing to tell


@contextlib.contextmanager
def progress_lines(command: str) -> Iterator[None]:
    """Print a progress line on stderr after ``CBRULES_PROGRESS_AFTER`` seconds and every
    ``EVERY_S`` after, until the block ends."""
    after = _after_s()
    if after <= 0:
        yield
        return
    from .rewrite.engine import PROGRESS
    stop, start = threading.Event(), time.monotonic()
    Task.now = ""

    def beat() -> None:
        wait = after
        while not stop.wait(wait):
            doing = "; ".join(x for x in (Task.now, PROGRESS.describe() if PROGRESS.lowering else "") if x)
            _line(f"{command}: still working after {time.monotonic() - start:.0f} s" + (f": {doing}" if doing else ""))
            wait = EVERY_S

    beater = threading.Thread(target=beat, name="cbrules-progress", daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        Task.now = ""
