"""Thin CUDA driver-API runtime: context, device arrays, TMA tensor maps, modules, launches."""

from __future__ import annotations

import ctypes
import math
import operator
import sys
import threading
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from cuda.bindings import driver as cu

from .errors import CodegenError, CudaError, NoGpuError

_DA = cu.CUdevice_attribute
_FA = cu.CUfunction_attribute
_lock = threading.Lock()
_primary: dict[str, Any] = {}  # "dev", "ctx" once created
_tls = threading.local()  # the current context is per thread in the driver


def checked(result: Any, call: str) -> Any:
    """Raise CudaError naming ``call`` unless it succeeded; return its outputs."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(call, err)
    return None if not rest else rest[0] if len(rest) == 1 else tuple(rest)


def _driver_device() -> Any:
    """cuInit and return device 0, turning 'no driver' / 'no device' into NoGpuError."""
    try:
        (err,) = cu.cuInit(0)
    except Exception as e:  # cuda.pathfinder raises when libcuda.so cannot be found
        raise NoGpuError(f"CUDA driver library (libcuda) could not be loaded: {e}") from e
    if err == cu.CUresult.CUDA_ERROR_NO_DEVICE:
        raise NoGpuError("the CUDA driver loaded but found no CUDA device")
    checked((err,), "cuInit")
    if checked(cu.cuDeviceGetCount(), "cuDeviceGetCount") < 1:
        raise NoGpuError("the CUDA driver loaded but found no CUDA device")
    return checked(cu.cuDeviceGet(0), "cuDeviceGet")


def _dev_attr(attr: Any, dev: Any = None) -> int:
    dev = _primary["dev"] if dev is None else dev
    return int(checked(cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))


def gpu_available() -> bool:
    """True iff the driver loads, a device exists and device 0 is Hopper (cc 9.x). Never raises."""
    try:
        return _dev_attr(_DA.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _driver_device()) == 9
    except Exception:  # missing libcuda, driver errors, broken installs: all mean "no"
        return False


def device_info() -> dict:
    """Name, compute capability, SM count, opt-in shared memory per block and L2 size of device 0."""
    dev = _driver_device()
    name = checked(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
    return {
        "name": name.split(b"\0")[0].decode(),
        "cc": (_dev_attr(_DA.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
               _dev_attr(_DA.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)),
        "sm_count": _dev_attr(_DA.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
        "max_shared_per_block_optin": _dev_attr(
            _DA.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
        "l2_bytes": _dev_attr(_DA.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev),
    }


def current_context() -> Any:
    """Make device 0's primary context current on this thread, retaining it on first use."""
    if getattr(_tls, "ctx", None) is None:
        with _lock:
            if "ctx" not in _primary:
                dev = _driver_device()
                _primary["ctx"] = checked(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
                _primary["dev"] = dev
        checked(cu.cuCtxSetCurrent(_primary["ctx"]), "cuCtxSetCurrent")
        _tls.ctx = _primary["ctx"]
    return _tls.ctx


def synchronize() -> None:
    """Wait for all work in the context; asynchronous kernel faults surface here as CudaError."""
    current_context()
    checked(cu.cuCtxSynchronize(), "cuCtxSynchronize")


def c_strides(shape: tuple, itemsize: int) -> tuple:
    """The byte strides of a C-contiguous array of ``shape`` (an empty extent counts as one)."""
    strides, acc = [], itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


class DeviceArray:
    """Device memory with numpy-style ``shape``, ``dtype`` and byte ``strides``.

    Owned arrays (``empty``/``from_numpy``) are freed by ``free()`` or on garbage
    collection; borrowed ones keep a reference to their source in ``owner``. ``readonly``
    records a producer's promise that the memory is not to be written.
    """

    def __init__(self, ptr: int, shape: Sequence[int], dtype: Any,
                 strides: Sequence[int] | None = None, *, owned: bool = False, owner: Any = None,
                 readonly: bool = False):
        self.owned = owned
        self.readonly = readonly
        self.ptr = int(ptr)
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        c = c_strides(self.shape, self.dtype.itemsize)
        self.strides = c if strides is None else tuple(int(s) for s in strides)
        self.owner = owner

    size = property(lambda self: math.prod(self.shape))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    @property
    def is_contiguous(self) -> bool:
        """C-contiguous, ignoring the strides of length-1 axes as numpy does."""
        c = c_strides(self.shape, self.dtype.itemsize)
        return all(n <= 1 or s == cs for n, s, cs in zip(self.shape, self.strides, c))

    @classmethod
    def empty(cls, shape: Sequence[int], dtype: Any) -> "DeviceArray":
        """Allocate an uninitialised owned array."""
        current_context()
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        ptr = checked(cu.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc")  # 0 bytes is an error
        return cls(int(ptr), shape, dtype, owned=True)

    @classmethod
    def from_numpy(cls, a: np.ndarray) -> "DeviceArray":
        """Copy a host array (made C-contiguous first) into a new owned array."""
        a = np.ascontiguousarray(a)
        out = cls.empty(a.shape, a.dtype)
        out.copy_from(a)
        return out

    def _require_contiguous(self, what: str) -> None:
        if not self.is_contiguous:
            raise CodegenError(f"{what} needs a C-contiguous DeviceArray, strides are {self.strides}")

    def copy_from(self, a: np.ndarray) -> None:
        """Copy a host array with the same number of elements (cast to this dtype) in."""
        self._require_contiguous("copy_from")
        a = np.ascontiguousarray(a, dtype=self.dtype)
        if a.size != self.size:
            raise ValueError(f"copy_from: host array has {a.size} elements, device {self.size}")
        if self.nbytes:
            current_context()
            checked(cu.cuMemcpyHtoD(self.ptr, a.ctypes.data, self.nbytes), "cuMemcpyHtoD")

    def to_numpy(self) -> np.ndarray:
        """Copy to a new C-contiguous host array (strided views are gathered on the host)."""
        out = np.empty(self.shape, self.dtype)
        if self.size == 0:
            return out
        current_context()
        if self.is_contiguous:
            checked(cu.cuMemcpyDtoH(out.ctypes.data, self.ptr, self.nbytes), "cuMemcpyDtoH")
            return out
        if min(self.strides) < 0:
            raise CodegenError("to_numpy does not support negative strides")
        span = sum((n - 1) * s for n, s in zip(self.shape, self.strides)) + self.dtype.itemsize
        raw = np.empty(span, np.uint8)
        checked(cu.cuMemcpyDtoH(raw.ctypes.data, self.ptr, span), "cuMemcpyDtoH")
        out[...] = np.ndarray(self.shape, self.dtype, buffer=raw, strides=self.strides)
        return out

    def fill_bytes(self, byte_value: int) -> None:
        """Set every byte to ``byte_value`` (cuMemsetD8), e.g. to poison outputs."""
        self._require_contiguous("fill_bytes")
        if self.nbytes:
            current_context()
            checked(cu.cuMemsetD8(self.ptr, byte_value & 0xFF, self.nbytes), "cuMemsetD8")

    def free(self) -> None:
        """Release owned memory now; a no-op for borrowed or already freed arrays."""
        if getattr(self, "owned", False) and self.ptr:
            ptr, self.ptr = self.ptr, 0
            checked(cu.cuMemFree(ptr), "cuMemFree")

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # interpreter shutdown or a dead context: nothing sensible to do
            pass

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, self.readonly),
                "strides": None if self.is_contiguous else self.strides, "version": 3}

    def __repr__(self) -> str:
        kind = "owned" if self.owned else "borrowed"
        return f"DeviceArray(ptr={self.ptr:#x}, shape={self.shape}, dtype={self.dtype}, {kind})"


