"""Differential checking on the CPU: a lowered kernel against the kernel before lowering and numpy.

For a built-in kernel, stage count S, prefetch P and WAR mode, :meth:`Checker.check` takes a small
problem whose circular-buffered loop runs ``trips`` times, lowers the kernel, interprets it with
the protocol checks on, interprets the unlowered kernel on the same inputs and compares both with
the kernel's numpy reference. Every trip count runs, those below S and 0 included (the rules
predicate the prologue's loads past the end). No tensor of positive extents makes a seed kernel's
loop run 0 times, so trip count 0 caps the loop's stop at ``min(stop, 0)`` (still symbolic where
the stop is) in both the lowered and the unlowered kernel, which are compared with each other
(numpy's answer is for the whole loop). A warp-specialized loop's roles run under every schedule
of :data:`cbrules.reference.interp.SCHEDULES`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .ir.bind import BlocksLike, LaunchError
from .ir.terms import call, const
from .rewrite import engine, rulefile
from .rewrite.engine import LoweringError
from . import options
from .errors import CbrulesError
from .reference.interp import SCHEDULES, Program, prepare, run
from .kernels import KernelSpec
from .ir.limits import MAX_CHECK_STAGES, TmaLimitError
from .reference.hazards import InterpError

# the code of the refusal of a trip count below S with strict_trip_count: the rule's
# (fail :code short-loop ...) at lowering time, the kernel's `requires` entry with that code at launch
SHORT_LOOP = "short-loop"


def _zero_trips(kernel):
    """``kernel`` with the stop of each circular-buffered loop capped at ``min(stop, 0)``: a run of
    0 iterations that stays symbolic where the stop is (a copy; the kernel is not changed)."""
    kg = kernel.graph.copy()
    for n in kg.nodes("for"):
        if "circular_buffer" in (kg[n].get("annotations") or {}):
            stop = kg[n]["stop"]
            kg[n]["stop"] = const(0) if stop.op == "const" else call("min", stop, 0)
    return kg


class CheckLimitError(CbrulesError, ValueError):
    """More stages than the checker runs (:data:`MAX_CHECK_STAGES`)."""


@dataclass
class CaseResult:
    """The outcome of one (kernel, options, trip count) case."""

    kernel: str
    stages: int
    prefetch: Optional[int]
    war: Optional[str]  # None: the rules' default
    trips: Optional[int]  # None: the trip count of ``shape`` (a kernel file without shape_for_trips)
    shape: tuple
    status: str  # "ok", "refused" (the expected named error) or "FAIL"
    detail: str = ""
    code: Optional[str] = None  # the code of the refusal (LoweringError / LaunchError ``code``)
    err_numpy: Optional[float] = None
    err_unlowered: Optional[float] = None
    seconds: float = 0.0
    warp_specialize: bool = False
    registers: Optional[tuple] = None
    tolerance: Optional[tuple] = None  # (rtol, atol) the outputs were compared with

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"


@dataclass
class CheckReport:
    """What :func:`cbrules.api.check` found: one :class:`CaseResult` per trip count (or one case)."""

    kernel: str
    cases: list
    skipped: int = 0  # trip counts not run: a smaller one ran past the interpreter's budget

    @property
    def ok(self) -> bool:
        """True when no case failed (a lowering, a protocol check or a comparison)."""
        return all(c.ok for c in self.cases)

    @property
    def failures(self) -> list:
        return [c for c in self.cases if not c.ok]

    def __str__(self) -> str:
        return summary_table(self.cases) + "\n" + summary_line(self.cases)


def _max_err(a: np.ndarray, b: np.ndarray) -> float:
    both = ~(np.isnan(a) & np.isnan(b))
    if not both.any():
        return 0.0
    d = np.abs(a[both].astype(np.float64) - b[both].astype(np.float64))
    return float(np.nan_to_num(d, nan=np.inf).max())


def _spec_key(spec: KernelSpec) -> tuple:
    """What a cached case depends on: variants of one kernel (another factory or other inputs, e.g. the
    kn B layout of matmul_tc) share its name but not their kernels or inputs."""
    return spec.name, spec.factory, spec.inputs


class Checker:
    """Runs cases, caching lowered graphs, inputs and unlowered results between them."""

    def __init__(self, blocks: BlocksLike = None, seed: int = 0, dtype: str = "float32", tma_store: bool = False,
                 swizzle: str = "none", **lower_options):
        """``dtype``: the kernels' tensor type (inputs are rounded to it, tolerances follow it);
        ``tma_store``: lowered kernels write their output tiles by TMA store (the unlowered kernel, the
        reference, stores per thread); ``swizzle``: lowered kernels read swizzled input tiles;
        ``lower_options`` go to the rule engine's ``lower``
        (``rules=[folder]`` adds rule folders, ``time_limit`` bounds a lowering)."""
        self.blocks, self.seed, self.dtype, self.lower_options = blocks, seed, dtype, dict(lower_options)
        self.tma_store, self.swizzle = tma_store, swizzle
        # read the rule files once, not at every lowering
        self.lower_options["rules"] = rulefile.rule_set(self.lower_options.get("rules"))
        self.lower_options.pop("debug", None)  # no trace: the checker reads none
        self._lowered: dict = {}
        self._kernels: dict = {}  # id of a lowered program -> the kernel it was lowered from (to trace it again)
        self._inputs: dict = {}
        self._unlowered: dict = {}

    def lower(self, spec: KernelSpec, shape: tuple, trips: int, stages: int, prefetch: Optional[int],
              war: Optional[str], warp_specialize: bool = False, registers: Optional[tuple] = None) -> Program:
        """The lowered kernel of the case, ready to run (a :class:`LoweringError` is cached and raised
        again)."""
        built = trips if trips is None else max(trips, 1)  # trip count 0: the kernel of 1, capped at 0
        params = {**spec.build_params(tuple(shape)), **(spec.trips_params(built) if built is not None else {})}
        key = (_spec_key(spec), stages, prefetch, war, warp_specialize, registers, self.dtype, self.tma_store, self.swizzle,
               tuple(sorted(params.items())), trips == 0)
        ws = {"warp_specialize": True, "registers": registers} if warp_specialize else {"registers": registers}
        if key not in self._lowered:
            try:
                kernel = spec.build(shape, trips=built, stages=stages, prefetch=prefetch, war=war,
                                    dtype=self.dtype, tma_store=self.tma_store, swizzle=self.swizzle, **ws)
                graph = _zero_trips(kernel) if trips == 0 else kernel.graph
                self._lowered[key] = prepare(engine.lower(graph, **self.lower_options).graph)
                self._kernels[id(self._lowered[key])] = graph
            except (LoweringError, InterpError) as e:  # InterpError: a term the interpreter does not model
                self._lowered[key] = e
        got = self._lowered[key]
        if isinstance(got, Exception):
            raise got
        return got

    def inputs(self, spec: KernelSpec, shape: tuple) -> dict:
        key = (_spec_key(spec), tuple(shape))
        if key not in self._inputs:
            self._inputs[key] = spec.make_inputs(tuple(shape), np.random.default_rng(self.seed), self.dtype)
        return self._inputs[key]

    def unlowered(self, spec: KernelSpec, shape: tuple, trips: int) -> dict:
        """Outputs of the kernel before lowering (the same for every S, P and WAR mode)."""
        key = (_spec_key(spec), tuple(shape), trips)
        if key not in self._unlowered:
            kernel = spec.build(shape, trips=trips if trips is None else max(trips, 1), stages=2, dtype=self.dtype)
            with np.errstate(divide="ignore", invalid="ignore"):  # C float arithmetic: x/0 is inf, not an error
                self._unlowered[key] = run(_zero_trips(kernel) if trips == 0 else kernel, self.inputs(spec, shape),
                                           blocks=self.blocks)
        return self._unlowered[key]

    def check(self, spec: KernelSpec, trips: int, stages: int, prefetch: Optional[int] = None,
              war: Optional[str] = None, shape: Optional[tuple] = None, warp_specialize: bool = False,
              registers: Optional[tuple] = None) -> CaseResult:
        """Check one case; never raises for a failure of the kernel (see ``status``/``detail``).

        ``shape`` defaults to ``spec.shape_for_trips(trips)``; given, it must make the loop run
        ``trips`` times (``trips`` also sets the build parameters of ``spec.trips_params``).
        ``war`` None is the rules' default (the options schema's: sync, or mbarrier when warp-specialized;
        a rule folder's own where it sets one), as for any kernel built without it."""
        if shape is None and spec.shape_for_trips is None:
            raise ValueError(f"{spec.name}: no small shapes for the CPU checker (KernelSpec.shape_for_trips)")
        shape = tuple(shape if shape is not None else spec.shape_for_trips(max(trips, 1)))
        res = CaseResult(spec.name, stages, prefetch, war, trips, shape, "FAIL", warp_specialize=warp_specialize,
                         registers=registers)
        t0 = time.perf_counter()
        try:
            self._check(spec, res)
        finally:
            res.seconds = time.perf_counter() - t0
        return res

    def _check(self, spec: KernelSpec, res: CaseResult) -> None:
        # a trip count below S runs, predicated, unless the kernel asks strict_trip_count: then the short-loop
        # refusal (at lowering, or at launch for a trip count known only then) is the expected answer
        below = res.trips is not None and res.trips < res.stages
        try:
            kg = self.lower(spec, res.shape, res.trips, res.stages, res.prefetch, res.war, res.warp_specialize,
                            res.registers)
        except (LoweringError, InterpError) as e:
            refused = below and isinstance(e, LoweringError) and e.code == SHORT_LOOP
            res.status, res.detail = ("refused" if refused else "FAIL"), f"{type(e).__name__}: {e}"
            res.code = getattr(e, "code", None)
            return
        short = below and options.strict_trip_count(self._kernels[id(kg)])
        args = self.inputs(spec, res.shape)
        results = []
        for schedule in (SCHEDULES if res.warp_specialize else SCHEDULES[:1]):  # one role: one schedule
            partial: dict = {}
            try:
                with np.errstate(divide="ignore", invalid="ignore"):  # as above (a 0-trip loop's mean)
                    results.append(run(kg, args, blocks=self.blocks, schedule=schedule, seed=self.seed,
                                       partial=partial))
            except (LaunchError, TmaLimitError, InterpError) as e:
                refused = short and isinstance(e, LaunchError) and e.code == SHORT_LOOP
                where = f" (schedule {schedule})" if res.warp_specialize else ""
                res.status, res.detail = ("refused" if refused else "FAIL"), f"{type(e).__name__}{where}: {e}"
                res.code = getattr(e, "code", None)
                if isinstance(e, InterpError):  # point at the cause: the outputs so far, and the rules
                    res.detail += "".join("; " + c for c in self._causes(spec, res, kg, e, partial))
                return
        got = results[0]
        for other in results[1:]:  # every interleaving computes the same
            for name in spec.outputs:
                if not np.array_equal(got[name], other[name], equal_nan=True):
                    res.detail = f"{name} depends on the schedule of the roles (max difference " \
                                 f"{_max_err(got[name], other[name]):.3g})"
                    return
        if short:
            res.detail = (f"trip count {res.trips} < stages {res.stages} ran instead of being refused "
                          f"with code {SHORT_LOOP} (by the rules or the launch check)")
            return
        try:
            before = self.unlowered(spec, res.shape, res.trips)
        except (LaunchError, TmaLimitError, InterpError) as e:
            res.detail = f"the unlowered kernel fails: {type(e).__name__}: {e}"
            return
        res.tolerance = spec.tolerances(tuple(res.shape), self.dtype)
        problems, res.err_numpy, res.err_unlowered = compare(spec, res.shape, args, got, before,
                                                             sampled=self.blocks is not None, dtype=self.dtype,
                                                             numpy=res.trips != 0 and spec.reference is not None)
        res.status, res.detail = ("FAIL", "; ".join(problems)) if problems else ("ok", "")


    def _causes(self, spec: KernelSpec, res: CaseResult, kg: Program, e: InterpError, partial: dict) -> list[str]:
        """What points at the cause of a failed run: which output elements differ from numpy when it
        stopped, the rules the user's folders disable, and the sync nodes a user's rule erased."""
        out = []
        if res.trips != 0 and partial and spec.reference is not None:
            try:
                out += self._differences(spec, res, partial)
            except (ValueError, TypeError, KeyError):  # a reference whose outputs do not fit: the error says enough
                pass
        rules = self.lower_options.get("rules")
        if rules is not None and getattr(rules, "disabled", None):
            out.append("disabled by the rule folders: " + ", ".join(f"{n} ({p})" for n, p in rules.disabled.items()))
        out += self._erasures(kg, e)
        return out

    def _differences(self, spec: KernelSpec, res: CaseResult, partial: dict) -> list[str]:
        """Which elements of the outputs as a failed run left them differ from numpy."""
        out = []
        want = spec.expected(self.inputs(spec, res.shape))
        try:
            before = self.unlowered(spec, res.shape, res.trips) if self.blocks is not None else None
        except (LaunchError, TmaLimitError, InterpError):
            before = None
        rtol, atol = spec.tolerances(tuple(res.shape), self.dtype)
        for name in spec.outputs:
            if name not in partial:
                continue
            got, ref = (np.asarray(v).astype(np.float64) for v in (partial[name], want[name]))
            mask = ~np.isnan(np.asarray(before[name], np.float64)) if before is not None else np.ones(got.shape, bool)
            bad = mask & ~np.isclose(got, ref, rtol=rtol, atol=atol)
            res.err_numpy = max(res.err_numpy or 0.0, _max_err(got[mask], ref[mask]))
            if bad.any():
                unwritten = int((bad & np.isnan(got)).sum())
                out.append(f"vs numpy when it stopped: {name} differs at {int(bad.sum())} of {int(mask.sum())} "
                           f"elements ({unwritten} never written): {_runs(bad)}")
        return out

    def _erasures(self, kg: Program, e: InterpError) -> list[str]:
        """The sync nodes (of ``e``'s barrier, where it names one) that rules of the user's folders
        erased or moved, from a debug lowering of the same kernel: a missing wait or arrive, or one
        in a new place, is a likely cause."""
        from .ir.ops import OPS
        from .rewrite.rulefile import SHIPPED
        from .trace import graph_at
        import os
        kernel = self._kernels.get(id(kg))
        if kernel is None:
            return []
        try:
            trace = engine.lower(kernel, **{**self.lower_options, "debug": True}).trace
        except LoweringError:
            return []
        shipped = os.path.realpath(SHIPPED) + os.sep
        found = {"erased": [], "moved": []}
        for r in trace.records:
            rule = trace.rules.get(r.rule)
            if not (r.erased or r.moved) or rule is None or os.path.realpath(rule.pos.file).startswith(shipped):
                continue
            # an erased node is seen in the graph before its step, a moved one in its new place after it
            for what, nodes, g in (("erased", r.erased, graph_at(trace, r.step - 1) if r.erased else None),
                                   ("moved", r.moved, graph_at(trace, r.step) if r.moved else None)):
                for n in nodes:
                    if n in g and OPS[g.op(n)].category == "sync" and \
                            (e.barrier is None or g[n].get("barrier") in (None, e.barrier)):
                        where = f" (now in {g.describe(g.parent(n)).split(' [')[0]})" if what == "moved" else ""
                        found[what].append(f"rule {r.rule} @ {r.at} {what} {g.describe(n).split(' [')[0]}"
                                           f"{where} at step {r.step}")
        return [f"{what} by a rule of yours (a likely cause): {'; '.join(f[:3])}" for what, f in found.items() if f]


