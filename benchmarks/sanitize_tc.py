"""matmul_tc variants launched once each against numpy, small and ragged, for compute-sanitizer:

    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_tc.py "dict(stages=4, store_swizzle=True)" ...

Each argument is the keyword arguments of one variant (warp-specialized with registers 40/232 unless it
says ``warp_specialize=False``); prints OK or WRONG per variant and shape, exit status 1 on any WRONG."""
from __future__ import annotations

import ast
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES = ((129, 264, 200), (300, 520, 136))


def main(argv: list[str]) -> int:
    from cbrules import api
    from cbrules.kernels import KERNELS
    spec, wrong = KERNELS["matmul_tc"], False
    for text in argv:
        call = ast.parse(text, mode="eval").body
        kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        kw = {"warp_specialize": True, "registers": (40, 232), **kw}
        if not kw["warp_specialize"]:
            kw.pop("registers")
        ck = api.compile(spec.factory(**kw))
        for shape in SHAPES:
            args = spec.make_inputs(shape, np.random.default_rng(0), "bfloat16")
            want = spec.expected(args)["c"]
            bound = ck.bind(**args)
            bound.arrays["c"].fill_bytes(0xFF)  # poisoned: an element nobody writes shows up
            bound.launch()
            bound.finish()
            ok = np.allclose(args["c"].astype(np.float64), want, *spec.tolerances(shape, "bfloat16"))
            wrong |= not ok
            print(f"{text} {shape} {'OK' if ok else 'WRONG'}", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
