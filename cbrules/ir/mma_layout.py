"""Facts of Hopper's warpgroup MMA (``wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}``) that
code generation and the CPU model share.

* the 64-bit **shared-memory matrix descriptor** (:class:`MatrixDescriptor`): start address,
  leading- and stride-dimension byte offsets (LBO, SBO), base offset and swizzle mode;
* the **canonical operand layouts** the tensor cores read through it (:func:`operand_address`):
  an operand is built of *core matrices*, 8 rows of 16 bytes, K-major (elements contiguous along
  K) or MN-major (contiguous along M or N), unswizzled or with the 32/64/128-byte swizzle;
* the descriptors of a tile that TMA loads wrote (:func:`tma_tile_descriptor`) and how a k-step
  moves them;
* the f32 **accumulator fragment** of m64nN: which thread and register hold which element
  (:func:`fragment_coords`, :func:`fragment_slot`).

Sources: the PTX ISA (asynchronous warpgroup MMA: shared memory matrix layout, matrix descriptor,
register fragments) and REFERENCE.md §7-8. Inputs are 2-byte (bfloat16, float16: m64nNk16) or 1-byte
(float8 e4m3 / e5m2: m64nNk32); either way one instruction reads 32 bytes of each K-major row, so
descriptors and k-steps are the same in bytes. FP8 operands are K-major only (the hardware has no
transposed FP8 read).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import CbrulesError
from .ops import DTYPE_BYTES, FP8_DTYPES
from .terms import swizzle_index

MMA_M = 64  # rows of A and of the accumulator per instruction (one warp group)
MMA_K = 16  # K per instruction for 2-byte inputs
K_STEP_BYTES = 32  # bytes of a K-major row one instruction reads: k16 of 2-byte, k32 of 1-byte inputs
WARPGROUP = 128  # threads that issue one wgmma together
HALF_MMA_DTYPES = ("bfloat16", "float16")
MMA_DTYPES = HALF_MMA_DTYPES + FP8_DTYPES
ELEMENT_BYTES = 2
CHUNK = 16  # bytes of one core-matrix row
CORE_ROWS = 8  # rows of one core matrix
MAJORS = ("k", "mn")
# the descriptor's 2-bit swizzle mode for each swizzle span in bytes (0: no swizzle)
SWIZZLE_MODE = {0: 0, 128: 1, 64: 2, 32: 3}
SPAN_OF_MODE = {m: s for s, m in SWIZZLE_MODE.items()}
ADDRESS_LIMIT = 1 << 18  # matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4: 18-bit byte values

_FIELDS = ((0, "start"), (16, "lbo"), (32, "sbo"))  # (bit position, attribute) of the 14-bit fields
_MASK14 = (1 << 14) - 1
_USED_BITS = (_MASK14 | (_MASK14 << 16) | (_MASK14 << 32) | (7 << 49) | (3 << 62))


class MmaLayoutError(CbrulesError, ValueError):
    """A wgmma operand, descriptor or fragment request that the hardware cannot express."""


class DescriptorError(MmaLayoutError):
    """A matrix-descriptor field out of range or misaligned, or descriptor bits outside its fields."""


class FragmentError(MmaLayoutError):
    """An accumulator shape, thread or register outside the m64nNk16 fragment."""


def k_step(dtype: str) -> int:
    """K of one wgmma with ``dtype`` inputs: 16 for the 2-byte types, 32 for FP8."""
    if dtype not in MMA_DTYPES:
        raise MmaLayoutError(f"wgmma input dtype {dtype!r}: one of {', '.join(MMA_DTYPES)}")
    return K_STEP_BYTES // DTYPE_BYTES[dtype]


def check_n(n: int) -> int:
    """``n`` if it is a valid N of m64nNk16 with 2-byte inputs (a multiple of 8 in 8..256)."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not (8 <= n <= 256 and n % 8 == 0):
        raise FragmentError(f"wgmma m64nNk16: N = {n!r} is not a multiple of 8 in 8..256; tile N into such parts")
    return int(n)


