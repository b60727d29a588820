"""The interpreter's memory and synchronisation ops, as a mixin of the block runner.

Loads and stores on global tensors, shared buffers and per-thread register arrays; TMA copies
(a load with a barrier is queued on it, one without is done at once); mbarrier ops and block
syncs. Each hands :mod:`cbrules.reference.protocol` what it needs to check, and checks indices itself.
"""
from __future__ import annotations

from typing import Optional

import ml_dtypes
import numpy as np

from .hwsim import inside_box, read_box, swizzled, tensor_view, unswizzled, write_box
from .interp_roles import Blocked
from ..ir.limits import SWIZZLE_SPAN
from ..ir.bind import NP_DTYPES
from ..ir.ops import DTYPE_BYTES, FP8_DTYPES, MAX_BACKOFF_NS
from ..ir.terms import swizzle_index
from .hazards import DivergentSync, InterpError, TmaIssueError
from ..schedule import Step
from ..ir.attributes import attribute_problem

_FP8_LIMITS = {np.dtype(NP_DTYPES[d]): float(ml_dtypes.finfo(NP_DTYPES[d]).max) for d in FP8_DTYPES}


def saturated(vals, dtype: np.dtype):
    """``vals`` as a store into ``dtype`` rounds them: an FP8 store saturates to the largest finite value
    (cvt.rn.satfinite) where numpy's cast would give NaN (e4m3) or infinity (e5m2); NaN stays NaN."""
    limit = _FP8_LIMITS.get(np.dtype(dtype))
    if limit is None:
        return vals
    return np.clip(np.asarray(vals, np.float32), -limit, limit).astype(dtype)


class OutOfBounds(InterpError):
    """An index outside its tensor, shared buffer or register array on an active thread."""


class MisalignedVector(InterpError):
    """A vector copy whose element indices are not multiples of its count, or whose two sides hold
    different types (the device would fault on the address or move the wrong bits)."""


class NonUniform(InterpError):
    """A value the block must agree on (loop bound, TMA coordinate) that differs across threads."""