class _DLTensor(ctypes.Structure):
    # Leading member of DLManagedTensor (DLPack < 1.0 "dltensor" capsules).
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


# A private prototype, so that argtypes set elsewhere on ctypes.pythonapi don't matter.
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_DL_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged


# DLPack's codes of the ml_dtypes types (dlpack.h 1.1: kDLBfloat, kDLFloat8_e4m3fn, kDLFloat8_e5m2)
_DL_ML_DTYPES = {(4, 16): "bfloat16", (10, 8): "float8_e4m3fn", (12, 8): "float8_e5m2"}


def _dl_dtype(code: int, bits: int, lanes: int) -> np.dtype:
    ml_name = _DL_ML_DTYPES.get((code, bits)) if lanes == 1 else None
    if ml_name is not None:
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(f"{ml_name} DLPack tensors need the ml_dtypes package") from None
        return np.dtype(getattr(ml_dtypes, ml_name))
    kind = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}.get(code)
    if lanes != 1 or kind is None:
        raise TypeError(f"unsupported DLPack dtype code={code} bits={bits} lanes={lanes}")
    return np.dtype(f"{kind}{bits // 8}")


def _parse_dlpack(capsule: Any) -> tuple[int, tuple, tuple, np.dtype, tuple[int, int]]:
    """Read (ptr, shape, byte strides, dtype, (device type, id)) from a DLPack capsule.

    The capsule is only read, never renamed to "used_dltensor": the caller keeps it
    alive and its destructor later hands the tensor back to the producer.
    """
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    dtype = _dl_dtype(t.code, t.bits, t.lanes)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = (None if not t.strides else
               tuple(t.strides[i] * dtype.itemsize for i in range(t.ndim)))
    if strides is None:
        strides = c_strides(shape, dtype.itemsize)
    ptr = (t.data or 0) + t.byte_offset
    _check_span("DLPack tensor", ptr, shape, strides, dtype.itemsize)
    return ptr, shape, strides, dtype, (t.device_type, t.device_id)


