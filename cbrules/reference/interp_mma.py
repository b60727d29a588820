"""Warpgroup MMA on the CPU: one ``wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}`` from
shared-memory bytes (:func:`wgmma`), which the interpreter's handlers of the ``mma`` node and the
wgmma ordering ops (cbrules/reference/interp.py) run.

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

from ..ir.mma_layout import (K_STEP_BYTES, MMA_DTYPES, MMA_K, MMA_M, WARPGROUP, MatrixDescriptor, MmaLayoutError,
                             check_n, fp8_operand_slot, fragment_slot, k_step, operand_address)
from ..ir.ops import DTYPE_BYTES
from .hazards import InterpError
from .interp_memory import saturated

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
    uint32, ``lo`` in the low half. FP8 (``cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32``): the pair saturated
    to the largest finite value and packed into the low 16 bits, ``lo`` in the low byte."""
    size = DTYPE_BYTES[dtype]
    if size == 1:
        bits = [_fp8_bits(v, dtype) for v in (lo, hi)]
        return bits[0] | (bits[1] << 8)
    bits = [np.asarray(v, np.float32).astype(_STORAGE[dtype]).view(np.uint16).astype(np.uint32) for v in (lo, hi)]
    return bits[0] | (bits[1] << 16)


def _fp8_bits(v, dtype: str) -> np.ndarray:
    """``v`` rounded to nearest even to an FP8 ``dtype``, saturated as a store is (satfinite: NaN stays
    NaN), as uint32 bits."""
    return np.asarray(saturated(v, np.dtype(_STORAGE[dtype]))).view(np.uint8).astype(np.uint32)


def register_operand(packed: np.ndarray, dtype: str) -> np.ndarray:
    """The A tile [64, K] (float32) that packed registers [128, K/4] of a warp group hold: packed register i
    is the pair (2i, 2i+1) of an m64nK float32 accumulator fragment (REFERENCE §8: the A fragment of
    m64k16 has the thread/row map of 16 accumulator columns), low half first."""
    packed = np.asarray(packed)
    if packed.ndim != 2 or packed.shape[0] != WARPGROUP or packed.dtype != np.uint32:
        raise MmaOperandError(f"register operand of {packed.dtype} {packed.shape}: a warp group holds uint32 "
                              f"[{WARPGROUP}, K/4] (FP8: [{WARPGROUP}, K/8])")
    if DTYPE_BYTES.get(dtype) == 1:
        return _fp8_register_operand(packed, dtype)
    k = check_n(4 * packed.shape[1])
    halves = np.stack([packed & 0xFFFF, packed >> 16], axis=-1).astype(np.uint16).reshape(WARPGROUP, k // 2)
    rows, cols = np.meshgrid(np.arange(MMA_M), np.arange(k), indexing="ij")
    thread, reg = fragment_slot(rows, cols, k)
    return halves[thread, reg].view(_STORAGE[dtype]).astype(np.float32)


def _fp8_register_operand(packed: np.ndarray, dtype: str) -> np.ndarray:
    """The FP8 A tile [64, K] of packed registers [128, K/8]: four registers a k32 step
    (:func:`cbrules.ir.mma_layout.fp8_operand_slot`)."""
    if packed.shape[1] % 4:
        raise MmaOperandError(f"FP8 register operand of {packed.shape[1]} registers a thread: a k32 step takes 4")
    rows, cols = np.meshgrid(np.arange(MMA_M), np.arange(K_STEP_BYTES), indexing="ij")
    thread, reg, byte = fp8_operand_slot(rows, cols)
    steps = []
    for s in range(packed.shape[1] // 4):
        bits = (packed[thread, 4 * s + reg] >> (8 * byte).astype(np.uint32)) & 0xFF
        steps.append(bits.astype(np.uint8).view(_STORAGE[dtype]).astype(np.float32))
    return np.concatenate(steps, axis=1)


def wgmma_register_a(acc: np.ndarray, a_regs: np.ndarray, b_smem: np.ndarray, desc_b: Descriptor, *, n: int,
                     dtype: str, scale_d: int, trans_b: int = 0) -> np.ndarray:
    """:func:`wgmma` with A from registers (``wgmma.mma_async ... {a0..a3}, descB``): ``a_regs`` are the
    warp group's four packed registers a thread, [128, 4]; ``trans_b`` B's transpose immediate."""
    n = check_n(n)
    if scale_d not in (0, 1):
        raise MmaOperandError(f"wgmma scale-d = {scale_d!r}: one of (0, 1)")
    a = register_operand(a_regs, dtype)
    if a.shape != (MMA_M, k_step(dtype)):
        raise MmaOperandError(f"register operand of {a_regs.shape[1]} registers a thread: one k{k_step(dtype)} "
                              "step takes 4")
    if trans_b and k_step(dtype) != MMA_K:
        raise MmaOperandError(f"wgmma with an {dtype} B and transpose immediate 1: FP8 operands are K-major")
    b = read_operand(b_smem, operand_addresses(desc_b, n, trans_b, dtype), dtype, "B")
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
