"""Triton peers of the generated kernels, with the same loop structure: the same grid and tile as the
cbrules kernel, and the loop the rules circular-buffer written as ``tl.range(..., num_stages=S)``.

``variants(op, shape, t)`` lists (label, stages, launch) for the harness; ``t`` holds the torch tensors.
Offsets are computed in int64 so that 32768 x 32768 tensors cannot overflow.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .ops import OPS, TRITON_STAGES


@triton.jit
def _exp_or_add(x_ptr, y_ptr, out_ptr, offs, mask, ADD: tl.constexpr):
    x = tl.load(x_ptr + offs, mask=mask)
    if ADD:
        v = x + tl.load(y_ptr + offs, mask=mask)
    else:
        v = tl.exp(x.to(tl.float32))  # a no-op for float32; Triton's exp takes no bfloat16
    tl.store(out_ptr + offs, v, mask=mask)


@triton.jit
def _pointwise2d(x_ptr, y_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 STAGES: tl.constexpr, ADD: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows[:, None] < M
    base = rows[:, None].to(tl.int64) * N
    for j in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        cols = j + tl.arange(0, BLOCK_N)
        mask = rmask & (cols[None, :] < N)
        offs = base + cols[None, :]
        _exp_or_add(x_ptr, y_ptr, out_ptr, offs, mask, ADD)


@triton.jit
def _pointwise_runs(x_ptr, y_ptr, out_ptr, M, N, WIDTH: tl.constexpr, PER_BLOCK: tl.constexpr,
                    STAGES: tl.constexpr, ADD: tl.constexpr):
    """The generated kernels' tiling: each program takes PER_BLOCK consecutive one-row tiles of
    WIDTH columns in row-major tile order."""
    across = tl.cdiv(N, WIDTH)
    for j in tl.range(0, PER_BLOCK, num_stages=STAGES):
        t = tl.program_id(0) * PER_BLOCK + j
        row = t // across
        cols = (t % across) * WIDTH + tl.arange(0, WIDTH)
        mask = (cols < N) & (row < M)
        offs = row.to(tl.int64) * N + cols
        _exp_or_add(x_ptr, y_ptr, out_ptr, offs, mask, ADD)


@triton.jit
def _inner_sum(x_ptr, out_ptr, M, N, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0)
    base = row.to(tl.int64) * N
    acc = tl.zeros([BLOCK_N], tl.float32)
    for j in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        cols = j + tl.arange(0, BLOCK_N)
        acc += tl.load(x_ptr + base + cols, mask=cols < N, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


@triton.jit
def _outer_sum(x_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for i in tl.range(0, M, BLOCK_M, num_stages=STAGES):
        rows = i + tl.arange(0, BLOCK_M)
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        acc += tl.load(x_ptr + offs, mask=(rows[:, None] < M) & cmask[None, :], other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def _normalize_loop(x_ptr, out_ptr, M, N, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    """Two passes over the row (the second re-reads it, mostly from L2): sum and sum of squares,
    then normalise."""
    row = tl.program_id(0)
    base = row.to(tl.int64) * N
    s1 = tl.zeros([BLOCK_N], tl.float32)
    s2 = tl.zeros([BLOCK_N], tl.float32)
    for j in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        cols = j + tl.arange(0, BLOCK_N)
        v = tl.load(x_ptr + base + cols, mask=cols < N, other=0.0)
        s1 += v
        s2 += v * v
    mean = tl.sum(s1, axis=0) / N
    rstd = 1.0 / tl.sqrt(tl.sum(s2, axis=0) / N - mean * mean)
    for j in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        cols = j + tl.arange(0, BLOCK_N)
        v = tl.load(x_ptr + base + cols, mask=cols < N, other=0.0)
        tl.store(out_ptr + base + cols, (v - mean) * rstd, mask=cols < N)


@triton.jit
def _normalize_row(x_ptr, out_ptr, M, N, BLOCK_N: tl.constexpr):
    """The whole row in registers (no loop): the usual Triton normalisation."""
    row = tl.program_id(0)
    base = row.to(tl.int64) * N
    cols = tl.arange(0, BLOCK_N)
    v = tl.load(x_ptr + base + cols, mask=cols < N, other=0.0).to(tl.float32)  # bfloat16 sums in float32
    mean = tl.sum(v, axis=0) / N
    d = tl.where(cols < N, v - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / N)
    tl.store(out_ptr + base + cols, d * rstd, mask=cols < N)


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            STAGES: tl.constexpr):
    rm = tl.program_id(1) * BM + tl.arange(0, BM)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k in tl.range(0, K, BK, num_stages=STAGES):
        kk = k + rk
        a = tl.load(a_ptr + rm[:, None].to(tl.int64) * K + kk[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None].to(tl.int64) * N + rn[None, :],
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    c_offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(c_ptr + c_offs, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def variants(op: str, shape: tuple, t: dict) -> list:
    """[(label, stages, launch)]: one per num_stages in TRITON_STAGES (and tile, for some ops)."""
    out = []
    for s in TRITON_STAGES:
        if op in ("exp", "add"):
            m, n = shape
            y = t["y"] if op == "add" else t["x"]

            def f(s=s, m=m, n=n, y=y):
                _pointwise2d[(_cdiv(m, 4),)](t["x"], y, t["out"], m, n, BLOCK_M=4, BLOCK_N=256, STAGES=s,
                                            ADD=op == "add", num_warps=8)
            out.append((f"4x256 tile, S={s}", s, f))
            _, params = OPS[op].generated(shape)  # the tiling the generated kernel uses
            w, per = params["width"], params["per_block"]

            def g(s=s, m=m, n=n, y=y, w=w, per=per):
                _pointwise_runs[(_cdiv(m * _cdiv(n, w), per),)](t["x"], y, t["out"], m, n, WIDTH=w, PER_BLOCK=per,
                                                                STAGES=s, ADD=op == "add", num_warps=8)
            out.append((f"{per} tiles 1x{w} a program, S={s}", s, g))
        elif op == "inner_sum":
            m, n = shape
            for bn in (256, OPS[op].params["width"]):
                def f(s=s, m=m, n=n, bn=bn):
                    _inner_sum[(m,)](t["x"], t["out"], m, n, BLOCK_N=bn, STAGES=s, num_warps=8)
                out.append((f"1x{bn} tile, S={s}", s, f))
        elif op == "outer_sum":
            m, n = shape
            for bm, bn in ((8, 256), (OPS[op].params["rows"], OPS[op].params["cols"])):
                def f(s=s, m=m, n=n, bm=bm, bn=bn):
                    _outer_sum[(_cdiv(n, bn),)](t["x"], t["out"], m, n, BLOCK_M=bm, BLOCK_N=bn, STAGES=s,
                                                num_warps=8)
                out.append((f"{bm}x{bn} tile, S={s}", s, f))
        elif op == "normalize":
            m, n = shape
            for bn in (256, 4096):
                def f(s=s, m=m, n=n, bn=bn):
                    _normalize_loop[(m,)](t["x"], t["out"], m, n, BLOCK_N=bn, STAGES=s, num_warps=8)
                out.append((f"2-pass loop 1x{bn}, S={s}", s, f))
        elif op == "matmul":
            m, n, k = shape
            for bm, bn, bk in ((64, 64, 16), (128, 128, 32)):
                def f(s=s, m=m, n=n, k=k, bm=bm, bn=bn, bk=bk):
                    _matmul[(_cdiv(n, bn), _cdiv(m, bm))](t["a"], t["b"], t["c"], m, n, k, BM=bm, BN=bn, BK=bk,
                                                          STAGES=s, num_warps=8)
                out.append((f"{bm}x{bn}x{bk}, S={s}", s, f))
    if op == "normalize" and shape[1] <= 32768:
        m, n = shape
        block = triton.next_power_of_2(n)

        def f(m=m, n=n, block=block):
            _normalize_row[(m,)](t["x"], t["out"], m, n, BLOCK_N=block, num_warps=16)
        out.append(("row in registers, no loop", None, f))
    return out