def _check_span(what: str, ptr: int, shape: tuple, strides: tuple | None, itemsize: int) -> None:
    """Refuse a borrowed array whose address or size a 64-bit machine cannot hold: a pointer outside
    0..2**64-1, or (extents all >= 0: a negative one is refused by name later) a byte count or a
    last byte at or past 2**63 / 2**64, which the kernel's 64-bit index arithmetic would wrap (2**64
    elements would count as 0, (2**31-1)**2 * 4 bytes as negative)."""
    if not 0 <= ptr < 1 << 64:
        raise ValueError(f"{what} data pointer {ptr} is negative" if ptr < 0 else
                         f"{what} data pointer {ptr:#x} is not a 64-bit address")
    if any(n < 0 for n in shape):
        return
    elements = math.prod(shape)
    if elements * itemsize >= 1 << 63:
        raise ValueError(f"{what} shape {shape} holds {elements} elements of {itemsize} bytes, more than a signed "
                         "64-bit byte count (2**63) can hold")
    if elements:
        strides = c_strides(shape, itemsize) if strides is None else strides
        last = ptr + sum((n - 1) * abs(st) for n, st in zip(shape, strides))
        if last + itemsize > 1 << 64:
            raise ValueError(f"{what} at {ptr:#x} with shape {shape} and strides {strides} reaches past the end of "
                             "the 64-bit address space")


