"""A scope's children by the resources they read or write (registers, buffers, the sync token), kept
while the graph changes, so that placing a node reads only the siblings that share its resources
(:func:`cbrules.ir.ops.nearest_conflicts_among`); :class:`cbrules.ir.graph.KernelGraph` keeps one per
scope while it keeps derived facts."""
from __future__ import annotations

from typing import Callable, Iterable, Optional

Effects = tuple[frozenset, frozenset]  # (reads, writes)


class ScopeResources:
    """``users``: resource -> the children that read or write it; ``writers``: resource -> those that
    write it; ``seen``: child -> the effects the index lists it with; ``stale``: the children to read
    again (changed since, or new)."""

    __slots__ = ("users", "writers", "seen", "stale")

    def __init__(self, children: Iterable[int]):
        self.users: dict[str, set[int]] = {}
        self.writers: dict[str, set[int]] = {}
        self.seen: dict[int, Effects] = {}
        self.stale: set[int] = set(children)

    def refresh(self, now_of: Callable[[int], Optional[Effects]]) -> tuple[dict, dict]:
        """Read the stale children again (``now_of``: a child's effects, None when it is no longer a
        child) and return (users, writers)."""
        users, writers, seen = self.users, self.writers, self.seen
        for c in self.stale:
            old = seen.pop(c, None)
            now = now_of(c)
            if now is not None and now == old:  # most changes inside a child leave its effects as they were
                seen[c] = now
                continue
            if old is not None:
                for r in old[0] | old[1]:
                    users[r].discard(c)
                for r in old[1]:
                    writers[r].discard(c)
            if now is not None:
                seen[c] = reads, writes = now
                for r in reads | writes:
                    users.setdefault(r, set()).add(c)
                for r in writes:
                    writers.setdefault(r, set()).add(c)
        self.stale.clear()
        return users, writers

    def grow(self, child: int, reads: frozenset, writes: frozenset, new: bool) -> None:
        """``child`` now also reads ``reads`` and writes ``writes`` (a node joined it, or ``new``: it
        joined the scope itself): list it for them now, or read it again later if it is stale or was
        never read."""
        old = self.seen.get(child)
        if new and old is None and child not in self.stale:  # new to the index: listed now, not read again
            old = self.seen[child] = (frozenset(), frozenset())
        if child in self.stale or old is None:
            self.stale.add(child)
            return
        for r in (reads | writes) - old[0] - old[1]:
            self.users.setdefault(r, set()).add(child)
        for r in writes - old[1]:
            self.writers.setdefault(r, set()).add(child)
        self.seen[child] = (old[0] | reads, old[1] | writes)