@dataclass(frozen=True)
class MatrixDescriptor:
    """A wgmma shared-memory matrix descriptor, fields in bytes (the encoding drops the low 4 bits).

    ``swizzle`` is the span in bytes (0 = none, 32, 64, 128); ``base_offset`` (3 bits) says on which
    128-byte row of its repeat a swizzle pattern starts when the pattern is not aligned to its repeat
    (0 when it is, which is how cbrules lays tiles out)."""

    start: int
    lbo: int
    sbo: int
    swizzle: int = 0
    base_offset: int = 0

    def __post_init__(self) -> None:
        for _, name in _FIELDS:
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= v < ADDRESS_LIMIT or v % 16:
                raise DescriptorError(f"matrix descriptor {name} = {v!r} bytes: it must be a multiple of 16 in "
                                      f"0..{ADDRESS_LIMIT - 16} (the field holds bits 4..17 of a shared address)")
        if self.swizzle not in SWIZZLE_MODE:
            raise DescriptorError(f"matrix descriptor swizzle = {self.swizzle!r}: give the span in bytes, one of "
                                  f"{sorted(SWIZZLE_MODE)} (0 = none)")
        if not isinstance(self.base_offset, (int, np.integer)) or not 0 <= self.base_offset < 8:
            raise DescriptorError(f"matrix descriptor base offset = {self.base_offset!r}: a 3-bit field, 0..7")
        if self.swizzle == 0 and self.base_offset:
            raise DescriptorError(f"matrix descriptor base offset = {self.base_offset} without a swizzle: the "
                                  "field only applies to swizzled layouts; give 0")

    def encode(self) -> int:
        """The 64-bit value the instruction takes."""
        bits = SWIZZLE_MODE[self.swizzle] << 62 | self.base_offset << 49
        for pos, name in _FIELDS:
            bits |= (getattr(self, name) >> 4) << pos
        return bits

    @classmethod
    def decode(cls, bits: int) -> "MatrixDescriptor":
        """The fields of a 64-bit descriptor; set bits outside the fields are an error (a mis-built
        descriptor), not something to ignore."""
        if not isinstance(bits, (int, np.integer)) or isinstance(bits, bool) or not 0 <= bits < 1 << 64:
            raise DescriptorError(f"matrix descriptor {bits!r} is not a 64-bit unsigned value")
        bits = int(bits)
        stray = bits & ~_USED_BITS
        if stray:
            raise DescriptorError(f"matrix descriptor {bits:#018x} sets bits {stray:#018x} outside its fields "
                                  "(start 0-13, LBO 16-29, SBO 32-45, base offset 49-51, swizzle 62-63)")
        f = {name: ((bits >> pos) & _MASK14) << 4 for pos, name in _FIELDS}
        return cls(swizzle=SPAN_OF_MODE[bits >> 62], base_offset=(bits >> 49) & 7, **f)

    def advanced(self, nbytes: int) -> "MatrixDescriptor":
        """The same operand with its start address moved by ``nbytes`` (a k-step inside a tile)."""
        return replace(self, start=self.start + nbytes)


def _check_major(major: str) -> None:
    if major not in MAJORS:
        raise MmaLayoutError(f"operand major-ness {major!r}: give 'k' (elements contiguous along K, the "
                             "instruction's transpose bit 0) or 'mn' (contiguous along M or N, transpose bit 1)")


