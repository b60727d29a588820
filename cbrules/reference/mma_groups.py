"""The asynchronous side of warpgroup MMA in the protocol checker: fences, groups, in-flight reads.

A ``wgmma.mma_async`` only issues: the tensor cores read its shared tiles and write its accumulator
registers some time before the ``wgmma.wait_group`` that covers its group returns. The model
(:class:`MmaGroups`, one per block, owned by :class:`cbrules.reference.protocol.BlockProtocol`):

* **fence**: a warp group's mma reads its accumulator registers as they were at its last
  ``wgmma.fence``; an mma by a thread that never fenced, or whose accumulator an ordinary
  instruction wrote since its last fence, is a :class:`MissingWgmmaFence` (consecutive mma on one
  accumulator need no fence between them: the hardware orders those);
* **groups**: per warp group, the mma issued since the last ``commit_group`` are open; a commit
  closes them into a group (an empty one too: it counts for ``wait_group``); ``wait_group N``
  completes all but the newest N groups;
* **reads in flight**: the shared elements an mma reads count as being read until its group
  completes. A TMA refill or a store to such an element is a :class:`WarHazard`. At completion the
  reads are recorded for the warp group's threads at that moment, so the ordinary WAR check of
  the next refill (every read ordered before the refill's issue by barriers) covers them too: an
  empty-barrier arrive before the ``wait_group`` does not order them;
* **accumulators in flight**: an ordinary read or write of an accumulator register array while an
  mma of that thread writing it has not completed is an :class:`AccumulatorInFlight`, and so is a write of
  a register operand (the register-A form's A) that such an mma reads; the A registers, like the
  accumulator, are read as they were at the last fence (a write since is a :class:`MissingWgmmaFence`);
* an mma still open or in flight when the block ends is an :class:`MmaInFlight`.

At issue, the RAW side: every thread of the warp group must have observed the barrier phase that
completes the TMA load of each element the mma reads; and the layout: the TMA load must have
written the element with the swizzle the mma reads it with (:class:`SwizzleMismatch`; the bytes
would be misread, which the numbers would show too, less clearly).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .hazards import ProtocolError, RawHazard, SiteFn, WarHazard

if TYPE_CHECKING:  # the protocol owns this model; imported for types only
    from .order_state import SharedBuffer
    from .protocol import BlockProtocol

WARPGROUP = 128


class MissingWgmmaFence(ProtocolError):
    """An mma whose accumulator registers were written (or never fenced) since the warp group's last
    ``wgmma.fence``."""


class AccumulatorInFlight(ProtocolError):
    """An ordinary read or write of accumulator registers that an mma not yet waited for writes."""


class SwizzleMismatch(ProtocolError):
    """An mma reading shared elements with another swizzle than the TMA load that wrote them."""


class MmaInFlight(ProtocolError):
    """The block ends with an mma that no ``wgmma.wait_group`` completed."""


@dataclass
class Issue:
    """One mma node issued by warp group ``wg``: its accumulator and the shared elements it reads."""

    node: int
    wg: int
    acc: str
    reads: list  # [(SharedBuffer, element indices)]
    operand: str | None = None  # the register array it reads as A (the register-A form), if any


class MmaGroups:
    """The wgmma state of one block (see the module docstring)."""

    def __init__(self, proto: "BlockProtocol"):
        self.proto = proto
        T = proto.threads
        self.fenced = np.zeros(T, bool)  # the thread has executed a wgmma.fence
        self.dirty: dict[str, np.ndarray] = {}  # register array -> threads that wrote it since their fence
        self.open: dict[int, list[Issue]] = {}  # warp group -> mma issued since its last commit
        self.groups: dict[int, deque] = {}  # warp group -> committed groups, oldest first
        self.reading: dict[str, np.ndarray] = {}  # shared buffer -> in-flight mma reads of each element
        self.layout: dict[str, np.ndarray] = {}  # shared buffer -> swizzle span its last TMA write used (-1: none)

    # ---------------------------------------------------------------- issue, commit, wait, fence
    def fence(self, lanes: np.ndarray) -> None:
        """``wgmma.fence`` by ``lanes``: their register writes so far are seen by their next mma."""
        self.fenced[lanes] = True
        for d in self.dirty.values():
            d[lanes] = False

    def issue(self, node: int, wg: int, lanes: np.ndarray, acc: str, reads: list, span, site: SiteFn,
              operand: str | None = None) -> None:
        """Warp group ``wg`` (threads ``lanes``) issues an mma into ``acc`` reading ``reads`` (pairs of a
        shared buffer and element indices) as tiles with a ``span``-byte swizzle (an int for all of them,
        or a tuple of one span for each read: an MN-major B's panels may have another than A's rows), and
        register array ``operand`` as its A (the register-A form)."""
        spans = tuple(span) if isinstance(span, (tuple, list)) else (span,) * len(reads)
        unfenced = lanes[~self.fenced[lanes]]
        if unfenced.size:
            raise MissingWgmmaFence(f"thread {unfenced[0]} issues an mma into {acc} but has not executed "
                                    "wgmma.fence: a warp group fences before its first mma", site())
        dirty = self.dirty.get(acc)
        if dirty is not None and dirty[lanes].any():
            t = int(lanes[dirty[lanes]][0])
            raise MissingWgmmaFence(f"thread {t} wrote accumulator {acc} after its last wgmma.fence and then "
                                    f"issues an mma that accumulates into {acc}: without a fence the tensor cores "
                                    "may read the registers before that write; fence between them", site())
        mine = self.dirty.get(operand) if operand is not None else None
        if mine is not None and mine[lanes].any():
            t = int(lanes[mine[lanes]][0])
            raise MissingWgmmaFence(f"thread {t} wrote register operand {operand} after its last wgmma.fence and "
                                    f"then issues an mma that reads it as A: without a fence the tensor cores may "
                                    "read the registers before that write; fence between them", site())
        for (buf, idx), sp in zip(reads, spans, strict=True):
            self._raw(buf, idx, lanes, site)
            self._same_swizzle(buf, idx, sp, site)
        for buf, idx in reads:  # an element listed twice counts once, here and at completion alike
            if buf.tracked:
                self._reading(buf)[idx] += 1
        self.open.setdefault(wg, []).append(Issue(node, wg, acc, reads, operand))

    def commit(self, wg: int) -> None:
        """``wgmma.commit_group``: the open mma of ``wg`` (possibly none) become its newest group."""
        self.groups.setdefault(wg, deque()).append(self.open.pop(wg, []))

    def wait(self, wg: int, lanes: np.ndarray, pending: int) -> None:
        """``wgmma.wait_group pending``: all but the newest ``pending`` groups of ``wg`` complete; their
        reads count as done by ``lanes`` now."""
        q = self.groups.get(wg, deque())
        # clocks only grow: the time of this wait is each thread's latest read of the elements
        now = self.proto.clocks.now[lanes].astype(np.int32)
        span = slice(int(lanes[0]), int(lanes[-1]) + 1)  # a warp group's threads are consecutive
        while len(q) > pending:
            for issue in q.popleft():
                for buf, idx in issue.reads:
                    if buf.tracked:
                        self._reading(buf)[idx] -= 1
                        buf.readers[idx, span] = now + buf.epoch

    # ---------------------------------------------------------------- checks other ops call
    def tma_written(self, buf: "SharedBuffer", lo: int, n: int, span: int) -> None:
        """A TMA load wrote ``buf[lo:lo+n]`` with a ``span``-byte swizzle (0: none)."""
        layout = self.layout.get(buf.name)
        if layout is None:
            layout = self.layout[buf.name] = np.full(buf.data.size, -1, np.int16)
        layout[lo:lo + n] = span

    def register_access(self, name: str, lanes: np.ndarray, write: bool, site: SiteFn) -> None:
        """An ordinary load (``write`` False) or store of register array ``name`` by ``lanes``."""
        for wg in np.unique(lanes // WARPGROUP):
            for issue in self._in_flight(int(wg)):
                if issue.acc == name:
                    what = "writes" if write else "reads"
                    raise AccumulatorInFlight(f"warp group {wg} {what} accumulator {name} while the mma #{issue.node} "
                                              "writing it has not completed: wgmma.commit_group and "
                                              "wgmma.wait_group must cover it first", site())
                if write and issue.operand == name:  # reading an operand the mma reads too is harmless
                    raise AccumulatorInFlight(f"warp group {wg} writes register operand {name} while the mma "
                                              f"#{issue.node} reading it as A has not completed: wgmma.commit_group "
                                              "and wgmma.wait_group must cover it first", site())
        if write:
            self.dirty.setdefault(name, np.zeros(self.proto.threads, bool))[lanes] = True

    def check_overwrite(self, buf: "SharedBuffer", idx: np.ndarray, what: str, site: SiteFn, barrier=None,
                        slot=None) -> None:
        """``what`` (a TMA refill, a store) writes ``buf[idx]``: no mma may still be reading them."""
        reading = self.reading.get(buf.name)
        if reading is None:
            return
        busy = idx[reading[idx] > 0]
        if not busy.size:
            return
        e = int(busy[0])
        issue = next((i for wg in sorted(set(self.open) | set(self.groups)) for i in self._in_flight(wg)
                      for b, ix in i.reads if b is buf and (ix == e).any()), None)
        who = f"the mma #{issue.node} of warp group {issue.wg}" if issue else "an mma"
        raise WarHazard(f"{what} {buf.name}[{e}] while {who} may still read it: its wgmma group has not been "
                        "completed by a wgmma.wait_group (release a slot only after the wait that covers the mma "
                        "reading it)", site(), barrier, slot)

    def stored(self, buf: "SharedBuffer", idx: np.ndarray, lanes: np.ndarray, site: SiteFn) -> None:
        """A plain store by ``lanes`` to ``buf[idx]``: not while an mma reads them, and afterwards they no
        longer hold a TMA-written layout."""
        self.check_overwrite(buf, idx, f"thread {lanes[0]} writes", site)
        layout = self.layout.get(buf.name)
        if layout is not None:
            layout[idx] = -1

    def finish(self, site: SiteFn) -> None:
        """End of the block: every mma completed."""
        for wg in sorted(set(self.open) | set(self.groups)):
            left = self._in_flight(wg)
            if left:
                raise MmaInFlight(f"the block ends while the mma #{left[0].node} of warp group {wg} has not been "
                                  "completed: commit its group and wait for it (wgmma.wait_group 0) before the "
                                  "accumulators are used or the kernel exits", site())

    # ---------------------------------------------------------------- helpers
    def _in_flight(self, wg: int) -> list[Issue]:
        return [i for g in self.groups.get(wg, ()) for i in g] + self.open.get(wg, [])

    def _reading(self, buf: "SharedBuffer") -> np.ndarray:
        r = self.reading.get(buf.name)
        if r is None:
            r = self.reading[buf.name] = np.zeros(buf.data.size, np.int32)
        return r

    def _same_swizzle(self, buf: "SharedBuffer", idx: np.ndarray, span: int, site: SiteFn) -> None:
        layout = self.layout.get(buf.name)
        if layout is None:
            return
        bad = idx[(layout[idx] >= 0) & (layout[idx] != span)]
        if bad.size:
            e = int(bad[0])
            wrote = f"{layout[e]}B swizzle" if layout[e] else "no swizzle"
            raise SwizzleMismatch(f"an mma reads {buf.name}[{e}] as a tile with {span}B swizzle, but the TMA load that "
                                  f"wrote it used {wrote}: the tensor cores would read other elements than the ones "
                                  "meant; give the tensor map and the mma the same swizzle", site())

    def _raw(self, buf: "SharedBuffer", idx: np.ndarray, lanes: np.ndarray, site: SiteFn) -> None:
        """Every thread of the issuing warp group has observed the phase completing each TMA write."""
        if not buf.tracked:
            return
        slots = buf.w_slot[idx]
        loaded = slots >= 0
        if not loaded.any():
            return
        bars = self.proto.bars
        slots, phases, elems = slots[loaded], buf.w_phase[idx][loaded], idx[loaded]
        for sid in np.unique(slots).tolist():
            seen = bars.observed[sid, lanes]
            late = (slots == sid) & (phases >= seen.min())
            if not late.any():
                continue
            k = int(np.argmax(late))
            e, phase, t = int(elems[k]), int(phases[k]), int(lanes[np.argmin(seen)])
            state = ("has not completed yet" if phase == np.iinfo(np.int64).max else
                     f"completes phase {phase} of {bars.label(sid)}")
            raise RawHazard(f"an mma of thread {t}'s warp group reads {buf.name}[{e}], whose TMA load #{buf.w_node[e]} "
                            f"{state}, but thread {t} has observed only {int(seen.min())} completed phase(s) of "
                            f"{bars.label(sid)} (a missing wait, or one with the wrong parity)", site(),
                            *bars.names[sid])
