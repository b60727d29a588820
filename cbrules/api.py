"""The pipeline in one place: build -> lower (rules) -> schedule -> codegen -> compile -> launch, and the CPU check."""
from __future__ import annotations

import os
from typing import Optional, Sequence, Union

from .rewrite import engine, rulefile
from .ir import option_schema
from .ir.builder import Kernel
from .ir.graph import KernelGraph
from .schedule import Step, schedule

KernelLike = Union[Kernel, KernelGraph]
RulesLike = Union[None, rulefile.RuleSet, Sequence[Union[str, os.PathLike]]]


def _graph(kernel: KernelLike) -> KernelGraph:
    return kernel.graph if isinstance(kernel, Kernel) else kernel


def load_rules(rules: RulesLike = None) -> rulefile.RuleSet:
    """A rule set: given as is, or loaded from the shipped folder, ``$CBRULES_RULES`` and the
    extra folders in ``rules``."""
    return rulefile.rule_set(rules)


def debug_default() -> bool:
    """Debug mode is on when ``CBRULES_DEBUG`` is set to anything but 0/empty."""
    return os.environ.get("CBRULES_DEBUG", "") not in ("", "0")


def lower(kernel: KernelLike, *, rules: RulesLike = None, debug: Optional[bool] = None,
          stop_after: Optional[int] = None, stop_after_phase: Optional[str] = None,
          time_limit: Optional[float] = engine.DEFAULT_TIME_LIMIT) -> KernelGraph:
    """The lowered kernel graph (the input is never modified). With ``debug`` (or
    ``CBRULES_DEBUG=1``) the returned graph's ``trace`` holds every rule application.
    ``time_limit`` bounds the lowering in seconds (None: no limit); past it, or when a rule keeps
    firing, lowering ends in a :class:`cbrules.rewrite.engine.LoweringError`. ``stop_after`` (a step) and
    ``stop_after_phase`` (a phase name) stop early, for debugging."""
    debug = debug_default() if debug is None else debug
    result = engine.lower(_graph(kernel), load_rules(rules), debug=debug, stop_after=stop_after,
                          time_limit=time_limit, stop_after_phase=stop_after_phase)
    result.graph.trace = result.trace
    return result.graph


def program(kernel: KernelLike, **lower_options) -> Step:
    """The lowered kernel as a linear program."""
    return schedule(lower(kernel, **lower_options))


def generate(kernel: KernelLike, annotate: bool = False, **lower_options):
    """CUDA source of the lowered kernel (a :class:`cbrules.codegen.cuda.KernelSource`)."""
    from .codegen.cuda import emit
    return emit(program(kernel, **lower_options), annotate=annotate)


def compile(kernel: KernelLike, *, annotate: bool = False, options: Sequence[str] = (),
            cache_dir: Optional[str] = None, **lower_options):
    """Lower, generate and NVRTC-compile; returns a launchable :class:`cbrules.codegen.launch.CompiledKernel`."""
    return compile_lowered(lower(kernel, **lower_options), annotate=annotate, options=options, cache_dir=cache_dir)


def compile_lowered(kg: KernelGraph, *, annotate: bool = False, options: Sequence[str] = (),
                    cache_dir: Optional[str] = None):
    """Generate and NVRTC-compile a graph :func:`lower` returned (without lowering it again)."""
    from .codegen.cuda import emit
    from .codegen.launch import CompiledKernel
    from .codegen.nvrtc import compile_cuda
    src = emit(schedule(kg), annotate=annotate)
    return CompiledKernel(src, compile_cuda(src.text, src.name, options=options, cache_dir=cache_dir))


def ptx(kernel: KernelLike, *, annotate: bool = False, options: Sequence[str] = (), **lower_options) -> str:
    """Lower, generate and NVRTC-compile to PTX for compute_90a; returns the PTX text."""
    from .codegen.nvrtc import compile_ptx
    src = generate(kernel, annotate=annotate, **lower_options)
    return compile_ptx(src.text, src.name, options=options)


