"""Text edits of generated CUDA for the hand-made variants of the probes (benchmarks/profile_tc.py,
benchmarks/probe_memcheck.py): each edit insists on finding exactly what it replaces, so a change in
the generated code stops a probe instead of silently measuring the unedited kernel."""
from __future__ import annotations

import re


def sub(text: str, old: str, new: str, count: int = 1, who: str = "probe") -> str:
    """``text`` with ``old`` replaced by ``new``; exits naming ``who`` unless ``old`` occurs ``count`` times."""
    n = text.count(old)
    if n != count:
        raise SystemExit(f"{who}: expected {count} of {old[:70]!r} in the generated CUDA, found {n}")
    return text.replace(old, new)


def resub(text: str, pattern: str, new: str, count: int = 1, who: str = "probe") -> str:
    """``text`` with the matches of regular expression ``pattern`` replaced by ``new`` (which may refer to
    groups); exits naming ``who`` unless there are exactly ``count`` matches."""
    out, n = re.subn(pattern, new, text)
    if n != count:
        raise SystemExit(f"{who}: expected {count} of /{pattern[:70]}/ in the generated CUDA, found {n}")
    return out


def between(text: str, start: str, end: str, new: str) -> str:
    """``text`` with the span from ``start`` through the next ``end`` replaced by ``new``."""
    i = text.index(start)
    j = text.index(end, i) + len(end)
    return text[:i] + new + text[j:]
