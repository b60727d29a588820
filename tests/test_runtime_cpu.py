"""Runtime pieces that need no GPU: limits, wrappers, argument packing, error types."""

import numpy as np
import pytest
from cuda.bindings import driver as cu

from cbrules.codegen import runtime as rt
from cbrules.codegen.errors import CudaError, NoGpuError, TmaLimitError
from cbrules.codegen.runtime import DeviceArray, as_device_array
from cbrules.codegen.tma import check_tensor_map, encode_tensor_map

GOOD = dict(shape=(64, 128), strides_bytes=(512, 4), itemsize=4, ptr=0x10000, box=(32, 64))


def _check(**over):
    kw = {**GOOD, **over}
    check_tensor_map("A_map", kw["shape"], kw["strides_bytes"], kw["itemsize"], kw["ptr"], kw["box"],
                     elem_strides=kw.get("elem_strides"))


def _raises(value_text, **over):
    with pytest.raises(TmaLimitError) as info:
        _check(**over)
    msg = str(info.value)
    assert "'A_map'" in msg and value_text in msg, msg
    return info.value


def test_check_tensor_map_accepts_valid():
    _check()
    _check(shape=(1000,), strides_bytes=(4,), box=(256,))
    _check(shape=(2, 3, 4, 5, 8), strides_bytes=(1920, 640, 160, 32, 4), box=(1, 1, 1, 1, 4))


def test_box_dim_zero():
    e = _raises("is 0", box=(0, 64))
    assert e.axis == 0 and e.value == 0 and "box extent of axis 0" in str(e)


def test_box_dim_257():
    e = _raises("is 257", box=(257, 64))
    assert "256" in str(e) and e.axis == 0


def test_inner_box_bytes_not_multiple_of_16():
    e = _raises("6 elements (24 bytes)", box=(32, 6))
    assert e.axis == 1 and "multiple of 4 elements" in str(e)
    _raises("3 elements (6 bytes)", itemsize=2, strides_bytes=(512, 2), box=(4, 3))


def test_stride_not_multiple_of_16():
    e = _raises("520 bytes", strides_bytes=(520, 4))
    assert e.axis == 0 and "16" in str(e)


def test_stride_too_large():
    _raises(f"{2**40} bytes", strides_bytes=(2**40, 4))
    _check(strides_bytes=(2**40 - 16, 4))


@pytest.mark.parametrize("rank", [0, 6])
def test_rank(rank):
    e = _raises(f"rank is {rank}", shape=(2,) * rank, strides_bytes=(16,) * rank, box=(1,) * rank)
    assert e.axis is None


def test_unaligned_address():
    e = _raises("0x10004", ptr=0x10004)
    assert "16-byte" in str(e)


def test_non_contiguous_innermost():
    e = _raises("8 bytes", strides_bytes=(512, 8))
    assert e.axis == 1 and "contiguous" in str(e)


def test_box_rank_mismatch_and_elem_strides():
    _raises("box rank is 1", box=(32,))
    _raises("element stride of axis 1 is 9", elem_strides=(1, 9))


class FakeCai:
    """A stand-in for a CUDA array: only the interface dict, pointing at host memory."""

    def __init__(self, a, ptr=None):
        self.a = a
        self.__cuda_array_interface__ = {
            "shape": a.shape, "typestr": a.dtype.str, "strides": a.strides,
            "data": (a.ctypes.data if ptr is None else ptr, False), "version": 3}


def test_encode_tensor_map_checks_before_driver():
    a = np.zeros((8, 8), np.complex64)
    with pytest.raises(TmaLimitError, match="'cmap'.*dtype.*complex64"):
        encode_tensor_map("cmap", FakeCai(a, ptr=0x1000), (8, 8))
    f = np.zeros((8, 8), np.float32)
    with pytest.raises(TmaLimitError, match="'fmap'.*box extent of axis 1 is 300"):
        encode_tensor_map("fmap", FakeCai(f, ptr=0x1000), (8, 300))
    with pytest.raises(TypeError):
        encode_tensor_map("np", f, (8, 8))


def test_as_device_array_cai_borrows():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    src = FakeCai(a)
    d = as_device_array(src)
    assert (d.ptr, d.shape, d.dtype, d.strides) == (a.ctypes.data, (4, 3), np.float32, (24, 8))
    assert d.owner is src and not d.owned and not d.is_contiguous
    assert as_device_array(d) is d
    d.free()  # borrowed: must not touch the driver
    del d


class FakeDlpack:
    """Reports a CUDA device but hands out numpy's (host) capsule: enough to test parsing."""

    def __init__(self, a):
        self.a = a

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()


