"""Lower one synthetic kernel once, for an instruction count: on a shared machine CPU seconds of the
same lowering move by a quarter within an hour, while the instructions it runs do not, so an engine
change is compared by them (under cachegrind, with hashing fixed and the modules compiled first).

    python3 -m compileall -q cbrules benchmarks
    PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
        python3 benchmarks/lower_once.py "many loops" 2000            # everything
    ... python3 benchmarks/lower_once.py "many loops" 2000 --skip     # all but the measured lowering

The lowering's instructions are the first count less the second (imports, reading the rules, a warm-up
lowering and building the kernel are in both).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.compile_times import synthetic  # noqa: E402
from cbrules import api  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("family", choices=("many loops", "long body"))
    ap.add_argument("nodes", type=int)
    ap.add_argument("--skip", action="store_true", help="build the kernel but do not lower it")
    args = ap.parse_args()
    rules = api.load_rules()
    api.lower(synthetic(args.family, 100))  # warm-up: egglog's start-up, the rules' compiled forms
    kernel = synthetic(args.family, args.nodes)
    if not args.skip:
        api.lower(kernel, rules=rules, time_limit=None)


if __name__ == "__main__":
    main()
