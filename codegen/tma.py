"""TMA tensor maps: the cuTensorMapEncodeTiled limits (checked first, with named errors) and encoding."""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np
from cuda.bindings import driver as cu

from ..ir.limits import TmaLimitError, check_swizzle, check_tensor_map  # noqa: F401 (check_tensor_map: re-exported)
from ..ir.tma_view import checked_view
from .runtime import DeviceArray, as_device_array, checked, current_context

_TMA_DTYPES = {np.dtype(t): n for t, n in [
    (np.uint8, "UINT8"), (np.uint16, "UINT16"), (np.uint32, "UINT32"), (np.int32, "INT32"),
    (np.uint64, "UINT64"), (np.int64, "INT64"), (np.float16, "FLOAT16"),
    (np.float32, "FLOAT32"), (np.float64, "FLOAT64")]}
# ml_dtypes' types by name: bfloat16 has its own TMA type; FP8 has none, and TMA copies bytes, so it moves
# as UINT8 (what the tensor cores then read as e4m3 / e5m2)
_FLOAT_NAMES = {"bfloat16": "BFLOAT16", "float8_e4m3fn": "UINT8", "float8_e5m2": "UINT8"}
_L2 = {"none": "NONE", "64B": "L2_64B", "128B": "L2_128B", "256B": "L2_256B"}
_SWIZZLE = {"none": "NONE", "32B": "32B", "64B": "64B", "128B": "128B"}


def encode_tensor_map(name: str, array: DeviceArray, box: Sequence[int], *,
                      elem_strides: Sequence[int] | None = None,
                      l2_promotion: str = "128B", swizzle: str = "none", split: Sequence = ()) -> bytes:
    """Encode a tiled CUtensorMap for ``array`` and return its 128 raw bytes.

    ``box`` (and ``elem_strides``) are outermost-first like ``array.shape``. No
    interleave, zero fill out of bounds; ``swizzle`` none/32B/64B/128B (the shared-memory layout
    the kernel's reads expect); ``split`` ((dimension, inner) pairs) maps the tensor's split view
    (:mod:`cbrules.ir.tma_view`) instead of its own shape. The map stores the raw address: keep ``array``'s memory alive
    while the map is used.
    """
    if isinstance(array, np.ndarray):
        raise TypeError("encode_tensor_map needs device memory, not a numpy array")
    array = as_device_array(array)
    kind = _FLOAT_NAMES.get(array.dtype.name) or _TMA_DTYPES.get(array.dtype)
    if kind is None:
        raise TmaLimitError(name, "dtype", array.dtype, "TMA has no such element type",
                            f"use one of {sorted(str(d) for d in _TMA_DTYPES)} or {', '.join(_FLOAT_NAMES)}")
    if l2_promotion not in _L2:
        raise ValueError(f"l2_promotion must be one of {list(_L2)}, got {l2_promotion!r}")
    box = [int(b) for b in box]
    es = [int(e) for e in elem_strides] if elem_strides is not None else [1] * len(box)
    shape, strides_bytes = checked_view(name, array.shape, array.strides, array.dtype.itemsize, array.ptr, box, split,
                                        es)
    check_swizzle(name, box, array.dtype.itemsize, swizzle)
    current_context()
    # The driver lists axes innermost first and omits the innermost stride.
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t  # plain ints are rejected by the bindings
    strides = [u64(s) for s in reversed(strides_bytes[:-1])]
    if not strides:  # rank 1: an empty list becomes NULL, which the driver refuses
        strides = [u64(-(-array.nbytes // 16) * 16)]  # never read; a valid value anyway
    tmap = checked(cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{kind}"), len(box), array.ptr,
        [u64(n) for n in reversed(shape)], strides,
        [u32(b) for b in reversed(box)], [u32(e) for e in reversed(es)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{_SWIZZLE[swizzle]}"),
        getattr(cu.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{_L2[l2_promotion]}"),
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    # CUtensorMap.opaque is a list of 16 cuuint64_t words.
    return struct.pack("<16Q", *(int(w) for w in tmap.opaque))
