"""Builder calls for synchronisation, mixed into :class:`cbrules.ir.builder.Kernel`: mbarriers (init,
arrive, arrive-expect-tx, wait on a parity, invalidate), block syncs, proxy fences and named barriers.
Kernels written by hand use them; the rules insert the same nodes when they circular-buffer a loop."""
from __future__ import annotations

from .builder_values import Buffer, BuildError, _call_site, _int
from .terms import TermLike, as_term


class SyncBuilder:
    """The synchronisation calls (needs the Kernel's ``_known`` and ``_node``)."""

    def _barrier(self, op: str, barrier: Buffer, slot: TermLike, **attrs) -> None:
        self._node(op, barrier=self._known(barrier, ("buffer",), op), slot=as_term(slot), **attrs)

    def mbarrier_init(self, barrier: Buffer, slot: TermLike, count: int) -> None:
        self._barrier("mbarrier_init", barrier, slot,
                      count=_int(count, f"mbarrier_init at {_call_site()}", "count", 1))

    def mbarrier_arrive(self, barrier: Buffer, slot: TermLike) -> None:
        self._barrier("mbarrier_arrive", barrier, slot)

    def mbarrier_arrive_expect_tx(self, barrier: Buffer, slot: TermLike, nbytes: int) -> None:
        self._barrier("mbarrier_arrive_expect_tx", barrier, slot,
                      bytes=_int(nbytes, f"mbarrier_arrive_expect_tx at {_call_site()}", "nbytes", 0))

    def mbarrier_wait(self, barrier: Buffer, slot: TermLike, parity: TermLike) -> None:
        self._barrier("mbarrier_wait", barrier, slot, parity=as_term(parity))

    def mbarrier_inval(self, barrier: Buffer, slot: TermLike) -> None:
        self._barrier("mbarrier_inval", barrier, slot)

    def syncthreads(self) -> None:
        self._node("syncthreads")

    def fence_proxy_async(self) -> None:
        self._node("fence_proxy_async")

    def fence_mbarrier_init(self) -> None:
        self._node("fence_mbarrier_init")

    def bar_sync(self, bar_id: int, count: int) -> None:
        """A named barrier ``bar_id`` (0..15) over ``count`` threads (a multiple of 32)."""
        where = f"bar_sync at {_call_site()}"
        bar_id, count = _int(bar_id, where, "bar_id", 0), _int(count, where, "count", 32)
        if bar_id > 15 or count % 32:
            raise BuildError(f"{where}: named barrier {bar_id} over {count} threads; ids are 0..15 and the "
                             "count a multiple of 32 (whole warps)")
        self._node("bar_sync", id=bar_id, count=count)
