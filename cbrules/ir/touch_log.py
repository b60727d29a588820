"""The touch log a lowering keeps on its graph: each node marked with the last step that changed it or a
node inside it, and a trail of the marks in step order, so that the rewrite engine can ask what changed
since a step (the anchored rules match again only there; see :mod:`cbrules.rewrite.anchors`)."""
from __future__ import annotations

import bisect
from typing import Container


class TouchLog:
    """Marks made at the current ``step``; :meth:`since` and :meth:`at` read them back."""

    __slots__ = ("last", "trail", "step")

    def __init__(self, step: int):
        self.last: dict[int, int] = {}  # node -> the last step that marked it
        self.trail: list[tuple[int, int]] = []  # (step, node) for each new mark, in step order
        self.step = step

    def mark(self, n: int) -> None:
        if self.last.get(n) != self.step:
            self.last[n] = self.step
            self.trail.append((self.step, n))

    def marked_now(self, n: int) -> bool:
        """Whether ``n`` was marked at the current step."""
        return self.last.get(n) == self.step

    def since(self, step: int, present: Container[int]) -> list[int]:
        """The nodes of ``present`` marked after ``step``, in no particular order."""
        first = bisect.bisect_right(self.trail, step, key=lambda mark: mark[0])
        return list({n for _, n in self.trail[first:] if n in present})

    def at(self, step: int) -> list[int]:
        """The nodes marked with ``step`` (removed ones too), in no particular order."""
        trail = self.trail
        i = len(trail)
        while i and trail[i - 1][0] >= step:  # the last step's marks end the trail
            i -= 1
        return [n for st, n in trail[i:] if st == step]
