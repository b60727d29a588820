"""The state the protocol checker (:mod:`.protocol`) keeps about ordering inside a block: the vector
clocks of its threads (:class:`Clocks`: who has seen whose past, through arrivals, waits and syncs) and
every mbarrier slot (:class:`Barriers`: init, arrivals, transaction bytes, completed phases, and whether
the TMA unit may see the init), the proxy fences (:class:`ProxyFences`), and each shared buffer's data
with who wrote and read which element (:class:`SharedBuffer`)."""
from __future__ import annotations

from collections import deque
from typing import Optional

import numpy as np

_EPOCH_LIMIT = 2 ** 30  # read marks are int32: epoch + a clock of one block stays below 2**31


class Clocks:
    """Vector clocks of the threads of a block (see the module docstring)."""

    def __init__(self, threads: int):
        self.now = np.zeros(threads, np.int64)
        self.known = np.full((threads, threads), -1, np.int64)  # known[u, t]: t's latest clock ordered before u

    def tick(self, lanes: np.ndarray) -> np.ndarray:
        """What ``lanes`` release by arriving: their knowledge and their own clocks; then they tick."""
        vec = self.known[lanes].max(axis=0)
        vec[lanes] = np.maximum(vec[lanes], self.now[lanes])
        self.now[lanes] += 1
        return vec

    def acquire(self, lanes: np.ndarray, vec: np.ndarray) -> None:
        self.known[lanes] = np.maximum(self.known[lanes], vec)

    def sync_all(self) -> None:
        """A block-wide barrier: every thread learns everything, then every clock ticks."""
        self.known[:] = np.maximum(self.known.max(axis=0), self.now)
        self.now += 1

    def sync_lanes(self, lanes: np.ndarray) -> None:
        """A barrier among ``lanes`` only (a named barrier): they learn what any of them knew."""
        vec = self.known[lanes].max(axis=0)
        vec[lanes] = np.maximum(vec[lanes], self.now[lanes])
        self.known[lanes] = np.maximum(self.known[lanes], vec)
        self.now[lanes] += 1

    def view_of(self, u: int) -> np.ndarray:
        """Per thread, the latest clock ordered before thread ``u``'s present (its own: now)."""
        v = self.known[u].copy()
        v[u] = self.now[u]
        return v


class ProxyFences:
    """The ``fence.proxy.async`` of a block's threads, as (thread, clock, view) records: thread ``w``'s
    fence covers every access ordered before it (its view then). A TMA refill by ``u`` (the async
    proxy) may overwrite an element a thread read with a plain load (the generic proxy) only if a
    fence covering that read is itself ordered before ``u`` (:meth:`covered`)."""

    def __init__(self, threads: int):
        self.threads = threads
        self.reset()

    def reset(self) -> None:
        self.who = np.zeros(0, np.int64)
        self.at = np.zeros(0, np.int64)
        self.views = np.zeros((0, self.threads), np.int64)

    def fence(self, lanes: np.ndarray, clocks: Clocks) -> None:
        """``lanes`` fence; their clocks tick, so that their later reads are not covered."""
        views = np.stack([clocks.view_of(int(w)) for w in lanes]) if lanes.size else self.views[:0]
        self.who = np.concatenate([self.who, lanes.astype(np.int64)])
        self.at = np.concatenate([self.at, clocks.now[lanes]])
        self.views = np.concatenate([self.views, views])
        clocks.now[lanes] += 1

    def covered(self, u: int, clocks: Clocks) -> np.ndarray:
        """Per thread, its latest clock whose accesses a fence ordered before thread ``u`` covers (-1: none)."""
        ok = self.at <= clocks.view_of(u)[self.who]
        return self.views[ok].max(axis=0) if ok.any() else np.full(self.threads, -1, np.int64)


