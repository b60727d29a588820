"""Hardware limits of the TMA (REFERENCE §2) as checks with named errors.

Shared by the builder (box limits, known when a tensor map is declared), the GPU launcher and the
reference interpreter (strides and alignment, known once real arrays are bound), so every path
refuses the same things with the same words.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from ..errors import CbrulesError
from .ops import DTYPE_BYTES

# the CPU checker (`cbrules check`) runs 4*S trip counts per case: S is bounded so a check ends in minutes
MAX_CHECK_STAGES = 16
MAX_SHARED_BYTES = 227 * 1024  # shared memory a block may have on sm_90 (H100/H200, with the opt-in attribute)
SM_SHARED_BYTES = 228 * 1024  # shared memory of one SM, which its resident blocks share
BLOCK_RESERVED_SHARED_BYTES = 1024  # what the hardware keeps of an SM's shared memory for each resident block
REGISTERS_PER_BLOCK = 65536  # 32-bit registers of an SM, all a block may take (sm_90)
MAX_THREAD_REGISTERS = 255  # registers one thread may have
MAX_BLOCK_THREADS = 1024  # CUDA's limit on threads per block
# the register counts setmaxnreg takes: multiples of SETMAXNREG_STEP in SETMAXNREG_MIN..SETMAXNREG_MAX
SETMAXNREG_MIN, SETMAXNREG_MAX, SETMAXNREG_STEP = 24, 256, 8
# the limits rules read with (limit NAME) (stages="auto" in rules/circular_buffer.rules, the checks of
# rules/warp_specialize.rules and rules/ws_pingpong.rules)
RULE_LIMITS = {"shared-bytes-per-block": MAX_SHARED_BYTES, "shared-bytes-per-sm": SM_SHARED_BYTES,
               "shared-bytes-reserved-per-block": BLOCK_RESERVED_SHARED_BYTES, "registers-per-block": REGISTERS_PER_BLOCK,
               "threads-per-block": MAX_BLOCK_THREADS, "setmaxnreg-min": SETMAXNREG_MIN,
               "setmaxnreg-max": SETMAXNREG_MAX, "setmaxnreg-step": SETMAXNREG_STEP}


class TmaLimitError(CbrulesError, ValueError):
    """A TMA tensor-map limit is violated.

    ``axis`` counts numpy-style (outermost first) and is None for whole-map
    properties such as rank, dtype or base address.
    """

    def __init__(
        self, tensor_map: str, what: str, value: Any, limit: str, fix: str, axis: int | None = None
    ):
        self.tensor_map = tensor_map
        self.what = what
        self.value = value
        self.limit = limit
        self.fix = fix
        self.axis = axis
        where = f" of axis {axis}" if axis is not None else ""
        super().__init__(
            f"tensor map '{tensor_map}': {what}{where} is {value}, but {limit}. Fix: {fix}"
        )


class TmaBoxError(TmaLimitError):
    """A TMA box outside the hardware limits, found when the tensor map is declared."""

    def __init__(self, message: str):
        ValueError.__init__(self, message)


SWIZZLE_SPAN = {"none": 0, "32B": 32, "64B": 64, "128B": 128}  # bytes of a swizzled row


class SwizzleError(TmaBoxError):
    """A swizzled tensor map, or a tile it fills, that breaks the swizzle's size or alignment rules."""


def swizzle_repeat(swizzle: str) -> int:
    """Bytes after which the swizzle pattern repeats (8 rows of the span): the tile base alignment."""
    return 8 * SWIZZLE_SPAN[swizzle]


def check_swizzle(mname: str, box: Sequence[int], itemsize: int, swizzle: str) -> None:
    """A swizzled box's inner dimension spans exactly the swizzle width (the hardware allows less;
    cbrules lays out and reads only full-width rows), so its rows are the pattern's rows."""
    if swizzle not in SWIZZLE_SPAN:
        raise SwizzleError(f"tensor map {mname!r}: swizzle {swizzle!r} is not one of {', '.join(SWIZZLE_SPAN)}")
    span = SWIZZLE_SPAN[swizzle]
    inner = box[-1] * itemsize
    if span and inner > span:
        raise SwizzleError(f"tensor map {mname!r}: the inner box dimension spans {box[-1]} x {itemsize} = {inner} "
                           f"bytes, more than the {span}-byte span of swizzle {swizzle}; use an inner box of "
                           f"{span // itemsize} elements (several boxes a tile) or a wider swizzle")
    if span and inner != span:
        raise SwizzleError(f"tensor map {mname!r}: the inner box dimension spans {inner} bytes; with swizzle "
                           f"{swizzle} cbrules needs it to span exactly {span} bytes ({span // itemsize} elements)")