def _from_cai(obj: Any, cai: Any) -> DeviceArray:
    """Borrow an object through its ``__cuda_array_interface__`` (version 3), checking the dict's
    shape first: every field is user data, and a wrong one must not become a wild pointer."""
    if not isinstance(cai, Mapping):
        raise TypeError(f"__cuda_array_interface__ is a {type(cai).__name__}, not a dict")
    if cai.get("mask") is not None:
        raise TypeError("masked __cuda_array_interface__ arrays are not supported")
    try:
        shape = tuple(operator.index(n) for n in cai["shape"])
        strides = cai.get("strides")
        strides = None if strides is None else tuple(operator.index(s) for s in strides)
        ptr, readonly = cai["data"]
        ptr = operator.index(ptr or 0)
        dtype = np.dtype(cai["typestr"])
    except (KeyError, TypeError, ValueError) as e:
        raise TypeError(f"malformed __cuda_array_interface__ ({type(e).__name__}: {e}); version 3 "
                        "has shape (ints), typestr, data (pointer, read-only flag) and strides") from None
    if strides is not None and len(strides) != len(shape):
        raise ValueError(f"__cuda_array_interface__ has {len(strides)} strides for shape {shape}")
    if any(isinstance(n, bool) for n in cai["shape"]):  # operator.index(True) is 1: no extent
        raise ValueError(f"__cuda_array_interface__ shape {tuple(cai['shape'])} holds a bool, not an extent")
    _check_span("__cuda_array_interface__", ptr, shape, strides, dtype.itemsize)
    # A "stream" entry is not waited on: the launch goes to the legacy default stream (which orders
    # itself after other blocking streams) or to the stream the caller gives.
    return DeviceArray(ptr, shape, dtype, strides, owner=obj, readonly=bool(readonly))


def _opaque_typestr(cai: Any) -> bool:
    """True when the interface's typestr is raw bytes (numpy kind 'V'), which names no element type."""
    try:
        return np.dtype(cai["typestr"]).kind == "V"
    except (KeyError, TypeError, ValueError):
        return False  # malformed: _from_cai says so


# torch's FP8 dtypes and ml_dtypes' names of the same bits (torch tensors are borrowed by _from_torch)
_TORCH_FP8 = {"torch.float8_e4m3fn": "float8_e4m3fn", "torch.float8_e5m2": "float8_e5m2"}