class Barriers:
    """Every mbarrier slot of a block, numbered globally (``names[i]`` = (buffer, slot))."""

    def __init__(self, threads: int, sizes: dict[str, int]):
        self.threads, self.size, self.base, self.names = threads, dict(sizes), {}, []
        for buf, n in sizes.items():
            self.base[buf] = len(self.names)
            self.names += [(buf, s) for s in range(n)]

    def reset(self) -> None:
        n, t = len(self.names), self.threads
        self.state = np.zeros(n, np.int8)  # 0 never initialised, 1 valid, 2 invalidated
        self.visible = np.zeros((n, t), bool)  # threads that may use it (init ordered before them)
        self.initialiser = np.full(n, -1, np.int64)  # the thread whose init is the latest
        self.fenced = np.zeros(n, bool)  # that thread ran fence.proxy.async since: the TMA unit sees the init
        self.count = np.zeros(n, np.int64)
        self.pending = np.zeros(n, np.int64)
        self.tx = np.zeros(n, np.int64)
        self.phase = np.zeros(n, np.int64)  # completed phases, counted over every init of the slot
        self.epoch = np.zeros(n, np.int64)  # ... of them before its latest init (which restarts parity at 0)
        self.expected = np.zeros(n, np.int64)
        self.delivered = np.zeros(n, np.int64)
        self.observed = np.zeros((n, t), np.int64)  # completed phases each thread has seen via a wait
        self.arrived = np.full((n, t), -1, np.int64)  # clocks released by the current phase's arrivals
        self.released = np.full((n, t), -1, np.int64)  # ... by all completed phases
        self.inflight: list[deque] = [deque() for _ in range(n)]

    def label(self, sid: int) -> str:
        b, s = self.names[sid]
        return f"{b}[{s}]"

    def current(self, sid: int) -> int:
        """The current phase of the slot as the hardware numbers it: from 0 at its latest init."""
        return int(self.phase[sid] - self.epoch[sid])


class SharedBuffer:
    """A shared allocation: its data and, for buffers TMA loads fill, who wrote and read what; for
    buffers the async proxy reads (``proxied``: TMA store sources, mma operands), each element's last
    generic store and the writer's first ``fence.proxy.async`` after it."""

    def __init__(self, name: str, dtype, size: int, threads: int, tracked: bool, proxied: bool = False):
        self.name = name
        self.data = np.empty(size, dtype)
        self.tracked, self.proxied = tracked, proxied
        self.fresh = np.empty(size, bool)  # written since a TMA store last sent it
        if proxied:
            self.g_thread = np.empty(size, np.int64)  # the thread of the last generic store (-1: none since an async write)
            self.g_node = np.empty(size, np.int64)  # ... its node
            self.g_fence = np.empty(size, np.int64)  # ... the writer's clock at its first proxy fence since (-1: none)
            self.a_group = np.empty(size, np.int64)  # the warp group whose wgmma.wait_group completed an mma read (-1: none)
            self.a_node = np.empty(size, np.int64)  # ... that mma's node
            self.a_done = np.empty(size, np.int64)  # ... the clock of the group's first thread at that wait
        if tracked:
            self.w_slot = np.empty(size, np.int64)  # barrier slot the last TMA write completes on
            self.w_phase = np.empty(size, np.int64)  # ... and the phase (INFLIGHT until delivered)
            self.w_node = np.empty(size, np.int64)
            # epoch + the clock of each thread's last read (below epoch: none in this block) ...
            # (zeros: the allocator's untouched zero pages, where a fill would touch every page)
            self.readers = np.zeros((size, threads), np.int32)
            self.plain = np.zeros((size, threads), np.int32)  # ... and of its last plain load (generic proxy)
        self.epoch = 1
        self.clear()

    def read_clocks(self) -> np.ndarray:
        """Per element and thread, the clock of the thread's last read in this block (-1: none)."""
        return np.where(self.readers >= self.epoch, self.readers - self.epoch, -1)

    def clear(self, top: Optional[int] = None) -> None:
        """The state at the start of a block. ``top``: the previous block's latest clock; its read marks
        stay, below a new epoch, instead of a refill of the large element x thread arrays."""
        # floats (bfloat16 too, which numpy does not class as floating) start as NaN: a read before a write shows
        self.data.fill(np.nan if self.data.dtype.kind in "fV" else 0)
        self.fresh.fill(False)
        if self.proxied:
            self.g_thread.fill(-1)
            self.g_node.fill(-1)
            self.g_fence.fill(-1)
            self.a_group.fill(-1)
        if self.tracked:
            self.w_slot.fill(-1)
            self.w_phase.fill(0)
            self.w_node.fill(-1)
            if top is None:
                return
            if self.epoch + top + 1 < _EPOCH_LIMIT:
                self.epoch += top + 1  # every mark of the previous block is now below it
            else:
                self.epoch = 1
                self.readers.fill(0)
                self.plain.fill(0)