class MemoryOps:
    """Handlers for memory, TMA and barrier ops; the block runner provides ``env``, ``ev``,
    ``site``, ``lanes``, ``uniform``, ``per_lane``, ``proto``, ``tensors`` and ``p``."""

    # ---------------------------------------------------------------- memory
    def _target(self, name: str, idx: np.ndarray, lanes: np.ndarray, what: str):
        """(kind, array) of the buffer ``name`` after checking ``idx`` is inside it."""
        if name in self.regarrays:
            kind, arr = "register", self.regarrays[name]
            size = arr.shape[1]
        elif name in self.proto.shared:
            kind, arr = "shared", self.proto.shared[name]
            size = arr.data.size
        elif name in self.flat:
            kind, arr = "global", self.flat[name]
            size = arr.size
        else:
            raise InterpError(f"{what} {name!r}, which is neither a tensor nor an allocated buffer", self.site())
        bad = np.nonzero((idx < 0) | (idx >= size))[0]
        if bad.size:
            raise OutOfBounds(f"thread {lanes[bad[0]]} {what} {name}[{idx[bad[0]]}], outside its {size} "
                              "elements", self.site())
        return kind, arr

    def _index(self, s: Step, mask: np.ndarray, lanes: np.ndarray) -> np.ndarray:
        idx = self.per_lane(self.ev(s, "index", mask), lanes)
        if idx.dtype.kind not in "iub":
            raise InterpError(f"index {s.attrs['index']} is not an integer", self.site())
        return idx.astype(np.int64)

    def _read(self, kind: str, arr, idx, lanes: np.ndarray):
        """The values ``lanes`` read at ``idx`` of a register array, a shared buffer (protocol-checked)
        or a global tensor."""
        if kind == "register":
            return arr[lanes, idx]
        if kind == "shared":
            self.proto.read(arr, idx, lanes, self.site)
            return arr.data[idx]
        return arr[idx]

    def _load(self, s: Step, mask: np.ndarray) -> None:
        lanes = np.nonzero(mask)[0]
        idx = self._index(s, mask, lanes)
        kind, arr = self._target(s.attrs["src"], idx, lanes, "reads")
        if kind == "register" and s.attrs["src"] in self.p.accumulators:
            self.proto.mma.register_access(s.attrs["src"], lanes, False, self.site)
        vals = self._read(kind, arr, idx, lanes)
        dst = s.attrs["dst"]
        new = self.env[dst].copy()
        new[lanes] = vals
        self.env[dst] = new

    def _store(self, s: Step, mask: np.ndarray) -> None:
        lanes = np.nonzero(mask)[0]
        idx = self._index(s, mask, lanes)
        name = s.attrs["dst"]
        kind, arr = self._target(name, idx, lanes, "writes")
        vals = self.per_lane(self.ev(s, "value", mask), lanes)
        if kind == "register":
            if name in self.p.accumulators:
                self.proto.mma.register_access(name, lanes, True, self.site)
            arr[lanes, idx] = vals
        elif kind == "shared":
            self.proto.write(arr, idx, lanes, self.site, s.node)
            arr.data[idx] = saturated(vals, arr.data.dtype)
        else:
            if name not in self.written:
                raise InterpError(f"stores to tensor {name!r}, which the kernel does not mark written "
                                  "(codegen declares it const)", self.site())
            arr[idx] = saturated(vals, arr.dtype)

    def _copy(self, s: Step, mask: np.ndarray) -> None:
        """A vector access: each thread moves ``count`` contiguous elements at once (element by element
        here, with every index, RAW and store-in-flight check of a plain load and store)."""
        a, lanes = s.attrs, np.nonzero(mask)[0]
        n = int(a["count"])
        at = {}
        for side in ("src", "dst"):
            idx = self.per_lane(self.ev(s, f"{side}_index", mask), lanes).astype(np.int64)
            bad = np.nonzero(idx % n)[0]
            if bad.size:
                raise MisalignedVector(f"thread {lanes[bad[0]]} copies {n} elements at {a[side]}[{idx[bad[0]]}]: "
                                       f"a vector access starts at a multiple of its {n} elements", self.site())
            at[side] = idx
        kinds = {side: self._target(a[side], at[side] + n - 1, lanes, "reads" if side == "src" else "writes")
                 for side in ("src", "dst")}
        dtypes = {side: (arr.data if kind == "shared" else arr).dtype for side, (kind, arr) in kinds.items()}
        if dtypes["src"] != dtypes["dst"]:
            raise MisalignedVector(f"copies {dtypes['src']} elements of {a['src']} into {dtypes['dst']} buffer "
                                   f"{a['dst']}: a vector access moves bits, both sides need one type", self.site())
        if kinds["dst"][0] == "global" and a["dst"] not in self.written:
            raise InterpError(f"stores to tensor {a['dst']!r}, which the kernel does not mark written "
                              "(codegen declares it const)", self.site())
        for k in range(n):
            (skind, src), (dkind, dst) = kinds["src"], kinds["dst"]
            si, di = at["src"] + k, at["dst"] + k
            vals = self._read(skind, src, si, lanes)
            if dkind == "register":
                dst[lanes, di] = vals
            elif dkind == "shared":
                self.proto.write(dst, di, lanes, self.site, s.node)
                dst.data[di] = vals
            else:
                dst[di] = vals

    def _tma_load(self, s: Step, mask: np.ndarray) -> None:
        a, lanes = s.attrs, np.nonzero(mask)[0]
        fns = self.p.fns[s.node]
        env, ln = self.env, self.lanes(mask)
        tmap = self.p.kg.params()[a["tmap"]]
        dst = self.proto.shared.get(a["dst"])
        if dst is None:
            raise InterpError(f"TMA destination {a['dst']!r} is not a shared buffer", self.site())
        box = tuple(tmap.box)
        box_elems = int(np.prod(box))
        itemsize = DTYPE_BYTES[tmap.dtype]
        if a.get("barrier"):
            u = lanes[0]
            pick = lambda v: int(v[u]) if isinstance(v, np.ndarray) and v.ndim else int(v)  # noqa: E731
            if lanes.size > 1:
                raise TmaIssueError(f"{lanes.size} threads issue this TMA load (completing on {a['barrier']}); "
                                    "issue it from one elected thread", self.site(), a["barrier"],
                                    pick(fns["slot"](env, ln)))
            coords = [pick(f(env, ln)) for f in fns["coords"]]
            lo = pick(fns["offset"](env, ln))
            slot = pick(fns["slot"](env, ln))
            self._smem_range(dst, lo, box_elems)
            sid = self.proto.slot_id(a["barrier"], slot, self.site)
            data = read_box(self._global(tmap), coords, box)
            if a.get("swizzle"):  # the box lands in the swizzled layout the hardware writes
                data = swizzled(data, itemsize, int(a["swizzle"]), lo, dst.name, self.site)
            self.proto.mma.tma_written(dst, lo, box_elems, int(a.get("swizzle") or 0))
            self.proto.tma_load(sid, s.node, dst, lo, data, box_elems * itemsize, int(u), self.site)
            return
        # before lowering: the logical load of the whole tile, dense row-major, done at once (the
        # rules split a tile wider than the box into boxes; here it means what the kernel reads)
        coords = [self.uniform(f(env, ln), mask, "TMA coordinate") for f in fns["coords"]]
        lo = self.uniform(fns["offset"](env, ln), mask, "TMA offset")
        tile = tuple(a.get("tile") or box)
        self._smem_range(dst, lo, int(np.prod(tile)))
        data = read_box(self._global(tmap), coords, tile)
        self.proto.tma_load(None, s.node, dst, lo, data, data.size * itemsize, int(lanes[0]), self.site)

    def _smem_range(self, buf, lo: int, n: int) -> None:
        if lo < 0 or lo + n > buf.data.size:
            raise OutOfBounds(f"TMA box of {n} elements at {buf.name}[{lo}] runs outside its {buf.data.size} "
                              "elements", self.site())

    def _tma_store(self, s: Step, mask: np.ndarray) -> None:
        a, lanes = s.attrs, np.nonzero(mask)[0]
        tmap = self.p.kg.params()[a["tmap"]]
        src = self.proto.shared.get(a["src"])
        if src is None:
            raise InterpError(f"TMA store source {a['src']!r} is not a shared buffer", self.site())
        fns, ln = self.p.fns[s.node], self.lanes(mask)
        coords = [self.uniform(f(self.env, ln), mask, "TMA coordinate") for f in fns["coords"]]
        lo = self.uniform(fns["offset"](self.env, ln), mask, "TMA offset")
        n = int(np.prod(tmap.box))
        self._smem_range(src, lo, n)
        span = SWIZZLE_SPAN[tmap.swizzle]
        align = int(self.p.allocs[src.name].get("align") or 0)
        if span and align % (8 * span):  # the hardware anchors the pattern on the address, not the buffer
            raise InterpError(f"a TMA store with {span}B swizzle reads {src.name}, allocated {align}-byte aligned: "
                              f"its slots must start on the {8 * span}-byte pattern (align the buffer to it)",
                              self.site())
        # the shared element holding each logical element of the box (a swizzled map reads it swizzled)
        place = swizzle_index(np.arange(n), DTYPE_BYTES[tmap.dtype], span) if span else np.arange(n)
        tensor = self._global(tmap)
        inside = np.zeros(tuple(tmap.box), bool)
        inside_box(inside, coords, tensor.shape)
        sent = lo + place[inside.ravel()]  # the shared elements that reach the tensor
        self.proto.async_read(src, sent, lanes[:1], f"the TMA store #{s.node} issued by thread {lanes[0]}", self.site)
        if a.get("wait", "read") != "read":  # a bulk group left in flight: the protocol tracks its reads
            if lanes.size > 1:
                raise TmaIssueError(f"{lanes.size} threads issue this TMA store; issue it from one elected thread",
                                    self.site())
            self.proto.bulk_store(s.node, src, lo, lo + n, sent, int(lanes[0]), self.site)
        self.proto.read(src, np.arange(lo, lo + n), np.full(n, lanes[0]), self.site, plain=False)  # the TMA unit reads
        data = src.data[lo:lo + n]
        if span:
            data = unswizzled(data, DTYPE_BYTES[tmap.dtype], span, lo, src.name, self.site)
        write_box(tensor, coords, data.reshape(tmap.box))

    def _global(self, tmap) -> np.ndarray:
        """The tensor of ``tmap`` in the map's dimensions (its split view, if it has one)."""
        return tensor_view(self.tensors[tmap.tensor], tmap.name, tmap.split, self.site)

    def _tma_store_wait(self, s: Step, mask: np.ndarray) -> None:
        self.proto.bulk_wait(np.nonzero(mask)[0], int(s.attrs["pending"]), bool(s.attrs["read"]))

    # ---------------------------------------------------------------- synchronisation
    def _syncthreads(self, s: Step, mask: np.ndarray):
        if self.in_roles:  # each role reaches it on its own: barrier 0 waits for the whole block
            return self._named_barrier(0, self.T, mask)
        if not mask.all():
            raise DivergentSync(f"__syncthreads() is reached by {int(mask.sum())} of {self.T} threads",
                                self.site())
        self.proto.sync_all()
        return None

    def _bar_sync(self, s: Step, mask: np.ndarray):
        return self._named_barrier(self._bar_id(s, mask), int(s.attrs["count"]), mask)

    def _bar_arrive(self, s: Step, mask: np.ndarray) -> None:
        """``bar.arrive id, count``: counts towards the barrier's opening; the threads go on at once."""
        self.proto.bar_arrive(self._bar_id(s, mask), int(s.attrs["count"]), np.nonzero(mask)[0], self.site,
                              wait=False)

    def _bar_id(self, s: Step, mask: np.ndarray) -> int:
        """A named barrier's id: an int, or a term the active threads agree on."""
        bar = s.attrs["id"]
        return int(bar) if isinstance(bar, int) else self.uniform(self.ev(s, "id", mask), mask, "named barrier id")

    def _named_barrier(self, bar: int, count: int, mask: np.ndarray):
        """``bar.sync bar, count``: None once it opened, else a generator blocking until it does."""
        token = self.proto.bar_arrive(bar, count, np.nonzero(mask)[0], self.site)
        if self.proto.bar_passed(token):
            return None
        return self._until(lambda: self.proto.bar_passed(token), lambda: self.proto.bar_error(token, self.site))

    @staticmethod
    def _until(passed, error):
        """Block (yield) until ``passed()``; ``error()`` says why, should it never pass."""
        while not passed():
            yield Blocked(error())

    def _slots(self, s: Step, mask: np.ndarray, extra: Optional[str] = None):
        """(barrier slot id, value of ``extra``, lanes) groups of the active threads."""
        lanes = np.nonzero(mask)[0]
        slots = self.per_lane(self.ev(s, "slot", mask), lanes).astype(np.int64)
        vals = self.per_lane(self.ev(s, extra, mask), lanes).astype(np.int64) if extra else np.zeros_like(slots)
        for sl, v in sorted({(int(a), int(b)) for a, b in zip(slots, vals)}):
            yield self.proto.slot_id(s.attrs["barrier"], sl, self.site), v, lanes[(slots == sl) & (vals == v)]

    def _fence_proxy_async(self, s: Step, mask: np.ndarray) -> None:
        self.proto.proxy_fence(np.nonzero(mask)[0])

    def _mbarrier_init(self, s: Step, mask: np.ndarray) -> None:
        for sid, _, lanes in self._slots(s, mask):
            self.proto.init(sid, lanes, int(s.attrs["count"]), self.site)

    def _mbarrier_arrive(self, s: Step, mask: np.ndarray) -> None:
        for sid, _, lanes in self._slots(s, mask):
            self.proto.arrive(sid, lanes, 0, self.site)

    def _mbarrier_arrive_expect_tx(self, s: Step, mask: np.ndarray) -> None:
        for sid, _, lanes in self._slots(s, mask):
            self.proto.arrive(sid, lanes, int(s.attrs["bytes"]), self.site)

    def _mbarrier_wait(self, s: Step, mask: np.ndarray):
        """None when every thread's wait succeeds at once, else a generator blocking until they do."""
        # a :backoff sleeps between polls: it changes when the wait returns, never what it observes,
        # so only its value is checked (codegen prints it into __nanosleep)
        # (a term is computed per thread, as the device does); backoff_max, spin and suspend_hint
        # change only timing too, and a wait that would time out is the deadlock reported below
        backoff = s.attrs.get("backoff")
        why = None if backoff is None else attribute_problem("mbarrier_wait", "backoff", backoff)
        if why is None and "backoff" in self.p.fns[s.node]:
            ns = self.per_lane(self.ev(s, "backoff", mask), np.nonzero(mask)[0])
            bad = ns[(ns < 0) | (ns > MAX_BACKOFF_NS)] if ns.size else ns
            why = f"{backoff} is {int(bad[0])} on a thread" if bad.size else None
        if why:
            raise InterpError(f"mbarrier_wait :backoff {why}; give 0..{MAX_BACKOFF_NS} nanoseconds", self.site())
        left = [(sid, parity % 2, lanes) for sid, parity, lanes in self._slots(s, mask, "parity")]
        left = [g for g in left if not self.proto.try_wait(g[0], g[2], g[1], self.site)]
        if not left:
            return None

        def passed() -> bool:
            left[:] = [g for g in left if not self.proto.try_wait(g[0], g[2], g[1], self.site)]
            return not left
        return self._until(passed, lambda: self.proto.wait_error(left[0][0], left[0][1], self.site))

    def _mbarrier_inval(self, s: Step, mask: np.ndarray) -> None:
        for sid, _, lanes in self._slots(s, mask):
            self.proto.inval(sid, lanes, self.site)
