"""Bind user arrays to a compiled kernel's parameters and launch it.

Symbols (tensor extents) are read off the arrays' shapes and checked for consistency; tensor maps
are encoded from the bound tensors and their boxes; the grid is evaluated from its terms. Numpy
inputs are copied to the device and written tensors copied back; device arrays (torch, cupy,
DLPack) are used in place.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import numpy as np

from cbrules.bind import LaunchError, bind_symbols, check_arguments, check_dtype
from cbrules.terms import evaluate

from . import runtime, tma
from .cuda import KernelSource
from .nvrtc import Cubin



__all__ = ["BoundLaunch", "CompiledKernel", "LaunchError"]  # LaunchError lives in cbrules.bind

@dataclass
class BoundLaunch:
    """A kernel with every parameter bound: ``launch()`` may be called repeatedly (benchmarks)."""

    fn: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: list
    arrays: dict[str, Any]
    copy_back: dict[str, np.ndarray] = field(default_factory=dict)
    symbols: dict[str, int] = field(default_factory=dict)

    def launch(self) -> None:
        if self.grid[0] * self.grid[1] * self.grid[2] == 0:
            return  # an empty problem launches nothing
        self.fn.launch(self.grid, self.block, self.args, shared_bytes=self.shared_bytes)

    def finish(self) -> None:
        """Wait for the kernel and copy written tensors back into the caller's numpy arrays."""
        runtime.synchronize()
        for pname, host in self.copy_back.items():
            host[...] = self.arrays[pname].to_numpy().reshape(host.shape)


class CompiledKernel:
    """A compiled kernel ready to run: ``kernel(x=..., out=...)``."""

    def __init__(self, source: KernelSource, cubin: Cubin):
        self.source = source
        self.cubin = cubin
        self._module = None

    @property
    def name(self) -> str:
        return self.source.name

    def _function(self):
        if self._module is None:
            self._module = runtime.Module(self.cubin.cubin)
        return self._module.function(self.source.name)

    def bind_symbols(self, shapes: Mapping[str, tuple], given: Mapping[str, int]) -> dict[str, int]:
        """Infer every symbol from the tensors' shapes (or take it from ``given``) and check them
        and the kernel's ``requires`` (see :func:`cbrules.bind.bind_symbols`)."""
        return bind_symbols(self.name, self.source.params, self.source.requires, shapes, given)

    def bind(self, **kwargs: Any) -> BoundLaunch:
        """Bind arrays and symbols by parameter name; numpy arrays are copied to the device."""
        given = check_arguments(self.name, self.source.params, kwargs)
        arrays, copy_back = {}, {}
        for p in (p for p in self.source.params if p.kind == "tensor"):
            value = kwargs[p.name]
            if isinstance(value, np.ndarray):
                check_dtype(self.name, p, value.dtype)
                if p.written:
                    copy_back[p.name] = value
            arrays[p.name] = runtime.as_device_array(value)
            check_dtype(self.name, p, arrays[p.name].dtype)
        symbols = self.bind_symbols({n: a.shape for n, a in arrays.items()}, given)
        args = []
        for p in self.source.params:
            if p.kind == "tensor":
                args.append(("ptr", arrays[p.name].ptr))
            elif p.kind == "tmap":
                args.append(("tmap", tma.encode_tensor_map(p.name, arrays[p.tensor], p.box)))
            else:
                args.append(("i32", symbols[p.name]))
        grid = tuple(int(evaluate(g, symbols)) for g in self.source.grid)
        return BoundLaunch(self._function(), grid, self.source.block, self.source.shared_bytes, args,
                           arrays, copy_back, symbols)

    def __call__(self, **kwargs: Any) -> Optional[dict]:
        """Launch once and wait; written numpy arrays are updated in place."""
        bound = self.bind(**kwargs)
        bound.launch()
        bound.finish()
        return bound.symbols