def check(kernel, inputs=None, reference=None, *, trips=None, outputs: Optional[Sequence[str]] = None,
          tolerance: tuple = (1e-5, 1e-6), stages=None, prefetch: Optional[int] = None, war: Optional[str] = None,
          warp_specialize: bool = False, registers: Optional[tuple] = None, dtype: str = "float32",
          tma_store: bool = False, swizzle: str = "none", sample: bool = False, seed: int = 0,
          rules: RulesLike = None, on_case=None):
    """Check a kernel's lowering on the CPU, as ``cbrules check`` does: lower it, interpret the lowered
    kernel with the barrier-protocol checks on, interpret the kernel before lowering on the same inputs,
    and compare the two with each other and with ``reference``. No GPU is used. Returns a
    :class:`cbrules.check.CheckReport` (``.ok``, ``.cases``, ``.failures``; ``str()`` is the table);
    a failing kernel is reported there, not raised.

    ``kernel`` is a :class:`Kernel` you built, a built-in kernel's name (``"single_dim"``) or the path
    of a kernel file.

    For a :class:`Kernel`, ``inputs`` is the launch arguments (``{name: numpy array or scalar}``,
    outputs included: fill them with NaN), or a function ``inputs(trips)`` returning the arguments of
    a problem whose circular-buffered loop runs ``trips`` times; then every trip count in ``trips``
    runs (default ``0 .. 4*S``, S the loop's stages; trip count 0 caps the loop at 0 iterations and is
    compared with the kernel before lowering only). ``reference`` is ``reference(inputs) -> {output:
    array}`` (or that dict), numpy's answer; without it the lowered kernel is compared with the kernel
    before lowering only. ``outputs`` defaults to every tensor the kernel writes; ``tolerance`` is
    ``(rtol, atol)``. The kernel's own ``circular_buffer(...)`` says how it is pipelined.

    For a name or a kernel file, inputs, reference, outputs and tolerances are the kernel's own;
    ``stages`` (default: the options schema's, 3), ``prefetch``, ``war``, ``warp_specialize``, ``registers``, ``dtype``,
    ``tma_store`` and ``swizzle`` build it as the command line's options do, and ``trips`` defaults
    to ``0 .. 4*S``.

    ``sample``: interpret a sample of the blocks only; ``rules``: extra rule folders (or a rule set);
    ``on_case(result)`` is called as each case finishes. A case that runs past the interpreter's
    statement budget (``InterpBudgetError``) ends the run: the larger trip counts would too, and the
    report's ``skipped`` says how many were not run."""
    from .check import CheckReport, Checker, trip_counts
    from .reference.interp import InterpBudgetError
    spec, default_trips, stages, built = _check_spec(kernel, inputs, reference, outputs, tolerance, stages,
                                              {"prefetch": prefetch, "war": war, "registers": registers,
                                               "warp_specialize": warp_specialize or None})
    checker = Checker(blocks="sample" if sample else None, seed=seed, dtype=dtype, tma_store=tma_store,
                      swizzle=swizzle, rules=load_rules(rules))
    if trips is None:
        trips = default_trips if default_trips is not None else trip_counts(stages)
    cases = []
    trips = [None] if trips == [None] else [int(t) for t in trips]
    for i, t in enumerate(trips):
        r = checker.check(spec, t, stages, prefetch, war, shape=spec.default_shape if t is None else None,
                          warp_specialize=bool(warp_specialize), registers=registers)
        if built and spec.outputs:  # a Kernel's "shape" is the case's trip count: show its first output's
            r.shape = tuple(getattr(checker.inputs(spec, r.shape)[spec.outputs[0]], "shape", ()))
        cases.append(r)
        if on_case is not None:
            on_case(r)
        if r.code == InterpBudgetError.code:
            return CheckReport(spec.name, cases, skipped=len(trips) - i - 1)
    return CheckReport(spec.name, cases)


def _check_spec(kernel, inputs, reference, outputs, tolerance, stages, options: dict):
    """(KernelSpec, trips or None, stages, whether it wraps a Kernel) for :func:`check`."""
    import dataclasses

    from .kernels.specs import KernelSpec
    if isinstance(kernel, (str, os.PathLike)):
        from .kernelfile import load_kernel
        kernel = load_kernel(os.fspath(kernel))
    if isinstance(kernel, KernelSpec):
        if inputs is not None or reference is not None or outputs is not None:
            raise TypeError(f"check({kernel.name!r}): a built-in kernel or kernel file brings its own inputs, "
                            "reference and outputs; build a Kernel to check it with yours")
        if kernel.inputs is None or not kernel.outputs or (kernel.reference is None):
            raise ValueError(f"{kernel.name}: checking needs inputs(shape, rng), reference(inputs) and OUTPUTS")
        stages = option_schema.default("stages") if stages is None else stages
        if stages == "auto":
            raise ValueError("check(stages='auto'): the checker runs trip counts around a given S; give a number")
        one_case = [None] if kernel.shape_for_trips is None else None
        return kernel, one_case, stages, False
    if not isinstance(kernel, Kernel):
        raise TypeError(f"check() takes a Kernel, a built-in kernel's name or a kernel file's path, "
                        f"not {type(kernel).__name__}")
    given = [k for k, v in dict(options, stages=stages).items() if v is not None]
    if given:
        raise TypeError(f"check(Kernel): {', '.join(given)} belong to the kernel itself; pass them to "
                        "circular_buffer(...) when building it")
    if inputs is None:
        raise TypeError("check(Kernel) needs inputs: the launch arguments, or inputs(trips) returning them")
    params = kernel.graph.params()
    outputs = tuple(outputs) if outputs is not None else tuple(
        n for n, p in params.items() if p.kind == "tensor" and p.written)
    want = reference if reference is None or callable(reference) else (lambda _args, r=reference: dict(r))
    fresh = lambda args: {k: v.copy() if hasattr(v, "copy") else v for k, v in args.items()}  # noqa: E731
    cb = [n for n in kernel.graph.nodes("for") if "circular_buffer" in (kernel.graph[n].get("annotations") or {})]
    most = max((s for n in cb if isinstance(s := kernel.graph[n]["annotations"]["circular_buffer"].get("stages"),
                                              int)), default=4)
    spec = KernelSpec(kernel.graph.kernel()["name"], "", lambda **_: kernel, None, want, outputs, (0,),
                      tolerance=lambda s: tuple(tolerance), pipelined=False)
    if callable(inputs):  # the trip count is the case's "shape"
        spec = dataclasses.replace(spec, inputs=lambda shape, rng: fresh(inputs(shape[0])),
                                   shape_for_trips=lambda t: (t,))
        trips = None
    else:
        spec = dataclasses.replace(spec, inputs=lambda shape, rng: fresh(inputs))
        trips = [None]
    return spec, trips, most, True
