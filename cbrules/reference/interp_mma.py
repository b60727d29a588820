"""One ``wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}`` on the CPU, from shared-memory bytes.

The model does what the tensor cores do with the instruction's operands: it decodes the two matrix
descriptors, gathers A [64, 16] and B [N, 16] byte by byte through the canonical layouts of
:mod:`cbrules.ir.mma_layout` (swizzle included), multiplies, and accumulates into the per-thread
fragment array ``[128, N/2]`` (thread of the warp group x register). Because it reads the bytes a
TMA model wrote, a wrong descriptor field, swizzle mode or start address gives a wrong result here
just as on the GPU.

Arithmetic: products of 2-byte floats are exact in float64, and one k16 step's sum of 16 of them
is rounded once to float32 and added to the float32 accumulator; the hardware's internal order and
rounding differ only in the last bits.
"""
from __future__ import annotations

from typing import Union

import ml_dtypes
import numpy as np

from ..ir.mma_layout import (MMA_DTYPES, MMA_K, MMA_M, WARPGROUP, MatrixDescriptor, MmaLayoutError, check_n,
                             fragment_slot, operand_address)

Descriptor = Union[int, MatrixDescriptor]
_STORAGE = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


class MmaOperandError(MmaLayoutError):
    """A wgmma operand or accumulator the model cannot read: outside shared memory, the wrong
    dtype or shape, or an immediate out of its range."""


def as_bytes(smem: np.ndarray) -> np.ndarray:
    """A shared buffer (any dtype, contiguous) as the bytes it holds, without a copy."""
    return np.ascontiguousarray(smem).reshape(-1).view(np.uint8)


def _descriptor(d: Descriptor) -> MatrixDescriptor:
    return d if isinstance(d, MatrixDescriptor) else MatrixDescriptor.decode(d)


def operand_addresses(desc: Descriptor, rows: int, trans: int) -> np.ndarray:
    """Byte addresses [rows, 16] of an operand: A (rows = 64, element (m, k)) or B (rows = N,
    element (n, k)); ``trans`` is the instruction's transpose immediate (0 K-major, 1 MN-major)."""
    if trans not in (0, 1):
        raise MmaOperandError(f"transpose immediate {trans!r}: 0 (K-major) or 1 (MN-major)")
    mn, k = np.meshgrid(np.arange(rows), np.arange(MMA_K), indexing="ij")
    return operand_address(_descriptor(desc), mn, k, "mn" if trans else "k")


def read_operand(smem: np.ndarray, addrs: np.ndarray, dtype: str, what: str) -> np.ndarray:
    """The 2-byte ``dtype`` elements at byte ``addrs`` of ``smem``, as float32."""
    if dtype not in MMA_DTYPES:
        raise MmaOperandError(f"wgmma .f32 input dtype {dtype!r}: one of {', '.join(MMA_DTYPES)}")
    raw = as_bytes(smem)
    bad = (addrs < 0) | (addrs + 2 > raw.size)
    if bad.any():
        i = np.argwhere(bad)[0]
        raise MmaOperandError(f"wgmma reads {what} element {tuple(int(x) for x in i)} at shared byte "
                              f"{int(addrs[tuple(i)])}, outside the {raw.size} bytes it has: check the descriptor's "
                              "start address, LBO and SBO")
    u16 = raw[addrs].astype(np.uint16) | (raw[addrs + 1].astype(np.uint16) << 8)  # little-endian
    return u16.view(_STORAGE[dtype]).astype(np.float32)


def wgmma(acc: np.ndarray, a_smem: np.ndarray, desc_a: Descriptor, b_smem: np.ndarray, desc_b: Descriptor, *,
          n: int, dtype: str, scale_d: int, scale_a: int = 1, scale_b: int = 1, trans_a: int = 0,
          trans_b: int = 0) -> np.ndarray:
    """The accumulator fragments [128, N/2] after ``wgmma.mma_async m64nNk16.f32.<dtype>`` with
    ``D = scale_d * D + (scale_a * A) @ (scale_b * B)``: A [64, 16] read through ``desc_a`` from
    ``a_smem``, B [16, N] through ``desc_b`` from ``b_smem`` (the shared buffers, their first byte
    being the descriptors' address 0). ``scale_d`` 0 overwrites, 1 accumulates."""
    n = check_n(n)
    for name, v, allowed in (("scale-d", scale_d, (0, 1)), ("imm-scale-a", scale_a, (1, -1)),
                             ("imm-scale-b", scale_b, (1, -1))):
        if v not in allowed:
            raise MmaOperandError(f"wgmma {name} = {v!r}: one of {allowed}")
    acc = np.asarray(acc)
    if acc.shape != (WARPGROUP, n // 2) or acc.dtype != np.float32:
        raise MmaOperandError(f"accumulator fragments of {acc.dtype} {acc.shape}: m64n{n}.f32 holds float32 "
                              f"[{WARPGROUP}, {n // 2}] (thread x register)")
    a = read_operand(a_smem, operand_addresses(desc_a, MMA_M, trans_a), dtype, "A")
    b = read_operand(b_smem, operand_addresses(desc_b, n, trans_b), dtype, "B")
    prod = ((scale_a * a.astype(np.float64)) @ (scale_b * b.astype(np.float64)).T).astype(np.float32)
    rows, cols = np.meshgrid(np.arange(MMA_M), np.arange(n), indexing="ij")
    thread, reg = fragment_slot(rows, cols, n)
    out = acc.copy() if scale_d else np.zeros_like(acc)
    out[thread, reg] += prod
    return out


def fragments_to_matrix(acc: np.ndarray, n: int) -> np.ndarray:
    """The [64, N] accumulator tile that fragments [128, N/2] hold."""
    rows, cols = np.meshgrid(np.arange(MMA_M), np.arange(check_n(n)), indexing="ij")
    thread, reg = fragment_slot(rows, cols, n)
    return np.asarray(acc)[thread, reg]
