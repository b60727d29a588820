"""Builder API: write a kernel graph the way the kernel reads.

    k = Kernel("exp1d", block=256)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    ...
    with k.loop("i", tiles) as i:
        v = k.load(tile, threadIdx.x)
        k.store(out, idx, k.exp(v))

Every node records its Python call site in ``origin``; program order becomes depends edges
(def->use on registers and buffers, memory order around barriers) when each node is complete.
"""
from __future__ import annotations

import itertools
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Sequence

from .graph import KernelGraph, Param
from .limits import TmaBoxError, check_box  # noqa: F401  (TmaBoxError: public via the builder)
from .ops import BINARY, DTYPE_BYTES, DTYPES, LOOP_KINDS, UNARY, DependenceTracker
from .terms import ELECT_ONE, Term, TermLike, as_term, call, name

threadIdx = type("threadIdx", (), {a: name(f"threadIdx.{a}") for a in "xyz"})
blockIdx = type("blockIdx", (), {a: name(f"blockIdx.{a}") for a in "xyz"})
blockDim = type("blockDim", (), {a: name(f"blockDim.{a}") for a in "xyz"})
gridDim = type("gridDim", (), {a: name(f"gridDim.{a}") for a in "xyz"})


def ceil_div(a: TermLike, b: TermLike) -> Term:
    """``(a + b - 1) / b`` as a term."""
    return call("ceil_div", a, b)


def lanes(count: int, stride: int) -> list[Term]:
    """``threadIdx.x, threadIdx.x + stride, ...``: the ``count`` columns one thread takes of a tile
    ``count * stride`` wide, one in each ``stride``-wide group (a block of ``stride`` threads)."""
    return [threadIdx.x + c * stride if c else threadIdx.x for c in range(count)]


@dataclass(frozen=True)
class Buffer:
    """A handle on a global tensor or an allocated buffer."""

    name: str
    dtype: str
    shape: tuple
    space: str


@dataclass(frozen=True)
class TensorMap:
    """A handle on a TMA tensor-map parameter over a global tensor."""

    name: str
    tensor: Buffer
    box: tuple

    @property
    def box_bytes(self) -> int:
        n = DTYPE_BYTES[self.tensor.dtype]
        for b in self.box:
            n *= b
        return n


def circular_buffer(stages: int, prefetch: Optional[int] = None, war: Optional[str] = None,
                    warp_specialize: bool = False, registers: Optional[tuple[int, int]] = None) -> dict:
    """Options of a circular-buffered loop: ``stages`` S, ``prefetch`` P (default S-1, negative counts
    from S), ``war`` = "sync" (block sync ends each main iteration) or "mbarrier" (empty barriers).

    ``warp_specialize``: a producer warp group of 128 threads, added after the block's threads, issues
    the loads while the block's own threads (the consumers) compute; WAR protection is then the empty
    barriers (``war`` defaults to "mbarrier") and the producer runs up to S tiles ahead.
    ``registers=(producer, consumer)`` adds register sharing (``setmaxnreg``) between the roles.
    The rules check the values and refuse bad ones with a named error."""
    opts = {"stages": stages, "prefetch": prefetch,
            "war": war if war is not None else ("mbarrier" if warp_specialize else "sync")}
    if warp_specialize or registers is not None:  # absent otherwise: annotations stay as they were
        opts["warp_specialize"] = warp_specialize
        opts["registers"] = tuple(registers) if isinstance(registers, (list, tuple)) else registers
    return opts


def _call_site() -> str:
    f = sys._getframe(1)
    while f is not None and f.f_globals.get("__name__", "") in ("cbrules.builder", "contextlib"):
        f = f.f_back
    if f is None:
        return "?"
    rel = os.path.relpath(f.f_code.co_filename)
    return f"{f.f_code.co_filename if rel.startswith('..') else rel}:{f.f_lineno}"


def _dims(x) -> tuple[int, int, int]:
    t = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    return tuple(t) + (1,) * (3 - len(t))  # type: ignore[return-value]