def operand_address(desc: MatrixDescriptor, mn, k, major: str, element_bytes: int = ELEMENT_BYTES):
    """The shared byte address wgmma reads for element (``mn``, ``k``) of an operand (``mn`` the row
    of A or the column of B, ``k`` in 0..15, or 0..31 for 1-byte elements) described by ``desc``; ints
    or numpy arrays.

    Before the swizzle, element (mn, k) lies at ``start`` plus (``W`` = the swizzle span, E =
    ``element_bytes``, C = 16 / E elements of a core-matrix row: 8 of a 2-byte type, 16 of FP8):

    * K-major, no swizzle: ``(mn // 8) * SBO + (mn % 8) * 16 + (k // C) * LBO + (k % C) * E``
      (core matrices of 8 rows x 16 bytes; SBO steps along M/N, LBO along K);
    * K-major, swizzled: ``(mn // 8) * SBO + (mn % 8) * W + (k // C) * 16 + (k % C) * E``
      (rows W bytes apart; the 32 bytes of one k-step always fit in a row, so LBO is unused);
    * MN-major, no swizzle: ``(mn // 8) * SBO + (mn % 8) * E + (k // 8) * LBO + (k % 8) * 16``;
    * MN-major, swizzled: ``(mn // (W/E)) * LBO + (mn % (W/E)) * E + (k // 8) * SBO + (k % 8) * W``
      (note that LBO and SBO trade roles with the unswizzled MN-major layout).

    The swizzle then XORs address bits 4..6 with bits 7..9 (:func:`cbrules.ir.terms.swizzle_index`
    with 1-byte elements) of the *absolute* address: with the pattern on its repeat boundary (base
    offset 0) that is the layout a TMA load with the same swizzle writes."""
    _check_major(major)
    if desc.base_offset:
        raise DescriptorError(f"matrix descriptor base offset {desc.base_offset}: only swizzle patterns that "
                              f"start on their {8 * desc.swizzle}-byte repeat (base offset 0) are modelled; "
                              "align the tile to the repeat")
    if element_bytes not in (1, 2) or element_bytes == 1 and major != "k":
        raise MmaLayoutError(f"a {major.upper()}-major operand of {element_bytes!r}-byte elements: wgmma reads "
                             "2-byte elements in either major-ness and 1-byte (FP8) elements K-major only")
    mn, k = np.asarray(mn, np.int64), np.asarray(k, np.int64)
    e, w = element_bytes, desc.swizzle
    per = CHUNK // e
    if major == "k":
        if w:
            off = (mn // 8) * desc.sbo + (mn % 8) * w + (k // per) * CHUNK + (k % per) * e
        else:
            off = (mn // 8) * desc.sbo + (mn % 8) * CHUNK + (k // per) * desc.lbo + (k % per) * e
    elif w:
        per = w // e
        off = (mn // per) * desc.lbo + (mn % per) * e + (k // 8) * desc.sbo + (k % 8) * w
    else:
        off = (mn // 8) * desc.sbo + (mn % 8) * e + (k // 8) * desc.lbo + (k % 8) * CHUNK
    addr = desc.start + off
    return swizzle_index(addr, 1, w) if w else addr


def _tile_geometry(box_rows: int, span: int, major: str) -> int:
    """Bytes of one TMA box [box_rows, inner] of the tile, after checking the request."""
    _check_major(major)
    if span not in SWIZZLE_MODE:
        raise MmaLayoutError(f"swizzle span {span!r}: one of {sorted(SWIZZLE_MODE)} bytes (0 = none)")
    least = CORE_ROWS if major == "k" else MMA_K
    if not isinstance(box_rows, (int, np.integer)) or box_rows < least or box_rows % CORE_ROWS:
        what = "M or N rows" if major == "k" else "K rows"
        raise MmaLayoutError(f"a {major.upper()}-major wgmma tile loaded as boxes of {box_rows!r} {what}: give a "
                             f"multiple of {CORE_ROWS}, at least {least}")
    return int(box_rows) * (span or CHUNK)


def tma_tile_descriptor(start: int, box_rows: int, span: int, major: str, kstep: int = 0) -> MatrixDescriptor:
    """The descriptor of k-step ``kstep`` (bytes ``32*kstep .. 32*kstep+31`` of each row: elements
    ``16*kstep ..`` of a 2-byte type, ``32*kstep ..`` of FP8) of a tile that TMA loads wrote at shared
    byte address ``start`` as consecutive boxes ``[box_rows, inner]``.

    ``inner`` is the swizzle span in bytes (16 bytes, 8 elements, without a swizzle: a core-matrix
    row); each box is dense row-major in that span and swizzled by the TMA unit. A K-major tile
    (A as [M, K] row-major, B as [N, K]) has M/N rows and panels along K; an MN-major tile (B as
    [K, N] row-major) has K rows and panels along N. For the usual K-major bf16 tile with 64-element
    (128-byte) rows and 128B swizzle: SBO = 1024 (8 rows x 128 B), LBO = 16 (unused; the conventional
    encoded 1), and each k-step adds 32 bytes to the start address."""
    box_bytes = _tile_geometry(box_rows, span, major)
    if span and start % (8 * span):
        raise DescriptorError(f"a {span}B-swizzled tile at shared address {start}: TMA anchors the pattern on its "
                              f"{8 * span}-byte repeat, so the tile must start on one")
    inner = span or CHUNK
    if not isinstance(kstep, (int, np.integer)) or kstep < 0:
        raise MmaLayoutError(f"k-step {kstep!r}: a non-negative int")
    k0 = MMA_K * int(kstep)
    if major == "k":
        panel, within = divmod(K_STEP_BYTES * int(kstep), inner)
        first = start + panel * box_bytes + within
        lbo, sbo = (CHUNK, CORE_ROWS * inner) if span else (box_bytes, CORE_ROWS * CHUNK)
    else:
        if k0 + MMA_K > box_rows:
            raise MmaLayoutError(f"k-step {kstep} reads K rows {k0}..{k0 + MMA_K - 1} of an MN-major tile of "
                                 f"{box_rows} K rows")
        first = start + k0 * inner
        lbo, sbo = (box_bytes, CORE_ROWS * span) if span else (CORE_ROWS * CHUNK, box_bytes)
    return MatrixDescriptor(first, lbo, sbo, span)


def fragment_coords(thread, reg, n: int):
    """(row, col) of the m64nN f32 accumulator held by ``thread`` (0..127 of the warp group) in
    register ``reg`` (0..N/2-1); ints or numpy arrays. Warp w = thread / 32, lane l = thread % 32:
    registers 4c..4c+3 cover columns 8c + 2(l % 4) + {0, 1} of rows 16w + l/4 (the first two) and
    16w + l/4 + 8 (the last two)."""
    n = check_n(n)
    t, r = np.asarray(thread, np.int64), np.asarray(reg, np.int64)
    _in_range(t, WARPGROUP, "thread")
    _in_range(r, n // 2, f"register of an m64n{n} accumulator")
    w, lane = t // 32, t % 32
    row = 16 * w + lane // 4 + 8 * ((r % 4) // 2)
    col = 8 * (r // 4) + 2 * (lane % 4) + r % 2
    return row, col


def fragment_slot(row, col, n: int):
    """(thread, register) holding element (``row``, ``col``) of the m64nN f32 accumulator: the
    inverse of :func:`fragment_coords`."""
    n = check_n(n)
    i, j = np.asarray(row, np.int64), np.asarray(col, np.int64)
    _in_range(i, MMA_M, "accumulator row")
    _in_range(j, n, f"column of an m64n{n} accumulator")
    lane = 4 * (i % 8) + (j % 8) // 2
    thread = 32 * (i // 16) + lane
    reg = 4 * (j // 8) + 2 * ((i % 16) // 8) + j % 2
    return thread, reg


def fp8_operand_slot(row, col):
    """(thread, register, byte) holding element (``row``, ``col``) of the [64, 32] A operand of one
    m64nNk32 FP8 wgmma from registers (four 4-byte registers a thread; CUTLASS's ALayout_64x32): thread
    32 (row / 16) + 4 (row % 8) + (col % 16) / 4, register 2 (col / 16) + (row % 16) / 8, byte col % 4.
    Unlike the 2-byte types' A, this is not the accumulator's thread map: a thread holds 4 neighbouring
    columns where the accumulator gives it 2 (fragment_convert moves the bytes between the lanes)."""
    i, j = np.asarray(row, np.int64), np.asarray(col, np.int64)
    _in_range(i, MMA_M, "A operand row")
    _in_range(j, K_STEP_BYTES, "column of an m64k32 A operand")
    thread = 32 * (i // 16) + 4 * (i % 8) + (j % 16) // 4
    return thread, 2 * (j // 16) + (i % 16) // 8, j % 4


def _in_range(v: np.ndarray, size: int, what: str) -> None:
    bad = (v < 0) | (v >= size)
    if bad.any():
        raise FragmentError(f"{what} {int(v[bad].flat[0])} is outside 0..{size - 1}")


# ----------------------------------------------------------------------------- the B operand of an mma node
# The instruction's transpose immediate (tnspA / tnspB) for each major-ness: 1 reads an MN-major tile
# (bfloat16 / float16 only). Codegen prints it and the interpreter executes it, both from here.
TRANSPOSE = {"k": 0, "mn": 1}
B_LAYOUTS = {"nk": "k", "kn": "mn"}  # the builder's names of B's layouts: [N, K] is K-major, [K, N] MN-major
MN_SPANS = (128, 64, 32)  # the swizzles an MN-major tile's panels may have, widest first


def mn_major_span(bn: int) -> int:
    """The swizzle span in bytes of an MN-major B tile [BK, BN] of 2-byte elements: the widest of
    128, 64, 32 whose panel (span / 2 columns of N, one TMA box [BK, span / 2]) divides ``bn``."""
    for span in MN_SPANS:
        if bn % (span // ELEMENT_BYTES) == 0:
            return span
    raise MmaLayoutError(f"an MN-major (B given as [K, N]) tile of bn = {bn} columns: its panels are 16, 32 or 64 "
                         "columns (one 32, 64 or 128-byte swizzle span a row); use a bn that is a multiple of 16")


def b_tile_descriptor(start: int, bn: int, bk: int, span: int, major: str, kstep: int = 0) -> MatrixDescriptor:
    """The descriptor of k-step ``kstep`` of an mma's B tile at shared byte ``start``: K-major, [BN, BK]
    with rows of ``span`` = BK * 2 bytes; or MN-major, [BK, BN] as BN / (span / 2) panels [BK, span / 2]
    one after the other, each a TMA box (LBO = the panel's bytes, the step along N; SBO = 8 K rows).
    Codegen encodes these, and the interpreter reads the operand through them."""
    _check_major(major)
    return tma_tile_descriptor(start, bn if major == "k" else bk, span, major, kstep)


def b_tile_elements(bn: int, bk: int, span: int, major: str) -> np.ndarray:
    """[BN, BK] element offsets of B's element (n, k) in the dense (unswizzled) tile the TMA boxes form:
    ``n * BK + k`` K-major; MN-major, panel ``n // W`` of ``BK * W`` elements, row ``k``, column ``n % W``
    (W = span / 2)."""
    _check_major(major)
    n, k = np.meshgrid(np.arange(bn), np.arange(bk), indexing="ij")
    if major == "k":
        return n * bk + k
    w = span // ELEMENT_BYTES
    return (n // w) * (bk * w) + k * w + n % w