def _runs(bad: np.ndarray) -> str:
    """The differing elements as runs of flat indices (at most three), e.g. ``elements 1792..2047``."""
    flat = np.flatnonzero(bad.reshape(-1))
    runs, start = [], flat[0]
    for a, b in zip(flat, flat[1:]):
        if b != a + 1:
            runs.append((start, a))
            start = b
    runs.append((start, flat[-1]))
    shown = ", ".join(f"{lo}..{hi}" if hi > lo else f"{lo}" for lo, hi in runs[:3])
    return f"flat elements {shown}" + (f" and {len(runs) - 3} more runs" if len(runs) > 3 else "") \
        + (f" of shape {tuple(bad.shape)}" if bad.ndim > 1 else "")


def compare(spec: KernelSpec, shape: tuple, args: dict, got: dict, before: dict,
            sampled: bool = False, dtype: str = "float32", numpy: bool = True) -> tuple[list[str], float, float]:
    """(problems, max error vs numpy, max error vs the unlowered kernel) of the lowered outputs.

    With ``sampled`` (a sample of blocks ran) only the elements the unlowered kernel wrote (the
    outputs start as NaN) are compared with numpy; without ``numpy`` (a loop capped at 0 trips) only
    the unlowered kernel is.
    """
    want = spec.expected(args) if numpy else before
    rtol, atol = spec.tolerances(tuple(shape), dtype)
    problems: list[str] = []
    err_numpy = err_before = 0.0
    for name in spec.outputs:
        # half-precision outputs compared in float64 (bfloat16 has no numpy arithmetic of its own)
        lo, un, ref = (np.asarray(v).astype(np.float64) for v in (got[name], before[name], want[name]))
        err_before = max(err_before, _max_err(lo, un))
        if not np.allclose(lo, un, rtol=rtol, atol=atol, equal_nan=True):
            problems.append(f"{name} differs from the unlowered kernel (max error {_max_err(lo, un):.3g})")
        if not numpy:
            continue
        written = ~np.isnan(un) if sampled else np.ones(un.shape, bool)
        err_numpy = max(err_numpy, _max_err(lo[written], ref[written]))
        if not np.allclose(lo[written], ref[written], rtol=rtol, atol=atol):
            problems.append(f"{name} differs from numpy (max error {_max_err(lo[written], ref[written]):.3g})")
    return problems, (err_numpy if numpy else None), err_before


