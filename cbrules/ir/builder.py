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

Every name and number is checked at the call that gives it (:mod:`cbrules.ir.names`): a name is a C
identifier outside cbrules' own prefixes, used for one thing only in the kernel (a register may be
written many times; a loop variable may be reused by a sibling loop, never by a nested one), and
sizes are positive ints. Range checks that belong to the transformation (stages >= 2, ...) stay in
the rules.
"""
from __future__ import annotations

import itertools
import math
import operator
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator, Optional, Sequence, Union

from . import names
from ..errors import CbrulesError
from .builder_mma import MmaBuilder
from .graph import KernelGraph, Param
from . import coverage
from .coverage import PartialTileError  # noqa: F401  (public via the builder)
from .limits import SWIZZLE_SPAN, SwizzleError, TmaBoxError, check_box, check_swizzle, swizzle_repeat  # noqa: F401
from .names import IdentifierError, NameClashError  # noqa: F401  (public via the builder)
from .ops import (BINARY, DTYPE_BYTES, DTYPES, HALF_DTYPES, LOOP_KINDS, REDUCE_COMBINE, SPACES, UNARY,
                  DependenceTracker, compute_dtype)
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
    swizzle: str = "none"

    @property
    def box_bytes(self) -> int:
        n = DTYPE_BYTES[self.tensor.dtype]
        for b in self.box:
            n *= b
        return n


class BuildError(CbrulesError, ValueError):
    """A builder call given a value it cannot use; the message names the call and the fix."""


class StagingAlignmentError(BuildError):
    """A TMA store from a shared buffer that is not aligned as the TMA requires."""


def _int(value: Any, where: str, what: str, low: Optional[int] = None) -> int:
    """``value`` as an int (numpy ints too; bool, float and text refused), at least ``low``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise BuildError(f"{where}: {what} must be an int, got {value!r} ({type(value).__name__}); "
                         f"pass a whole number") from None
    if low is not None and v < low:
        raise BuildError(f"{where}: {what} must be at least {low}, got {v}")
    return v


def _ints(values: Any, where: str, what: str, low: Optional[int] = 1) -> tuple[int, ...]:
    if not isinstance(values, (tuple, list)):
        raise BuildError(f"{where}: {what} must be a tuple of ints, got {values!r}")
    return tuple(_int(v, where, f"{what}[{i}]", low) for i, v in enumerate(values))


