"""Warpgroup MMA on the CPU: one ``wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}`` from
shared-memory bytes (:func:`wgmma`), and the interpreter's handlers of the ``mma`` node and the
wgmma ordering ops (:class:`MmaOps`).

The model does what the tensor cores do with the instruction's operands: it decodes the two matrix
descriptors, gathers A [64, 16] and B [N, 16] byte by byte through the canonical layouts of
:mod:`cbrules.ir.mma_layout` (swizzle included), multiplies, and accumulates into the per-thread
fragment array ``[128, N/2]`` (thread of the warp group x register). Because it reads the bytes a
TMA model wrote, a wrong descriptor field, swizzle mode or start address gives a wrong result here
just as on the GPU.

Arithmetic: products of 2-byte or 1-byte floats are exact in float64, and one k-step's sum of 16 (FP8:
32) of them is rounded once to float32 and added to the float32 accumulator; the hardware's internal
order and rounding differ only in the last bits for the 2-byte types. For FP8 the H200 keeps fewer bits
while it adds a k-step into the accumulator (DeepGEMM's finding, measured here: docs/fp8.md), so
a GPU result lies within the FP8 tolerance of this model rather than its last bits.
"""
from __future__ import annotations

from typing import Union

import ml_dtypes
import numpy as np

from ..ir.mma_layout import (MMA_DTYPES, MMA_K, MMA_M, MN_SPANS, TRANSPOSE, WARPGROUP, MatrixDescriptor,
                             MmaLayoutError, b_tile_descriptor, b_tile_elements, check_n, fragment_slot, k_step,
                             operand_address, tma_tile_descriptor)
from ..ir.ops import DTYPE_BYTES
from ..schedule import Step
from .hazards import DivergentSync, InterpError

Descriptor = Union[int, MatrixDescriptor]
_STORAGE = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float8_e4m3": ml_dtypes.float8_e4m3fn,
            "float8_e5m2": ml_dtypes.float8_e5m2}


class MmaOperandError(MmaLayoutError):
    """A wgmma operand or accumulator the model cannot read: outside shared memory, the wrong
    dtype or shape, or an immediate out of its range."""


def as_bytes(smem: np.ndarray) -> np.ndarray:
    """A shared buffer (any dtype, contiguous) as the bytes it holds, without a copy."""
    return np.ascontiguousarray(smem).reshape(-1).view(np.uint8)


def _descriptor(d: Descriptor) -> MatrixDescriptor:
    return d if isinstance(d, MatrixDescriptor) else MatrixDescriptor.decode(d)


def operand_addresses(desc: Descriptor, rows: int, trans: int, dtype: str = "bfloat16") -> np.ndarray:
    """Byte addresses [rows, K] of an operand of ``dtype`` (K = 16, or 32 for FP8): A (rows = 64,
    element (m, k)) or B (rows = N, element (n, k)); ``trans`` is the instruction's transpose immediate
    (0 K-major, 1 MN-major)."""
    if trans not in (0, 1):
        raise MmaOperandError(f"transpose immediate {trans!r}: 0 (K-major) or 1 (MN-major)")
    mn, k = np.meshgrid(np.arange(rows), np.arange(k_step(dtype)), indexing="ij")
    return operand_address(_descriptor(desc), mn, k, "mn" if trans else "k", DTYPE_BYTES[dtype])


def read_operand(smem: np.ndarray, addrs: np.ndarray, dtype: str, what: str) -> np.ndarray:
    """The ``dtype`` elements (2 bytes, or 1 for FP8) at byte ``addrs`` of ``smem``, as float32."""
    if dtype not in MMA_DTYPES:
        raise MmaOperandError(f"wgmma .f32 input dtype {dtype!r}: one of {', '.join(MMA_DTYPES)}")
    raw = as_bytes(smem)
    size = DTYPE_BYTES[dtype]
    bad = (addrs < 0) | (addrs + size > raw.size)
    if bad.any():
        i = np.argwhere(bad)[0]
        raise MmaOperandError(f"wgmma reads {what} element {tuple(int(x) for x in i)} at shared byte "
                              f"{int(addrs[tuple(i)])}, outside the {raw.size} bytes it has: check the descriptor's "
                              "start address, LBO and SBO")
    if size == 1:
        return raw[addrs].view(_STORAGE[dtype]).astype(np.float32)
    u16 = raw[addrs].astype(np.uint16) | (raw[addrs + 1].astype(np.uint16) << 8)  # little-endian
    return u16.view(_STORAGE[dtype]).astype(np.float32)


