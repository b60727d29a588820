"""``cbrules check``: the CPU checker over trip counts 0..4S, one table row as each finishes, with a
progress line on a terminal."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Optional

from .errors import CbrulesError, CliError
from .ir.limits import MAX_CHECK_STAGES

if TYPE_CHECKING:
    from .kernels.specs import KernelSpec

from .cli_kernel import _dtype, _file_options, _lower_options, _warp_options, load_spec


def cmd_check(a) -> int:
    stages = a.stages if a.stages is not None else 3
    if stages == "auto":
        raise CliError("check --stages auto: the checker runs trip counts around a given S; give a number "
                       "(`cbrules lower KERNEL --stages auto` shows the S the rules choose)")
    if not 1 <= stages <= MAX_CHECK_STAGES:
        raise CliError(f"check --stages {stages}: the checker runs 4*S trip counts, so it takes 1 <= S <= "
                       f"{MAX_CHECK_STAGES} (the rules themselves refuse S < 2 with a named error)")
    from .check import TABLE_HEADER, Checker, table_row, trip_counts
    from .kernels import KERNELS
    from .reference.interp import SCHEDULES
    spec = load_spec(a)
    kernel_file = getattr(spec, "takes", None) is not None
    if kernel_file:
        missing = [w for w, have in (("inputs(shape, rng)", spec.inputs), ("reference(inputs)", spec.reference),
                                     ("OUTPUTS", spec.outputs)) if not have]
        if missing:
            raise CliError(f"{a.kernel}: `cbrules check` compares the lowered kernel with the unlowered one and with "
                           f"reference(); the kernel file must define {', '.join(missing)}")
        _file_options(a, spec)
    elif not spec.pipelined or spec.shape_for_trips is None:
        raise CliError(f"{spec.name}: `cbrules check` needs a built-in circular-buffered kernel with small "
                       "shapes for the CPU checker (one of: " + ", ".join(
                           n for n, s in sorted(KERNELS.items()) if s.pipelined and s.shape_for_trips) + "), "
                       "or a kernel file defining inputs, reference and OUTPUTS")
    ws = _warp_options(a)
    asked = " ".join(f"--{k} {v}" for k, v in (("stages", a.stages), ("prefetch", a.prefetch), ("war", a.war),
                                                ("registers", a.registers), ("dtype", a.dtype),
                                                ("swizzle", a.swizzle), ("b-layout", a.b_layout),
                                                ("epilogue", a.epilogue), ("head-dim", a.head_dim),
                                                ("scale", a.scale)) if v is not None)
    asked += (" --warp-specialize" if ws["warp_specialize"] else "") + (" --tma-store" if a.tma_store else "")
    asked += (" --causal" if a.causal else "") + (" --lse" if a.lse else "")
    roles = f"; roles under schedules {', '.join(SCHEDULES)}" if ws["warp_specialize"] else ""
    # a kernel file without shape_for_trips(trips): one case, at its SHAPE
    trips = trip_counts(stages) if spec.shape_for_trips is not None else [None]
    cases = (f"trip counts 0..{4 * stages}" if trips != [None]
             else f"shape {'x'.join(map(str, spec.default_shape))} (define shape_for_trips(trips) for every trip count)")
    print(f"{spec.name}: options given: {asked.strip() or 'none'}; {cases}, "
          f"{'a sample of' if a.sample else 'all'} blocks{roles}; lowered vs before lowering vs numpy, "
          "protocol checked")
    checker = Checker(blocks="sample" if a.sample else None, dtype=_dtype(a, spec), tma_store=a.tma_store,
                      swizzle=a.swizzle or "none", **_lower_options(a))
    print(_check_options(spec, checker, stages, a.prefetch, a.war, ws))
    print(TABLE_HEADER, flush=True)
    results = []
    for i, t in enumerate(trips):
        _progress(f"check {spec.name}: trip count {t} ({i + 1}/{len(trips)}) ...")
        results.append(checker.check(spec, t, stages, a.prefetch, a.war, warp_specialize=bool(ws["warp_specialize"]),
                                     registers=ws["registers"], shape=None if t is not None else spec.default_shape))
        _progress("")
        print(table_row(results[-1]), flush=True)  # each row as it finishes: a long check shows it is alive
    failed = [r for r in results if not r.ok]
    print(f"{len(results)} {'trip counts' if trips != [None] else 'case'}: {len(results) - len(failed)} ok, "
          f"{len(failed)} failed")
    return 1 if failed else 0


def _progress(text: str) -> None:
    """A progress line on a terminal's stderr, overwritten by the next (nothing when stderr is a file or pipe)."""
    try:
        if sys.stderr.isatty():
            sys.stderr.write("\r" + text.ljust(79)[:79] + ("" if text else "\r"))
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _check_options(spec: KernelSpec, checker, stages: int, prefetch: Optional[int], war: Optional[str],
                   ws: dict) -> str:
    """The effective options of the case with trip count S (the defaults filled in by the rules)."""
    from . import api, options
    trips = stages
    shape = spec.shape_for_trips(trips) if spec.shape_for_trips is not None else spec.default_shape
    built = spec.build(shape, trips=trips, stages=stages, prefetch=prefetch, war=war,
                       dtype=checker.dtype, tma_store=checker.tma_store, swizzle=checker.swizzle, **ws)
    try:
        kg = api.lower(built, rules=checker.lower_options["rules"])
    except CbrulesError as e:
        return f"effective options: unknown, lowering with trip count {trips} fails ({type(e).__name__})"
    return options.describe(kg, built.graph)
