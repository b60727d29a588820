"""``cbrules check``: the CPU checker over trip counts 0..4S, one table row as each finishes, with a
progress line on a terminal."""
from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Optional

from .errors import CbrulesError, CliError
from .ir import option_schema
from .ir.limits import MAX_CHECK_STAGES

if TYPE_CHECKING:
    from .kernels.specs import KernelSpec

from .cli_kernel import dtype_of, file_options, lowering_options, warp_options, load_spec
from .cli_progress import Task


def cmd_check(a) -> int:
    stages = a.stages if a.stages is not None else option_schema.default("stages")
    if stages == "auto":
        raise CliError("check --stages auto: the checker runs trip counts around a given S; give a number "
                       "(`cbrules lower KERNEL --stages auto` shows the S the rules choose)")
    if not 1 <= stages <= MAX_CHECK_STAGES:
        raise CliError(f"check --stages {stages}: the checker runs 4*S trip counts, so it takes 1 <= S <= "
                       f"{MAX_CHECK_STAGES} (the rules themselves refuse S < 2 with a named error)")
    from . import api
    from .check import TABLE_HEADER, TABLE_NOTE, summary_line, table_row, trip_counts
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
        file_options(a, spec)
    elif not spec.pipelined or spec.shape_for_trips is None:
        raise CliError(f"{spec.name}: `cbrules check` needs a built-in circular-buffered kernel with small "
                       "shapes for the CPU checker (one of: " + ", ".join(
                           n for n, s in sorted(KERNELS.items()) if s.pipelined and s.shape_for_trips) + "), "
                       "or a kernel file defining inputs, reference and OUTPUTS")
    ws = warp_options(a)
    shape = _check_shape(a, spec)
    asked = " ".join(f"--{k} {v}" for k, v in (("stages", a.stages), ("prefetch", a.prefetch), ("war", a.war),
                                                ("registers", a.registers), ("dtype", a.dtype),
                                                ("swizzle", a.swizzle), ("b-layout", a.b_layout),
                                                ("epilogue", a.epilogue), ("scaling", a.scaling),
                                                ("head-dim", a.head_dim), ("scale", a.scale),
                                                ("persistent", a.persistent)) if v is not None)
    asked += (" --warp-specialize" if ws["warp_specialize"] else "") + (" --tma-store" if a.tma_store else "")
    asked += (" --causal" if a.causal else "") + (" --lse" if a.lse else "")
    asked += " --pingpong" if a.pingpong else ""
    roles = f"; roles under schedules {', '.join(SCHEDULES)}" if ws["warp_specialize"] else ""
    # one case at a shape: --shape, or a kernel file without shape_for_trips(trips) at its SHAPE
    trips = [None] if shape is not None or spec.shape_for_trips is None else trip_counts(stages)
    if trips == [None]:
        shape = shape or spec.default_shape
        spec = dataclasses.replace(spec, default_shape=shape)
        cases = f"shape {'x'.join(map(str, shape))}" + ("" if a.shape else
                                                         " (define shape_for_trips(trips) for every trip count)")
    else:
        cases = f"trip counts 0..{4 * stages}"
    print(f"{spec.name}: options given: {asked.strip() or 'none'}; {cases}, "
          f"{'a sample of' if a.sample else 'all'} blocks{roles}; lowered vs before lowering vs numpy, "
          "protocol checked")
    options = dict(dtype=dtype_of(a, spec), tma_store=a.tma_store, swizzle=a.swizzle or "none")
    rules = api.load_rules(lowering_options(a)["rules"])
    print(_check_options(spec, rules, stages, a.prefetch, a.war, ws, **options))
    print(TABLE_NOTE)
    print(TABLE_HEADER, flush=True)
    done = []

    def row(r) -> None:
        _progress("")
        Task.now = ""
        print(table_row(r), flush=True)  # each row as it finishes: a long check shows it is alive
        done.append(r)
        if len(done) < len(trips):
            _at(len(done))

    def _at(i: int) -> None:
        _progress(f"check {spec.name}: trip count {trips[i]} ({i + 1}/{len(trips)}) ...")
        Task.now = f"trip count {trips[i]} ({i + 1}/{len(trips)})"

    _at(0)
    report = api.check(spec, trips=trips, stages=stages, prefetch=a.prefetch, war=a.war,
                       warp_specialize=bool(ws["warp_specialize"]), registers=ws["registers"],
                       sample=a.sample, rules=rules, on_case=row, **options)
    if report.skipped:
        print(f"stopped: trip count {report.cases[-1].trips} ran past the interpreter's budget; the "
              f"{report.skipped} larger trip counts are not run")
    print(summary_line(report.cases))
    return 0 if report.ok else 1


def _check_shape(a, spec: KernelSpec) -> Optional[tuple]:
    """``--shape``: one case at that shape (its loop's trip count follows from it), else None."""
    if not getattr(a, "shape", None):
        return None
    from .cli_kernel import shape_of
    return shape_of(a, spec)


def _progress(text: str) -> None:
    """A progress line on a terminal's stderr, overwritten by the next (nothing when stderr is a file or pipe)."""
    try:
        if sys.stderr.isatty():
            sys.stderr.write("\r" + text.ljust(79)[:79] + ("" if text else "\r"))
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _check_options(spec: KernelSpec, rules, stages: int, prefetch: Optional[int], war: Optional[str],
                   ws: dict, dtype: str, tma_store: bool, swizzle: str) -> str:
    """The effective options of the case with trip count S (the defaults filled in by the rules)."""
    from . import api, options
    trips = stages
    shape = spec.shape_for_trips(trips) if spec.shape_for_trips is not None else spec.default_shape
    built = spec.build(shape, trips=trips, stages=stages, prefetch=prefetch, war=war,
                       dtype=dtype, tma_store=tma_store, swizzle=swizzle, **ws)
    try:
        kg = api.lower(built, rules=rules)
    except CbrulesError as e:
        return f"effective options: unknown, lowering with trip count {trips} fails ({type(e).__name__})"
    return options.describe(kg, built.graph)
