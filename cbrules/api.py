"""The pipeline in one place: build -> lower (rules) -> schedule -> codegen -> compile -> launch."""
from __future__ import annotations

import os
from typing import Optional, Sequence, Union

from .rewrite import engine, rulefile
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
    if isinstance(rules, rulefile.RuleSet):
        return rules
    return rulefile.load(rulefile.rule_dirs(rules or ()))


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