class Kernel:
    """A kernel under construction; ``graph`` is the :class:`KernelGraph` being built."""

    def __init__(self, name: str, block: int | Sequence[int] = 256):
        self.graph = KernelGraph(name, block=_dims(block))
        self._scopes: list[int] = [self.graph.root]
        self._regs = itertools.count()
        self._trackers: dict[int, DependenceTracker] = {}

    # ---------------------------------------------------------------- signature & geometry
    def _add_param(self, p: Param) -> None:
        k = self.graph.kernel()
        if p.name in {q.name for q in k["params"]}:
            raise ValueError(f"kernel {k['name']!r} already has a parameter named {p.name!r}")
        k["params"] = k["params"] + (p,)

    def symbol(self, sym: str) -> Term:
        """An int parameter (tensor extent, trip count) known only at launch."""
        self._add_param(Param(sym, "symbol", "int32"))
        return name(sym)

    def tensor(self, tname: str, shape: Sequence[TermLike], dtype: str = "float32") -> Buffer:
        """A global-memory tensor parameter; ``shape`` is outermost-first, terms over symbols."""
        if dtype not in DTYPES or dtype == "mbarrier":
            raise ValueError(f"tensor {tname!r}: unsupported dtype {dtype!r}")
        shape_t = tuple(as_term(s) for s in shape)
        self._add_param(Param(tname, "tensor", dtype, shape_t))
        return Buffer(tname, dtype, shape_t, "global")

    def tensor_map(self, tensor: Buffer, box: Sequence[int], mname: Optional[str] = None) -> TensorMap:
        """A TMA tensor map over ``tensor`` with the given box (outermost-first, like the shape)."""
        if len(box) != len(tensor.shape):
            raise ValueError(f"tensor map over {tensor.name!r}: box {tuple(box)} has rank {len(box)}, "
                             f"the tensor has rank {len(tensor.shape)}")
        check_box(mname or f"{tensor.name}_tmap", tuple(box), tensor.dtype)
        mname = mname or f"{tensor.name}_tmap"
        self._add_param(Param(mname, "tmap", tensor.dtype, tensor.shape, tensor.name, tuple(box)))
        return TensorMap(mname, tensor, tuple(box))

    def grid(self, *dims: TermLike) -> None:
        """Launch grid as terms over symbols (missing dimensions are 1)."""
        self.graph.kernel()["grid"] = tuple(as_term(d) for d in dims) + (as_term(1),) * (3 - len(dims))

    # ---------------------------------------------------------------- node creation
    def _node(self, op: str, **attrs) -> int:
        n = self.graph.add(op, self._scopes[-1], origin={"by": "build", "where": _call_site()}, **attrs)
        if op not in ("for", "if"):
            self._order(n)
        return n

    def _order(self, n: int) -> None:
        """Program order becomes depends edges from the nearest conflicting earlier siblings."""
        tracker = self._trackers.setdefault(self.graph.parent(n), DependenceTracker())
        for p in tracker.add(n, self.graph.effects(n)):
            self.graph.add_depends(p, n)

    @contextmanager
    def _scope(self, op: str, **attrs) -> Iterator[int]:
        n = self._node(op, **attrs)
        self._scopes.append(n)
        try:
            yield n
        finally:
            self._scopes.pop()
            self._order(n)  # now that its body (and so its effects) is known

    @contextmanager
    def loop(self, var: str, start: TermLike, stop: Optional[TermLike] = None, step: TermLike = 1,
             kind: str = "serial", **annotations) -> Iterator[Term]:
        """``for var in [start, stop) by step``; ``loop("i", n)`` means ``[0, n)``. Yields the variable.

        ``circular_buffer=circular_buffer(stages=3)`` asks the rules to pipeline the TMA loads in it."""
        if stop is None:
            start, stop = 0, start
        if kind not in LOOP_KINDS:
            raise ValueError(f"loop {var!r}: kind {kind!r} is not one of {', '.join(LOOP_KINDS)}")
        with self._scope("for", var=var, start=as_term(start), stop=as_term(stop), step=as_term(step),
                         kind=kind, annotations=dict(annotations)):
            yield name(var)

    @contextmanager
    def if_(self, pred: TermLike) -> Iterator[None]:
        """A predicated scope; ``pred`` may use ``elect_one()``."""
        with self._scope("if", pred=as_term(pred)):
            yield

    @contextmanager
    def elect_one(self) -> Iterator[None]:
        """A scope run by one elected thread of the first warp."""
        with self.if_(ELECT_ONE):
            yield

    def alloc(self, buf: str, space: str, dtype: str, shape: Sequence[int], align: Optional[int] = None) -> Buffer:
        """Allocate a shared- or register-memory buffer (shape in elements, outermost-first)."""
        align = align or (128 if space == "shared" and dtype != "mbarrier" else DTYPE_BYTES[dtype])
        self._node("alloc", buf=buf, space=space, dtype=dtype, shape=tuple(shape), align=align)
        return Buffer(buf, dtype, tuple(shape), space)

    def _reg(self, dst: Optional[str]) -> str:
        return dst or f"v{next(self._regs)}"

    # ---------------------------------------------------------------- memory
    def load(self, src: Buffer, index: TermLike, dst: Optional[str] = None) -> Term:
        """Read one element ``src[index]`` (flat index) into a register; returns the register."""
        dst = self._reg(dst)
        self._node("load", dst=dst, src=src.name, index=as_term(index), dtype=src.dtype)
        return name(dst)

    def store(self, dst: Buffer, index: TermLike, value: TermLike) -> None:
        """Write ``dst[index] = value`` (flat index)."""
        if dst.space == "global":
            self._mark_written(dst.name)
        self._node("store", dst=dst.name, index=as_term(index), value=as_term(value))

    def _mark_written(self, tname: str) -> None:
        k = self.graph.kernel()
        k["params"] = tuple(replace(p, written=True) if p.name == tname else p for p in k["params"])

    def tma_load(self, tmap: TensorMap, coords: Sequence[TermLike], dst: Buffer,
                 barrier: Optional[Buffer] = None, slot: TermLike = 0, offset: TermLike = 0,
                 tile: Optional[Sequence[int]] = None, circular_buffer: Optional[dict] = None) -> None:
        """Bulk-copy the tile at ``coords`` (outermost-first, elements) into ``dst + offset``.

        With ``barrier`` the copy completes ``box_bytes`` transaction bytes on ``barrier[slot]``;
        without one the rules arrange its completion (circular buffering of the enclosing loop, or
        ``circular_buffer=circular_buffer(...)`` here). ``tile`` may be wider than the box in the
        innermost dimension: the rules split it into several boxes.
        """
        attrs = dict(tmap=tmap.name, coords=tuple(as_term(c) for c in coords), dst=dst.name,
                     offset=as_term(offset), bytes=tmap.box_bytes, box=tmap.box, tile=tuple(tile or tmap.box))
        if barrier is not None:
            attrs.update(barrier=barrier.name, slot=as_term(slot))
        if circular_buffer is not None:
            attrs["circular_buffer"] = dict(circular_buffer)
        self._node("tma_load", **attrs)

    def tma_store(self, tmap: TensorMap, coords: Sequence[TermLike], src: Buffer, offset: TermLike = 0) -> None:
        """Bulk-copy one box from shared ``src + offset`` to global at ``coords`` (waits for completion)."""
        self._mark_written(tmap.tensor.name)
        self._node("tma_store", tmap=tmap.name, coords=tuple(as_term(c) for c in coords), src=src.name,
                   offset=as_term(offset))

    # ---------------------------------------------------------------- compute
    def assign(self, value: TermLike, dtype: str = "float32", dst: Optional[str] = None) -> Term:
        """A register holding ``value`` (any term, e.g. ``0.0`` or an index)."""
        dst = self._reg(dst)
        self._node("assign", dst=dst, value=as_term(value), dtype=dtype)
        return name(dst)

    def fma(self, a: TermLike, b: TermLike, c: TermLike, dst: Optional[str] = None, dtype: str = "float32") -> Term:
        """``dst = a * b + c``; with ``dst`` naming ``c``'s register this accumulates in place."""
        dst = self._reg(dst)
        self._node("fma", dst=dst, args=(as_term(a), as_term(b), as_term(c)), dtype=dtype)
        return name(dst)

    def reduce(self, src: TermLike, kind: str = "block", combine: str = "sum",
               dst: Optional[str] = None, dtype: str = "float32") -> Term:
        """``kind='block'``: combine ``src`` over all threads of the block (every thread gets the result);
        ``kind='serial'``: ``dst = dst (combine) src``, accumulating across loop iterations."""
        dst = self._reg(dst)
        self._node("reduce", dst=dst, src=as_term(src), kind=kind, combine=combine, dtype=dtype)
        return name(dst)

    def _elementwise(self, op: str, *args: TermLike, dst: Optional[str] = None, dtype: str = "float32") -> Term:
        dst = self._reg(dst)
        self._node(op, dst=dst, args=tuple(as_term(a) for a in args), dtype=dtype)
        return name(dst)

    # ---------------------------------------------------------------- synchronisation
    def mbarrier_init(self, barrier: Buffer, slot: TermLike, count: int) -> None:
        self._node("mbarrier_init", barrier=barrier.name, slot=as_term(slot), count=count)

    def mbarrier_arrive(self, barrier: Buffer, slot: TermLike) -> None:
        self._node("mbarrier_arrive", barrier=barrier.name, slot=as_term(slot))

    def mbarrier_arrive_expect_tx(self, barrier: Buffer, slot: TermLike, nbytes: int) -> None:
        self._node("mbarrier_arrive_expect_tx", barrier=barrier.name, slot=as_term(slot), bytes=nbytes)

    def mbarrier_wait(self, barrier: Buffer, slot: TermLike, parity: TermLike) -> None:
        self._node("mbarrier_wait", barrier=barrier.name, slot=as_term(slot), parity=as_term(parity))

    def mbarrier_inval(self, barrier: Buffer, slot: TermLike) -> None:
        self._node("mbarrier_inval", barrier=barrier.name, slot=as_term(slot))

    def syncthreads(self) -> None:
        self._node("syncthreads")

    def fence_proxy_async(self) -> None:
        self._node("fence_proxy_async")

    def fence_mbarrier_init(self) -> None:
        self._node("fence_mbarrier_init")

    def bar_sync(self, bar_id: int, count: int) -> None:
        self._node("bar_sync", id=bar_id, count=count)


def _make_elementwise(op: str):
    def method(self: Kernel, *args: TermLike, dst: Optional[str] = None, dtype: str = "float32") -> Term:
        return self._elementwise(op, *args, dst=dst, dtype=dtype)
    method.__name__ = op
    method.__doc__ = f"Elementwise ``{op}`` of {'one operand' if op in UNARY else 'two operands'}; returns the register."
    return method


for _op in UNARY + BINARY:
    setattr(Kernel, _op, _make_elementwise(_op))
