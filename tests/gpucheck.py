"""The GPU tests' one way to run a compiled kernel: outputs poisoned, launched, compared with numpy."""
from __future__ import annotations

import numpy as np


def poisoned_launch(ck, args: dict, outputs) -> None:
    """Launch ``ck`` on ``args`` with every output first filled with 0xFF bytes (NaN in every float
    type: an element the kernel does not write stays NaN); the outputs are back in ``args``."""
    bound = ck.bind(**args)
    for out in outputs:
        bound.arrays[out].fill_bytes(0xFF)
    bound.launch()
    bound.finish()


def unwritten_or_not_finite(args: dict, outputs, shape) -> list[str]:
    """One line for each output of ``args`` holding a NaN or an infinity (after :func:`poisoned_launch`:
    an element not written, or a value that overflowed)."""
    failures = []
    for out in outputs:
        got = np.asarray(args[out]).astype(np.float64)
        bad = np.argwhere(~np.isfinite(got))
        if len(bad):
            failures.append(f"shape {shape}: {out} has {len(bad)} elements not written or not finite, first "
                            f"{bad[0].tolist()}: {got[tuple(bad[0])]}")
    return failures


def poisoned_run(ck, args: dict, want: dict, outputs, rtol: float, atol: float, shape) -> list[str]:
    """:func:`poisoned_launch` (an element the kernel does not write cannot pass), then compare each output
    with ``want``; returns one line per output that differs."""
    poisoned_launch(ck, args, outputs)
    failures = []
    for out in outputs:
        got = np.asarray(args[out]).astype(np.float64)
        if not np.allclose(got, want[out], rtol=rtol, atol=atol):
            bad = np.argwhere(~np.isclose(got, want[out], rtol=rtol, atol=atol))
            failures.append(f"shape {shape}: {out} differs at {len(bad)} elements, first {bad[0].tolist()}: "
                            f"{got[tuple(bad[0])]} vs {want[out][tuple(bad[0])]} (max |error| "
                            f"{np.nanmax(np.abs(got - want[out])):.3g}, max |want| {np.nanmax(np.abs(want[out])):.3g})")
    return failures


def matmul_data(shape, dtype: str, cache={}):
    """(a [M, K], b [K, N], float64 a @ b) of one seed per shape, in ``dtype`` (bfloat16, float16), shared
    by the tests that run matmul_tc on the same data (each layout, each variant)."""
    import ml_dtypes
    key = (shape, dtype)
    if key not in cache:
        m, n, kk = shape
        rng = np.random.default_rng(sum(shape))
        np_dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
        a = rng.standard_normal((m, kk), dtype=np.float32).astype(np_dtype)
        b = rng.standard_normal((kk, n), dtype=np.float32).astype(np_dtype)
        cache[key] = a, b, a.astype(np.float64) @ b.astype(np.float64)
    return cache[key]
