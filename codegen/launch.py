"""Bind user arrays to a compiled kernel's parameters and launch it.

Symbols (tensor extents) are read off the arrays' shapes and checked for consistency; tensor maps
are encoded from the bound tensors and their boxes; the grid is evaluated from its terms. Numpy
inputs are copied to the device and written tensors copied back; device arrays (torch, cupy,
DLPack) are used in place.

Every argument is checked before anything reaches the driver (values, shapes, layouts, tensor
maps, grid), so a refused launch is a :class:`LaunchError` (or a
:class:`cbrules.ir.limits.TmaLimitError`) on any machine, GPU or not.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

import numpy as np

from ..ir.bind import LaunchError, bind_symbols, check_arguments, check_dtype, launch_grid
from ..ir.tma_view import checked_view

from . import runtime, tma
from .cuda import KernelSource
from .errors import CodegenError, RegisterPoolError
from .nvrtc import Cubin
from .registers import pool_problem
from .runtime import DeviceArray

# LaunchError lives in cbrules.ir.bind; it is re-exported here for callers of the launcher
__all__ = ["BoundLaunch", "CompiledKernel", "LaunchError", "borrow", "check_layout"]

HostOrDevice = Union[np.ndarray, DeviceArray]
_SIGNATURES = 16  # launch signatures a compiled kernel keeps the symbols and grid of
_ARG_KINDS = {"int32": "i32", "int64": "i64", "uint32": "u32", "uint64": "u64", "float32": "f32", "float64": "f64"}


def borrow(kernel: str, param, value: Any) -> HostOrDevice:
    """``value`` for tensor ``param`` without touching the device: a numpy array as is (copied to
    the device later), anything else borrowed as a :class:`DeviceArray` (torch, cupy, DLPack,
    ``__cuda_array_interface__``); what cannot be borrowed is a LaunchError naming the argument."""
    if isinstance(value, np.ndarray):
        return value
    try:
        return runtime.as_device_array(value)  # borrowing reads the interface only: no driver call
    except (TypeError, ValueError, KeyError, CodegenError) as e:
        raise LaunchError(f"{kernel}: tensor {param.name!r} cannot be used ({e}); pass a numpy array or a "
                          "CUDA array on device 0 (torch, cupy or any DLPack / __cuda_array_interface__ "
                          "producer)") from None


def check_layout(kernel: str, param, array: HostOrDevice, vector_bytes: int = 0) -> None:
    """Refuse an argument the kernel cannot use in place.

    The generated kernel indexes every tensor as a dense C-order array of its dtype, so a borrowed
    device array must be C-contiguous (no slicing steps, transposes or negative strides), start at a
    non-NULL address aligned to its element size (to ``vector_bytes`` where the kernel moves that many
    bytes of it at once), and, if written, not be read-only. Such arrays are
    refused, never copied: a copy would be silently slow for inputs and cannot be written back
    transparently for outputs. Numpy arrays are always copied to fresh device memory, so any layout
    is fine; a written one must be writeable, as the result is copied back into it.
    """
    where = f"{kernel}: tensor {param.name!r}"
    # the checks below that look at the address are the ones a kept launch plan repeats (_TorchPlan)
    if isinstance(array, np.ndarray):
        if param.written and not array.flags.writeable:
            raise LaunchError(f"{where} is a read-only numpy array but the kernel writes it; pass a writeable "
                              "array (e.g. np.empty_like(...))")
        return
    layout = f"shape {array.shape}, strides {array.strides} bytes, {array.dtype}, address {array.ptr:#x}"
    if not array.ptr:
        raise LaunchError(f"{where} ({layout}) has a NULL data pointer; pass an allocated device array")
    if not array.is_contiguous:
        how = "reversed (negative strides)" if min(array.strides, default=0) < 0 else "strided"
        raise LaunchError(f"{where} ({layout}) is a {how} view, but the kernel indexes it as a dense C-order "
                          "array; pass x.contiguous() (torch) or cupy.ascontiguousarray(x) (arrays are not copied "
                          "implicitly)")
    if array.ptr % array.dtype.itemsize:
        raise LaunchError(f"{where} ({layout}) is not aligned to its {array.dtype.itemsize}-byte elements; pass "
                          "a copy in fresh memory (torch: x.clone(), cupy: x.copy())")
    if vector_bytes and array.ptr % vector_bytes:
        raise LaunchError(f"{where} ({layout}) is not {vector_bytes}-byte aligned, but the kernel accesses it "
                          f"{vector_bytes} bytes at a time; pass a copy in fresh memory (torch: x.clone(), cupy: "
                          "x.copy())")
    if param.written and array.readonly:
        raise LaunchError(f"{where} ({layout}) is marked read-only by its producer but the kernel writes it; "
                          "pass a writeable array")


def _check_tensor_map(param, array: HostOrDevice) -> None:
    """The TMA limits for ``param``'s tensor as it will be on the device: numpy arrays become fresh
    C-contiguous allocations (cuMemAlloc aligns to 256 bytes), borrowed arrays stay as they are."""
    if isinstance(array, np.ndarray):
        checked_view(param.name, array.shape, runtime.c_strides(array.shape, array.itemsize), array.itemsize, 0,
                     param.box, param.split)
    else:
        checked_view(param.name, array.shape, array.strides, array.dtype.itemsize, array.ptr, param.box, param.split)


@dataclass
class BoundLaunch:
    """A kernel with every parameter bound: ``launch()`` may be called repeatedly (timing loops)."""

    fn: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: list
    arrays: dict[str, Any]
    copy_back: dict[str, np.ndarray] = field(default_factory=dict)
    symbols: dict[str, int] = field(default_factory=dict)

    def launch(self, stream: Any = None) -> None:
        """Launch without waiting: on ``stream`` when given (a handle, a CUstream or a
        torch.cuda.Stream), else on torch's current stream when a tensor is torch's, else on the legacy
        default stream (:func:`cbrules.codegen.runtime.launch_stream`)."""
        if self.grid[0] * self.grid[1] * self.grid[2] == 0:
            return  # an empty problem launches nothing
        try:
            on = runtime.launch_stream(self.arrays.values(), stream)
        except TypeError as e:
            raise LaunchError(f"{self.fn.name}: {e}") from None
        self.fn.launch(self.grid, self.block, self.args, shared_bytes=self.shared_bytes, stream=on)

    def finish(self) -> None:
        """Wait for the kernel and copy written tensors back into the caller's numpy arrays."""
        runtime.synchronize()
        for pname, host in self.copy_back.items():
            host[...] = self.arrays[pname].to_numpy().reshape(host.shape)


