"""Causal sliding-window attention: each query q attends to the keys [q - WINDOW + 1, q] only. A kernel
file built from the built-in attention kernel's pieces (cbrules/kernels/attention.py, docs/attention.md):

    cbrules check examples/sliding_window_attention.py --stages 2          # CPU: vs numpy, protocol checked
    cbrules compile examples/sliding_window_attention.py --warp-specialize
    cbrules run examples/sliding_window_attention.py --shape 16,8192,8192  # H200: vs numpy

Two hooks change the kernel: ``key_blocks`` makes a query tile walk only the key tiles its window reaches
(from the tile holding key row0 - WINDOW + 1 up to the causal bound: the loop stays a circular-buffered
loop from 0, over the key tiles ``first + t``), and ``mask_mod`` sends the keys below a row's window to
-inf, on the tiles the window's lower edge cuts (``partial``) besides the causal diagonal's.
"""
import numpy as np

from cbrules.ir.terms import call
from cbrules.kernels.attention import BM, BN, attention
from cbrules.kernels.specs import attention_reference

WINDOW = 160  # keys a query sees, itself included (not a multiple of a tile: the edge cuts tiles)
HEAD_DIM = 64
SHAPE = (1, 400, 400)  # (BH, Lq, Lk): the CPU check's problem; --shape for larger ones
OUTPUTS = ("o",)
DTYPES = ("bfloat16", "float16")  # the tensor cores' types; bfloat16 unless --dtype float16
TOLERANCE = (2e-3, 1.5e-2)  # P rounded to bfloat16 before P @ V, o stored in bfloat16


def key_blocks(row0, key_tiles):
    """(first, stop, partial): the key tiles of the query rows [row0, row0 + BM) and which the window cuts."""
    first = call("max", row0 - (WINDOW - 1), 0) / BN
    return first, key_tiles, lambda key0: key0.lt(row0 + BM - WINDOW)  # some row's window starts past key0


def in_window(e):
    """Keep key e.col for query e.row: at most WINDOW - 1 keys back (causal cuts the keys ahead)."""
    return e.col.gt(e.row - WINDOW)


def build(stages=2, prefetch=None, war=None, warp_specialize=False, dtype="bfloat16"):
    """The kernel; the command line passes --stages, --prefetch, --war, --warp-specialize and --dtype."""
    return attention(stages=stages, prefetch=prefetch, war=war, warp_specialize=warp_specialize, dtype=dtype,
                     head_dim=HEAD_DIM, causal=True, mask_mod=in_window, key_blocks=key_blocks)


def inputs(shape, rng):
    """q, k, v [BH, L, D] (standard normal) and a NaN-poisoned o."""
    bh, lq, lk = shape
    args = {n: rng.standard_normal((bh, length, HEAD_DIM), dtype=np.float32)
            for n, length in (("q", lq), ("k", lk), ("v", lk))}
    args["o"] = np.full((bh, lq, HEAD_DIM), np.nan, np.float32)
    return args


def reference(args):
    """numpy's answer (float64): causal attention with the keys more than WINDOW - 1 back masked too."""
    lq, lk = args["q"].shape[1], args["k"].shape[1]
    far = np.arange(lk)[None, :] <= np.arange(lq)[:, None] - WINDOW
    o, _ = attention_reference(args["q"], args["k"], args["v"], HEAD_DIM ** -0.5, True, masked=far)
    return {"o": o}
