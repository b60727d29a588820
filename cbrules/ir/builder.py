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
from dataclasses import replace
from typing import Any, Callable, Iterator, Optional, Sequence

from . import coverage, names
from . import builder_mma
from .builder_mma import (FRAGMENT_COMBINE, FRAGMENT_OPS, MMA_M, MMA_MAX_N, PACKED, WARPGROUP,
                          FragmentElement, fragment_coords, unrolled)  # noqa: F401  (FragmentElement: public via the builder)
from .builder_values import (MAX_BLOCK_THREADS, Buffer, BuildError, StagingAlignmentError, TensorMap,  # noqa: F401
                             call_site, checked_cb_options, checked_choice, launch_dims, tile_inside, checked_int, checked_ints, ADDRESSABLE, bounded_term, checked_term,
                             blockDim, blockIdx, ceil_div, circular_buffer, gridDim, lanes, threadIdx)
from .coverage import PartialTileError  # noqa: F401  (public via the builder)
from .graph import KernelGraph, Param
from .mma_layout import B_LAYOUTS, MMA_DTYPES, MmaLayoutError, mn_major_span
from .limits import (SWIZZLE_SPAN, SwizzleError, TmaBoxError, check_box, check_swizzle,  # noqa: F401
                     swizzle_repeat)
from .names import IdentifierError, NameClashError  # noqa: F401  (public via the builder)
from .ops import (BINARY, BUILT_SCOPE_DEPTH, DTYPE_BYTES, DTYPES, FLOAT32_ONLY, FLOAT_REGISTERS, LOOP_KINDS, MATH,
                  MATH_ERRORS, OPS, REDUCE_COMBINE, SHFL_MODES, SPACES, UNARY, WARP_SIZE,
                  DependenceTracker,
                  FP8_DTYPES, STORAGE_DTYPES, compute_dtype)
from .tma_view import TmaSplitError, check_divides, normalize_split
from .terms import BUILT_TERM_DEPTH, BUILT_TERM_PARTS, ELECT_ONE, Term, TermLike, as_term, call, fits, name