def _choice(value: Any, where: str, what: str, options: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in options:
        raise BuildError(f"{where}: {what} {value!r} is not one of {', '.join(options)}")
    return value


def _term(value: TermLike, where: str, what: str, low: Optional[int] = None) -> Term:
    """A size, bound or step: a term over symbols, or an int literal of at least ``low`` (a float
    would make C compare floats, a non-positive size negative memory)."""
    if isinstance(value, (Term, str)):
        return as_term(value)
    return as_term(_int(value, where, what, low))


def _cb_options(options: Any, where: str) -> dict:
    """Type checks of circular-buffer options (their ranges are the rules' to check)."""
    if not isinstance(options, dict):
        raise BuildError(f"{where}: circular_buffer must be a dict from circular_buffer(...), got {options!r}")
    out = dict(options)
    if "stages" in out and out["stages"] != AUTO:
        out["stages"] = _int(out["stages"], where, "circular_buffer stages")
    if out.get("prefetch") is not None and out["prefetch"] != AUTO:
        out["prefetch"] = _int(out["prefetch"], where, "circular_buffer prefetch")
    if "war" in out and not isinstance(out["war"], str):
        raise BuildError(f"{where}: circular_buffer war must be \"sync\" or \"mbarrier\", got {out['war']!r}")
    if "warp_specialize" in out and not isinstance(out["warp_specialize"], bool):
        raise BuildError(f"{where}: circular_buffer warp_specialize must be True or False, "
                         f"got {out['warp_specialize']!r}")
    if "strict_trip_count" in out and not isinstance(out["strict_trip_count"], bool):
        raise BuildError(f"{where}: circular_buffer strict_trip_count must be True or False, "
                         f"got {out['strict_trip_count']!r}")
    if isinstance(out.get("registers"), list):
        out["registers"] = tuple(out["registers"])  # the rules check the pair and its counts
    return out


AUTO = "auto"  # stages/prefetch chosen by the rules (cb-auto-stages, cb-auto-prefetch)


def circular_buffer(stages: Union[int, str], prefetch: Union[int, str, None] = None, war: Optional[str] = None,
                    warp_specialize: bool = False, registers: Optional[tuple[int, int]] = None,
                    strict_trip_count: bool = False) -> dict:
    """Options of a circular-buffered loop: ``stages`` S, ``prefetch`` P (negative counts from S),
    ``war`` = "sync" (block sync ends each main iteration) or "mbarrier" (empty barriers).
    Only the options given are recorded: the rules fill in the rest (``cb-default-prefetch``: S-1,
    ``cb-default-war``: "sync", or "mbarrier" when warp-specialized), so a rule folder can change a
    default. ``stages="auto"`` lets the rules choose S from the bytes a stage loads, the shared memory a
    block may use at the occupancy target, the trip count when known, and a cap (see the trace for
    why); ``prefetch="auto"`` is S-1.

    ``warp_specialize``: a producer warp group of 128 threads, added after the block's threads, issues
    the loads while the block's own threads (the consumers) compute; WAR protection is then the empty
    barriers and the producer runs up to S tiles ahead.
    ``registers=(producer, consumer)`` adds register sharing (``setmaxnreg``) between the roles.
    Any trip count runs, fewer than S and 0 included (the rules predicate the prologue's loads past
    the end); ``strict_trip_count=True`` refuses a trip count below S instead (code ``short-loop``:
    at lowering when it is known, else at launch).
    Non-int stages or prefetch are a :class:`BuildError` here; the rules check the ranges and
    refuse bad ones with a named error."""
    given = {"stages": stages, "prefetch": prefetch, "war": war}
    opts = {k: v for k, v in given.items() if v is not None}
    if warp_specialize or registers is not None:  # absent otherwise: annotations stay as they were
        opts["warp_specialize"] = warp_specialize
        opts["registers"] = registers
    if strict_trip_count:  # absent otherwise, as above
        opts["strict_trip_count"] = True
    return _cb_options(opts, "circular_buffer(...)")


def _inside(tile: dict, shape: tuple) -> Term:
    """The test that element ``tile['index']`` (row-major in the box) of the box at ``tile['coords']`` lies
    inside a tensor of ``shape``."""
    rest, pred = tile["index"], None
    for d in reversed(range(len(tile["box"]))):
        within = rest % tile["box"][d] if d else rest
        rest = rest / tile["box"][d]
        t = (tile["coords"][d] + within).lt(shape[d])
        pred = t if pred is None else t.and_(pred)
    return pred


def _call_site() -> str:
    f = sys._getframe(1)
    while f is not None and f.f_globals.get("__name__", "") in ("cbrules.ir.builder", "cbrules.ir.builder_mma",
                                                                "contextlib"):
        f = f.f_back
    if f is None:
        return "?"
    rel = os.path.relpath(f.f_code.co_filename)
    return f"{f.f_code.co_filename if rel.startswith('..') else rel}:{f.f_lineno}"


_MEMORY = ("tensor", "buffer")  # what load and store may address
MAX_BLOCK_THREADS = 1024  # CUDA's limit on threads per block


def _dims(x, where: str) -> tuple[int, int, int]:
    t = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    if not 1 <= len(t) <= 3:
        raise BuildError(f"{where}: block {x!r} must have 1 to 3 dimensions")
    dims = _ints(t, where, "block") + (1,) * (3 - len(t))
    if dims[0] * dims[1] * dims[2] > MAX_BLOCK_THREADS:
        raise BuildError(f"{where}: block {x!r} has {dims[0] * dims[1] * dims[2]} threads, more than the "
                         f"{MAX_BLOCK_THREADS} a CUDA block may have")
    return dims  # type: ignore[return-value]


class Kernel(MmaBuilder):
    """A kernel under construction; ``graph`` is the :class:`KernelGraph` being built."""

    def __init__(self, name: str, block: int | Sequence[int] = 256):
        where = f"Kernel({name!r}) at {_call_site()}"
        names.check(name, where)
        self.graph = KernelGraph(name, block=_dims(block, where))
        self._scopes: list[int] = [self.graph.root]
        self._regs = itertools.count()
        self._trackers: dict[int, DependenceTracker] = {}
        # every name inside the kernel -> what it names (the kernel's own name is outside its body:
        # a parameter or loop may reuse it, as C allows)
        self._names: dict[str, str] = {}
        self._loop_vars: list[str] = []  # variables of the enclosing loops, outermost first
        self._tile_writes: dict[str, list[coverage.TileWrite]] = {}  # buffer -> its TMA loads so far
        self._stored: set[str] = set()  # buffers written by plain stores (their coverage is not judged)
        self._fragments: dict[str, tuple[int, int, int]] = {}  # accumulator -> (bm, bn, groups)

    # the checks the mixed-in calls (builder_mma) use, so that module need not import this one
    def _where(self, call: str) -> str:
        return f"{call} at {_call_site()}"

    def _error(self, message: str) -> BuildError:
        return BuildError(message)

    def _int_arg(self, value: Any, where: str, what: str, low: Optional[int] = None) -> int:
        return _int(value, where, what, low)

    # ---------------------------------------------------------------- names
    def _claim(self, nm: Any, what: str, call: str, reuse: bool = False) -> str:
        """Check ``nm`` (given to builder call ``call``) and record it as naming a ``what``;
        ``reuse`` lets a name stand that already names the same kind of thing (registers, sibling loops)."""
        where = f"{call} at {_call_site()}"
        names.check(nm, where)
        had = self._names.get(nm)
        if what == "loop variable" and nm in self._loop_vars:
            raise NameClashError(nm, where, "is already the variable of an enclosing loop",
                                 "give the inner loop a variable of its own")
        if had is not None and not (reuse and had == what):
            kernel = self.graph.kernel()["name"]
            raise NameClashError(nm, where, f"already names a {had} of kernel {kernel!r} (the generated CUDA "
                                 "would mix them up)",
                                 f"choose another name for this {what}")
        self._names[nm] = what
        return nm

    def _known(self, handle: Any, kinds: tuple[str, ...], call: str) -> str:
        """The name of a handle this kernel made (a forged or foreign handle is refused)."""
        nm = getattr(handle, "name", None)
        if self._names.get(nm) not in kinds:
            raise BuildError(f"{call} at {_call_site()}: {handle!r} is not a {' or '.join(kinds)} of kernel "
                             f"{self.graph.kernel()['name']!r}; pass the handle its builder call returned")
        return nm  # type: ignore[return-value]

    def _add_param(self, p: Param, what: str, call: str) -> None:
        k = self.graph.kernel()
        self._claim(p.name, what, call)
        k["params"] = k["params"] + (p,)

    # ---------------------------------------------------------------- signature & geometry
    def symbol(self, sym: str) -> Term:
        """An int parameter (tensor extent, trip count) known only at launch."""
        self._add_param(Param(sym, "symbol", "int32"), "symbol", f"symbol({sym!r})")
        return name(sym)

    def scalar(self, sname: str, dtype: str = "float32", finite: bool = True) -> Term:
        """A scalar parameter of ``dtype`` (``eps``, a scale) passed at launch like a symbol
        (``kernel(x=..., eps=1e-5)``); the launcher checks its type and range, and with ``finite``
        (floats) refuses infinities and NaN. Half types are refused: registers compute in float32."""
        where = f"scalar({sname!r}) at {_call_site()}"
        _choice(dtype, where, "dtype", [d for d in DTYPES if d not in ("mbarrier",) + HALF_DTYPES])
        if not isinstance(finite, bool):
            raise BuildError(f"{where}: finite must be True or False, got {finite!r}")
        self._add_param(Param(sname, "symbol", dtype, finite=finite), "symbol", f"scalar({sname!r})")
        return name(sname)

    def tensor(self, tname: str, shape: Sequence[TermLike], dtype: str = "float32") -> Buffer:
        """A global-memory tensor parameter; ``shape`` is outermost-first, terms over symbols."""
        where = f"tensor({tname!r}) at {_call_site()}"
        if dtype not in DTYPES or dtype == "mbarrier":
            raise BuildError(f"{where}: unsupported dtype {dtype!r}; use one of "
                             f"{', '.join(d for d in DTYPES if d != 'mbarrier')}")
        if not isinstance(shape, (tuple, list)) or not shape:
            raise BuildError(f"{where}: shape must be a non-empty tuple of extents, got {shape!r}")
        shape_t = tuple(_term(s, where, f"shape[{i}]", 1) for i, s in enumerate(shape))
        self._add_param(Param(tname, "tensor", dtype, shape_t), "tensor", f"tensor({tname!r})")
        return Buffer(tname, dtype, shape_t, "global")

    def tensor_map(self, tensor: Buffer, box: Sequence[int], mname: Optional[str] = None,
                   swizzle: str = "none") -> TensorMap:
        """A TMA tensor map over ``tensor`` with the given box (outermost-first, like the shape).

        ``swizzle`` ("none", "32B", "64B", "128B") is the shared-memory layout its loads write: the 16-byte
        chunks of each row XORed by the row number (bank-conflict-free column reads); reads of such a
        tile are given logical indices, which the rules turn into swizzled addresses. The inner box
        dimension must then span exactly the swizzle width (a :class:`SwizzleError` otherwise)."""
        mname = f"{tensor.name}_tmap" if mname is None else mname
        where = f"tensor_map({mname!r}) at {_call_site()}"
        box = _ints(box, where, "box", low=None)  # the range is check_box's (a TmaBoxError)
        if len(box) != len(tensor.shape):
            raise BuildError(f"tensor map over {tensor.name!r}: box {tuple(box)} has rank {len(box)}, "
                             f"the tensor has rank {len(tensor.shape)}")
        names.check(mname, where)
        check_box(mname, box, tensor.dtype)
        check_swizzle(mname, box, DTYPE_BYTES[tensor.dtype], swizzle)
        extra = {} if swizzle == "none" else {"swizzle": swizzle}
        self._add_param(Param(mname, "tmap", tensor.dtype, tensor.shape, tensor.name, box, **extra), "tensor map",
                        f"tensor_map({mname!r})")
        return TensorMap(mname, tensor, box, swizzle)

    def grid(self, *dims: TermLike) -> None:
        """Launch grid as terms over symbols (missing dimensions are 1)."""
        where = f"grid(...) at {_call_site()}"
        if not 1 <= len(dims) <= 3:
            raise BuildError(f"{where}: a grid has 1 to 3 dimensions, got {len(dims)}")
        self.graph.kernel()["grid"] = tuple(_term(d, where, f"grid[{i}]", 1) for i, d in enumerate(dims)) \
            + (as_term(1),) * (3 - len(dims))

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
        where = f"loop({var!r}) at {_call_site()}"
        _choice(kind, where, "kind", LOOP_KINDS)
        # a literal step below 1 would never end on the device; a term step is the launch's to get right
        bounds = {k: _term(v, where, k, 1 if k == "step" else None)
                  for k, v in (("start", start), ("stop", stop), ("step", step))}
        if "circular_buffer" in annotations:
            annotations["circular_buffer"] = _cb_options(annotations["circular_buffer"], where)
        self._claim(var, "loop variable", f"loop({var!r})", reuse=True)
        with self._scope("for", var=var, **bounds, kind=kind, annotations=dict(annotations)):
            self._loop_vars.append(var)
            try:
                yield name(var)
            finally:
                self._loop_vars.pop()

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
        where = f"alloc({buf!r}) at {_call_site()}"
        _choice(space, where, "space", [s for s in SPACES if s != "global"])
        _choice(dtype, where, "dtype", list(DTYPES))
        if space == "register" and dtype in HALF_DTYPES:
            raise BuildError(f"{where}: a register array of {dtype}; registers compute in float32 (half types "
                             "are storage types of tensors and shared buffers): allocate it as float32")
        shape = _ints(shape, where, "shape")
        if not shape:
            raise BuildError(f"{where}: shape must have at least one dimension")
        if align is not None:
            align = _int(align, where, "align", 1)
            if align & (align - 1):
                raise BuildError(f"{where}: align {align} must be a power of two")
        self._claim(buf, "buffer", f"alloc({buf!r})")
        align = align or (128 if space == "shared" and dtype != "mbarrier" else DTYPE_BYTES[dtype])
        self._node("alloc", buf=buf, space=space, dtype=dtype, shape=shape, align=align)
        return Buffer(buf, dtype, shape, space)

    def _reg(self, dst: Optional[str], call: str, dtype: Optional[str] = None) -> str:
        """The register a compute call writes: ``dst`` (checked), or the next free ``v<n>``."""
        if dtype is not None:
            where = f"{call} at {_call_site()}"
            _choice(dtype, where, "dtype", [d for d in DTYPES if d != "mbarrier"])
            if dtype in HALF_DTYPES:
                raise BuildError(f"{where}: a {dtype} register; registers compute in float32 (a load of a "
                                 f"{dtype} buffer converts, a store rounds): use dtype='float32'")
        if dst is None:
            dst = next(f"v{i}" for i in self._regs if f"v{i}" not in self._names)
        return self._claim(dst, "register", f"{call}(dst={dst!r})", reuse=True)

    # ---------------------------------------------------------------- memory
    def _check_read(self, src: Buffer, index: Term) -> None:
        """A read of a TMA-loaded shared buffer sees only elements its loads write (coverage)."""
        if src.space != "shared" or src.name not in self._tile_writes:
            return
        where = _call_site()
        coverage.check_read(src.name, src.shape, index, coverage.scope_ranges(self.graph, self._scopes),
                            coverage.scope_preds(self.graph, self._scopes), where)
        if src.name not in self._stored:
            coverage.check_covered(src.name, src.shape, self._tile_writes[src.name], where)

    def load(self, src: Buffer, index: TermLike, dst: Optional[str] = None) -> Term:
        """Read one element ``src[index]`` (flat index) into a register; returns the register.
        A float16/bfloat16 element arrives as float32."""
        src_name = self._known(src, _MEMORY, "load")
        self._check_read(src, as_term(index))
        dst = self._reg(dst, "load")
        self._node("load", dst=dst, src=src_name, index=as_term(index), dtype=compute_dtype(src.dtype))
        return name(dst)

    def store(self, dst: Buffer, index: TermLike, value: TermLike,
              tile: Optional[tuple[TensorMap, Sequence[TermLike], TermLike]] = None, clip: bool = False) -> None:
        """Write ``dst[index] = value`` (flat index); a float16/bfloat16 buffer gets the value rounded to
        nearest even.

        ``tile=(tmap, coords, element)`` says the element is element ``element`` (row-major) of the box
        of ``tmap`` (a tensor map over ``dst``) at ``coords``: the rules then write the tile to a shared
        staging buffer and store it with one TMA store (see rules/tma_store.rules). Every in-bounds
        element of such a box must be written in each iteration (the interpreter checks it).
        ``clip=True`` (with ``tile``): the element may lie outside the tensor; the store is wrapped in the
        bounds test of its place in the box (coords + element < the tensor's shape, an ``if`` tagged
        ``tile-bounds``), which the rules drop once the store writes a staging slot, since the TMA store
        clips the box at the tensor's edges (tma-store-drop-tile-bounds)."""
        where = f"store at {_call_site()}"
        dst_name = self._known(dst, _MEMORY, "store")
        if dst.space == "global":
            self._mark_written(dst_name)
        else:
            self._stored.add(dst_name)
        attrs = {}
        if tile is not None:
            if not (isinstance(tile, tuple) and len(tile) == 3):
                raise BuildError(f"{where}: tile must be (tensor map, coords, element), got {tile!r}")
            tmap, coords, element = tile
            self._known(tmap, ("tensor map",), "store(tile=...)")
            if tmap.swizzle != "none":
                raise SwizzleError(f"{where}: tile stores through swizzled tensor map {tmap.name!r} are not "
                                   "supported; store through a map without swizzle")
            if dst.space != "global" or tmap.tensor.name != dst_name:
                raise BuildError(f"{where}: tile store into {dst_name!r} through tensor map {tmap.name!r}, which "
                                 f"maps {tmap.tensor.name!r}; a TMA store writes the tensor its map covers: "
                                 f"map {dst_name!r} itself")
            if not isinstance(coords, (tuple, list)) or len(coords) != len(tmap.box):
                raise BuildError(f"{where}: tile coords {coords!r} must give one coordinate per box dimension "
                                 f"({len(tmap.box)})")
            attrs["tile"] = {"tensor": dst_name, "map": tmap.name, "coords": tuple(as_term(c) for c in coords),
                             "index": as_term(element), "box": tmap.box, "dtype": tmap.tensor.dtype}
        elif clip:
            raise BuildError(f"{where}: clip=True needs tile=: it tests the element's place in the tile's box")
        if clip:
            with self._scope("if", pred=_inside(attrs["tile"], dst.shape), tag="tile-bounds"):
                self._node("store", dst=dst_name, index=as_term(index), value=as_term(value), **attrs)
            return
        self._node("store", dst=dst_name, index=as_term(index), value=as_term(value), **attrs)

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
        where = f"tma_load at {_call_site()}"
        attrs = dict(tmap=self._known(tmap, ("tensor map",), "tma_load"), coords=tuple(as_term(c) for c in coords),
                     dst=self._known(dst, ("buffer",), "tma_load"), offset=as_term(offset), bytes=tmap.box_bytes,
                     box=tmap.box, tile=_ints(tmap.box if tile is None else tile, where, "tile"))
        if tmap.swizzle != "none":
            self._check_swizzled_tile(tmap, dst, attrs["tile"], where)
            attrs["swizzle"] = SWIZZLE_SPAN[tmap.swizzle]
        if barrier is not None:
            attrs.update(barrier=self._known(barrier, ("buffer",), "tma_load"), slot=as_term(slot))
        if circular_buffer is not None:
            attrs["circular_buffer"] = _cb_options(circular_buffer, where)
        write = coverage.TileWrite(dst.name, attrs["offset"], math.prod(attrs["tile"]), tmap.box, attrs["tile"],
                                   tmap.name, _call_site(), tuple(coverage.scope_ranges(self.graph, self._scopes)))
        coverage.check_write(write, math.prod(dst.shape), dst.shape)
        self._tile_writes.setdefault(dst.name, []).append(write)
        self._node("tma_load", **attrs)

    def _check_swizzled_tile(self, tmap: TensorMap, dst: Buffer, tile: tuple, where: str) -> None:
        """A swizzled box lands on the pattern only from a base aligned to its repeat (8 rows of the
        span): the buffer, every box of the tile, and every stage slot must start there."""
        repeat = swizzle_repeat(tmap.swizzle)
        alloc = next(self.graph[n] for n in self.graph.nodes() if self.graph.op(n) == "alloc"
                     and self.graph[n]["buf"] == dst.name)
        if alloc["align"] < repeat:
            raise SwizzleError(f"{where}: buffer {dst.name!r} is aligned to {alloc['align']} bytes, but tiles of "
                               f"swizzle {tmap.swizzle} start on its {repeat}-byte pattern: allocate it with "
                               f"align={repeat}")
        box_bytes = tmap.box_bytes
        if box_bytes % repeat:
            raise SwizzleError(f"{where}: a box of {tmap.box} spans {box_bytes} bytes, not a multiple of the "
                               f"{repeat}-byte swizzle {tmap.swizzle} pattern, so the next box or stage slot would "
                               f"start off the pattern; use a multiple of {repeat // SWIZZLE_SPAN[tmap.swizzle]} "
                               "rows a box")

    def tma_store(self, tmap: TensorMap, coords: Sequence[TermLike], src: Buffer, offset: TermLike = 0,
                  wait: str = "read") -> None:
        """Bulk-copy one box from shared ``src + offset`` to global at ``coords``; parts of the box outside
        the tensor are not written. ``wait="read"`` commits the store's group and waits until ``src``
        may be written again; ``wait="none"`` only commits: a later :meth:`tma_store_wait` by the same
        thread must cover it before ``src`` is rewritten and before the kernel ends."""
        where = f"tma_store at {_call_site()}"
        tmap_name = self._known(tmap, ("tensor map",), "tma_store")
        src_name = self._known(src, ("buffer",), "tma_store")
        _choice(wait, where, "wait", ("read", "none"))
        if tmap.swizzle != "none":
            raise SwizzleError(f"{where}: TMA stores through swizzled tensor map {tmap.name!r} are not supported; "
                               "store through a map without swizzle")
        alloc = next((self.graph[n] for n in self.graph.nodes() if self.graph.op(n) == "alloc"
                      and self.graph[n]["buf"] == src_name), None)
        if alloc is None or alloc["space"] != "shared":
            raise BuildError(f"{where}: the source {src_name!r} of a TMA store must be a shared buffer")
        if alloc["align"] < 128:
            raise StagingAlignmentError(f"{where}: staging buffer {src_name!r} is aligned to {alloc['align']} "
                                        "bytes; the TMA reads shared memory from 128-byte aligned addresses: "
                                        "allocate it with align=128 (the default for shared buffers)")
        self._mark_written(tmap.tensor.name)
        extra = {} if wait == "read" else {"wait": wait}  # the default stays implicit (unchanged graphs)
        self._node("tma_store", tmap=tmap_name, coords=tuple(as_term(c) for c in coords), src=src_name,
                   offset=as_term(offset), **extra)

    def tma_store_wait(self, pending: int = 0, read: bool = False) -> None:
        """``cp.async.bulk.wait_group[.read] pending``: wait until all but this thread's newest
        ``pending`` TMA-store groups have read their source (``read``) or completed."""
        where = f"tma_store_wait at {_call_site()}"
        if not isinstance(read, bool):
            raise BuildError(f"{where}: read must be True or False, got {read!r}")
        self._node("tma_store_wait", pending=_int(pending, where, "pending", 0), read=read)

    # ---------------------------------------------------------------- compute
    def assign(self, value: TermLike, dtype: str = "float32", dst: Optional[str] = None) -> Term:
        """A register holding ``value`` (any term, e.g. ``0.0``, ``float("-inf")`` or an index)."""
        self._check_literals("assign", dtype, value)
        dst = self._reg(dst, "assign", dtype)
        self._node("assign", dst=dst, value=as_term(value), dtype=dtype)
        return name(dst)

    def fma(self, a: TermLike, b: TermLike, c: TermLike, dst: Optional[str] = None, dtype: str = "float32") -> Term:
        """``dst = a * b + c``; with ``dst`` naming ``c``'s register this accumulates in place."""
        dst = self._reg(dst, "fma", dtype)
        self._node("fma", dst=dst, args=(as_term(a), as_term(b), as_term(c)), dtype=dtype)
        return name(dst)

    def reduce(self, src: TermLike, kind: str = "block", combine: str = "sum",
               dst: Optional[str] = None, dtype: str = "float32") -> Term:
        """``kind='block'``: combine ``src`` over all threads of the block (every thread gets the result);
        ``kind='serial'``: ``dst = dst (combine) src``, accumulating across loop iterations."""
        where = f"reduce at {_call_site()}"
        _choice(kind, where, "kind", ("block", "serial"))
        _choice(combine, where, "combine", REDUCE_COMBINE)
        dst = self._reg(dst, "reduce", dtype)
        self._node("reduce", dst=dst, src=as_term(src), kind=kind, combine=combine, dtype=dtype)
        return name(dst)

    def select(self, pred: TermLike, a: TermLike, b: TermLike, dst: Optional[str] = None,
               dtype: str = "float32") -> Term:
        """``dst = pred ? a : b`` per thread, e.g. ``k.select((col).lt(n), v, float("-inf"))`` for a
        ragged tail whose padding must not count in a max."""
        return self._elementwise("select", pred, a, b, dst=dst, dtype=dtype)

    def _check_literals(self, call: str, dtype: str, *values: TermLike) -> None:
        """An infinity or NaN literal is a float's: an integer register cannot hold one."""
        if dtype in ("float32", "float64"):
            return
        for v in values:
            t = as_term(v) if isinstance(v, (Term, int, float)) else None
            consts = [] if t is None else [x for x in _subterms(t) if x.op == "const" and isinstance(x.value, float)
                                           and not math.isfinite(x.value)]
            if consts:
                raise BuildError(f"{call} at {_call_site()}: {consts[0].value} in a {dtype} register; only float32 "
                                 "and float64 registers hold infinities and NaN: use dtype='float32'")

    def _elementwise(self, op: str, *args: TermLike, dst: Optional[str] = None, dtype: str = "float32") -> Term:
        self._check_literals(op, dtype, *args)
        dst = self._reg(dst, op, dtype)
        self._node(op, dst=dst, args=tuple(as_term(a) for a in args), dtype=dtype)
        return name(dst)

    # ---------------------------------------------------------------- synchronisation
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


def _subterms(t: Term) -> Iterator[Term]:
    yield t
    for a in t.args:
        yield from _subterms(a)


def _make_elementwise(op: str):
    def method(self: Kernel, *args: TermLike, dst: Optional[str] = None, dtype: str = "float32") -> Term:
        return self._elementwise(op, *args, dst=dst, dtype=dtype)
    method.__name__ = op
    method.__doc__ = f"Elementwise ``{op}`` of {'one operand' if op in UNARY else 'two operands'}; returns the register."
    return method


for _op in UNARY + BINARY:
    setattr(Kernel, _op, _make_elementwise(_op))
