"""The pipeline-protocol model the interpreter checks while it runs a block.

Three pieces of state, all per block:

* **mbarriers** (:class:`Barriers`, in :mod:`.order_state`): per slot, whether it is initialised (and which threads can
  see the init), its arrival count, the arrivals still pending in the current phase, the
  transaction bytes (expect-tx adds, TMA completion subtracts) and the number of completed phases.
  A phase completes when no arrival is pending and the tx count is 0. ``try_wait.parity p``
  succeeds when the current phase's parity differs from ``p`` -- exactly the hardware rule, so
  parity aliasing (waiting for a phase two behind) is modelled, not assumed away.
* **asynchronous loads**: a TMA load is queued when issued and delivered as late as possible: only
  when a wait on its barrier could not otherwise succeed. Its elements are "in flight" until then
  and afterwards carry the barrier phase they complete on.
* **ordering between threads** (:class:`Clocks`): vector clocks. A thread's clock ticks at every
  arrive and every block sync; a wait that observes a phase learns the clocks of every arrival of
  the completed phases. A shared element remembers, per thread, the clock at which the thread last
  read it; a refill by thread ``u`` is safe only if every such read is ordered before ``u``'s issue,
  and, since the refill writes through the async proxy, a ``fence.proxy.async`` after the read is
  ordered before the issue too (:class:`ProxyFences`).
* **the two proxies, generic writes then an async read**: a shared element written by a plain store
  (the generic proxy) and then read by the async proxy (a TMA store's source, a wgmma operand) remembers
  its writer and the writer's first ``fence.proxy.async`` after the store. At the async read the fence
  must exist (else :class:`UnfencedProxyWrite`) and be ordered before every issuing thread by a block
  sync, a named barrier over both or an arrive/wait chain (else :class:`UnorderedProxyRead`): the writer
  fences, a fence by the issuer after a barrier does not publish other threads' stores.

Every failure is a :class:`ProtocolError` subclass naming the node, the barrier and slot, the
block, and the iteration (the values of the enclosing loop variables).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

# the checker's failures live in .hazards; they are public here too
from .order_state import Barriers, Clocks, ProxyFences, SharedBuffer  # noqa: F401  (public here too)
from .mma_groups import MmaGroups
from .hazards import (DivergentSync, Deadlock, DoubleInit, ElectError, InterpError,  # noqa: F401
                      MissingInval, OutstandingTma, PartialTileStore, ProtocolError, RawHazard, Site, SiteFn,
                      ProxyHazard, StoreInFlight, StoreOverwrite, TmaIssueError, TooManyArrivals, TxMismatch,
                      UnfencedInit, UnfencedProxyWrite, UnfencedRefill, UnopenedBarrier, UnorderedProxyRead,
                      UseAfterInval, UseBeforeInit, WarHazard)

INFLIGHT = np.iinfo(np.int64).max  # phase of an element whose load has not been delivered yet


@dataclass
class BulkStore:
    """A TMA store committed as a bulk async-group by thread ``issuer``, reading ``buf[lo:hi]``."""

    node: int
    buf: "SharedBuffer"
    lo: int
    hi: int
    issuer: int
    read_at: int = -1  # the issuer's clock at the wait that saw the reads done (-1: still reading)
    done: bool = False  # a non-.read wait saw it complete


@dataclass
class Transfer:
    """A TMA load in flight."""

    node: int
    buf: SharedBuffer
    lo: int
    data: np.ndarray
    nbytes: int
    issued: Optional[Site] = None  # where it was issued (the iteration whose tile it is)


def _issued(t: Transfer) -> str:
    return f", issued in {t.issued}," if t.issued is not None else ""


class BlockProtocol:
    """Protocol state of one block and the checks on every barrier, TMA and shared access."""

    def __init__(self, threads: int, barriers: dict[str, int], shared: dict[str, tuple]):
        """``barriers``: mbarrier buffer -> slots; ``shared``: buffer -> (numpy dtype, size, tracked[,
        proxied]): ``tracked`` for buffers TMA loads fill, ``proxied`` for those the async proxy reads."""
        self.threads = threads
        self.bars = Barriers(threads, barriers)
        self.shared_spec = shared
        self.shared: dict[str, SharedBuffer] = {}
        self.reset()

    def reset(self) -> None:
        """Fresh state for the next block."""
        top = int(self.clocks.now.max()) if self.shared else None  # the previous block's latest clock
        self.bars.reset()
        self.clocks = Clocks(self.threads)
        self.fences = ProxyFences(self.threads)
        self.named: dict[int, np.ndarray] = {}  # named barrier -> threads waiting in it
        self.named_count: dict[int, int] = {}
        self.named_gen: dict[int, int] = {}  # times each named barrier has opened
        self.named_only: dict[int, np.ndarray] = {}  # ... threads in it that arrived without waiting (bar.arrive)
        self.named_release: dict[int, np.ndarray] = {}  # ... what those released when they arrived
        self.stores: list[BulkStore] = []  # bulk groups whose reads are not yet known to every thread
        self.unfinished: list[BulkStore] = []  # ... not yet waited for to completion
        self.mma = MmaGroups(self)  # warpgroup MMA: fences, groups, reads in flight
        if self.shared:  # the buffers of the previous block, cleared
            for buf in self.shared.values():
                buf.clear(top)
        else:
            self.shared = {n: SharedBuffer(n, *spec[:2], self.threads, *spec[2:]) for n, spec in self.shared_spec.items()}
        self.proxied = [b for b in self.shared.values() if b.proxied]

    # ------------------------------------------------------------------ barrier slots
    def slot_id(self, buf: str, slot: int, site: SiteFn) -> int:
        b = self.bars
        if buf not in b.base:
            raise ProtocolError(f"{buf!r} is not an allocated mbarrier array", site(), buf, slot)
        n = b.size[buf]
        if not 0 <= slot < n:
            raise ProtocolError(f"slot {slot} is outside {buf}[0..{n})", site(), buf, slot)
        return b.base[buf] + slot

    def _usable(self, sid: int, lanes: np.ndarray, site: SiteFn, what: str) -> None:
        b = self.bars
        buf, slot = b.names[sid]
        if b.state[sid] == 0:
            raise UseBeforeInit(f"{what} {b.label(sid)}, which was never initialised", site(), buf, slot)
        if b.state[sid] == 2:
            raise UseAfterInval(f"{what} {b.label(sid)} after it was invalidated", site(), buf, slot)
        unseen = lanes[~b.visible[sid, lanes]]
        if unseen.size:
            raise UseBeforeInit(f"thread {unseen[0]} uses {b.label(sid)} ({what}) but no block sync orders the "
                                "barrier's init before it", site(), buf, slot)

    def init(self, sid: int, lanes: np.ndarray, count: int, site: SiteFn) -> None:
        b = self.bars
        buf, slot = b.names[sid]
        if b.state[sid] == 1 or lanes.size > 1:
            raise DoubleInit(f"{b.label(sid)} is initialised again (by {lanes.size} thread(s)) while valid; "
                             "initialise each barrier once, from one thread", site(), buf, slot)
        if count < 1:
            raise ProtocolError(f"arrival count {count} of {b.label(sid)} must be >= 1", site(), buf, slot)
        b.state[sid], b.count[sid], b.pending[sid] = 1, count, count
        b.epoch[sid] = b.phase[sid]  # a re-init after inval starts again at phase 0 (parity 0)
        b.tx[sid] = b.expected[sid] = b.delivered[sid] = 0
        b.visible[sid] = False
        b.visible[sid, lanes] = True
        b.arrived[sid] = -1
        b.initialiser[sid], b.fenced[sid] = lanes[0], False

    def proxy_fence(self, lanes: np.ndarray, data: bool = True) -> None:
        """``fence.proxy.async``: the inits these threads made become visible to the async proxy (TMA),
        and (``data``; not so ``fence.mbarrier_init``) the shared accesses ordered before the fence
        are ordered before the async proxy's later accesses."""
        b = self.bars
        b.fenced |= np.isin(b.initialiser, lanes)
        if data:
            if self.proxied:  # the fencing threads' stores not fenced yet are, at their present clocks
                fencing = np.zeros(self.threads + 1, bool)  # index -1 (no writer): False
                fencing[lanes] = True
                for buf in self.proxied:
                    m = fencing[buf.g_thread] & (buf.g_fence < 0)
                    buf.g_fence[m] = self.clocks.now[buf.g_thread[m]]
            self.fences.fence(lanes, self.clocks)

    def inval(self, sid: int, lanes: np.ndarray, site: SiteFn) -> None:
        b = self.bars
        self._usable(sid, lanes, site, "invalidate")
        if b.inflight[sid]:
            t = b.inflight[sid][0]
            raise OutstandingTma(f"{b.label(sid)} is invalidated while the TMA load #{t.node} into "
                                 f"{t.buf.name}[{t.lo}:{t.lo + t.data.size}]{_issued(t)} is still in flight (nobody "
                                 "waited for it: no reader consumed that tile)",
                                 site(), *b.names[sid])
        b.state[sid] = 2

    def arrive(self, sid: int, lanes: np.ndarray, nbytes: int, site: SiteFn) -> None:
        """Each thread in ``lanes`` arrives once (after adding ``nbytes`` to the expected tx)."""
        b = self.bars
        buf, slot = b.names[sid]
        self._usable(sid, lanes, site, "arrive on")
        n = lanes.size
        if n > b.pending[sid]:
            raise TooManyArrivals(f"{n} arrival(s) on {b.label(sid)} in phase {b.current(sid)} with only "
                                  f"{b.pending[sid]} of its count {b.count[sid]} pending", site(), buf, slot)
        b.tx[sid] += nbytes * n
        b.expected[sid] += nbytes * n
        b.pending[sid] -= n
        b.arrived[sid] = np.maximum(b.arrived[sid], self.clocks.tick(lanes))
        self._maybe_complete(sid, site)

    def _maybe_complete(self, sid: int, site: SiteFn) -> None:
        b = self.bars
        if b.pending[sid] != 0:
            return
        if b.tx[sid] < 0:
            raise TxMismatch(f"phase {b.current(sid)} of {b.label(sid)}: TMA loads delivered {b.delivered[sid]} "
                             f"bytes but the arrivals expected only {b.expected[sid]}", site(), *b.names[sid])
        if b.tx[sid] == 0:
            b.phase[sid] += 1
            b.pending[sid] = b.count[sid]
            b.expected[sid] = b.delivered[sid] = 0
            b.released[sid] = np.maximum(b.released[sid], b.arrived[sid])
            b.arrived[sid] = -1

    def _deliver(self, sid: int, site: SiteFn) -> None:
        b = self.bars
        t = b.inflight[sid].popleft()
        hi = t.lo + t.data.size
        t.buf.data[t.lo:hi] = t.data
        if t.buf.tracked:
            ph = t.buf.w_phase[t.lo:hi]
            ph[(t.buf.w_slot[t.lo:hi] == sid) & (ph == INFLIGHT)] = b.phase[sid]
        b.tx[sid] -= t.nbytes
        b.delivered[sid] += t.nbytes
        self._maybe_complete(sid, site)

    def wait(self, sid: int, lanes: np.ndarray, parity: int, site: SiteFn) -> None:
        """``try_wait.parity`` until it succeeds, with nothing else running meanwhile: deliver this
        slot's loads one by one while it cannot; a wait that still cannot succeed never will."""
        if not self.try_wait(sid, lanes, parity, site):
            raise self.wait_error(sid, parity, site)

    def try_wait(self, sid: int, lanes: np.ndarray, parity: int, site: SiteFn) -> bool:
        """One ``try_wait.parity``: True (and the phase observed) when it succeeds, after delivering
        as many of this slot's loads as it needs; False when the phase cannot complete yet."""
        b = self.bars
        self._usable(sid, lanes, site, "wait on")
        while b.current(sid) % 2 == parity and b.inflight[sid]:
            self._deliver(sid, site)
        if b.current(sid) % 2 == parity:
            return False
        b.observed[sid, lanes] = np.maximum(b.observed[sid, lanes], b.phase[sid])
        self.clocks.acquire(lanes, b.released[sid])
        return True

    def wait_error(self, sid: int, parity: int, site: SiteFn) -> ProtocolError:
        """Why a wait that cannot succeed is stuck (raised once nothing in the block can help it)."""
        b = self.bars
        buf, slot = b.names[sid]
        if b.pending[sid] == 0 and b.tx[sid] != 0:
            return TxMismatch(f"phase {b.current(sid)} of {b.label(sid)} never completes: the arrivals "
                              f"expected {b.expected[sid]} transaction bytes, the TMA loads delivered "
                              f"{b.delivered[sid]}", site(), buf, slot)
        return Deadlock(f"waits for parity {parity} of {b.label(sid)}, but phase {b.current(sid)} (parity "
                        f"{parity}) is still open with {b.pending[sid]} of {b.count[sid]} arrival(s) and "
                        f"{b.tx[sid]} transaction byte(s) pending, and nothing left in the block can "
                        "complete it", site(), buf, slot)

    def sync_all(self) -> None:
        """A block sync: orders every access before it, and publishes barrier inits to every thread."""
        self.clocks.sync_all()
        self.bars.visible[self.bars.state == 1] = True

    # ------------------------------------------------------------------ named barriers (bar.sync id, count)
    def bar_arrive(self, bar: int, count: int, lanes: np.ndarray, site: SiteFn, wait: bool = True) -> tuple[int, int]:
        """Threads ``lanes`` reach ``bar.sync bar, count`` (``wait`` False: ``bar.arrive``, they go on);
        returns a token for :meth:`bar_passed`. When ``count`` threads have arrived the barrier opens: the
        waiting ones are ordered like a block sync among themselves and after what the arriving ones did
        before their arrival, and barrier inits any of them could see become visible to the waiting ones."""
        label = f"named barrier {bar}"
        if not (0 <= bar < 16) or count <= 0 or count % 32 or count > self.threads:
            raise ProtocolError(f"bar.sync {bar}, {count}: the id is 0..15 and the count a multiple of 32 up to "
                                f"the block's {self.threads} threads", site(), label, bar)
        arrived = self.named.setdefault(bar, np.zeros(self.threads, bool))
        if arrived.any() and self.named_count[bar] != count:
            raise ProtocolError(f"bar.sync {bar}, {count} while threads wait at bar.sync {bar}, "
                                f"{self.named_count[bar]}: every use of one named barrier needs one count",
                                site(), label, bar)
        if arrived[lanes].any():
            again = "bar.arrive" if not wait else "bar.sync"
            raise ProtocolError(f"thread {lanes[arrived[lanes]][0]} reaches {again} {bar} again before it opened",
                                site(), label, bar)
        arrived[lanes] = True
        only = self.named_only.setdefault(bar, np.zeros(self.threads, bool))
        if not wait:
            only[lanes] = True
            rel = self.clocks.tick(lanes)
            prev = self.named_release.get(bar)
            self.named_release[bar] = rel if prev is None else np.maximum(prev, rel)
        self.named_count[bar] = count
        total = int(arrived.sum())
        if total > count:
            raise TooManyArrivals(f"{total} threads at bar.sync {bar}, {count}", site(), label, bar)
        gen = self.named_gen.get(bar, 0)
        if total == count:
            who = np.nonzero(arrived & ~only)[0]  # the waiting threads
            self.clocks.sync_lanes(who)
            if bar in self.named_release:
                self.clocks.acquire(who, self.named_release.pop(bar))
            vis = self.bars.visible
            seen = vis[:, np.nonzero(arrived)[0]].any(axis=1) & (self.bars.state == 1)
            vis[:, who] |= seen[:, None]
            arrived[:] = False
            only[:] = False
            self.named_gen[bar] = gen + 1
        return bar, gen

    def bar_passed(self, token: tuple[int, int]) -> bool:
        bar, gen = token
        return self.named_gen.get(bar, 0) > gen

    def bar_error(self, token: tuple[int, int], site: SiteFn) -> Deadlock:
        bar, _ = token
        arrived = self.named.get(bar, np.zeros(self.threads, bool))
        return Deadlock(f"waits at bar.sync {bar}, {self.named_count.get(bar)} with {int(arrived.sum())} thread(s) "
                        "arrived, and nothing left in the block brings the others", site(), f"named barrier {bar}",
                        bar)

    # ------------------------------------------------------------------ shared memory
    def tma_load(self, sid: Optional[int], node: int, buf: SharedBuffer, lo: int, data: np.ndarray,
                 nbytes: int, issuer: int, site: SiteFn) -> None:
        """A TMA load into ``buf[lo:lo+size]``: queued on barrier slot ``sid``, or done at once
        (``sid`` None: a load before lowering, which has no completion mechanism yet)."""
        hi = lo + data.size
        if buf.proxied:  # an async write: no generic store is left to publish there
            buf.g_thread[lo:hi] = -1
        if sid is None:
            buf.data[lo:hi] = data
            if buf.tracked:
                buf.w_slot[lo:hi] = -1
                buf.readers[lo:hi] = buf.plain[lo:hi] = -1
            return
        b = self.bars
        bname, slot = b.names[sid]
        self._usable(sid, np.array([issuer]), site, "issue a TMA load completing on")
        if not b.fenced[sid]:
            raise UnfencedInit(f"thread {issuer} issues a TMA load completing on {b.label(sid)}, whose init (by thread "
                               f"{b.initialiser[sid]}) no fence.proxy.async has made visible to the TMA unit: it may "
                               "see the barrier uninitialised; the initialising thread runs fence_proxy_async after "
                               "its inits, before the block sync", site(), bname, slot)
        self._not_being_stored(buf, np.arange(lo, hi), np.array([issuer]), site)
        self.mma.check_overwrite(buf, np.arange(lo, hi), f"thread {issuer} refills (completing on {b.label(sid)})",
                                 site, bname, slot)
        if buf.tracked:
            busy = np.nonzero(buf.w_phase[lo:hi] == INFLIGHT)[0]
            busy = busy[buf.w_slot[lo + busy] >= 0] if busy.size else busy
            if busy.size:
                e = lo + busy[0]
                raise WarHazard(f"refills {buf.name}[{e}] while the TMA load #{buf.w_node[e]} into it is still "
                                "in flight (nobody waited for it)", site(), bname, slot)
            late = _first_unordered(buf.readers, lo, hi, self.clocks.view_of(issuer) + buf.epoch)
            if late:
                e, t = late
                raise WarHazard(f"thread {issuer} refills {buf.name}[{lo}:{hi}] (completing on "
                                f"{b.label(sid)}) while thread {t} may still read {buf.name}[{e}]: its read is "
                                "not ordered before the refill by a block sync or an arrive/wait chain",
                                site(), bname, slot)
            unfenced = _first_unordered(buf.plain, lo, hi, self.fences.covered(issuer, self.clocks) + buf.epoch)
            if unfenced:
                e, t = unfenced
                raise UnfencedRefill(f"thread {issuer} refills {buf.name}[{lo}:{hi}] (completing on {b.label(sid)}) "
                                     f"through the async proxy, but no fence.proxy.async orders thread {t}'s plain "
                                     f"read of {buf.name}[{e}] before it (the WAR protection orders the generic "
                                     "proxy only): the issuing thread runs fence_proxy_async before the refill",
                                     site(), bname, slot)
            buf.w_slot[lo:hi], buf.w_phase[lo:hi], buf.w_node[lo:hi] = sid, INFLIGHT, node
            buf.readers[lo:hi] = buf.plain[lo:hi] = -1
        b.inflight[sid].append(Transfer(node, buf, lo, data, nbytes, site()))

    def read(self, buf: SharedBuffer, idx: np.ndarray, lanes: np.ndarray, site: SiteFn, plain: bool = True) -> None:
        """Threads ``lanes`` read ``buf[idx]`` (one element each): check RAW, remember the reads
        (``plain``: a load through the generic proxy, not the TMA unit's)."""
        if not buf.tracked:
            return
        slots = buf.w_slot[idx]
        async_ = slots >= 0
        if async_.any():
            phase = buf.w_phase[idx]
            seen = self.bars.observed[np.where(async_, slots, 0), lanes]
            bad = np.nonzero(async_ & (seen <= phase))[0]
            if bad.size:
                k = bad[0]
                e, sid, t = int(idx[k]), int(slots[k]), int(lanes[k])
                state = ("has not completed yet" if phase[k] == INFLIGHT else
                         f"completes phase {phase[k]} of {self.bars.label(sid)}")
                raise RawHazard(f"thread {t} reads {buf.name}[{e}], whose TMA load #{buf.w_node[e]} {state}, but "
                                f"the thread has observed only {seen[k]} completed phase(s) of "
                                f"{self.bars.label(sid)} (a missing wait, or a wait with the wrong parity)",
                                site(), *self.bars.names[sid])
        buf.readers[idx, lanes] = self.clocks.now[lanes] + buf.epoch
        if plain:
            buf.plain[idx, lanes] = self.clocks.now[lanes] + buf.epoch

    def write(self, buf: SharedBuffer, idx: np.ndarray, lanes: Optional[np.ndarray] = None,
              site: Optional[SiteFn] = None, node: int = -1) -> None:
        """A plain store (node ``node``) by ``lanes``: no TMA store may still read the elements; they are
        no longer the product of a TMA load; an async read of them needs the writers' proxy fences."""
        if lanes is not None and site is not None:
            self._not_being_stored(buf, idx, lanes, site)
            self.mma.stored(buf, idx, lanes, site)
        if buf.proxied and lanes is not None:
            buf.g_thread[idx] = lanes if lanes.size == idx.size else lanes[0]
            buf.g_node[idx], buf.g_fence[idx] = node, -1
        buf.fresh[idx] = True
        if buf.tracked:
            buf.w_slot[idx] = -1
            buf.readers[idx] = buf.plain[idx] = -1

    def async_read(self, buf: SharedBuffer, idx: np.ndarray, issuers: np.ndarray, what: str, site: SiteFn) -> None:
        """The async proxy reads ``buf[idx]`` for ``what`` issued by ``issuers`` (the elected thread of a TMA
        store, the warp group of an mma): each element's last generic store must have been fenced by its
        writer, and that fence ordered before every issuer."""
        if not buf.proxied:
            return
        writer = buf.g_thread[idx]
        if not (writer >= 0).any():  # the common case: the TMA loaded it, or nobody wrote it
            return
        fence = buf.g_fence[idx]
        bad = np.nonzero((writer >= 0) & (fence < 0))[0]
        if bad.size:
            e, t = int(idx[bad[0]]), int(writer[bad[0]])
            raise UnfencedProxyWrite(
                f"{what} reads {buf.name}[{e}], which thread {t} wrote with a generic store (#{buf.g_node[e]}) and "
                "no fence.proxy.async followed in that thread: the async proxy may read the old bytes; every "
                "writing thread runs fence_proxy_async after its stores, then a barrier over the writers and "
                "the issuing thread (syncthreads, or bar_sync) comes before the read",
                site(), writer=int(buf.g_node[e]), thread=t, buffer=buf.name, element=e)
        known = self.clocks.known[issuers].copy()  # the latest clock of each thread ordered before each issuer
        known[np.arange(issuers.size), issuers] = self.clocks.now[issuers]
        least = known.min(axis=0)
        w = np.maximum(writer, 0)
        bad = np.nonzero((writer >= 0) & (fence > least[w]))[0]
        if bad.size:
            k = bad[0]
            e, t = int(idx[k]), int(writer[k])
            u = int(issuers[np.argmin(known[:, t])])
            raise UnorderedProxyRead(
                f"{what} reads {buf.name}[{e}], which thread {t} wrote (#{buf.g_node[e]}) and fenced, but no barrier "
                f"orders thread {t}'s fence.proxy.async before thread {u}'s issue: put a syncthreads, or a bar_sync "
                f"whose threads include both {t} and {u}, (or an mbarrier arrive/wait chain) between the fence "
                "and the async read", site(), writer=int(buf.g_node[e]), thread=t, buffer=buf.name, element=e)

    # ------------------------------------------------------------------ TMA stores (bulk async-groups)
    def bulk_store(self, node: int, buf: SharedBuffer, lo: int, hi: int, inside: np.ndarray, issuer: int,
                   site: SiteFn) -> None:
        """Thread ``issuer`` commits a TMA store of ``buf[lo:hi]`` as a bulk group; ``inside`` are the
        elements that land inside the tensor, each of which must have been written since the last
        store sent it."""
        stale = inside[~buf.fresh[inside]]
        if stale.size:
            raise PartialTileStore(f"the TMA store sends {buf.name}[{int(stale[0])}] ({stale.size} in-bounds "
                                   f"element(s) of {buf.name}[{lo}:{hi}]), which no thread wrote since the last "
                                   "store sent it: a tile store needs every element of the tile written in each "
                                   "iteration", site())
        buf.fresh[lo:hi] = False
        g = BulkStore(node, buf, lo, hi, issuer)
        self.stores.append(g)
        self.unfinished.append(g)

    def bulk_wait(self, lanes: np.ndarray, pending: int, read: bool) -> None:
        """``cp.async.bulk.wait_group[.read] pending`` by ``lanes``: all but each thread's newest
        ``pending`` groups have read their source (and, without ``read``, completed)."""
        for u in map(int, lanes):
            mine = [g for g in self.unfinished if g.issuer == u]
            for g in mine[:max(len(mine) - pending, 0)]:
                if g.read_at < 0:
                    g.read_at = int(self.clocks.now[u])
                g.done = g.done or not read
        self.unfinished = [g for g in self.unfinished if not g.done]

    def _not_being_stored(self, buf: SharedBuffer, idx: np.ndarray, lanes: np.ndarray, site: SiteFn) -> None:
        """Writers ``lanes`` of ``buf[idx]``: no bulk group may still read those elements, and the wait
        that saw its reads done must be ordered before every writer."""
        keep = []
        for g in self.stores:
            if g.read_at >= 0 and (self.clocks.known[:, g.issuer] >= g.read_at).all():
                continue  # every thread is ordered after the wait: it can no longer conflict
            keep.append(g)
            if g.buf is not buf:
                continue
            hit = (idx >= g.lo) & (idx < g.hi)
            if not hit.any():
                continue
            writers = lanes if lanes.size == idx.size else np.full(idx.size, lanes[0])
            if g.read_at < 0:
                k = int(np.argmax(hit))
                raise StoreOverwrite(f"thread {writers[k]} writes {buf.name}[{int(idx[k])}] while the TMA store "
                                     f"#{g.node} of {buf.name}[{g.lo}:{g.hi}] committed by thread {g.issuer} may still "
                                     "read it (no cp.async.bulk.wait_group.read covers it): wait before the buffer "
                                     "is written again", site())
            # the issuer itself is ordered after its own wait; every other writer must have learnt of it
            late = hit & (writers != g.issuer) & (self.clocks.known[writers, g.issuer] < g.read_at)
            if late.any():
                k = int(np.argmax(late))
                raise StoreOverwrite(f"thread {writers[k]} writes {buf.name}[{int(idx[k])}], which the TMA store "
                                     f"#{g.node} reads, and thread {g.issuer}'s wait for that store is not ordered "
                                     "before the write (a block sync must follow the wait)", site())
        self.stores = keep

    def finish(self, site: SiteFn) -> None:
        """End of the block: no load, store or mma in flight, no named barrier left with arrivals that
        never opened it, every initialised barrier invalidated."""
        self.mma.finish(site)
        for bar, arrived in sorted(self.named.items()):
            if arrived.any():
                who = np.nonzero(arrived)[0]
                raise UnopenedBarrier(f"the block ends with {who.size} thread(s) (thread {who[0]} first) arrived at "
                                      f"named barrier {bar}, {self.named_count[bar]} that never opened: a bar.arrive "
                                      "that no bar.sync of the same id and count completes (an arrive for a hand-over "
                                      "nobody takes, or the wrong count)", site(), f"named barrier {bar}", bar)
        if self.unfinished:
            g = self.unfinished[0]
            raise StoreInFlight(f"the block ends while the TMA store #{g.node} of {g.buf.name}[{g.lo}:{g.hi}] "
                                f"committed by thread {g.issuer} is still in flight: wait for it "
                                "(cp.async.bulk.wait_group 0) before the kernel exits", site())
        b = self.bars
        for sid, q in enumerate(b.inflight):
            if q:
                raise OutstandingTma(f"the block ends while the TMA load #{q[0].node} into {q[0].buf.name}"
                                     f"[{q[0].lo}:{q[0].lo + q[0].data.size}]{_issued(q[0])} completing on "
                                     f"{b.label(sid)} is still in flight (no reader consumed that tile)",
                                     site(), *b.names[sid])
        live = np.nonzero(b.state == 1)[0]
        if live.size:
            sid = int(live[0])
            raise MissingInval(f"{b.label(sid)} is still valid when the block ends; invalidate every barrier "
                               "(mbarrier_inval) after its last use", site(), *b.names[sid])


def _first_unordered(marks: np.ndarray, lo: int, hi: int, bound: np.ndarray) -> Optional[tuple[int, int]]:
    """The first element of ``[lo, hi)`` with a thread's access (``marks``: element x thread clock) that
    ``bound`` (per thread) does not cover, as (element, thread); None when all are covered."""
    if hi <= lo or not (marks[lo:hi].max(axis=0) > bound).any():  # the common case, in one reduction
        return None
    rows = np.nonzero((marks[lo:hi] > bound).any(axis=1))[0]
    if not rows.size:
        return None
    e = lo + int(rows[0])
    return e, int(np.nonzero(marks[e] > bound)[0][0])
