"""Builder calls for the TMA engine, mixed into :class:`cbrules.ir.builder.Kernel`: tensor maps, bulk
tensor loads into shared buffers (with the coverage record that refuses reads of elements no load
writes) and bulk tensor stores from shared staging buffers."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional, Sequence

from . import coverage, names
from .builder_values import (Buffer, BuildError, StagingAlignmentError, TensorMap, _call_site, _cb_options, _choice,
                             _int, _ints, _bounded_term)
from .graph import Param
from .limits import SWIZZLE_SPAN, SwizzleError, check_box, check_swizzle, swizzle_repeat
from .ops import DTYPE_BYTES
from .terms import TermLike, as_term
from .tma_view import TmaSplitError, check_divides, normalize_split


class TmaBuilder:
    """``tensor_map``, ``tma_load``, ``tma_store`` and ``tma_store_wait`` (needs the Kernel's ``graph``,
    ``_known``, ``_add_param``, ``_node``, ``_scopes`` and ``_tile_writes``)."""

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
        where = f"tensor_map({mname!r}) at {_call_site()}"
        box = _ints(box, where, "box", low=None)  # the range is check_box's (a TmaBoxError)
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
        where = f"tma_load at {_call_site()}"
        attrs = dict(tmap=self._known(tmap, ("tensor map",), "tma_load"), coords=tuple(as_term(c) for c in coords),
                     dst=self._known(dst, ("buffer",), "tma_load"), offset=as_term(offset), bytes=tmap.box_bytes,
                     box=tmap.box, tile=_ints(tmap.box if tile is None else tile, where, "tile"))
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
            attrs["circular_buffer"] = _cb_options(circular_buffer, where)
        for i, c in enumerate(attrs["coords"]):  # the coverage check below reads them
            _bounded_term(c, where, f"coords[{i}]")
        _bounded_term(attrs["offset"], where, "offset")
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
