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
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

from . import coverage, names
from .builder_mma import FragmentElement, MmaBuilder, fragment_coords  # noqa: F401  (public via the builder)
from .builder_sync import SyncBuilder
from .builder_tma import TmaBuilder
from .builder_values import (MAX_BLOCK_THREADS, Buffer, BuildError, StagingAlignmentError, TensorMap,  # noqa: F401
                             _call_site, _cb_options, _choice, _dims, _inside, _int, _ints, _MEMORY, _bounded_term, _term,
                             blockDim, blockIdx, ceil_div, circular_buffer, gridDim, lanes, threadIdx)
from .coverage import PartialTileError  # noqa: F401  (public via the builder)
from .graph import KernelGraph, Param
from .limits import SWIZZLE_SPAN, SwizzleError, TmaBoxError, swizzle_repeat  # noqa: F401  (public via the builder)
from .names import IdentifierError, NameClashError  # noqa: F401  (public via the builder)
from .ops import (BINARY, BUILT_SCOPE_DEPTH, DTYPE_BYTES, DTYPES, FLOAT32_ONLY, FLOAT_REGISTERS, LOOP_KINDS, MATH,
                  MATH_ERRORS, OPS, REDUCE_COMBINE, SHFL_MODES, SPACES, UNARY, WARP_SIZE,
                  DependenceTracker,
                  STORAGE_DTYPES, compute_dtype)
from .terms import BUILT_TERM_DEPTH, BUILT_TERM_PARTS, ELECT_ONE, Term, TermLike, as_term, fits, name



