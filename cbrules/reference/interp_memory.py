"""The interpreter's memory model beside the block runner (cbrules/reference/interp.py, whose memory,
TMA and barrier ops use it): how a store into an FP8 type rounds (saturated), and the memory errors the
ops raise (an index out of bounds, a misaligned or non-uniform vector access)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..ir.bind import NP_DTYPES
from ..ir.ops import FP8_DTYPES
from .hazards import InterpError

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