def check_box(mname: str, box: tuple, dtype: str) -> None:
    """Box limits known when the kernel is built: rank 1..5, every extent 1..256, inner extent x
    element size a multiple of 16 bytes."""
    if not 1 <= len(box) <= 5:
        raise TmaBoxError(f"tensor map {mname!r}: box rank {len(box)} is outside 1..5")
    for d, b in enumerate(box):
        if not 1 <= b <= 256:
            raise TmaBoxError(f"tensor map {mname!r}: box extent {b} in dimension {d} is outside 1..256; use a "
                              "box of at most 256 and a wider tile= on tma_load (the rules split it into boxes)")
    inner = box[-1] * DTYPE_BYTES[dtype]
    if inner % 16:
        raise TmaBoxError(f"tensor map {mname!r}: inner box extent {box[-1]} x {DTYPE_BYTES[dtype]} bytes = "
                          f"{inner} bytes is not a multiple of 16; make it a multiple of "
                          f"{16 // math.gcd(16, DTYPE_BYTES[dtype])} elements")


def check_tensor_map(name: str, shape: Sequence[int], strides_bytes: Sequence[int],
                     itemsize: int, ptr: int, box: Sequence[int],
                     elem_strides: Sequence[int] | None = None) -> None:
    """Check the cuTensorMapEncodeTiled limits (no interleave), raising TmaLimitError.

    Everything is given numpy-style, outermost axis first; strides are in bytes.
    """
    rank = len(shape)
    if not 1 <= rank <= 5:
        raise TmaLimitError(name, "rank", rank, "TMA supports ranks 1 to 5",
                            "reshape the tensor (merge or split axes) to 1..5 axes")
    for what, seq in (("box rank", box), ("stride count", strides_bytes),
                      ("element-stride count", elem_strides or box)):
        if len(seq) != rank:
            raise TmaLimitError(name, what, len(seq), f"it must equal the tensor rank {rank}",
                                "give one value per axis")
    if ptr % 16:
        raise TmaLimitError(name, "global address", hex(ptr), "it must be 16-byte aligned",
                            "start the view at a 16-byte aligned element offset")
    for axis, n in enumerate(shape):
        if not 1 <= n <= 2**32:
            raise TmaLimitError(name, "extent", n, "extents must be in 1..2**32",
                                "drop empty tensors or split huge axes", axis)
    for axis, b in enumerate(box):
        if not 1 <= b <= 256:
            raise TmaLimitError(name, "box extent", b, "box extents must be in 1..256",
                                "use a smaller tile or several TMA copies along this axis", axis)
    for axis, e in enumerate(elem_strides or ()):
        if not 1 <= e <= 8:
            raise TmaLimitError(name, "element stride", e, "element strides must be in 1..8",
                                "use a smaller traversal stride", axis)
    inner = rank - 1
    if strides_bytes[inner] != itemsize:
        raise TmaLimitError(name, "innermost stride", f"{strides_bytes[inner]} bytes",
                            f"it must equal the element size ({itemsize} bytes)",
                            "make the innermost axis contiguous (np.ascontiguousarray)", inner)
    if box[inner] * itemsize % 16:
        step = 16 // math.gcd(16, itemsize)
        raise TmaLimitError(name, "inner box extent", f"{box[inner]} elements "
                            f"({box[inner] * itemsize} bytes)", "it must span a multiple of 16 bytes",
                            f"make the innermost box extent a multiple of {step} elements", inner)
    for axis in range(inner):
        s = strides_bytes[axis]
        if s <= 0 or s % 16 or s >= 2**40:
            raise TmaLimitError(name, "stride", f"{s} bytes",
                                "strides must be positive multiples of 16 bytes below 2**40",
                                _padding_fix(shape, strides_bytes, itemsize, axis), axis)


def _padding_fix(shape: Sequence[int], strides_bytes: Sequence[int], itemsize: int, axis: int) -> str:
    """The padding that makes every stride of a dense tensor a multiple of 16 bytes: its rows (the
    innermost extent) rounded up to whole 16-byte units, named in elements and with numpy's call."""
    dense = all(strides_bytes[a] == itemsize * math.prod(shape[a + 1:]) for a in range(len(shape)))
    if not dense or strides_bytes[axis] <= 0:
        return (f"give axis {axis} a stride that is a multiple of 16 bytes (rows padded to a 16-byte pitch), "
                "as a dense C-order array")
    n = shape[-1]
    step = 16 // math.gcd(16, itemsize)
    padded = -(-n // step) * step
    widths = ", ".join(["(0, 0)"] * (len(shape) - 1) + [f"(0, {padded - n})"])
    return (f"pad the innermost extent from {n} to {padded} elements (rows of {padded * itemsize} bytes, a multiple "
            f"of 16), e.g. np.pad(x, ({widths})), and every tensor of the kernel with that extent the same way, "
            "filling the extra elements with a value neutral for the kernel (0 for a sum, -inf for a max) and "
            f"slicing the results back to {n}; TMA cannot load rows of {n * itemsize} bytes and cbrules has no "
            "other load path for them")