class Kernel(TmaBuilder, SyncBuilder, MmaBuilder):
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
        self._reductions: dict[str, tuple[str, str]] = {}  # fragment reduction -> (accumulator, axis)
        self._operands: dict[str, tuple[int, int, int, str]] = {}  # register MMA operand -> (bm, bk, groups, dtype)

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
        (floats) refuses infinities and NaN. Storage types (half, 8-bit float) are refused: registers compute in float32."""
        where = f"scalar({sname!r}) at {_call_site()}"
        _choice(dtype, where, "dtype", [d for d in DTYPES if d not in ("mbarrier",) + STORAGE_DTYPES])
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

    def grid(self, *dims: TermLike) -> None:
        """Launch grid as terms over symbols (missing dimensions are 1)."""
        where = f"grid(...) at {_call_site()}"
        if not 1 <= len(dims) <= 3:
            raise BuildError(f"{where}: a grid has 1 to 3 dimensions, got {len(dims)}")
        self.graph.kernel()["grid"] = tuple(_term(d, where, f"grid[{i}]", 1) for i, d in enumerate(dims)) \
            + (as_term(1),) * (3 - len(dims))

    # ---------------------------------------------------------------- node creation
    def _node(self, op: str, **attrs) -> int:
        for key in OPS[op].terms:  # before anything reads them: a term too deep or large cannot be walked or printed
            v = attrs.get(key)
            for i, t in enumerate(v if isinstance(v, tuple) else (v,)):
                if isinstance(t, Term) and not fits(t, BUILT_TERM_DEPTH, BUILT_TERM_PARTS):  # the call site: only then
                    _bounded_term(t, f"{op} at {_call_site()}", key if not isinstance(v, tuple) else f"{key}[{i}]")
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
        if len(self._scopes) > BUILT_SCOPE_DEPTH:  # the kernel's own scope counts as one
            raise BuildError(f"{op} at {_call_site()}: scopes nested more than {BUILT_SCOPE_DEPTH} deep, more than the "
                             "generated code and the simplifier take; flatten the nest (one loop over the product of "
                             "the trip counts, or an if whose predicate joins the conditions with &&)")
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
        if space == "register" and dtype in STORAGE_DTYPES:
            raise BuildError(f"{where}: a register array of {dtype}; registers compute in float32 (half and 8-bit "
                             "float types are storage types of tensors and shared buffers): allocate it as float32")
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
            if dtype in STORAGE_DTYPES:
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
        _bounded_term(index, f"load at {where}", "index")
        coverage.check_read(src.name, src.shape, index, coverage.scope_ranges(self.graph, self._scopes),
                            coverage.scope_preds(self.graph, self._scopes), where)
        if src.name not in self._stored:
            coverage.check_covered(src.name, src.shape, self._tile_writes[src.name], where)

    def load(self, src: Buffer, index: TermLike, dst: Optional[str] = None) -> Term:
        """Read one element ``src[index]`` (flat index) into a register; returns the register.
        A float16/bfloat16/float8 element arrives as float32."""
        src_name = self._known(src, _MEMORY, "load")
        self._check_read(src, as_term(index))
        dst = self._reg(dst, "load")
        self._node("load", dst=dst, src=src_name, index=as_term(index), dtype=compute_dtype(src.dtype))
        return name(dst)

    def store(self, dst: Buffer, index: TermLike, value: TermLike,
              tile: Optional[tuple[TensorMap, Sequence[TermLike], TermLike]] = None, clip: bool = False) -> None:
        """Write ``dst[index] = value`` (flat index); a float16/bfloat16 buffer gets the value rounded to
        nearest even, a float8 buffer rounded to nearest even and saturated to its largest finite value.

        ``tile=(tmap, coords, element)`` says the element is element ``element`` (row-major) of the box
        of ``tmap`` (a tensor map over ``dst``) at ``coords``: the rules then write the tile to a shared
        staging buffer and store it with one TMA store (see rules/tma_store.rules). Every in-bounds
        element of such a box must be written in each iteration (the interpreter checks it).
        ``clip=True`` (with ``tile``): the element may lie outside the tensor; the store is wrapped in the
        bounds test of its place in the box (coords + element < the tensor's shape, an ``if`` tagged
        ``tile-bounds``), which the rules drop once the store writes a staging slot, since the TMA store
        clips the box at the tensor's edges (tma-store-drop-tile-bounds). Through a swizzled map the
        staging slots hold the box in that swizzle (the 16-byte chunks of a row XORed by the row, so a
        warp writing a column of rows spreads over the banks) and the TMA store reads it back dense."""
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
            if tmap.split:  # the tile's bounds test and staging speak the tensor's dimensions, not a view's
                raise BuildError(f"{where}: tile store through split tensor map {tmap.name!r}; tile stores go "
                                 "through a map without split=")
            if tmap.swizzle != "none" and tmap.box_bytes % swizzle_repeat(tmap.swizzle):
                raise SwizzleError(f"{where}: tile store through tensor map {tmap.name!r} ({tmap.swizzle} swizzle): "
                                   f"its box {tmap.box} spans {tmap.box_bytes} bytes, not a multiple of the "
                                   f"{swizzle_repeat(tmap.swizzle)}-byte pattern, so the second staging slot would "
                                   "start on another phase of it; use a box of whole patterns (8 rows of the swizzle "
                                   "span) or a map without swizzle")
            if dst.space != "global" or tmap.tensor.name != dst_name:
                raise BuildError(f"{where}: tile store into {dst_name!r} through tensor map {tmap.name!r}, which "
                                 f"maps {tmap.tensor.name!r}; a TMA store writes the tensor its map covers: "
                                 f"map {dst_name!r} itself")
            if not isinstance(coords, (tuple, list)) or len(coords) != len(tmap.box):
                raise BuildError(f"{where}: tile coords {coords!r} must give one coordinate per box dimension "
                                 f"({len(tmap.box)})")
            attrs["tile"] = {"tensor": dst_name, "map": tmap.name, "coords": tuple(as_term(c) for c in coords),
                             "index": as_term(element), "box": tmap.box, "dtype": tmap.tensor.dtype}
            if tmap.swizzle != "none":  # the rules stage the tile in the layout the map's TMA store reads
                attrs["tile"]["swizzle"] = SWIZZLE_SPAN[tmap.swizzle]
        elif clip:
            raise BuildError(f"{where}: clip=True needs tile=: it tests the element's place in the tile's box")
        if clip:
            with self._scope("if", pred=_inside(attrs["tile"], dst.shape), tag="tile-bounds"):
                self._node("store", dst=dst_name, index=as_term(index), value=as_term(value), **attrs)
            return
        self._node("store", dst=dst_name, index=as_term(index), value=as_term(value), **attrs)

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

    def block_stats(self, mean: TermLike, m2: TermLike, n: int, dst: Optional[str] = None,
                    dst_m2: Optional[str] = None) -> tuple[Term, Term]:
        """The block's (mean, M2) from each thread's ``mean`` and ``m2`` (the sum of squared deviations
        from that mean) over ``n`` elements of its own, in one block reduction that does not cancel when
        the mean is large against the spread (the variance is M2 / (n * threads)). Every thread gets
        both; the block must be a power-of-two count of whole warps."""
        where = f"block_stats at {_call_site()}"
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BuildError(f"{where}: n={n!r} must be the count of elements each thread's mean covers, a "
                             "whole number of at least 1")
        dst = self._reg(dst, "block_stats", "float32")
        dst_m2 = self._reg(dst_m2, "block_stats", "float32")
        if dst_m2 == dst:
            raise BuildError(f"{where}: dst and dst_m2 are both {dst!r}; give two registers")
        self._node("block_stats", dst=dst, dst_m2=dst_m2, args=(as_term(mean), as_term(m2)), n=n, dtype="float32")
        return name(dst), name(dst_m2)

    def select(self, pred: TermLike, a: TermLike, b: TermLike, dst: Optional[str] = None,
               dtype: str = "float32") -> Term:
        """``dst = pred ? a : b`` per thread, e.g. ``k.select((col).lt(n), v, float("-inf"))`` for a
        ragged tail whose padding must not count in a max."""
        return self._elementwise("select", pred, a, b, dst=dst, dtype=dtype)

    def shfl(self, value: TermLike, lane: TermLike, mode: str = "xor", width: int = 32, dst: Optional[str] = None,
             dtype: str = "float32") -> Term:
        """A warp shuffle (full mask): each lane gets ``value`` as computed by another lane of its warp.

        ``mode`` picks the source lane from ``lane`` (a literal 0..width-1 or a term): ``"xor"`` lane ^ lane_arg
        (a butterfly: ``k.shfl(v, 1)`` then ``k.shfl(v, 2)`` combine the four lanes of each group),
        ``"down"`` lane + lane_arg, ``"up"`` lane - lane_arg, ``"idx"`` lane lane_arg (a broadcast).
        The warp is split into segments of ``width`` lanes (a power of two up to 32); a lane whose source
        lies past its segment (down, xor; before it, up) keeps its own value, and idx counts within the
        segment. As ``__shfl_*_sync(0xffffffff, ...)``: every lane of the warp must execute it together
        (not inside an ``if`` that splits a warp; the interpreter refuses that), so the block must be whole
        warps. ``dtype`` is the register's type (float32, float64 or an int type)."""
        where = f"shfl at {_call_site()}"
        _choice(mode, where, "mode", SHFL_MODES)
        width = _int(width, where, "width", 1)
        if width > WARP_SIZE or width & (width - 1):
            raise BuildError(f"{where}: width {width} is not a power of two in 1..{WARP_SIZE}; a shuffle's segments "
                             "tile the warp (use 4 for the four lanes of an MMA fragment row)")
        if not isinstance(lane, (Term, str)):
            lane = _int(lane, where, "lane")
            if not 0 <= lane < width:  # the hardware reads 5 bits and wraps or leaks across segments past width
                raise BuildError(f"{where}: lane {lane} is outside 0..{width - 1} (width {width}); past the segment "
                                 "a shuffle names another lane than written or none (each keeps its own value)")
        self._check_literals("shfl", dtype, value)
        dst = self._reg(dst, "shfl", dtype)
        self._node("shfl", dst=dst, args=(as_term(value), as_term(lane)), mode=mode, width=width, dtype=dtype)
        return name(dst)

    def _check_literals(self, call: str, dtype: str, *values: TermLike) -> None:
        """An infinity or NaN literal is a float's: an integer register cannot hold one."""
        if dtype in ("float32", "float64"):
            return
        for v in values:
            t = as_term(v) if isinstance(v, (Term, int, float)) else None
            if t is not None and not fits(t, BUILT_TERM_DEPTH, BUILT_TERM_PARTS):
                continue  # too large to walk (shared parts print many times): _node refuses it by its size
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

def _subterms(t: Term) -> Iterator[Term]:
    yield t
    for a in t.args:
        yield from _subterms(a)


def _make_elementwise(op: str):
    def method(self: Kernel, *args: TermLike, dst: Optional[str] = None, dtype: str = "float32") -> Term:
        if op in FLOAT32_ONLY and dtype != "float32":
            raise BuildError(f"{op} at {_call_site()}: dtype {dtype!r}; {op} is a float32 instruction: "
                             "use dtype='float32' (or exp2 for float64)")
        if op in MATH and dtype not in FLOAT_REGISTERS:
            raise BuildError(f"{op} at {_call_site()}: dtype {dtype!r}; {op} computes in a float register: "
                             "use dtype='float32' or 'float64'")
        return self._elementwise(op, *args, dst=dst, dtype=dtype)
    method.__name__ = op
    method.__doc__ = f"Elementwise ``{op}`` of {'one operand' if op in UNARY else 'two operands'}; returns the register."
    if op in MATH_ERRORS:
        method.__doc__ += f" CUDA: {MATH_ERRORS[op]}."
    return method


for _op in UNARY + BINARY:
    setattr(Kernel, _op, _make_elementwise(_op))