def wgmma(acc: np.ndarray, a_smem: np.ndarray, desc_a: Descriptor, b_smem: np.ndarray, desc_b: Descriptor, *,
          n: int, dtype: str, scale_d: int, scale_a: int = 1, scale_b: int = 1, trans_a: int = 0,
          trans_b: int = 0, b_dtype: str | None = None) -> np.ndarray:
    """The accumulator fragments [128, N/2] after ``wgmma.mma_async m64nNk16.f32.<dtype>`` (FP8:
    ``m64nNk32.f32.<dtype>.<b_dtype>``) with ``D = scale_d * D + (scale_a * A) @ (scale_b * B)``: A [64, K]
    read through ``desc_a`` from ``a_smem``, B [K, N] through ``desc_b`` from ``b_smem`` (the shared
    buffers, their first byte being the descriptors' address 0). ``scale_d`` 0 overwrites, 1 accumulates.
    FP8 has no transposed read: a transpose immediate of 1 is refused."""
    b_dtype = dtype if b_dtype is None else b_dtype
    if k_step(dtype) != k_step(b_dtype) or k_step(dtype) != MMA_K and (trans_a or trans_b):
        raise MmaOperandError(f"wgmma with A {dtype} and B {b_dtype}, transpose ({trans_a}, {trans_b}): the two "
                              "types must be both 2-byte or both FP8, and FP8 operands are K-major")
    n = check_n(n)
    for name, v, allowed in (("scale-d", scale_d, (0, 1)), ("imm-scale-a", scale_a, (1, -1)),
                             ("imm-scale-b", scale_b, (1, -1))):
        if v not in allowed:
            raise MmaOperandError(f"wgmma {name} = {v!r}: one of {allowed}")
    acc = np.asarray(acc)
    if acc.shape != (WARPGROUP, n // 2) or acc.dtype != np.float32:
        raise MmaOperandError(f"accumulator fragments of {acc.dtype} {acc.shape}: m64n{n}.f32 holds float32 "
                              f"[{WARPGROUP}, {n // 2}] (thread x register)")
    a = read_operand(a_smem, operand_addresses(desc_a, MMA_M, trans_a, dtype), dtype, "A")
    b = read_operand(b_smem, operand_addresses(desc_b, n, trans_b, b_dtype), b_dtype, "B")
    prod = ((scale_a * a.astype(np.float64)) @ (scale_b * b.astype(np.float64)).T).astype(np.float32)
    rows, cols = np.meshgrid(np.arange(MMA_M), np.arange(n), indexing="ij")
    thread, reg = fragment_slot(rows, cols, n)
    out = acc.copy() if scale_d else np.zeros_like(acc)
    out[thread, reg] += prod
    return out


def pack_pairs(lo: np.ndarray, hi: np.ndarray, dtype: str) -> np.ndarray:
    """``cvt.rn.{bf16x2,f16x2}.f32``: each pair rounded to nearest even to ``dtype`` and packed into a
    uint32, ``lo`` in the low half."""
    bits = [np.asarray(v, np.float32).astype(_STORAGE[dtype]).view(np.uint16).astype(np.uint32) for v in (lo, hi)]
    return bits[0] | (bits[1] << 16)


def register_operand(packed: np.ndarray, dtype: str) -> np.ndarray:
    """The A tile [64, K] (float32) that packed registers [128, K/4] of a warp group hold: packed register i
    is the pair (2i, 2i+1) of an m64nK float32 accumulator fragment (REFERENCE §8: the A fragment of
    m64k16 has the thread/row map of 16 accumulator columns), low half first."""
    packed = np.asarray(packed)
    if packed.ndim != 2 or packed.shape[0] != WARPGROUP or packed.dtype != np.uint32:
        raise MmaOperandError(f"register operand of {packed.dtype} {packed.shape}: a warp group holds uint32 "
                              f"[{WARPGROUP}, K/4]")
    k = check_n(4 * packed.shape[1])
    halves = np.stack([packed & 0xFFFF, packed >> 16], axis=-1).astype(np.uint16).reshape(WARPGROUP, k // 2)
    rows, cols = np.meshgrid(np.arange(MMA_M), np.arange(k), indexing="ij")
    thread, reg = fragment_slot(rows, cols, k)
    return halves[thread, reg].view(_STORAGE[dtype]).astype(np.float32)


def wgmma_register_a(acc: np.ndarray, a_regs: np.ndarray, b_smem: np.ndarray, desc_b: Descriptor, *, n: int,
                     dtype: str, scale_d: int, trans_b: int = 0) -> np.ndarray:
    """:func:`wgmma` with A from registers (``wgmma.mma_async ... {a0..a3}, descB``): ``a_regs`` are the
    warp group's four packed registers a thread, [128, 4]; ``trans_b`` B's transpose immediate."""
    n = check_n(n)
    if scale_d not in (0, 1):
        raise MmaOperandError(f"wgmma scale-d = {scale_d!r}: one of (0, 1)")
    a = register_operand(a_regs, dtype)
    if a.shape != (MMA_M, MMA_K):
        raise MmaOperandError(f"register operand of {a_regs.shape[1]} registers a thread: one k16 step takes 4")
    b = read_operand(b_smem, operand_addresses(desc_b, n, trans_b), dtype, "B")
    prod = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32)
    rows, cols = np.meshgrid(np.arange(MMA_M), np.arange(n), indexing="ij")
    thread, reg = fragment_slot(rows, cols, n)
    out = np.asarray(acc).copy() if scale_d else np.zeros_like(acc)
    out[thread, reg] += prod
    return out


def fragments_to_matrix(acc: np.ndarray, n: int) -> np.ndarray:
    """The [64, N] accumulator tile that fragments [128, N/2] hold."""
    rows, cols = np.meshgrid(np.arange(MMA_M), np.arange(check_n(n)), indexing="ij")
    thread, reg = fragment_slot(rows, cols, n)
    return np.asarray(acc)[thread, reg]


class MmaIssueError(InterpError):
    """An ``mma`` node the tensor cores could not execute as written: a warp group outside the tile's
    consumers, operands or accumulator that do not fit the node, or descriptors the hardware cannot
    express."""


class MmaOps:
    """Handlers for ``mma``, ``wgmma_fence``, ``wgmma_commit`` and ``wgmma_wait``; the block runner
    provides ``ev``, ``site``, ``uniform``, ``proto``, ``regarrays``, ``p`` and ``T``.

    ``mma`` executes what codegen unrolls it into: warp group g of ``groups`` computes rows
    [g * BM/groups, (g+1) * BM/groups) of the tile, as 64-row blocks j; block j, k-step s is one
    m64n{BN}k16 wgmma whose A descriptor starts at ``a_offset`` + row g * BM/groups + 64j of the A tile
    plus 32 s bytes, B's at ``b_offset`` plus 32 s bytes (both K-major, rows of ``swizzle`` bytes as
    TMA wrote them: :func:`cbrules.ir.mma_layout.tma_tile_descriptor`; an MN-major B, ``b_major`` "mn",
    through :func:`cbrules.ir.mma_layout.b_tile_descriptor` and the transpose bit), and whose fragment is
    registers [j * BN/2, (j+1) * BN/2) of ``acc``. In a lowered kernel (one with mbarriers or wgmma
    ordering ops) it is asynchronous and checked by :class:`cbrules.reference.mma_groups.MmaGroups`;
    before lowering it completes at once, like a TMA load without a barrier."""

    def _warp_groups(self, s: Step, mask: np.ndarray):
        """(warp group, its 128 threads) of the active threads; a partial warp group is an error."""
        lanes = np.nonzero(mask)[0]
        for g in np.unique(lanes // WARPGROUP):
            mine = lanes[lanes // WARPGROUP == g]
            if mine.size != WARPGROUP:
                raise DivergentSync(f"{s.op} is executed by {mine.size} of the {WARPGROUP} threads of warp group {g}; "
                                    "a warp group executes it all together (.sync.aligned)", self.site())
            yield int(g), mine

    def _cvt_pack(self, s: Step, mask: np.ndarray) -> None:
        lo, hi = (f(self.env, self.lanes(mask)) for f in self.p.fns[s.node]["args"])
        self.set_reg(s.attrs["dst"], pack_pairs(np.broadcast_to(lo, (self.T,)), np.broadcast_to(hi, (self.T,)),
                                                s.attrs["to"]), mask)

    def _issuing_groups(self, s: Step, mask: np.ndarray, groups: int):
        """(warp group of the block, its place among the tile's groups, its threads, a_offset, b_offset,
        scale_d) of each warp group issuing mma ``s``, the offsets and scale uniform over the group. The
        MMA groups are tracked per warp group of the block; the place differs where the block runs
        several tiles at once (``group0``: the tile's first warp group)."""
        for wg, lanes in self._warp_groups(s, mask):
            m = np.zeros(self.T, bool)
            m[lanes] = True
            g = wg
            if s.attrs.get("group0") is not None:
                g -= self.uniform(self.ev(s, "group0", m), m, f"mma group0 in warp group {wg}")
            if not 0 <= g < groups:
                raise MmaIssueError(f"warp group {g} issues an mma of a tile on warp groups 0..{groups - 1}",
                                    self.site())
            yield (wg, g, lanes, *(self.uniform(self.ev(s, k, m), m, f"mma {k} in warp group {g}")
                                   for k in ("a_offset", "b_offset", "scale_d")))

    def _mma(self, s: Step, mask: np.ndarray) -> None:
        a = s.attrs
        if a.get("a_space") == "register":
            self._mma_register_a(s, mask)
            return
        bm, bn, bk = (int(x) for x in a["shape"])
        groups, span, dtype = int(a["groups"]), int(a["swizzle"]), a["dtype"]
        b_dtype = a.get("b_dtype") or dtype
        b_major, b_span = self._b_layout(a, span)
        rows = bm // groups
        acc = self.regarrays.get(a["acc"])
        tiles = [self.proto.shared.get(a[k]) for k in ("a", "b")]
        size = DTYPE_BYTES.get(dtype)  # bytes of an element: 2, or 1 for FP8 (both operands alike)
        if acc is None or acc.shape[1] != (rows // MMA_M) * bn // 2 or dtype not in MMA_DTYPES or any(
                t is None or t.data.dtype.itemsize != size for t in tiles):
            raise MmaIssueError(f"an mma of {dtype} tile ({bm}, {bn}, {bk}) on {groups} warp group(s) needs a float32 "
                                f"register array {a['acc']!r} of {(rows // MMA_M) * bn // 2} elements a thread and "
                                f"shared {size}-byte tiles {a['a']!r}, {a['b']!r}", self.site())
        tile_a, tile_b = tiles
        kk = k_step(dtype)
        for wg, g, lanes, a_off, b_off, scale_d in self._issuing_groups(s, mask, groups):
            if not self.p.mma_async:
                self._mma_logical(acc, lanes, (tile_a, a_off + g * rows * bk), (tile_b, b_off), (rows, bn, bk), scale_d,
                                  b_tile_elements(bn, bk, b_span, b_major), kk)
                continue
            try:
                steps = [(j, ks, tma_tile_descriptor(size * a_off + (g * rows + MMA_M * j) * span, bm, span, "k", ks),
                          b_tile_descriptor(size * b_off, bn, bk, b_span, b_major, ks))
                         for j in range(rows // MMA_M) for ks in range(bk // kk)]
                # the elements it reads (byte address / element size), for the protocol checks
                reads = [(tile, np.concatenate([operand_addresses(d[w], rows_of, trans, t).ravel()
                                                for d in steps]) // size)
                         for tile, w, rows_of, trans, t in ((tile_a, 2, MMA_M, 0, dtype),
                                                            (tile_b, 3, bn, TRANSPOSE[b_major], b_dtype))]
                for tile, idx in reads:  # a descriptor that reaches past the tile: named here, before any read
                    out = idx[(idx < 0) | (idx >= tile.data.size)]
                    if out.size:
                        raise MmaIssueError(f"an mma reads {tile.name}[{int(out[0])}], outside its {tile.data.size} "
                                            "elements: check the descriptors' start address, LBO and SBO",
                                            self.site())
                self.proto.mma.issue(s.node, wg, lanes, a["acc"], reads, span if b_span == span else (span, b_span),
                                     self.site)
                frags = acc[lanes]
                for j, ks, da, db in steps:  # scale-d applies to k-step 0; later ones accumulate
                    cols = slice(j * bn // 2, (j + 1) * bn // 2)
                    # the 64-bit descriptors codegen prints, decoded again by the instruction
                    frags[:, cols] = wgmma(frags[:, cols], tile_a.data, da.encode(), tile_b.data, db.encode(), n=bn,
                                           dtype=dtype, scale_d=int(bool(scale_d) or ks > 0),
                                           trans_b=TRANSPOSE[b_major], b_dtype=b_dtype)
            except MmaLayoutError as e:
                raise MmaIssueError(str(e), self.site()) from None
            acc[lanes] = frags

    def _b_layout(self, a, span: int) -> tuple[str, int]:
        """(major-ness, swizzle span) of an mma's B: an MN-major B is panels of b_swizzle-byte rows read
        through the transpose bit; refused by name where the two disagree (as codegen does)."""
        b_major = a.get("b_major", "k")
        b_span = int(a.get("b_swizzle", span))
        if b_major not in TRANSPOSE or (b_major == "mn") != ("b_swizzle" in a) or \
                b_major == "mn" and b_span not in MN_SPANS:
            raise MmaIssueError(f"an mma with b_major {b_major!r} and b_swizzle {a.get('b_swizzle')!r}: B is 'k' "
                                f"(a [BN, BK] tile, no b_swizzle) or 'mn' (a [BK, BN] tile of panels whose rows are "
                                f"b_swizzle = {' / '.join(map(str, MN_SPANS))} bytes)", self.site())
        return b_major, b_span

    def _mma_register_a(self, s: Step, mask: np.ndarray) -> None:
        """An mma whose A is packed registers: block j, k-step s reads registers a_offset + j*BK/4 + 4s ..
        + 3 of each thread of the warp group, B as a shared tile in either layout (see :meth:`_mma`)."""
        a = s.attrs
        bm, bn, bk = (int(x) for x in a["shape"])
        groups, span, dtype = int(a["groups"]), int(a["swizzle"]), a["dtype"]
        b_major, b_span = self._b_layout(a, span)
        rows = bm // groups
        acc, regs = self.regarrays.get(a["acc"]), self.regarrays.get(a["a"])
        tile_b = self.proto.shared.get(a["b"])
        if acc is None or acc.shape[1] != (rows // MMA_M) * bn // 2 or regs is None or regs.dtype != np.uint32 \
                or tile_b is None or tile_b.data.dtype.itemsize != 2:
            raise MmaIssueError(f"an mma of tile ({bm}, {bn}, {bk}) with A from registers needs float32 register "
                                f"array {a['acc']!r}, uint32 register array {a['a']!r} and a shared 2-byte tile "
                                f"{a['b']!r}", self.site())
        for wg, g, lanes, a_off, b_off, scale_d in self._issuing_groups(s, mask, groups):
            first, last = a_off, a_off + (rows // MMA_M) * bk // 4
            if first < 0 or last > regs.shape[1]:
                raise MmaIssueError(f"an mma reads registers {a['a']}[{first}:{last}], outside its {regs.shape[1]}",
                                    self.site())
            frags = acc[lanes]
            try:
                if self.p.mma_async:
                    descs = [b_tile_descriptor(2 * b_off, bn, bk, b_span, b_major, ks) for ks in range(bk // MMA_K)]
                    idx = np.concatenate([operand_addresses(d, bn, TRANSPOSE[b_major]).ravel() for d in descs]) // 2
                    out = idx[(idx < 0) | (idx >= tile_b.data.size)]
                    if out.size:
                        raise MmaIssueError(f"an mma reads {tile_b.name}[{int(out[0])}], outside its "
                                            f"{tile_b.data.size} elements", self.site())
                    self.proto.mma.issue(s.node, wg, lanes, a["acc"], [(tile_b, idx)], b_span, self.site,
                                         operand=a["a"])
                else:  # before lowering the tile lies dense as its TMA boxes
                    descs, elements = None, b_off + b_tile_elements(bn, bk, b_span, b_major)
                    if elements.min() < 0 or elements.max() >= tile_b.data.size:
                        raise MmaIssueError(f"an mma reads {tile_b.name} from element {b_off}, past its "
                                            f"{tile_b.data.size} elements", self.site())
                for j in range(rows // MMA_M):
                    cols = slice(j * bn // 2, (j + 1) * bn // 2)
                    for ks in range(bk // MMA_K):
                        r0 = a_off + j * bk // 4 + 4 * ks
                        sd = int(bool(scale_d) or ks > 0)
                        if descs is not None:
                            frags[:, cols] = wgmma_register_a(frags[:, cols], regs[lanes, r0:r0 + 4], tile_b.data,
                                                              descs[ks].encode(), n=bn, dtype=dtype, scale_d=sd,
                                                              trans_b=TRANSPOSE[b_major])
                        else:
                            bt = tile_b.data[elements[:, ks * MMA_K:(ks + 1) * MMA_K]].astype(np.float64)
                            self._register_a_logical(frags, cols, regs[lanes, r0:r0 + 4], bt, dtype, sd)
            except MmaLayoutError as e:
                raise MmaIssueError(str(e), self.site()) from None
            acc[lanes] = frags

    def _register_a_logical(self, frags, cols, a_regs, bt: np.ndarray, dtype: str, scale_d: int) -> None:
        """One k16 step before lowering: A from the packed registers, B's [BN, 16] elements ``bt``."""
        bn = bt.shape[0]
        at = register_operand(a_regs, dtype).astype(np.float64)
        tile = fragments_to_matrix(frags[:, cols], bn) if scale_d else np.zeros((MMA_M, bn), np.float32)
        tile = tile + (at @ bt.T).astype(np.float32)
        rr, cc = np.meshgrid(np.arange(MMA_M), np.arange(bn), indexing="ij")
        t, r = fragment_slot(rr, cc, bn)
        block = frags[:, cols]
        block[t, r] = tile
        frags[:, cols] = block

    def _mma_logical(self, acc: np.ndarray, lanes: np.ndarray, a, b, shape, scale_d, b_elements: np.ndarray,
                     kk: int = MMA_K) -> None:
        """Before lowering: the tiles lie dense as their TMA boxes (a TMA load without a barrier copies the
        logical box), so the warp group's product of its ``rows`` of A (from element ``a_off``) and B
        (element (n, k) at ``b_off + b_elements[n, k]``: row-major [BN, BK], or MN-major panels) is taken
        on them directly, rounded like the tensor cores' k-steps."""
        (tile_a, a_off), (tile_b, b_off) = a, b
        rows, bn, bk = shape
        for tile, lo, n in ((tile_a, a_off, rows * bk), (tile_b, b_off, bn * bk)):
            if lo < 0 or lo + n > tile.data.size:
                raise MmaIssueError(f"an mma reads {tile.name}[{lo}:{lo + n}], outside its {tile.data.size} elements",
                                    self.site())
        bt = tile_b.data[b_off + b_elements].astype(np.float64)
        frags = acc[lanes]
        for j in range(rows // MMA_M):
            r0 = a_off + MMA_M * j * bk
            at = tile_a.data[r0:r0 + MMA_M * bk].reshape(MMA_M, bk).astype(np.float64)
            cols = slice(j * bn // 2, (j + 1) * bn // 2)
            tile = fragments_to_matrix(frags[:, cols], bn) if scale_d else np.zeros((MMA_M, bn), np.float32)
            for ks in range(0, bk, kk):  # one instruction's k-step (16, or 32 for FP8) at a time
                tile = tile + (at[:, ks:ks + kk] @ bt[:, ks:ks + kk].T).astype(np.float32)
            rr, cc = np.meshgrid(np.arange(MMA_M), np.arange(bn), indexing="ij")
            t, r = fragment_slot(rr, cc, bn)
            frags[t, j * bn // 2 + r] = tile
        acc[lanes] = frags

    def _wgmma_fence(self, s: Step, mask: np.ndarray) -> None:
        for _, lanes in self._warp_groups(s, mask):
            self.proto.mma.fence(lanes)

    def _wgmma_commit(self, s: Step, mask: np.ndarray) -> None:
        for g, _ in self._warp_groups(s, mask):
            self.proto.mma.commit(g)

    def _wgmma_wait(self, s: Step, mask: np.ndarray) -> None:
        for g, lanes in self._warp_groups(s, mask):
            self.proto.mma.wait(g, lanes, int(s.attrs["pending"]))
