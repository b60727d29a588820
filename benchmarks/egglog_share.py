"""egglog's share of a cold lowering (CPU only): for each built-in kernel, the process CPU seconds
of ``engine.lower`` with egglog's result cache emptied, and of its egglog step
(``simplifier.simplify_terms``: renaming, encoding, saturation, extraction) within it.

    python3 benchmarks/egglog_share.py [--repeat 7] [--out benchmarks/results/egglog_share.json]

Best of ``--repeat`` runs after one warm-up lowering (imports, egglog's rule file loaded once per
process): on a shared machine the minimum is the figure least stretched by other work. The
``provably-*`` guards' answers stay cached between runs, as they do within one process.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measure(repeat: int) -> list[dict]:
    from cbrules import api
    from cbrules.kernels import KERNELS
    from cbrules.rewrite import engine, simplifier

    rules = api.load_rules()
    api.lower(KERNELS["single_dim"].build(stages=3))  # warm-up
    spent = [0.0]

    def timed(*args, **kwargs):
        t0 = time.process_time()
        try:
            return simplifier.simplify_terms(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - t0

    rows = []
    engine.simplify_terms = timed
    try:
        for name, spec in KERNELS.items():
            g = spec.build(spec.default_shape).graph
            runs = []
            for _ in range(repeat):
                engine._SIMPLIFIED.clear()
                spent[0] = 0.0
                t0 = time.process_time()
                engine.lower(g, rules)
                runs.append((time.process_time() - t0, spent[0]))
            lower, egglog = min(runs)
            rows.append({"kernel": name, "lower_cpu_s": lower, "egglog_cpu_s": egglog})
            print(f"  {name:20s} lower {lower * 1e3:6.1f} ms, egglog {egglog * 1e3:5.1f} ms "
                  f"({egglog / lower:.0%})", flush=True)
    finally:
        engine.simplify_terms = simplifier.simplify_terms
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--out", help="write the rows as JSON here")
    a = p.parse_args(argv)
    rows = measure(a.repeat)
    print(f"median lower {statistics.median(r['lower_cpu_s'] for r in rows) * 1e3:.1f} ms")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