def torch_tensor(obj: Any) -> bool:
    """True for a torch tensor (torch is looked up, never imported: only its own tensors load it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def borrowed_from_torch(array: Any) -> bool:
    """True for a DeviceArray borrowed from a torch tensor (:func:`_from_torch`)."""
    return isinstance(array, DeviceArray) and torch_tensor(array.owner)


def launch_stream(arrays: Any, stream: Any = None) -> Any:
    """The stream a launch over ``arrays`` goes to: ``stream`` when given (a handle, a CUstream or an
    object with ``cuda_stream``, such as a torch.cuda.Stream); else torch's current stream when a
    tensor is borrowed from torch, as torch's own operators do (so ``with torch.cuda.stream(s):`` and
    CUDA-graph capture see it); else the legacy default stream."""
    if stream is not None:
        handle = getattr(stream, "cuda_stream", stream)
        if isinstance(handle, cu.CUstream):
            return handle
        if isinstance(handle, bool) or not isinstance(handle, int) or not 0 <= handle < 1 << 64:
            raise TypeError(f"stream={stream!r}: give a CUDA stream handle (an int), a cuda.bindings CUstream "
                            "or an object with .cuda_stream (a torch.cuda.Stream)")
        return handle
    if any(borrowed_from_torch(a) for a in arrays):
        return torch_current_stream()
    return None


def torch_current_stream() -> int:
    """torch's current stream on its current device, as a handle: through torch's raw getter where it
    has one (under a microsecond; ``torch.cuda.current_stream()`` builds a Stream object, about 8 us on
    the H200's host, a tenth of a memory-bound kernel), else the public way."""
    torch = sys.modules["torch"]
    raw, device = getattr(torch._C, "_cuda_getCurrentRawStream", None), getattr(torch._C, "_cuda_getDevice", None)
    if raw is None or device is None:
        return torch.cuda.current_stream().cuda_stream
    return raw(device())


# torch's dtypes -> the element types cbrules names them by (ml_dtypes' for bfloat16 and FP8)
_TORCH_ELEMENTS = {"torch.float32": "float32", "torch.float64": "float64", "torch.float16": "float16",
                   "torch.int32": "int32", "torch.int64": "int64", "torch.uint8": "uint8", "torch.int8": "int8",
                   "torch.bfloat16": "bfloat16", **_TORCH_FP8}


def _from_torch(t: Any) -> DeviceArray:
    """A CUDA torch tensor borrowed in place from its own attributes (no DLPack capsule, no interface
    dict: a launch inside a model pays microseconds, not tens of them); its element type by name."""
    if t.device.type != "cuda":
        raise TypeError(f"a torch tensor on {t.device}; cbrules borrows CUDA tensors (x.cuda())")
    if (t.device.index or 0) != 0:
        raise CodegenError(f"torch tensor lives on CUDA device {t.device.index}; only 0 is used")
    name = _TORCH_ELEMENTS.get(str(t.dtype))
    if name is None:
        raise TypeError(f"torch dtype {t.dtype} has no cbrules element type")
    if name in ("bfloat16", *_TORCH_FP8.values()):
        import ml_dtypes
        dtype = np.dtype(getattr(ml_dtypes, name))
    else:
        dtype = np.dtype(name)
    shape = tuple(int(n) for n in t.shape)
    strides = tuple(int(st) * dtype.itemsize for st in t.stride())
    ptr = int(t.data_ptr())
    _check_span("torch tensor", ptr, shape, strides, dtype.itemsize)
    return DeviceArray(ptr, shape, dtype, strides, owner=t)


def as_device_array(obj: Any) -> DeviceArray:
    """Wrap ``obj`` as a DeviceArray.

    DeviceArray: returned as is. ``__cuda_array_interface__`` or CUDA ``__dlpack__``
    objects: borrowed without a copy (the result references ``obj``) and without a driver
    call, so they can be checked before anything reaches CUDA; a malformed interface is a
    TypeError or ValueError. numpy arrays: copied into a new owned DeviceArray.
    """
    if isinstance(obj, DeviceArray):
        return obj
    if torch_tensor(obj):
        return _from_torch(obj)
    if str(getattr(obj, "dtype", "")).startswith("torch."):  # claims torch's types, is not a torch tensor
        raise TypeError(f"a {type(obj).__name__} of dtype {obj.dtype}: only torch tensors of it are taken")
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except TypeError:  # some producers raise for bfloat16, which the interface cannot describe
        if not hasattr(obj, "__dlpack__"):
            raise
        cai = None
    if cai is not None and hasattr(obj, "__dlpack__") and _opaque_typestr(cai):
        cai = None  # a producer that describes bfloat16 as raw bytes ("|V2"): DLPack says what it is
    if cai is not None:
        return _from_cai(obj, cai)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        dev_type, dev_id = obj.__dlpack_device__()
        if int(dev_type) in _DL_CUDA:
            capsule = obj.__dlpack__()  # stream None: the producer orders its work before the legacy stream
            ptr, shape, strides, dtype, (_, dev_id) = _parse_dlpack(capsule)
            if dev_id != 0:
                raise CodegenError(f"DLPack tensor lives on CUDA device {dev_id}; only 0 is used")
            return DeviceArray(ptr, shape, dtype, strides, owner=(obj, capsule))
    if isinstance(obj, np.ndarray):
        return DeviceArray.from_numpy(obj)
    raise TypeError(f"cannot make a DeviceArray from {type(obj).__name__}")



# numpy dtype -> CUtensorMapDataType suffix; the enum has no signed 8/16-bit types.
_SCALARS = {"ptr": np.uint64, "i32": np.int32, "i64": np.int64, "u32": np.uint32,
            "u64": np.uint64, "f32": np.float32, "f64": np.float64}


def _pack_arg(kind: str, value: Any) -> np.ndarray:
    """Host storage for one kernel argument; its address goes into kernelParams."""
    if kind == "tmap":
        raw = bytes(value)
        if len(raw) != 128:
            raise ValueError(f"a tensor map argument has 128 bytes, got {len(raw)}")
        buf = np.zeros(192, np.uint8)  # room to place 128 bytes on a 64-byte boundary
        off = -buf.ctypes.data % 64
        view = buf[off:off + 128]  # the view keeps buf alive through .base
        view[:] = np.frombuffer(raw, np.uint8)
        return view
    if kind not in _SCALARS:
        raise ValueError(f"unknown kernel argument kind {kind!r}; use one of {list(_SCALARS)} or 'tmap'")
    if kind == "ptr":
        value = getattr(value, "ptr", value) or 0  # DeviceArray or raw address
    return np.array([value], dtype=_SCALARS[kind])


def _stream(stream: Any) -> Any:
    if stream is None:
        return 0
    return getattr(stream, "cuda_stream", stream)  # torch.cuda.Stream exposes the handle so


def _dim3(d: Sequence[int]) -> list[int]:
    d = [int(x) for x in d]
    if not 1 <= len(d) <= 3:
        raise ValueError(f"grid/block needs 1..3 dimensions, got {d}")
    return d + [1] * (3 - len(d))


class Function:
    """A kernel of a loaded Module."""

    def __init__(self, module: "Module", handle: Any, name: str):
        self.module, self.handle, self.name = module, handle, name  # module: keeps code loaded
        self._static: int | None = None  # static shared bytes, read on first launch
        self._dynamic_ok = 0  # largest dynamic shared size already allowed

    def _attr(self, attr: Any) -> int:
        return int(checked(cu.cuFuncGetAttribute(attr, self.handle), "cuFuncGetAttribute"))

    def attributes(self) -> dict:
        """Registers, static shared, local (spill/stack) bytes and max threads per block."""
        return {"num_regs": self._attr(_FA.CU_FUNC_ATTRIBUTE_NUM_REGS),
                "shared_size_bytes": self._attr(_FA.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                "max_threads_per_block": self._attr(_FA.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
                "local_size_bytes": self._attr(_FA.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)}

    def _reserve_shared(self, shared_bytes: int) -> None:
        if self._static is None:  # without opt-in, static + dynamic must fit in 48 KiB
            self._static = self._attr(_FA.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            self._dynamic_ok = 48 * 1024 - self._static
        if shared_bytes <= self._dynamic_ok:
            return
        optin = _dev_attr(_DA.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        if shared_bytes + self._static > optin:
            raise CodegenError(
                f"kernel '{self.name}' requests {shared_bytes} bytes of dynamic shared memory "
                f"(+{self._static} static) but the device allows at most {optin} bytes per block")
        checked(cu.cuFuncSetAttribute(
            self.handle, _FA.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes),
            "cuFuncSetAttribute")
        self._dynamic_ok = shared_bytes

    def launch(self, grid: Sequence[int], block: Sequence[int], args: Sequence[tuple[str, Any]],
               shared_bytes: int = 0, stream: Any = None) -> None:
        """Launch with typed ``args`` like ``("ptr", p)``, ``("tmap", raw128)``, ``("i32", n)``.

        Kinds: ptr, tmap, i32, i64, u32, u64, f32, f64. Runs on the legacy default
        stream unless ``stream`` is given; errors in the kernel show up at synchronize().
        """
        storages = [_pack_arg(kind, value) for kind, value in args]
        # kernelParams: an array of pointers to each argument's storage; `storages`
        # stays referenced until cuLaunchKernel has copied the values.
        params = np.array([s.ctypes.data for s in storages], dtype=np.uint64)
        self.launch_packed(_dim3(grid), _dim3(block), shared_bytes, _stream(stream), params.ctypes.data)

    def launch_packed(self, grid: Sequence[int], block: Sequence[int], shared_bytes: int, stream: Any,
                      params: int) -> None:
        """Launch with ``params``, the address of the kernelParams array (see :class:`PackedArgs`);
        ``grid`` and ``block`` have three entries. cuLaunchKernel copies the arguments before it returns."""
        current_context()
        self._reserve_shared(shared_bytes)
        checked(cu.cuLaunchKernel(self.handle, *grid, *block, shared_bytes, stream, params, 0), "cuLaunchKernel")


class PackedArgs:
    """A kernel's arguments in one host buffer whose addresses stay put, for launching the same kernel
    many times with only its tensor addresses changing: ``params`` is the kernelParams address, and
    :meth:`set_pointer` / :meth:`set_bytes` rewrite one argument in place (callers serialise their
    writes and the launch that reads them)."""

    def __init__(self, args: Sequence[tuple[str, Any]]):
        storages = [_pack_arg(kind, value) for kind, value in args]
        offsets, size = [], 0
        for st in storages:
            size += -size % (64 if st.nbytes == 128 else 8)  # a tensor map on a 64-byte boundary
            offsets.append(size)
            size += st.nbytes
        raw = np.zeros(size + 64, np.uint8)
        self.buffer = raw[-raw.ctypes.data % 64:][:size]
        for st, off in zip(storages, offsets):
            self.buffer[off:off + st.nbytes] = st.view(np.uint8)
        self.offsets = offsets
        self._addresses = np.array([self.buffer.ctypes.data + off for off in offsets], dtype=np.uint64)
        self.params = self._addresses.ctypes.data

    def set_pointer(self, index: int, ptr: int) -> None:
        off = self.offsets[index]
        self.buffer[off:off + 8].view(np.uint64)[0] = ptr

    def set_bytes(self, index: int, raw: bytes) -> None:
        off = self.offsets[index]
        self.buffer[off:off + len(raw)] = np.frombuffer(raw, np.uint8)


class Module:
    """A cubin loaded into the process-wide context (cuModuleLoadData)."""

    def __init__(self, cubin: Any):
        image = bytes(getattr(cubin, "cubin", cubin))  # also accepts a cbrules.codegen.nvrtc.Cubin
        current_context()
        self.handle = checked(cu.cuModuleLoadData(image), "cuModuleLoadData")

    def function(self, name: str) -> Function:
        """The kernel ``name`` (an extern "C" entry) of this module."""
        return Function(self, checked(cu.cuModuleGetFunction(self.handle, name.encode()),
                                     "cuModuleGetFunction"), name)

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle is not None:
            try:
                cu.cuModuleUnload(handle)
            except Exception:  # interpreter shutdown: the driver reclaims it anyway
                pass


def time_launch(fn: Callable[[], Any], reps: int, stream: Any = None) -> list[float]:
    """Call ``fn`` ``reps`` times, returning each call's GPU time in ms (CUDA events)."""
    if reps <= 0:
        return []
    current_context()
    s = _stream(stream)
    events = [checked(cu.cuEventCreate(0), "cuEventCreate") for _ in range(2 * reps)]
    try:
        for i in range(reps):
            checked(cu.cuEventRecord(events[2 * i], s), "cuEventRecord")
            fn()
            checked(cu.cuEventRecord(events[2 * i + 1], s), "cuEventRecord")
        checked(cu.cuEventSynchronize(events[-1]), "cuEventSynchronize")
        return [float(checked(cu.cuEventElapsedTime(events[2 * i], events[2 * i + 1]),
                             "cuEventElapsedTime")) for i in range(reps)]
    finally:
        for e in events:
            cu.cuEventDestroy(e)


def memcpy_dtod(dst: DeviceArray, src: DeviceArray, stream: Any = None) -> None:
    """Asynchronous device-to-device copy of equally sized contiguous arrays."""
    if dst.nbytes != src.nbytes:
        raise ValueError(f"memcpy_dtod: {src.nbytes} bytes into {dst.nbytes}")
    dst._require_contiguous("memcpy_dtod")
    src._require_contiguous("memcpy_dtod")
    current_context()
    checked(cu.cuMemcpyDtoDAsync(dst.ptr, src.ptr, dst.nbytes, _stream(stream)),
           "cuMemcpyDtoDAsync")