def trip_counts(stages: int) -> range:
    """Every trip count the checker tries for ``stages``: 0 .. 4*S (S at most :data:`MAX_CHECK_STAGES`)."""
    if not 1 <= stages <= MAX_CHECK_STAGES:
        raise CheckLimitError(f"the checker takes 1 <= stages <= {MAX_CHECK_STAGES} (4*S trip counts, each "
                              f"interpreted on the CPU), got {stages}")
    return range(0, 4 * stages + 1)


# errors: the largest absolute difference over every element of the outputs, in the outputs' own units
TABLE_HEADER = (f"{'trips':>5}  {'shape':<12} {'result':<8} {'|err| numpy':>11} {'|err| before':>12} "
                f"{'rtol, atol':>15} {'time':>7}  detail")
TABLE_NOTE = ("|err|: the largest absolute difference of any output element from numpy's answer and from the "
              "kernel before lowering; a case passes where every element is within atol + rtol * |expected|")


def table_row(r: CaseResult) -> str:
    """One trip count's line of the results table (under :data:`TABLE_HEADER`)."""
    fmt = lambda x: "-" if x is None else f"{x:.2g}"  # noqa: E731
    tol = "-" if r.tolerance is None else f"{r.tolerance[0]:.2g}, {r.tolerance[1]:.2g}"
    return (f"{'-' if r.trips is None else r.trips:>5}  {'x'.join(map(str, r.shape)):<12} {r.status:<8} "
            f"{fmt(r.err_numpy):>11} {fmt(r.err_unlowered):>12} {tol:>15} {r.seconds:>6.2f}s  {r.detail}")


def summary_table(results: list[CaseResult]) -> str:
    """The results as a fixed-width table, one line per trip count."""
    return "\n".join([TABLE_HEADER, *(table_row(r) for r in results)])


def summary_line(results: list[CaseResult]) -> str:
    """``N trip counts: K ok, F failed`` (``case`` for one case without a trip count)."""
    failed = sum(not r.ok for r in results)
    what = "case" if len(results) == 1 and results[0].trips is None else "trip counts"
    return f"{len(results)} {what}: {len(results) - failed} ok, {failed} failed"
