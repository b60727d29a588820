"""The Triton peer of benchmarks/attention.py: a FlashAttention forward in Triton (online softmax in the
exp2 domain, both products on the tensor cores through ``tl.dot``), over contiguous ``[B, H, L, D]``
bfloat16/float16 tensors; causal is top-left aligned as torch's ``is_causal``.

Key tiles that no mask cuts run in a loop without masks; the tiles a mask may cut (the diagonal's when
causal, the ragged last one) in a second loop with them. ``triton.autotune`` picks the tile and pipeline
per (D, causal) among a few configurations usual on Hopper.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634

CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=s, num_warps=w)
           for bm, bn, s, w in ((128, 64, 3, 8), (128, 128, 2, 8), (64, 64, 3, 4))]


def _prune(configs, named_args, **kwargs):
    """At D = 256 a 128 x 128 score tile beside the 128 x 256 output spills: keep the 64-key tiles."""
    d = kwargs.get("D", named_args.get("D"))
    return [c for c in configs if d < 256 or c.kwargs["BLOCK_N"] == 64]


@triton.jit
def _tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, start, offs_m, offs_n, L, qk_scale,
          MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """One key tile from ``start``: S = Q K^T, the online softmax update, O += P V."""
    k = tl.load(k_ptrs, mask=(start + offs_n)[None, :] < L, other=0.0) if MASKED else tl.load(k_ptrs)
    s = tl.dot(q, k) * qk_scale
    if MASKED:
        keep = (start + offs_n)[None, :] < L
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= (start + offs_n)[None, :])
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row that has kept no key yet: exponents stay -inf (weight 0), not -inf - -inf
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_ptrs, mask=(start + offs_n)[:, None] < L, other=0.0) if MASKED else tl.load(v_ptrs)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.autotune(configs=CONFIGS, key=["L", "D", "CAUSAL"], prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _attention_fwd(Q, K, V, O, L, qk_scale, D: tl.constexpr, CAUSAL: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    base = bh.to(tl.int64) * L * D
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=offs_m[:, None] < L, other=0.0)
    k_ptrs = K + base + offs_n[None, :] * D + offs_d[:, None]  # K^T: [D, BLOCK_N]
    v_ptrs = V + base + offs_n[:, None] * D + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, L) if CAUSAL else L
    # tiles wholly below the diagonal and inside the keys need no mask
    clear = (tl.minimum(pid_m * BLOCK_M, L) if CAUSAL else L) // BLOCK_N * BLOCK_N
    for start in range(0, clear, BLOCK_N):
        acc, l_i, m_i = _tile(acc, l_i, m_i, q, k_ptrs + start * D, v_ptrs + start * D, start, offs_m, offs_n,
                              L, qk_scale, False, CAUSAL)
    for start in range(clear, hi, BLOCK_N):
        acc, l_i, m_i = _tile(acc, l_i, m_i, q, k_ptrs + start * D, v_ptrs + start * D, start, offs_m, offs_n,
                              L, qk_scale, True, CAUSAL)
    out = acc / l_i[:, None]
    tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], out.to(O.dtype.element_ty), mask=offs_m[:, None] < L)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None) -> torch.Tensor:
    """softmax(scale * q k^T) v over contiguous [B, H, L, D] tensors (self-attention: one L)."""
    b, h, length, d = q.shape
    assert k.shape == v.shape == q.shape and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    o = torch.empty_like(q)
    scale = 1.0 / math.sqrt(d) if scale is None else scale

    def grid(meta):
        return (triton.cdiv(length, meta["BLOCK_M"]), b * h)
    _attention_fwd[grid](q, k, v, o, length, scale * LOG2E, D=d, CAUSAL=causal)
    return o
