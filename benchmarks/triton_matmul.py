"""The Triton peer of matmul_tc: a persistent bfloat16/float16 matmul ``c = a @ b^T`` (b given [N, K], like
matmul_tc) reading its tiles through TMA tensor descriptors, tiles taken in groups of GROUP_M tile rows
(L2 reuse), autotuned over the usual Hopper configurations (tile 128x128 / 128x256 / 256x128, BK 64 / 128,
3-5 stages, 4 or 8 warps). Needs torch and Triton >= 3.4 (host-side TensorDescriptor)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


def _configs() -> list:
    out = []
    for bm, bn, bk, stages, warps in ((128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (256, 128, 64, 3, 8),
                                      (256, 128, 64, 4, 8), (128, 128, 64, 4, 4), (128, 128, 64, 5, 8),
                                      (128, 128, 128, 3, 8), (128, 256, 128, 2, 8), (64, 256, 64, 4, 4)):
        out.append(triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8}, num_stages=stages, num_warps=warps,
                                 pre_hook=_set_blocks))
    return out


def _set_blocks(nargs: dict) -> None:
    """The descriptors' block shapes follow the configuration being tried."""
    bm, bn, bk = nargs["BM"], nargs["BN"], nargs["BK"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk]
    nargs["c_desc"].block_shape = [bm, bn]


@triton.autotune(configs=_configs(), key=["M", "N", "K"])
@triton.jit
def _matmul_persistent(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    per_group = GROUP_M * tiles_n
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_SMS, flatten=True):
        first = (tile // per_group) * GROUP_M
        rows = min(tiles_m - first, GROUP_M)
        pm = first + (tile % per_group) % rows
        pn = (tile % per_group) // rows
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kk in range(k_tiles):
            a = a_desc.load([pm * BM, kk * BK])
            b = b_desc.load([pn * BN, kk * BK])
            acc = tl.dot(a, b.T, acc)
        c_desc.store([pm * BM, pn * BN], acc.to(c_desc.dtype))


def matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """``c = a @ b^T`` with a [M, K], b [N, K], c [M, N] (contiguous, bfloat16 or float16)."""
    m, k = a.shape
    n = b.shape[0]
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    dummy = [1, 1]  # replaced by the configuration's blocks (pre_hook)
    a_desc = TensorDescriptor.from_tensor(a, dummy)
    b_desc = TensorDescriptor.from_tensor(b, dummy)
    c_desc = TensorDescriptor.from_tensor(c, dummy)

    def grid(meta):
        return (min(sms, triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"])),)

    _matmul_persistent[grid](a_desc, b_desc, c_desc, m, n, k, NUM_SMS=sms)


def best_config() -> str:
    """The configuration the autotuner chose last, as text."""
    c = _matmul_persistent.best_config
    return f"{c.kwargs['BM']}x{c.kwargs['BN']}x{c.kwargs['BK']} S={c.num_stages} warps={c.num_warps}"