def _torch_key(kwargs: Mapping[str, Any]) -> Optional[tuple]:
    """What a call's checks depend on besides the tensors' addresses, when every tensor argument is a
    torch tensor and every other argument a plain number (None otherwise; a plan is only kept for a
    call with torch tensors, so a key without one finds none)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    key = []
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            key.append((name, tuple(value.shape), value.stride(), value.dtype, value.device))
        elif type(value) in (int, float):
            key.append((name, type(value), value))
        else:
            return None
    return tuple(key)


def _three(dims) -> list[int]:
    return [int(d) for d in dims] + [1] * (3 - len(dims))


class _TorchPlan:
    """A checked launch with torch tensors, kept so that a call with tensors of the same layouts only
    writes their addresses into the packed arguments and launches (a row kernel's call cost 0.17 ms of
    host time through check and bind, twice the kernel). Each address is still checked against the
    alignments the first call's checks needed (element size, vector width, a tensor map's 16 bytes);
    one that fails sends the call through the full checks, which name it. Tensor maps hold their
    tensor's address, so they are encoded again when it changes (the last few kept)."""

    _MAPS = 8  # encoded tensor maps kept a plan

    def __init__(self, kernel: "CompiledKernel", bound: BoundLaunch):
        self.kernel = kernel
        self.fn = bound.fn
        self.grid, self.block = _three(bound.grid), _three(bound.block)
        self.shared_bytes = bound.shared_bytes
        self.symbols = dict(bound.symbols)
        self.packed = runtime.PackedArgs(bound.args)
        # the address checks of check_layout (not NULL, aligned to the element and to the kernel's vector
        # accesses) and of the tensor maps (16 bytes): the only ones that look at an address
        vectors = dict(kernel.source.aligned)
        params = kernel.source.params
        mapped = {p.tensor for p in params if p.kind == "tmap"}
        self.pointers = [(i, p.name, max(bound.arrays[p.name].dtype.itemsize, vectors.get(p.name, 0),
                                         16 if p.name in mapped else 1))
                         for i, p in enumerate(params) if p.kind == "tensor"]  # (argument, tensor, alignment)
        self.maps = [(i, p, p.tensor) for i, p in enumerate(params) if p.kind == "tmap"]
        first = {n: bound.arrays[n].ptr for _, n, _ in self.pointers}
        self.encoded = {(i, first[t]): bytes(bound.args[i][1]) for i, _, t in self.maps}
        self.lock = threading.Lock()

    def launch(self, kwargs: Mapping[str, Any]) -> bool:
        """Launch on torch's current stream; False (nothing launched) where an address fails its checks."""
        ptrs = {}
        for _, name, align in self.pointers:
            ptr = kwargs[name].data_ptr()
            if not ptr or ptr % align:
                return False
            ptrs[name] = ptr
        if self.grid[0] * self.grid[1] * self.grid[2] == 0:
            return True
        maps = []
        for i, p, tensor in self.maps:
            raw = self.encoded.get((i, ptrs[tensor]))
            if raw is None:
                raw = self.kernel.encode_map(p, runtime.as_device_array(kwargs[tensor]))
                with self.lock:
                    if len(self.encoded) >= self._MAPS * len(self.maps):
                        self.encoded.pop(next(iter(self.encoded)))
                    self.encoded[(i, ptrs[tensor])] = raw
            maps.append((i, raw))
        stream = runtime.torch_current_stream()
        with self.lock:  # the buffer is shared by the calls of this plan; the launch copies it
            for i, name, _ in self.pointers:
                self.packed.set_pointer(i, ptrs[name])
            for i, raw in maps:
                self.packed.set_bytes(i, raw)
            self.fn.launch_packed(self.grid, self.block, self.shared_bytes, stream, self.packed.params)
        return True