def test_as_device_array_dlpack_borrows():
    base = np.arange(60, dtype=np.int16).reshape(3, 4, 5)
    a = base[1:, :, 1:3]
    src = FakeDlpack(a)
    d = as_device_array(src)
    assert d.ptr == a.ctypes.data
    assert d.shape == a.shape and d.dtype == np.int16 and d.strides == a.strides
    assert d.owner[0] is src and not d.owned


def test_parse_dlpack_contiguous():
    a = np.ones((2, 3), np.float64)
    ptr, shape, strides, dtype, dev = rt._parse_dlpack(a.__dlpack__())
    assert (ptr, shape, strides, dtype, dev) == (a.ctypes.data, (2, 3), (24, 8), np.float64, (1, 0))


def test_as_device_array_rejects_unknown():
    with pytest.raises(TypeError):
        as_device_array([1, 2, 3])


def test_pack_args():
    raw = bytes(range(128))
    t = rt._pack_arg("tmap", raw)
    assert t.ctypes.data % 64 == 0 and t.tobytes() == raw
    assert rt._pack_arg("i32", -3).tobytes() == np.int32(-3).tobytes()
    assert rt._pack_arg("f64", 1.5).tobytes() == np.float64(1.5).tobytes()
    fake = DeviceArray(0x1234, (1,), np.float32)
    assert rt._pack_arg("ptr", fake).tobytes() == np.uint64(0x1234).tobytes()
    with pytest.raises(ValueError):
        rt._pack_arg("tmap", b"short")
    with pytest.raises(ValueError):
        rt._pack_arg("half", 1)
    with pytest.raises(OverflowError):
        rt._pack_arg("u32", -1)


_HAVE_DRIVER = rt.gpu_available()
needs_no_gpu = pytest.mark.skipif(_HAVE_DRIVER, reason="a GPU is present")


@needs_no_gpu
def test_gpu_available_false_without_gpu():
    assert rt.gpu_available() is False


@needs_no_gpu
def test_no_gpu_errors():
    with pytest.raises(NoGpuError, match="libcuda"):
        rt.device_info()
    with pytest.raises(NoGpuError):
        DeviceArray.empty((4,), np.float32)


def test_cuda_error_message():
    e = CudaError("cuModuleLoadData", cu.CUresult.CUDA_ERROR_INVALID_IMAGE)
    assert e.call == "cuModuleLoadData" and e.code == "CUDA_ERROR_INVALID_IMAGE"
    assert str(e).startswith("cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE")
    assert CudaError("cuInit", 100).code == "CUDA_ERROR_NO_DEVICE"


def test_launch_refuses_tensors_past_32_bit_indexing():
    """Generated indices are C int: a tensor of more than 2**31 elements must be refused before
    launch (checked from shapes alone, nothing allocated)."""
    from cbrules import api
    from cbrules.ir.bind import LaunchError, bind_symbols
    from cbrules.kernels import KERNELS
    src = api.generate(KERNELS["multi_dim"].build(stages=2))
    ok = bind_symbols("multi_dim", src.params, src.requires, {"x": (32768, 65536), "out": (32768, 65536)}, {})
    assert ok == {"M": 32768, "N": 65536}  # exactly 2**31 elements: the last index is 2**31 - 1
    with pytest.raises(LaunchError, match=r"'x' has 4294967296 elements; .* 32-bit int"):
        bind_symbols("multi_dim", src.params, src.requires, {"x": (65536, 65536), "out": (65536, 65536)}, {})
    with pytest.raises(LaunchError, match="symbol M = 2147483648 does not fit"):
        bind_symbols("multi_dim", src.params, src.requires, {"x": (2**31, 1), "out": (2**31, 1)}, {})


@pytest.mark.parametrize("cai, match", [
    ("not a dict", "is a str, not a dict"),
    ({"shape": (4,), "data": (0x1000, False)}, "malformed .*KeyError: 'typestr'"),
    ({"shape": (4.0,), "typestr": "<f4", "data": (0x1000, False)}, "malformed .*shape \\(ints\\)"),
    ({"shape": (4,), "typestr": "<f4", "data": 0x1000}, "malformed"),
    ({"shape": (4, 4), "typestr": "<f4", "data": (0x1000, False), "strides": (16,)}, "1 strides for shape \\(4, 4\\)"),
    ({"shape": (4,), "typestr": "<f4", "data": (-4, False)}, "pointer -4 is negative"),
])
def test_as_device_array_checks_the_interface(cai, match):
    """Every field of a borrowed array's interface is user data: a wrong one is refused, not a wild pointer."""
    fake = FakeCai(np.zeros(4, np.float32))
    fake.__cuda_array_interface__ = cai
    with pytest.raises((TypeError, ValueError), match=match):
        as_device_array(fake)


