"""What the protocol checker reports: the place of a statement in a run (:class:`Site`) and the
failures, each a :class:`ProtocolError` naming the node, the barrier and slot, the block and the
iteration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import CbrulesError


@dataclass(frozen=True)
class Site:
    """Where the interpreter is: the node, the block and the enclosing loop iterations."""

    node: int
    what: str
    block: tuple
    iteration: tuple = ()  # ((var, value, part), ...), outermost first

    def __str__(self) -> str:
        its = ", ".join(f"{v}={x}" + (f" ({p})" if p else "") for v, x, p in self.iteration)
        return f"block {self.block}" + (f", iteration {its}" if its else ", outside any loop")


SiteFn = Callable[[], Site]


class InterpError(CbrulesError):
    """Anything the interpreter refuses; ``node``, ``block`` and ``iteration`` say where."""

    def __init__(self, message: str, site: Site, barrier: Optional[str] = None, slot: Optional[int] = None):
        self.site, self.node, self.barrier, self.slot = site, site.node, barrier, slot
        self.block, self.iteration = site.block, site.iteration
        self.detail = message
        super().__init__(f"{site.what}: {message} [{site}]")


class ProtocolError(InterpError):
    """A violation of the mbarrier / TMA / block-sync protocol."""


class Deadlock(ProtocolError):
    """A wait that can never complete."""


class RawHazard(ProtocolError):
    """A read of shared data whose TMA load the reader has not observed complete."""


class WarHazard(ProtocolError):
    """A TMA refill of shared data that some thread may still read (or that is still in flight)."""


class UnfencedRefill(WarHazard):
    """A TMA refill (the async proxy) of shared data read with plain loads (the generic proxy) with no
    ``fence.proxy.async`` ordered between the reads and the refill."""


class TxMismatch(ProtocolError):
    """Expect-tx bytes of a phase that differ from the bytes the TMA loads delivered to it."""


class UseBeforeInit(ProtocolError):
    """A barrier used before its init (or before a block sync made the init visible)."""


class UseAfterInval(ProtocolError):
    """A barrier used after it was invalidated."""


class DoubleInit(ProtocolError):
    """A barrier initialised twice without an inval in between."""


class TooManyArrivals(ProtocolError):
    """More arrivals than the barrier's count within one phase."""


class UnopenedBarrier(ProtocolError):
    """A named barrier that threads arrived at (bar.arrive) but that never opened before the block ended."""


class MissingInval(ProtocolError):
    """A barrier still valid when the block ends."""


class OutstandingTma(ProtocolError):
    """A TMA load still in flight when its barrier is invalidated or the block ends."""


class DivergentSync(ProtocolError):
    """A block-wide operation (block sync, block reduction) reached by only some threads."""


class DivergentShuffle(DivergentSync):
    """A warp shuffle with the full mask executed by only some lanes of a warp (the others would be
    read without having computed the value; CUDA leaves the result undefined)."""


class ElectError(ProtocolError):
    """``elect_one()`` (``elect.sync`` with a full mask) executed by part of warp 0 only."""


class TmaIssueError(ProtocolError):
    """A TMA load with a barrier issued by more than one thread at once."""


class StoreOverwrite(ProtocolError):
    """Shared memory written while a TMA store's bulk group may still be reading it."""


class StoreInFlight(ProtocolError):
    """The block ends while a TMA store's bulk group has not been waited for (``wait_group 0``)."""


class UnfencedInit(ProtocolError):
    """A TMA (the async proxy) completes on an mbarrier whose init no fence.proxy.async has ordered before it."""


class PartialTileStore(ProtocolError):
    """A TMA store sends in-bounds elements of its box that no thread wrote since the last store."""


class ProxyHazard(ProtocolError):
    """An async-proxy read (a TMA store, a wgmma descriptor read) of shared memory that threads wrote with
    generic stores, not made visible to it. ``writer`` is the node of the store, ``thread`` the writing
    thread, ``buffer`` and ``element`` the shared element, ``reader`` the node of the async read."""

    def __init__(self, message: str, site: Site, *, writer: int, thread: int, buffer: str, element: int):
        super().__init__(message, site)
        self.writer, self.thread, self.buffer, self.element, self.reader = writer, thread, buffer, element, site.node


class UnfencedProxyWrite(ProxyHazard):
    """The writing thread ran no ``fence.proxy.async`` between its generic store and the async read."""


class UnorderedProxyRead(ProxyHazard):
    """The writer fenced, but no barrier (block sync, named barrier over both, mbarrier arrive/wait chain)
    orders its fence before the thread that issues the async read."""