class CompiledKernel:
    """A compiled kernel ready to run: ``kernel(x=..., out=...)``."""

    def __init__(self, source: KernelSource, cubin: Cubin):
        # a register split the block cannot hold hangs it on the device: refused before any launch
        why = pool_problem(source.name, source.setmaxnreg, source.block[0] * source.block[1] * source.block[2],
                           cubin.resources.registers)
        if why:
            raise RegisterPoolError(why)
        self.source = source
        self.cubin = cubin
        self._module = None
        self._fn = None
        self._signatures: dict = {}  # (shapes and types, scalars) -> (symbols, grid): see check()
        self._plans: dict = {}  # torch tensors' layouts and the scalars -> _TorchPlan: see __call__

    @property
    def name(self) -> str:
        return self.source.name

    def _function(self):
        """The loaded kernel, one Function for every launch: its handle and what it learnt about its
        shared memory are kept, not asked of the driver again each time."""
        if self._fn is None:
            if self._module is None:
                self._module = runtime.Module(self.cubin.cubin)
            self._fn = self._module.function(self.source.name)
        return self._fn

    def bind_symbols(self, shapes: Mapping[str, tuple], given: Mapping[str, int]) -> dict[str, int]:
        """Infer every symbol from the tensors' shapes (or take it from ``given``) and check them
        and the kernel's ``requires`` (see :func:`cbrules.ir.bind.bind_symbols`)."""
        return bind_symbols(self.name, self.source.params, self.source.requires, shapes, given)

    def check(self, **kwargs: Any) -> tuple[dict[str, HostOrDevice], dict[str, int], tuple[int, int, int]]:
        """Check a launch without touching the device: returns the tensors (numpy or borrowed), the
        symbols and the grid, or raises LaunchError / TmaLimitError (see :func:`check_layout`).

        The symbols and the grid depend only on the tensors' shapes and types and the scalars given, so
        they are kept for the last few such signatures (a model calls a kernel at a few shapes, and
        binding them again cost most of a launch); the layout checks, which look at the addresses,
        run every time."""
        params = self.source.params
        given = check_arguments(self.name, params, kwargs)
        tensors: dict[str, HostOrDevice] = {}
        for p in (p for p in params if p.kind == "tensor"):
            tensors[p.name] = borrow(self.name, p, kwargs[p.name])
        signature = (tuple((a.shape, a.dtype.str) for a in tensors.values()), tuple(sorted(given.items())))
        known = self._signatures.get(signature)
        if known is None:
            for p in (p for p in params if p.kind == "tensor"):
                check_dtype(self.name, p, tensors[p.name].dtype)
            symbols = self.bind_symbols({n: a.shape for n, a in tensors.items()}, given)
            known = symbols, launch_grid(self.name, self.source.grid, symbols)
            if len(self._signatures) >= _SIGNATURES:
                self._signatures.pop(next(iter(self._signatures)))
            self._signatures[signature] = known
        vectors = dict(self.source.aligned)
        for p in params:
            if p.kind == "tensor":
                check_layout(self.name, p, tensors[p.name], vectors.get(p.name, 0))
            elif p.kind == "tmap":
                _check_tensor_map(p, tensors[p.tensor])
        return tensors, dict(known[0]), known[1]

    def bind(self, **kwargs: Any) -> BoundLaunch:
        """Bind arrays and symbols by parameter name after :meth:`check`; numpy arrays are copied
        to the device."""
        tensors, symbols, grid = self.check(**kwargs)
        fn = self._function()
        arrays, copy_back = {}, {}
        written = {p.name for p in self.source.params if p.written}
        for pname, value in tensors.items():
            if isinstance(value, np.ndarray):
                arrays[pname] = DeviceArray.from_numpy(value)
                if pname in written:
                    copy_back[pname] = value
            else:
                arrays[pname] = value
        args = []
        for p in self.source.params:
            if p.kind == "tensor":
                args.append(("ptr", arrays[p.name].ptr))
            elif p.kind == "tmap":
                args.append(("tmap", self.encode_map(p, arrays[p.tensor])))
            else:  # a symbol, or a scalar of another dtype (k.scalar)
                args.append((_ARG_KINDS[p.dtype], symbols[p.name]))
        return BoundLaunch(fn, grid, self.source.block, self.source.shared_bytes, args,
                           arrays, copy_back, symbols)

    def encode_map(self, p, array: DeviceArray) -> bytes:
        """The 128 bytes of tensor map ``p`` over ``array``."""
        asked = dict(getattr(self.source, "l2_promotion", ()))  # a source pickled before the field: none
        promotion = {"l2_promotion": asked[p.name]} if p.name in asked else {}
        return tma.encode_tensor_map(p.name, array, p.box, swizzle=p.swizzle, split=p.split, **promotion)

    def __call__(self, **kwargs: Any) -> Optional[dict]:
        """Launch once. With a torch tensor among the tensors it returns at once, as torch's own
        operators do: the kernel runs on torch's current stream (or ``stream=``) and a fault in it
        surfaces at the next synchronisation; then numpy arguments are refused, since their results
        could not be copied back without waiting. Otherwise it waits, and written numpy arrays are
        updated in place. ``stream=`` (a handle or a torch.cuda.Stream) picks the stream, unless the
        kernel has a parameter of that name."""
        names = {p.name for p in self.source.params}
        stream = kwargs.pop("stream", None) if "stream" not in names else None
        if stream is None:
            plan = self._torch_plan(kwargs)
            if plan is not None and plan.launch(kwargs):
                return dict(plan.symbols)
        bound = self.bind(**kwargs)
        torch_call = any(runtime.borrowed_from_torch(a) for a in bound.arrays.values())
        if torch_call and bound.copy_back:
            raise LaunchError(f"{self.name}: numpy arrays ({', '.join(bound.copy_back)}) beside torch tensors: a "
                              "call with torch tensors does not wait, so their results could not be copied back; "
                              "pass torch tensors (torch.from_numpy(x).cuda())")
        bound.launch(stream)
        if not torch_call:
            bound.finish()
        elif stream is None:
            self._keep_plan(kwargs, bound)
        return bound.symbols

    # ------------------------------------------------------------ launches with torch tensors, again
    def _torch_plan(self, kwargs: Mapping[str, Any]) -> Optional["_TorchPlan"]:
        """The plan of an earlier call whose torch tensors had the shapes, strides, dtypes and device of
        these, with the same other arguments (None: no such call, or not every tensor is torch's)."""
        key = _torch_key(kwargs)
        return None if key is None else self._plans.get(key)

    def _keep_plan(self, kwargs: Mapping[str, Any], bound: BoundLaunch) -> None:
        key = _torch_key(kwargs)
        if key is None:
            return
        if len(self._plans) >= _SIGNATURES:
            self._plans.pop(next(iter(self._plans)))
        self._plans[key] = _TorchPlan(self, bound)