def test_as_device_array_keeps_the_read_only_flag():
    a = np.zeros(4, np.float32)
    src = FakeCai(a)
    src.__cuda_array_interface__["data"] = (a.ctypes.data, True)
    d = as_device_array(src)
    assert d.readonly and d.__cuda_array_interface__["data"] == (a.ctypes.data, True)
    assert not as_device_array(FakeCai(a)).readonly


def test_packed_arguments_sit_where_kernel_params_point():
    """PackedArgs: each kernelParams entry points at its argument's bytes (a tensor map on a 64-byte
    boundary), and a pointer or tensor map rewritten in place is what the entry then reads."""
    import ctypes
    from cbrules.codegen.runtime import PackedArgs
    tmap = bytes(range(128))
    packed = PackedArgs([("ptr", 0x1000), ("i32", -7), ("tmap", tmap), ("f32", 1.5), ("u64", 1 << 40)])
    entries = np.frombuffer(ctypes.string_at(packed.params, 5 * 8), np.uint64)
    assert int(entries[2]) % 64 == 0

    def at(i, n):
        return ctypes.string_at(int(entries[i]), n)
    assert np.frombuffer(at(0, 8), np.uint64)[0] == 0x1000
    assert np.frombuffer(at(1, 4), np.int32)[0] == -7
    assert at(2, 128) == tmap
    assert np.frombuffer(at(3, 4), np.float32)[0] == 1.5
    assert np.frombuffer(at(4, 8), np.uint64)[0] == 1 << 40
    packed.set_pointer(0, 0xdeadbeef00)
    packed.set_bytes(2, bytes(128))
    assert np.frombuffer(at(0, 8), np.uint64)[0] == 0xdeadbeef00 and at(2, 128) == bytes(128)
    assert np.frombuffer(at(1, 4), np.int32)[0] == -7  # its neighbours untouched


def test_a_launch_plan_rewrites_only_the_addresses_and_gives_way_on_a_misaligned_one(monkeypatch):
    """_TorchPlan without a GPU: a plan made from a bound launch writes each new tensor address into the
    packed arguments (the symbols as bound) and launches on torch's stream; an address its vectors cannot
    take launches nothing, so the call goes through the full checks."""
    import ctypes
    import ml_dtypes
    from cbrules import api
    from cbrules.codegen import launch
    from cbrules.kernels.rows import row_op
    ck = api.compile(row_op("rms_norm", row=1024, dtype="bfloat16"))
    bf16 = np.dtype(ml_dtypes.bfloat16)
    first = {"x": 0x10000, "out": 0x20000, "weight": 0x30000}
    arrays = {n: DeviceArray(p, (8, 1024) if n != "weight" else (1024,), bf16) for n, p in first.items()}
    args = [("i32", 8) if p.kind == "symbol" else ("ptr", first[p.name]) for p in ck.source.params]

    class Fn:
        calls = []

        def launch_packed(self, grid, block, shared, stream, params):
            entries = np.frombuffer(ctypes.string_at(params, 8 * len(args)), np.uint64)
            values = [int(np.frombuffer(ctypes.string_at(int(e), 8 if k == "ptr" else 4),
                                        np.uint64 if k == "ptr" else np.int32)[0])
                      for e, (k, _) in zip(entries, args)]
            self.calls.append((grid, block, shared, stream, values))
    bound = launch.BoundLaunch(Fn(), (8, 1, 1), ck.source.block, 0, args, arrays, symbols={"M": 8})
    plan = launch._TorchPlan(ck, bound)
    monkeypatch.setattr(rt, "torch_current_stream", lambda: 77)

    class Tensor:  # what the plan reads of a torch tensor
        def __init__(self, ptr):
            self.ptr = ptr

        def data_ptr(self):
            return self.ptr
    moved = {"x": 0x50000, "out": 0x60010, "weight": 0x70020}
    assert plan.launch({n: Tensor(p) for n, p in moved.items()})
    grid, block, shared, stream, values = Fn.calls[-1]
    assert (grid, block, stream) == ([8, 1, 1], list(ck.source.block), 77)
    assert values == [8 if p.kind == "symbol" else moved[p.name] for p in ck.source.params]
    assert not plan.launch({**{n: Tensor(p) for n, p in moved.items()}, "x": Tensor(0x50008)})  # 8, not 16
    assert len(Fn.calls) == 1
