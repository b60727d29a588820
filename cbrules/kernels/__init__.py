"""Built-in kernels, each with a way to make inputs and a numpy reference.

``get(name)`` looks one up; an unknown name is an error that lists the known ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..builder import Kernel
from .exp1d import exp1d_tma


@dataclass(frozen=True)
class KernelSpec:
    """A named kernel: how to build it, make inputs of a given size, and compute the answer."""

    name: str
    doc: str
    build: Callable[[], Kernel]
    inputs: Callable[[int, np.random.Generator], dict]
    reference: Callable[[dict], dict]
    outputs: tuple[str, ...]
    default_size: int
    rtol: float = 1e-5
    atol: float = 1e-6


def _exp_inputs(n: int, rng: np.random.Generator) -> dict:
    return {"x": rng.standard_normal(n, dtype=np.float32), "out": np.full(n, np.nan, np.float32)}


KERNELS: dict[str, KernelSpec] = {
    s.name: s for s in [
        KernelSpec("exp1d_tma", "out = exp(x), 1-D, one TMA tile of 256 per iteration under one mbarrier "
                   "(hand-built, no rules)", exp1d_tma, _exp_inputs,
                   lambda a: {"out": np.exp(a["x"])}, ("out",), 1 << 20),
    ]
}


class UnknownKernelError(KeyError):
    """A kernel name that is not built in."""

    def __str__(self) -> str:
        return self.args[0]


def get(name: str) -> KernelSpec:
    """The built-in kernel called ``name``."""
    if name not in KERNELS:
        raise UnknownKernelError(f"unknown kernel {name!r}; known kernels: {', '.join(sorted(KERNELS))}")
    return KERNELS[name]