class Kernel:
    """A kernel under construction; ``graph`` is the :class:`KernelGraph` being built."""

    def __init__(self, name: str, block: int | Sequence[int] = 256):
        where = f"Kernel({name!r}) at {call_site()}"
        names.check(name, where)
        self.graph = KernelGraph(name, block=launch_dims(block, where))
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
        where = f"{call} at {call_site()}"
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
            raise BuildError(f"{call} at {call_site()}: {handle!r} is not a {' or '.join(kinds)} of kernel "
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
        where = f"scalar({sname!r}) at {call_site()}"
        checked_choice(dtype, where, "dtype", [d for d in DTYPES if d not in ("mbarrier",) + STORAGE_DTYPES])
        if not isinstance(finite, bool):
            raise BuildError(f"{where}: finite must be True or False, got {finite!r}")
        self._add_param(Param(sname, "symbol", dtype, finite=finite), "symbol", f"scalar({sname!r})")
        return name(sname)

    def tensor(self, tname: str, shape: Sequence[TermLike], dtype: str = "float32") -> Buffer:
        """A global-memory tensor parameter; ``shape`` is outermost-first, terms over symbols."""
        where = f"tensor({tname!r}) at {call_site()}"
        if dtype not in DTYPES or dtype == "mbarrier":
            raise BuildError(f"{where}: unsupported dtype {dtype!r}; use one of "
                             f"{', '.join(d for d in DTYPES if d != 'mbarrier')}")
        if not isinstance(shape, (tuple, list)) or not shape:
            raise BuildError(f"{where}: shape must be a non-empty tuple of extents, got {shape!r}")
        shape_t = tuple(checked_term(s, where, f"shape[{i}]", 1) for i, s in enumerate(shape))
        self._add_param(Param(tname, "tensor", dtype, shape_t), "tensor", f"tensor({tname!r})")
        return Buffer(tname, dtype, shape_t, "global")

    def grid(self, *dims: TermLike) -> None:
        """Launch grid as terms over symbols (missing dimensions are 1)."""
        where = f"grid(...) at {call_site()}"
        if not 1 <= len(dims) <= 3:
            raise BuildError(f"{where}: a grid has 1 to 3 dimensions, got {len(dims)}")
        self.graph.kernel()["grid"] = tuple(checked_term(d, where, f"grid[{i}]", 1) for i, d in enumerate(dims)) \
            + (as_term(1),) * (3 - len(dims))

    def require(self, predicate: TermLike, message: str) -> None:
        """A launch-time requirement over the kernel's symbols: a launch (or an interpreter run) whose
        symbols make ``predicate`` false is refused with ``message`` before anything runs (a condition the
        kernel needs to be right that its parameters' types cannot say, like one extent at least another)."""
        where = f"require(...) at {call_site()}"
        pred = checked_term(predicate, where, "predicate")
        symbols = {p.name for p in self.graph.kernel()["params"] if p.kind == "symbol"}
        unknown = sorted(n for n in set(pred.names()) if n not in symbols)
        if unknown:
            raise BuildError(f"{where}: the predicate names {', '.join(unknown)}, which are not symbols of the kernel; "
                             "a requirement is checked at launch, where only the symbols are known")
        if not isinstance(message, str) or not message:
            raise BuildError(f"{where}: give the refusal's message as a non-empty string")
        kernel = self.graph.kernel()
        kernel["requires"] = tuple(kernel.get("requires", ())) + ((pred, message),)

    # ---------------------------------------------------------------- node creation
    def _node(self, op: str, **attrs) -> int:
        for key in OPS[op].terms:  # before anything reads them: a term too deep or large cannot be walked or printed
            v = attrs.get(key)
            for i, t in enumerate(v if isinstance(v, tuple) else (v,)):
                if isinstance(t, Term) and not fits(t, BUILT_TERM_DEPTH, BUILT_TERM_PARTS):  # the call site: only then
                    bounded_term(t, f"{op} at {call_site()}", key if not isinstance(v, tuple) else f"{key}[{i}]")
        n = self.graph.add(op, self._scopes[-1], origin={"by": "build", "where": call_site()}, **attrs)
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
            raise BuildError(f"{op} at {call_site()}: scopes nested more than {BUILT_SCOPE_DEPTH} deep, more than the "
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
        where = f"loop({var!r}) at {call_site()}"
        checked_choice(kind, where, "kind", LOOP_KINDS)
        # a literal step below 1 would never end on the device; a term step is the launch's to get right
        bounds = {k: checked_term(v, where, k, 1 if k == "step" else None)
                  for k, v in (("start", start), ("stop", stop), ("step", step))}
        if "circular_buffer" in annotations:
            annotations["circular_buffer"] = checked_cb_options(annotations["circular_buffer"], where)
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
        where = f"alloc({buf!r}) at {call_site()}"
        checked_choice(space, where, "space", [s for s in SPACES if s != "global"])
        checked_choice(dtype, where, "dtype", list(DTYPES))
        if space == "register" and dtype in STORAGE_DTYPES:
            raise BuildError(f"{where}: a register array of {dtype}; registers compute in float32 (half and 8-bit "
                             "float types are storage types of tensors and shared buffers): allocate it as float32")
        shape = checked_ints(shape, where, "shape")
        if not shape:
            raise BuildError(f"{where}: shape must have at least one dimension")
        if align is not None:
            align = checked_int(align, where, "align", 1)
            if align & (align - 1):
                raise BuildError(f"{where}: align {align} must be a power of two")
        self._claim(buf, "buffer", f"alloc({buf!r})")
        align = align or (128 if space == "shared" and dtype != "mbarrier" else DTYPE_BYTES[dtype])
        self._node("alloc", buf=buf, space=space, dtype=dtype, shape=shape, align=align)
        return Buffer(buf, dtype, shape, space)

    def _reg(self, dst: Optional[str], call: str, dtype: Optional[str] = None) -> str:
        """The register a compute call writes: ``dst`` (checked), or the next free ``v<n>``."""
        if dtype is not None:
            where = f"{call} at {call_site()}"
            checked_choice(dtype, where, "dtype", [d for d in DTYPES if d != "mbarrier"])
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
        where = call_site()
        bounded_term(index, f"load at {where}", "index")
        coverage.check_read(src.name, src.shape, index, coverage.scope_ranges(self.graph, self._scopes),
                            coverage.scope_preds(self.graph, self._scopes), where)
        if src.name not in self._stored:
            coverage.check_covered(src.name, src.shape, self._tile_writes[src.name], where)

    def load(self, src: Buffer, index: TermLike, dst: Optional[str] = None) -> Term:
        """Read one element ``src[index]`` (flat index) into a register; returns the register.
        A float16/bfloat16/float8 element arrives as float32."""
        src_name = self._known(src, ADDRESSABLE, "load")
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
        where = f"store at {call_site()}"
        dst_name = self._known(dst, ADDRESSABLE, "store")
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
            with self._scope("if", pred=tile_inside(attrs["tile"], dst.shape), tag="tile-bounds"):
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
        where = f"reduce at {call_site()}"
        checked_choice(kind, where, "kind", ("block", "serial"))
        checked_choice(combine, where, "combine", REDUCE_COMBINE)
        dst = self._reg(dst, "reduce", dtype)
        self._node("reduce", dst=dst, src=as_term(src), kind=kind, combine=combine, dtype=dtype)
        return name(dst)

    def block_stats(self, mean: TermLike, m2: TermLike, n: int, dst: Optional[str] = None,
                    dst_m2: Optional[str] = None) -> tuple[Term, Term]:
        """The block's (mean, M2) from each thread's ``mean`` and ``m2`` (the sum of squared deviations
        from that mean) over ``n`` elements of its own, in one block reduction that does not cancel when
        the mean is large against the spread (the variance is M2 / (n * threads)). Every thread gets
        both; the block must be a power-of-two count of whole warps."""
        where = f"block_stats at {call_site()}"
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
        where = f"shfl at {call_site()}"
        checked_choice(mode, where, "mode", SHFL_MODES)
        width = checked_int(width, where, "width", 1)
        if width > WARP_SIZE or width & (width - 1):
            raise BuildError(f"{where}: width {width} is not a power of two in 1..{WARP_SIZE}; a shuffle's segments "
                             "tile the warp (use 4 for the four lanes of an MMA fragment row)")
        if not isinstance(lane, (Term, str)):
            lane = checked_int(lane, where, "lane")
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
                raise BuildError(f"{call} at {call_site()}: {consts[0].value} in a {dtype} register; only float32 "
                                 "and float64 registers hold infinities and NaN: use dtype='float32'")

    def _elementwise(self, op: str, *args: TermLike, dst: Optional[str] = None, dtype: str = "float32") -> Term:
        self._check_literals(op, dtype, *args)
        dst = self._reg(dst, op, dtype)
        self._node(op, dst=dst, args=tuple(as_term(a) for a in args), dtype=dtype)
        return name(dst)

    # ------------------------------------------------------------------ TMA: tensor maps, bulk tensor loads and stores
    def tensor_map(self, tensor: Buffer, box: Sequence[int], mname: Optional[str] = None,
                   swizzle: str = "none", split: Optional[dict] = None) -> TensorMap:
        """A TMA tensor map over ``tensor`` with the given box (outermost-first, like the shape).

        ``swizzle`` ("none", "32B", "64B", "128B") is the shared-memory layout its loads write: the 16-byte
        chunks of each row XORed by the row number (bank-conflict-free column reads); reads of such a
        tile are given logical indices, which the rules turn into swizzled addresses. The inner box
        dimension must then span exactly the swizzle width (a :class:`SwizzleError` otherwise).

        ``split={d: inner}`` maps a view of higher rank over the same tensor: dimension ``d`` becomes
        ``(extent / inner, inner)`` (see :mod:`cbrules.ir.tma_view`), so one box may span several
        ``inner``-long stretches of it, e.g. a [M, 32768] tensor with ``split={1: 256}`` and box
        ``(1, 64, 256)`` loads 16384 elements of a row at once. The box and the coordinates of loads
        through the map are in the view's dimensions; the extent must be a multiple of ``inner``
        (a :class:`TmaSplitError` here for a constant extent, at launch for a symbolic one)."""
        mname = f"{tensor.name}_tmap" if mname is None else mname
        where = f"tensor_map({mname!r}) at {call_site()}"
        box = checked_ints(box, where, "box", low=None)  # the range is check_box's (a TmaBoxError)
        split_dims = normalize_split(mname, split, len(tensor.shape))
        rank = len(tensor.shape) + len(split_dims)
        if len(box) != rank:
            seen = f"its split view has rank {rank}" if split_dims else f"the tensor has rank {rank}"
            raise BuildError(f"tensor map over {tensor.name!r}: box {tuple(box)} has rank {len(box)}, {seen}")
        names.check(mname, where)
        check_box(mname, box, tensor.dtype)
        check_swizzle(mname, box, DTYPE_BYTES[tensor.dtype], swizzle)
        itemsize = DTYPE_BYTES[tensor.dtype]
        for d, inner in split_dims:
            if d == len(tensor.shape) - 1 and inner * itemsize % 16:  # the view's outer stride: inner elements
                raise TmaSplitError(f"tensor map {mname!r}: splitting the innermost dimension into stretches of "
                                    f"{inner} x {itemsize} = {inner * itemsize} bytes gives the view a stride of "
                                    f"{inner * itemsize} bytes, but TMA strides are multiples of 16 bytes: split "
                                    f"by a multiple of {16 // math.gcd(16, itemsize)} elements")
        known = [(d, n) for d, n in split_dims if tensor.shape[d].op == "const"]
        check_divides(mname, {d: tensor.shape[d].value for d, _ in known}, known, "when declared")
        extra = {} if swizzle == "none" else {"swizzle": swizzle}
        if split_dims:
            extra["split"] = split_dims
        self._add_param(Param(mname, "tmap", tensor.dtype, tensor.shape, tensor.name, box, **extra), "tensor map",
                        f"tensor_map({mname!r})")
        return TensorMap(mname, tensor, box, swizzle, split_dims)

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
        where = f"tma_load at {call_site()}"
        attrs = dict(tmap=self._known(tmap, ("tensor map",), "tma_load"), coords=tuple(as_term(c) for c in coords),
                     dst=self._known(dst, ("buffer",), "tma_load"), offset=as_term(offset), bytes=tmap.box_bytes,
                     box=tmap.box, tile=checked_ints(tmap.box if tile is None else tile, where, "tile"))
        if len(attrs["coords"]) != len(tmap.box):  # one coordinate a dimension of the map (of its view, if split)
            raise BuildError(f"{where}: {len(attrs['coords'])} coordinates for tensor map {tmap.name!r} of rank "
                             f"{len(tmap.box)} (box {tmap.box}); give one a dimension, outermost first")
        if tmap.split and attrs["tile"] != tmap.box:  # several boxes would step out of the view's inner extent
            raise BuildError(f"{where}: tile {attrs['tile']} through split tensor map {tmap.name!r} (box "
                             f"{tmap.box}): a split map loads one box a tile; give the map the tile's box")
        if tmap.swizzle != "none":
            self._check_swizzled_tile(tmap, dst, attrs["tile"], where)
            attrs["swizzle"] = SWIZZLE_SPAN[tmap.swizzle]
        if barrier is not None:
            attrs.update(barrier=self._known(barrier, ("buffer",), "tma_load"), slot=as_term(slot))
        if circular_buffer is not None:
            attrs["circular_buffer"] = checked_cb_options(circular_buffer, where)
        for i, c in enumerate(attrs["coords"]):  # the coverage check below reads them
            bounded_term(c, where, f"coords[{i}]")
        bounded_term(attrs["offset"], where, "offset")
        write = coverage.TileWrite(dst.name, attrs["offset"], math.prod(attrs["tile"]), tmap.box, attrs["tile"],
                                   tmap.name, call_site(), tuple(coverage.scope_ranges(self.graph, self._scopes)))
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
        where = f"tma_store at {call_site()}"
        tmap_name = self._known(tmap, ("tensor map",), "tma_store")
        src_name = self._known(src, ("buffer",), "tma_store")
        checked_choice(wait, where, "wait", ("read", "none"))
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
        where = f"tma_store_wait at {call_site()}"
        if not isinstance(read, bool):
            raise BuildError(f"{where}: read must be True or False, got {read!r}")
        self._node("tma_store_wait", pending=checked_int(pending, where, "pending", 0), read=read)

    # ------------------------------------------------------------------ synchronisation: mbarriers, block syncs, proxy fences, named barriers
    def _barrier(self, op: str, barrier: Buffer, slot: TermLike, **attrs) -> None:
        self._node(op, barrier=self._known(barrier, ("buffer",), op), slot=as_term(slot), **attrs)

    def mbarrier_init(self, barrier: Buffer, slot: TermLike, count: int) -> None:
        self._barrier("mbarrier_init", barrier, slot,
                      count=checked_int(count, f"mbarrier_init at {call_site()}", "count", 1))

    def mbarrier_arrive(self, barrier: Buffer, slot: TermLike) -> None:
        self._barrier("mbarrier_arrive", barrier, slot)

    def mbarrier_arrive_expect_tx(self, barrier: Buffer, slot: TermLike, nbytes: int) -> None:
        self._barrier("mbarrier_arrive_expect_tx", barrier, slot,
                      bytes=checked_int(nbytes, f"mbarrier_arrive_expect_tx at {call_site()}", "nbytes", 0))

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
        where = f"bar_sync at {call_site()}"
        bar_id, count = checked_int(bar_id, where, "bar_id", 0), checked_int(count, where, "count", 32)
        if bar_id > 15 or count % 32:
            raise BuildError(f"{where}: named barrier {bar_id} over {count} threads; ids are 0..15 and the "
                             "count a multiple of 32 (whole warps)")
        self._node("bar_sync", id=bar_id, count=count)

    # ------------------------------------------------------------------ the tensor cores: accumulators, mma, fragments as values
    def _mma_fragment(self, acc, call: str) -> tuple[int, int, int]:
        nm = self._known(acc, ("buffer",), call)
        frag = self._fragments.get(nm)
        if frag is None:
            raise BuildError(f"{call} at {call_site()}: {nm!r} is not an accumulator; pass the handle "
                             "mma_accumulator(...) returned")
        return frag

    def mma_accumulator(self, bm: int, bn: int, acc: str = "acc", groups: Optional[int] = None):
        """A zeroed float32 accumulator for a tile C[bm, bn] on ``groups`` consumer warp groups (default: the
        block's threads / 128); each warp group holds bm/groups rows in 64-row blocks. Returns its handle."""
        where = f"mma_accumulator at {call_site()}"
        bm, bn = checked_int(bm, where, "bm", 1), checked_int(bn, where, "bn", 1)
        block = self.graph.kernel()["block"]
        if block[1] != 1 or block[2] != 1 or block[0] % WARPGROUP:
            raise BuildError(f"{where}: warpgroup MMA runs on whole warp groups of a one-dimensional block; the "
                             f"block is {block}: use 128 x (consumer warp groups) threads in x")
        groups = block[0] // WARPGROUP if groups is None else checked_int(groups, where, "groups", 1)
        if groups * WARPGROUP != block[0]:
            raise BuildError(f"{where}: {groups} consumer warp groups need a block of {groups * WARPGROUP} threads, "
                             f"the block has {block[0]}; make them agree")
        if bm % (MMA_M * groups):
            raise BuildError(f"{where}: bm={bm} does not split into 64-row blocks over {groups} warp groups; use a "
                             f"multiple of {MMA_M * groups}")
        if bn % 8 or not 8 <= bn <= MMA_MAX_N:
            raise BuildError(f"{where}: bn={bn}: a wgmma computes N = 8..256 columns in steps of 8; use such a bn")
        size = (bm // groups // MMA_M) * (bn // 2)
        buf = self.alloc(acc, "register", "float32", (size,))
        self._fragments[buf.name] = (bm, bn, groups)
        self.mma_zero(buf)
        return buf

    def mma_zero(self, acc) -> None:
        """Zero an accumulator again (the next tile of a persistent block)."""
        bm, bn, groups = self._mma_fragment(acc, "mma_zero")
        with self.loop(f"{acc.name}_zero", (bm // groups // MMA_M) * (bn // 2), kind="unroll") as i:
            self.store(acc, i, 0.0)

    def mma(self, acc, a, b, a_offset: TermLike = 0, b_offset: TermLike = 0, scale_d: TermLike = 1,
            b_layout: str = "nk") -> None:
        """Issue ``acc += a @ b^T`` on the tensor cores: ``a`` a shared [BM, BK] tile, ``b`` a shared
        [BN, BK] tile (B given K-major), both bfloat16 or both float16, their rows BK * 2 = 32, 64 or 128
        bytes and filled by TMA loads with that swizzle. ``scale_d=0`` overwrites acc instead.

        ``b_layout="kn"``: ``acc += a @ b`` with ``b`` a shared [BK, BN] tile (B given MN-major, as a
        row-major [K, N] tensor: no transpose needed), read through the instruction's transpose bit. The
        tile is BN / W panels [BK, W] one after the other, W = 64, 32 or 16 columns (the widest dividing
        BN, :func:`cbrules.ir.mma_layout.mn_major_span`), each one TMA box of a map with box (BK, W) and
        the W * 2-byte swizzle, loaded at element offset ``p * BK * W`` for panel p.

        FP8 tiles (float8_e4m3, float8_e5m2, or one of each) are K-major only, as the tensor cores read
        them, with rows of 128 elements (BK = 128: one 128-byte swizzle span), multiplied k32 at a
        time. The rules (rules/mma.rules) add the ordering around each mma (wgmma fence, commit, wait)
        and release a stage slot only once the mma reading it has completed; codegen unrolls the node
        into the instruction sequence."""
        where = f"mma at {call_site()}"
        if b_layout not in B_LAYOUTS:
            raise BuildError(f"{where}: b_layout={b_layout!r}: give 'nk' (b a [BN, BK] tile of B given as [N, K]) "
                             "or 'kn' (b a [BK, BN] tile of B given as [K, N])")
        bm, bn, groups = self._mma_fragment(acc, "mma")
        a_name, b_name = self._known(a, ("buffer",), "mma"), self._known(b, ("buffer",), "mma")
        if a_name in self._operands:
            self._register_a_mma(where, acc, a, b, (bm, bn, groups), a_offset, b_offset, scale_d, b_layout)
            return
        for t, nm in ((a, "a"), (b, "b")):
            if t.space != "shared" or t.dtype not in MMA_DTYPES or len(t.shape) != 2:
                raise BuildError(f"{where}: operand {nm} ({t.name!r}, {t.space} {t.dtype} {t.shape}) must be a "
                                 f"two-dimensional shared tile of {', '.join(MMA_DTYPES)}")
        fp8 = a.dtype in FP8_DTYPES
        if a.dtype != b.dtype and not (fp8 and b.dtype in FP8_DTYPES):
            raise BuildError(f"{where}: operands of different types ({a.dtype}, {b.dtype}); give both one type "
                             "(only the FP8 types mix: e4m3 with e5m2)")
        if fp8 and b_layout != "nk":
            raise BuildError(f"{where}: an FP8 ({a.dtype}) mma with b_layout={b_layout!r}: the tensor cores read FP8 "
                             "operands K-major only (no transposed read); give B as [N, K] (b_layout='nk'), "
                             "transposing it beforehand")
        bk = a.shape[1]
        want_b = (bn, bk) if b_layout == "nk" else (bk, bn)
        if a.shape != (bm, bk) or b.shape != want_b:
            other = "kn" if b_layout == "nk" else "nk"
            hint = (f"; b is the {other} layout's tile: pass b_layout={other!r}"
                    if a.shape == (bm, bk) and b.shape == want_b[::-1] else "")
            raise BuildError(f"{where}: tiles a {a.shape} and b {b.shape} do not fit the accumulator's tile "
                             f"[{bm}, {bn}]: a must be [{bm}, BK] and b {list(want_b)} (b_layout={b_layout!r}: B "
                             f"given as {'[N, K]' if b_layout == 'nk' else '[K, N]'}){hint}")
        row_bytes = bk * DTYPE_BYTES[a.dtype]
        if row_bytes not in (32, 64, 128):
            size = DTYPE_BYTES[a.dtype]
            raise BuildError(f"{where}: BK={bk} makes tile rows of {row_bytes} bytes; a row must be one swizzle "
                             f"span (32, 64 or 128 bytes): use BK = {32 // size}, {64 // size} or {128 // size} "
                             f"for {a.dtype}")
        extra = {}  # K-major B keeps the node as it was (unchanged graphs); MN-major names its layout and span
        if b.dtype != a.dtype:
            extra["b_dtype"] = b.dtype
        if b_layout == "kn":
            try:
                extra = {"b_major": B_LAYOUTS[b_layout], "b_swizzle": mn_major_span(bn)}
            except MmaLayoutError as e:
                raise BuildError(f"{where}: {e}") from None
        self._node("mma", acc=acc.name, a=a_name, b=b_name, shape=(bm, bn, bk), groups=groups, dtype=a.dtype,
                   swizzle=row_bytes, a_offset=as_term(a_offset), b_offset=as_term(b_offset),
                   scale_d=as_term(scale_d), **extra)

    def _register_a_mma(self, where: str, acc, a, b, fragment, a_offset, b_offset, scale_d, b_layout: str) -> None:
        """``acc += a @ b^T`` with ``a`` a register operand (:meth:`fragment_convert`): wgmma's register-A form.
        With ``b_layout="kn"`` b is a [BK, BN] tile read MN-major (``acc += a @ b``): its K rows are not
        swizzle spans, so K is any number of k16 steps (an attention's P @ V over a whole key tile)."""
        bm, bn, groups = fragment
        a_bm, bk, a_groups, dtype = self._operands[a.name]
        if (a_bm, a_groups) != (bm, groups):
            raise BuildError(f"{where}: register operand {a.name!r} holds a [{a_bm}, {bk}] tile on {a_groups} warp "
                             f"group(s), the accumulator a [{bm}, {bn}] tile on {groups}: the A fragment's rows are "
                             "the accumulator's (one thread holds the same rows of both); give them one tile height")
        if dtype in FP8_DTYPES and b_layout != "nk":
            raise BuildError(f"{where}: an FP8 ({dtype}) mma with b_layout={b_layout!r}: the tensor cores read an FP8 "
                             "B K-major only; give B as [N, K] (b_layout='nk': for P @ V, V transposed to [D, keys])")
        want_b = (bn, bk) if b_layout == "nk" else (bk, bn)
        if b.space != "shared" or b.dtype != dtype or b.shape != want_b:
            given = "[N, K], K" if b_layout == "nk" else "[K, N] (b_layout='kn'), K"
            raise BuildError(f"{where}: operand b ({b.name!r}, {b.space} {b.dtype} {b.shape}) must be a shared "
                             f"{dtype} tile {list(want_b)} (B given as {given} = the register operand's columns)")
        extra = {}
        if b_layout == "nk":
            row_bytes = bk * DTYPE_BYTES[dtype]
            if row_bytes not in (32, 64, 128):
                size = DTYPE_BYTES[dtype]
                raise BuildError(f"{where}: the register operand's {bk} columns make B tile rows of {row_bytes} bytes; "
                                 f"a row must be one swizzle span (32, 64 or 128 bytes): convert a fragment of "
                                 f"{32 // size}, {64 // size} or {128 // size} columns"
                                 + (", or give B as [K, N] (b_layout='kn')" if size == 2 else ""))
        else:
            try:
                row_bytes = mn_major_span(bn)
            except MmaLayoutError as e:
                raise BuildError(f"{where}: {e}") from None
            extra = {"b_major": B_LAYOUTS[b_layout], "b_swizzle": row_bytes}
        self._node("mma", acc=acc.name, a=a.name, b=b.name, shape=(bm, bn, bk), groups=groups, dtype=dtype,
                   swizzle=row_bytes, a_offset=as_term(a_offset), b_offset=as_term(b_offset),
                   scale_d=as_term(scale_d), a_space="register", **extra)

    def mma_operand(self, acc, dtype: str = "bfloat16", dst: Optional[str] = None) -> Buffer:
        """A register A operand for a following :meth:`mma` with ``K`` = the columns of ``acc``'s tile:
        :meth:`fragment_convert` fills it from ``acc`` (allocate it where the accumulator is, before the
        loops that convert into it). It is a uint32 register array, BN/4 a thread for each 64-row block
        (FP8, four elements a register: BN/8)."""
        where = f"mma_operand at {call_site()}"
        bm, bn, groups = self._mma_fragment(acc, "mma_operand")
        if dtype not in MMA_DTYPES:
            raise BuildError(f"{where}: dtype {dtype!r}: a register MMA operand is one of {', '.join(MMA_DTYPES)}")
        step = 32 // DTYPE_BYTES[dtype]  # K of one instruction: k16, FP8 k32
        if bn % step:
            raise BuildError(f"{where}: {acc.name!r} has {bn} columns; a {dtype} A operand is whole k{step} chunks: "
                             f"convert a fragment of a multiple of {step} columns")
        out = self.alloc(dst or f"{acc.name}_{PACKED[dtype]}", "register", "uint32",
                         ((bm // groups // MMA_M) * (bn * DTYPE_BYTES[dtype] // 8),))
        self._operands[out.name] = (bm, bn, groups, dtype)
        return out

    def fragment_convert(self, acc, into: Buffer) -> None:
        """``acc`` (float32, [BM, BN]) rounded to the operand's dtype (nearest even) and packed in pairs into
        ``into`` (from :meth:`mma_operand`): the A of a following :meth:`mma`, with no trip through shared
        memory. The A fragment of a 64 x 16 wgmma chunk has the thread and row map of 16 accumulator
        columns (REFERENCE §8), so accumulator registers (2i, 2i+1) become packed register i
        (``cvt.rn.bf16x2.f32``, the lower column in the low half).

        FP8 (saturating to the largest finite value, ``cvt.rn.satfinite``): a thread's A register holds
        four neighbouring columns where its accumulator holds two, so the four lanes of each row exchange
        their pairs (two shuffles and six byte permutes for every two registers: :meth:`_fp8_convert`)."""
        where = f"fragment_convert at {call_site()}"
        bm, bn, groups = self._mma_fragment(acc, "fragment_convert")
        target = self._operands.get(self._known(into, ("buffer",), "fragment_convert"))
        if target is None or target[:3] != (bm, bn, groups):
            raise BuildError(f"{where}: {into!r} is not a register operand of {acc.name!r}'s [{bm}, {bn}] tile; "
                             f"pass what mma_operand({acc.name}) returned")
        blocks, quarter = bm // groups // MMA_M, bn // 4
        if DTYPE_BYTES[target[3]] == 1:
            self._fp8_convert(acc, into, blocks, bn, target[3])
            return
        with self.loop(f"{into.name}_j", blocks, kind="unroll") as j:
            with self.loop(f"{into.name}_i", quarter, kind="unroll") as i:
                lo, hi = self.load(acc, j * (bn // 2) + i * 2), self.load(acc, j * (bn // 2) + i * 2 + 1)
                packed = self._reg(None, "fragment_convert")
                self._node("cvt_pack", dst=packed, args=(lo, hi), dtype="uint32", to=target[3])
                self.store(into, j * quarter + i, name(packed))

    def _fp8_convert(self, acc, into: Buffer, blocks: int, bn: int, dtype: str) -> None:
        """FP8 :meth:`fragment_convert`. For each k32 step s and row half h of a 64-row block, lane u of a
        row's four lanes holds the pairs (byte pairs after cvt_pack) of columns 2u and 8 + 2u of each
        16-column half G0, G1 of the step (accumulator registers 16s + 4m + 2h + {0, 1}, m = 0..3) and
        needs columns 4u..4u+3 of each (mma_layout.fp8_operand_slot: registers 4s + h and 4s + 2 + h),
        that is the pairs u' = 2u, 2u + 1 of lanes (2u) % 4 and (2u + 1) % 4, their slot u / 2. Lane s' sends
        its slot (s' % 2) of G0 and G1 in one register to the lane that reads it in the first shuffle
        (source lane: u's two bits swapped) and its other slot in the second (that source ^ 1); the two
        registers received are put together by byte permutes."""
        lane = name("threadIdx.x") % 4
        odd, upper = lane % 2, lane / 2
        first = name("threadIdx.x") % 32 - lane + odd * 2 + upper  # lane u reads lane (u's bits swapped)
        per_block = bn // 8
        with self.loop(f"{into.name}_j", blocks, kind="unroll") as j:
            with self.loop(f"{into.name}_s", bn // 32, kind="unroll") as s:
                with self.loop(f"{into.name}_h", 2, kind="unroll") as h:
                    pairs = []
                    for m in range(4):  # the pair of the thread's columns 8m + 2u, + 1 of the step, its row half h
                        reg = j * (bn // 2) + s * 16 + m * 4 + h * 2
                        packed = self._reg(None, "fragment_convert")
                        self._node("cvt_pack", dst=packed, args=(self.load(acc, reg), self.load(acc, reg + 1)),
                                   dtype="uint32", to=dtype)
                        pairs.append(name(packed))
                    # slots 0, 1 of G0 (m = 0, 1) and of G1 (m = 2, 3), each in one register
                    g0, g1 = (call("byte_perm", pairs[2 * g], pairs[2 * g + 1], 0x5410) for g in (0, 1))
                    sent = [call("byte_perm", g0, g1, 0x5410 + odd * 0x2222),   # slot (lane % 2) of G0 and G1
                            call("byte_perm", g0, g1, 0x7632 - odd * 0x2222)]   # the other slot
                    got = [self.shfl(sent[0], first, "idx", dtype="uint32"),
                           self.shfl(sent[1], first + 1 - 2 * upper, "idx", dtype="uint32")]  # first ^ 1
                    # lanes 0, 1 got the lower pair first, lanes 2, 3 the upper one
                    for g, select in ((0, 0x5410), (1, 0x7632)):
                        self.store(into, j * per_block + s * 4 + g * 2 + h,
                                   call("byte_perm", got[0], got[1], select - upper * 0x43BC))

    def mma_store(self, acc, tmap, coords: Sequence[TermLike]) -> None:
        """The epilogue: every accumulator element to the output tile at ``coords`` (row, column of its first
        element), rounded to the tensor's dtype; elements outside the tensor are not written. ``tmap`` maps
        the two-dimensional output with box [BM, W], W dividing BN: a serial loop walks the BN / W column
        chunks and each element is a ``store(..., tile=..., clip=True)``, so the rules stage each chunk and
        write it with one TMA store while the next is staged (rules/tma_store.rules), in BM x W of shared
        memory a slot; the TMA store clips the box at the tensor's edges, so the staged elements need no
        bounds test. Its register indices depend on the chunk, so the rules unroll that loop (rules/mma.rules)."""
        where = f"mma_store at {call_site()}"
        bm, bn, groups = self._mma_fragment(acc, "mma_store")
        self._known(tmap, ("tensor map",), "mma_store")
        tensor = tmap.tensor
        width = tmap.box[-1]
        if len(tensor.shape) != 2 or tmap.box[0] != bm or bn % width or width % 8:
            raise BuildError(f"{where}: tensor map {tmap.name!r} has box {tmap.box}; the accumulator's tile is "
                             f"[{bm}, {bn}]: map the two-dimensional output with box ({bm}, W), W a multiple of 8 "
                             f"dividing {bn}")
        if not isinstance(coords, (tuple, list)) or len(coords) != 2:
            raise BuildError(f"{where}: coords {coords!r} must be (row, column) of the tile's first element")
        row0, col0 = (as_term(c) for c in coords)
        n = tensor.shape[1]
        half, chunk_regs = bn // 2, width // 2
        tid = name("threadIdx.x")
        with self.loop(f"{acc.name}_q", bn // width) as q:
            with self.loop(f"{acc.name}_j", bm // groups // MMA_M, kind="unroll") as j:
                with self.loop(f"{acc.name}_r", chunk_regs, kind="unroll") as r:
                    reg = q * chunk_regs + r
                    v = self.load(acc, j * half + reg)
                    row, col = builder_mma.fragment_coords(bn, bm // groups, j, reg, tid)
                    # clip: a bounds test the rules drop once the element goes to a staging slot
                    self.store(tensor, (row0 + row) * n + col0 + col, v,
                               tile=(tmap, (row0, col0 + q * width), row * width + col - q * width), clip=True)

    # ---------------------------------------------------------------- fragments as values
    @contextmanager
    def fragment_elements(self, acc, origin: Sequence[TermLike] = (0, 0),
                          columns: Optional[tuple[int, int]] = None) -> Iterator[FragmentElement]:
        """Compute on an accumulator after its MMA: the body runs for every element this thread holds
        (loops over its 64-row blocks and registers, unrolled) with a :class:`FragmentElement` giving
        the element's value, its (row, col) in the output (``origin``, the tile's first element, plus
        its place in the tile) and ``set`` to write it back::

            with k.fragment_elements(acc, origin=(row0, col0)) as e:
                e.set(k.max(k.add(e.value, e.load_col(bias)), 0.0))   # relu(acc + bias[col])

        ``columns=(first, count)`` visits only the tile's columns ``first .. first + count - 1`` (both
        multiples of 8: whole groups of a thread's registers); ``e.part_index`` is then the element's index
        in an accumulator ``count`` columns wide (a column block's own part, promoted into this sum).

        Read it after the MMA loop (the rules wait for the MMA groups there); write the result with
        :meth:`mma_store` or :meth:`fragment_store`."""
        bm, bn, groups = self._mma_fragment(acc, "fragment_elements")
        if not isinstance(origin, (tuple, list)) or len(origin) != 2:
            raise BuildError(f"fragment_elements at {call_site()}: origin {origin!r} must be (row, column) of "
                             "the tile's first element")
        row0, col0 = (as_term(c) for c in origin)
        half = bn // 2
        first, count = self._fragment_columns(columns, bn)
        with self.loop(f"{acc.name}_ej", bm // groups // MMA_M, kind="unroll") as j:
            with self.loop(f"{acc.name}_er", count // 2, kind="unroll") as r:
                register = r + first // 2 if first else r
                index = j * half + register
                row, col = builder_mma.fragment_coords(bn, bm // groups, j, register, name("threadIdx.x"))
                yield FragmentElement(self.load(acc, index), row0 + row, col0 + col, row, col, index, acc, self, j,
                                      register, j * (count // 2) + r, reductions=self._reductions)

    def _fragment_columns(self, columns, bn: int) -> tuple[int, int]:
        """(first column, column count) of ``columns`` (None: all ``bn``), checked."""
        if columns is None:
            return 0, bn
        where = f"fragment_elements at {call_site()}"
        if not isinstance(columns, (tuple, list)) or len(columns) != 2:
            raise BuildError(f"{where}: columns={columns!r}: give (first column, count)")
        first, count = checked_int(columns[0], where, "the first column", 0), checked_int(columns[1], where, "the column count", 8)
        if first % 8 or count % 8 or first + count > bn:
            raise BuildError(f"{where}: columns={tuple(columns)!r} of a {bn}-column accumulator: the first column and "
                             f"the count are multiples of 8 (a thread's registers go in groups of 8 columns) and "
                             f"first + count <= {bn}")
        return first, count

    def fragment_map(self, acc, fn: Callable[[FragmentElement], TermLike],
                     origin: Sequence[TermLike] = (0, 0), columns: Optional[tuple[int, int]] = None) -> None:
        """Replace every element of ``acc`` by ``fn(element)`` (a :class:`FragmentElement`; ``fn`` builds
        its value with the kernel's calls and returns it): :meth:`fragment_elements` in one call (of the
        ``columns`` given only)."""
        if not callable(fn):
            raise BuildError(f"fragment_map at {call_site()}: fn {fn!r} must be a function of one element")
        with self.fragment_elements(acc, origin, columns) as e:
            e.set(fn(e))

    def fragment_reduce(self, acc, axis: str = "row", combine: str = "max", dst: Optional[str] = None,
                        into: Optional[Buffer] = None) -> Buffer:
        """Reduce ``acc`` along the rows (``axis="row"``: each row of the tile over its BN columns) or the
        columns (``axis="col"``: each column over the BM rows) with ``combine`` (max, min, sum); returns a
        register array that :meth:`FragmentElement.reduced` reads per element (every thread holding an
        element of the row or column gets the result).

        A row's BN elements are held by the four lanes of one warp (lane / 4 equal): each thread combines
        its own (BN/4 a row), then two shuffles (xor 1, xor 2) combine the four lanes. A column's elements
        are held by the 8 lanes of each warp with the same lane % 4, in every warp of every warp group:
        each thread combines its own, three shuffles (xor 4, 8, 16) the warp's, and the warps' partials
        meet in a shared [warps, BN] scratch between two block syncs (the consumers' named barrier once
        warp-specialized: rules/warp_specialize.rules). Mask elements outside the output first (a
        ``select`` to the combine's identity in :meth:`fragment_map`).

        ``into``: a float32 register array allocated before (e.g. before a circular-buffered loop whose
        body reduces every iteration: the rules copy the body into several loops, and an allocation
        inside would be made twice) to hold the result instead of a new one."""
        where = f"fragment_reduce at {call_site()}"
        bm, bn, groups = self._mma_fragment(acc, "fragment_reduce")
        if axis not in ("row", "col") or combine not in FRAGMENT_COMBINE:
            raise BuildError(f"{where}: axis {axis!r} / combine {combine!r}: give axis 'row' or 'col' and combine "
                             f"one of {', '.join(FRAGMENT_COMBINE)}")
        blocks, half = bm // groups // MMA_M, bn // 2
        size = (blocks * 2 if axis == "row" else bn // 4,)
        if into is None:
            out = self.alloc(dst or f"{acc.name}_{axis}_{combine}", "register", "float32", size)
        else:
            self._known(into, ("buffer",), "fragment_reduce")
            if into.space != "register" or into.dtype != "float32" or tuple(into.shape) != size:
                raise BuildError(f"{where}: into={into.name!r} ({into.space} {into.dtype} {into.shape}) must be a "
                                 f"float32 register array of shape {size} (one result a {axis} the thread holds)")
            out = into
        self._reductions[out.name] = (acc.name, axis)
        tmp = self._reg(None, "fragment_reduce")
        identity, op = FRAGMENT_COMBINE[combine]
        # register j * BN/2 + 4c + 2h + p holds row (j, h) and column pair (c, p): the outer loops walk the
        # results, the inner ones the thread's own registers of one result
        rows, cols = (("j", blocks), ("h", 2)), (("c", bn // 8), ("p", 2))
        outer, inner = (rows, cols) if axis == "row" else (cols, rows)
        with unrolled(self, f"{out.name}_", outer) as o:
            self.assign(identity, dst=tmp)
            with unrolled(self, f"{out.name}_", inner) as i:
                v = {**o, **i}
                self.reduce(self.load(acc, v["j"] * half + v["c"] * 4 + v["h"] * 2 + v["p"]), kind="serial",
                            combine=combine, dst=tmp)
            for lane in builder_mma.ROW_SHUFFLES if axis == "row" else builder_mma.COL_SHUFFLES:
                getattr(self, op)(tmp, self.shfl(tmp, lane, "xor"), dst=tmp)
            self.store(out, o["j"] * 2 + o["h"] if axis == "row" else o["c"] * 2 + o["p"], tmp)
        if axis == "col":  # 4 warps a group, each with its own rows
            self._columns_across_warps(out, bn, 4 * groups, identity, op, tmp)
        return out

    def _columns_across_warps(self, out: Buffer, bn: int, warps: int, identity: float, op: str, tmp: str) -> None:
        """Each warp's column partials (lanes 0..3 hold all BN columns) through shared memory to every thread."""
        scratch = self.alloc(f"{out.name}_warps", "shared", "float32", (warps, bn))
        tid = name("threadIdx.x")
        lane, warp = tid % 32, tid / 32
        with self.if_(lane.lt(4)):
            with unrolled(self, f"{out.name}_", (("c", bn // 8), ("p", 2))) as v:
                self.store(scratch, warp * bn + v["c"] * 8 + lane * 2 + v["p"], self.load(out, v["c"] * 2 + v["p"]))
        self.syncthreads()
        with unrolled(self, f"{out.name}_", (("c", bn // 8), ("p", 2))) as v:
            self.assign(identity, dst=tmp)
            with self.loop(f"{out.name}_w", warps, kind="unroll") as w:
                self.reduce(self.load(scratch, w * bn + v["c"] * 8 + (lane % 4) * 2 + v["p"]), kind="serial",
                            combine=FRAGMENT_OPS[op], dst=tmp)
            self.store(out, v["c"] * 2 + v["p"], tmp)
        self.syncthreads()  # every warp has read the scratch before a later reduction writes it again

    def fragment_store(self, acc, out: Buffer, origin: Sequence[TermLike]) -> None:
        """Every element of ``acc`` to the global tensor ``out`` at ``origin`` + its place in the tile,
        rounded to ``out``'s dtype, each thread storing its own elements (no staging; the elements outside
        ``out`` are not written). ``out`` is [..., rows, cols]: ``origin`` gives one coordinate a dimension,
        the tile's first element (e.g. ``(head, row0, 0)`` of a [BH, L, D] output), and the tile's rows and
        columns run along the last two. Where ``cols`` is an even number the thread's two neighbouring
        columns (registers 2i, 2i+1) leave as one vector store (a vectorize loop of 2, rules/vectorize.rules),
        half the store instructions of one element each. :meth:`mma_store` writes the tile by TMA instead."""
        where = f"fragment_store at {call_site()}"
        self._known(out, ("tensor",), "fragment_store")
        if len(out.shape) < 2:
            raise BuildError(f"{where}: {out.name!r} has shape {out.shape}; store a fragment into a tensor of two "
                             "or more dimensions (its last two take the tile's rows and columns)")
        if not isinstance(origin, (tuple, list)) or len(origin) != len(out.shape):
            raise BuildError(f"{where}: origin {origin!r} must give one coordinate for each of {out.name!r}'s "
                             f"{len(out.shape)} dimensions (the tile's first element)")
        *lead, row0, col0 = (as_term(c) for c in origin)
        rows, cols = out.shape[-2:]
        flat0 = _plane_row(lead, out.shape, row0)  # the tile's first row counted from the tensor's start
        if not (cols.op == "const" and isinstance(cols.value, int) and cols.value % 2 == 0):
            with self.fragment_elements(acc, (row0, col0)) as e:
                with self.if_(e.inside(rows, cols)):
                    self.store(out, (flat0 + e.tile_row) * cols + e.col, e.value)
            return
        bm, bn, groups = self._mma_fragment(acc, "fragment_store")
        half = bn // 2
        with self.loop(f"{acc.name}_sj", bm // groups // MMA_M, kind="unroll") as j:
            with self.loop(f"{acc.name}_sp", half // 2, kind="unroll") as pair:
                row, col = builder_mma.fragment_coords(bn, bm // groups, j, pair * 2, name("threadIdx.x"))
                # the pair's first column is even, so with cols even both columns lie inside or neither
                with self.if_((row0 + row).lt(rows).and_((col0 + col).lt(cols))):
                    with self.loop(f"{acc.name}_sv", 2, kind="vectorize") as v:
                        self.store(out, (flat0 + row) * cols + col0 + col + v,
                                   self.load(acc, j * half + pair * 2 + v))

    def wgmma_fence(self) -> None:
        """``wgmma.fence``: earlier register and shared writes are seen by the next mma."""
        self._node("wgmma_fence")

    def wgmma_commit(self) -> None:
        """``wgmma.commit_group``: the mma issued since the last commit form one group."""
        self._node("wgmma_commit")

    def wgmma_wait(self, pending: int = 0) -> None:
        """``wgmma.wait_group pending``: all but the newest ``pending`` committed groups are complete."""
        self._node("wgmma_wait", pending=checked_int(pending, f"wgmma_wait at {call_site()}", "pending", 0))


def _plane_row(lead: Sequence[Term], shape: tuple, row0: Term) -> Term:
    """Row ``row0`` of the [rows, cols] plane at the leading coordinates ``lead`` of a tensor of ``shape``,
    as a row of the tensor seen as [prod(shape[:-1]), cols]."""
    if not lead:
        return row0
    plane = lead[0]
    for coordinate, extent in zip(lead[1:], shape[1:-2]):
        plane = plane * extent + coordinate
    return plane * shape[-2] + row0


def _subterms(t: Term) -> Iterator[Term]:
    yield t
    for a in t.args:
        yield from _subterms(a)


def _make_elementwise(op: str):
    def method(self: Kernel, *args: TermLike, dst: Optional[str] = None, dtype: str = "float32") -> Term:
        if op in FLOAT32_ONLY and dtype != "float32":
            raise BuildError(f"{op} at {call_site()}: dtype {dtype!r}; {op} is a float32 instruction: "
                             "use dtype='float32' (or exp2 for float64)")
        if op in MATH and dtype not in FLOAT_REGISTERS:
            raise BuildError(f"{op} at {call_site()}: dtype {dtype!r}; {op} computes in a float register: "
                             "use dtype='float32' or 'float64'")
        return self._elementwise(op, *args, dst=dst, dtype=dtype)
    method.__name__ = op
    method.__doc__ = f"Elementwise ``{op}`` of {'one operand' if op in UNARY else 'two operands'}; returns the register."
    if op in MATH_ERRORS:
        method.__doc__ += f" CUDA: {MATH_ERRORS[op]}."
    return method


for _op in UNARY + BINARY:
    setattr(Kernel, _op, _make_elementwise(_op))
