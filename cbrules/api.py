"""The pipeline in one place: build -> lower -> schedule -> codegen -> compile -> launch."""
from __future__ import annotations

from typing import Optional, Sequence, Union

from .builder import Kernel
from .graph import KernelGraph
from .schedule import Step, schedule

KernelLike = Union[Kernel, KernelGraph]


def _graph(kernel: KernelLike) -> KernelGraph:
    return kernel.graph if isinstance(kernel, Kernel) else kernel


def lower(kernel: KernelLike) -> KernelGraph:
    """The lowered kernel graph (a verified copy; the input is never modified)."""
    kg = _graph(kernel).copy()
    kg.verify()
    return kg


def program(kernel: KernelLike) -> Step:
    """The lowered kernel as a linear program."""
    return schedule(lower(kernel))


def generate(kernel: KernelLike, annotate: bool = False):
    """CUDA source of the lowered kernel (a :class:`codegen.cuda.KernelSource`)."""
    from codegen.cuda import emit
    return emit(program(kernel), annotate=annotate)


def compile(kernel: KernelLike, *, annotate: bool = False, options: Sequence[str] = (),
            cache_dir: Optional[str] = None):
    """Lower, generate and NVRTC-compile; returns a launchable :class:`codegen.launch.CompiledKernel`."""
    from codegen.launch import CompiledKernel
    from codegen.nvrtc import compile_cuda
    src = generate(kernel, annotate=annotate)
    return CompiledKernel(src, compile_cuda(src.text, src.name, options=options, cache_dir=cache_dir))
