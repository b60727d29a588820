"""Run one built-in kernel once on the GPU and say which output elements differ from numpy (rows and
columns), e.g. under a compute-sanitizer tool:

    compute-sanitizer --tool memcheck python3 benchmarks/probe_elements.py persistent 512,2048 bfloat16 2
    compute-sanitizer --tool racecheck python3 benchmarks/probe_elements.py inner_reduction 257,5000 bfloat16 3 rows=4
    compute-sanitizer --tool synccheck python3 benchmarks/probe_elements.py persistent 300,32768 bfloat16 2 \
        width=16384 threads=512 box=256 one_box=true walk=132 warp_specialize=true

(build parameters after the stage count, NAME=INTEGER, NAME=true|false or NAME=WORD).
"""
from __future__ import annotations

import inspect
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _value(text: str, word: bool = False):
    """A build parameter from the command line: the text itself where the parameter takes a word
    (``word``: its default is text, e.g. ``stats=stable``), else true / false or a whole number."""
    if word:
        return text
    return {"true": True, "false": False}[text] if text in ("true", "false") else int(text)


def main(argv: list[str]) -> int:
    from cbrules import api
    from cbrules.kernels import KERNELS

    name, shape, dtype, stages = argv[0], tuple(int(s) for s in argv[1].split(",")), argv[2], int(argv[3])
    spec = KERNELS[name]
    defaults = {k: p.default for k, p in inspect.signature(spec.factory).parameters.items()}
    params = {k: _value(v, isinstance(defaults.get(k), str)) for k, v in (kv.split("=") for kv in argv[4:])}
    ck = api.compile(spec.build(shape, stages=stages, dtype=dtype, **params))
    args = spec.make_inputs(shape, np.random.default_rng(0), dtype)
    want = spec.expected(args)
    bound = ck.bind(**args)
    for o in spec.outputs:  # poisoned: an element nobody writes shows up
        bound.arrays[o].fill_bytes(0xFF)
    bound.launch()
    bound.finish()
    rtol, atol = spec.tolerances(shape, dtype)
    bad_any = False
    for o in spec.outputs:
        got = args[o].astype(np.float64)
        bad = ~np.isclose(got, want[o], rtol=rtol, atol=atol)
        print(f"{name} {shape} {dtype} S={stages} {params} {o}: {int(bad.sum())} of {bad.size} elements differ")
        if bad.any() and bad.ndim == 2:
            rows, cols = np.unique(np.nonzero(bad)[0]), np.unique(np.nonzero(bad)[1])
            print(f"  rows ({len(rows)}): {rows[:12].tolist()}  columns ({len(cols)}): {cols[:12].tolist()}")
        bad_any |= bool(bad.any())
    return 1 if bad_any else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
