"""Runtime tests that need a Hopper GPU (skipped elsewhere by the gpu marker's conftest)."""

import numpy as np
import pytest

from cbrules.codegen import runtime as rt
from cbrules.codegen.errors import CodegenError, CudaError
from cbrules.codegen.nvrtc import compile_cuda
from cbrules.codegen.runtime import DeviceArray, Module, as_device_array
from cbrules.codegen.tma import encode_tensor_map

pytestmark = pytest.mark.gpu

BASIC = r"""
extern "C" __global__ void write_tid(int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = threadIdx.x;
}

extern "C" __global__ void scalars(double* out, int a, long long b, unsigned int c, float d,
                                   double e, unsigned long long f) {
    out[0] = a; out[1] = (double)b; out[2] = c; out[3] = d; out[4] = e; out[5] = (double)f;
}

extern "C" __global__ void big_smem(float* out, int n) {
    extern __shared__ float buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = (float)i;
    __syncthreads();
    float s = 0.f;  // read back in another order so the whole buffer must be right
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += buf[n - 1 - i];
    out[threadIdx.x] = s;
}
"""

TMA = r"""
struct __align__(64) CUtensorMap { unsigned long long opaque[16]; };

__device__ __forceinline__ void bar_init(unsigned bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(1) : "memory");
    // Make the initialised barrier visible to the async proxy (the TMA unit).
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void bar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "LAB_WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra LAB_WAIT_%=;\n"
        "}\n" :: "r"(bar), "r"(parity) : "memory");
}

#define TILE 256
extern "C" __global__ void tma_copy_1d(const __grid_constant__ CUtensorMap tmap, float* out) {
    __shared__ __align__(128) float tile[TILE];
    __shared__ __align__(8) unsigned long long bar;
    const unsigned bar_a = (unsigned)__cvta_generic_to_shared(&bar);
    const unsigned tile_a = (unsigned)__cvta_generic_to_shared(tile);
    const int x0 = blockIdx.x * TILE;
    if (threadIdx.x == 0) bar_init(bar_a);
    __syncthreads();
    if (threadIdx.x == 0) {
        bar_expect(bar_a, TILE * sizeof(float));  // the whole box, out-of-bounds part included
        asm volatile(
            "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2}], [%3];"
            :: "r"(tile_a), "l"(reinterpret_cast<unsigned long long>(&tmap)), "r"(x0), "r"(bar_a)
            : "memory");
    }
    bar_wait(bar_a, 0);
    for (int i = threadIdx.x; i < TILE; i += blockDim.x) out[x0 + i] = tile[i];
}

#define BOX_R 16
#define BOX_C 32
extern "C" __global__ void tma_copy_2d(const __grid_constant__ CUtensorMap tmap, float* out,
                                       int out_cols) {
    __shared__ __align__(128) float tile[BOX_R * BOX_C];
    __shared__ __align__(8) unsigned long long bar;
    const unsigned bar_a = (unsigned)__cvta_generic_to_shared(&bar);
    const unsigned tile_a = (unsigned)__cvta_generic_to_shared(tile);
    const int x0 = blockIdx.x * BOX_C, y0 = blockIdx.y * BOX_R;
    if (threadIdx.x == 0) bar_init(bar_a);
    __syncthreads();
    if (threadIdx.x == 0) {
        bar_expect(bar_a, BOX_R * BOX_C * sizeof(float));
        // Coordinates are innermost first: {column, row}.
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2, %3}], [%4];"
            :: "r"(tile_a), "l"(reinterpret_cast<unsigned long long>(&tmap)), "r"(x0), "r"(y0),
               "r"(bar_a)
            : "memory");
    }
    bar_wait(bar_a, 0);
    for (int i = threadIdx.x; i < BOX_R * BOX_C; i += blockDim.x)
        out[(y0 + i / BOX_C) * out_cols + x0 + i % BOX_C] = tile[i];
}
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("nvrtc")


def _fn(source, entry, cache):
    return Module(compile_cuda(source, entry, cache_dir=cache)).function(entry)


def test_device_info():
    assert rt.gpu_available()
    info = rt.device_info()
    assert info["cc"][0] == 9 and info["sm_count"] > 0
    assert info["max_shared_per_block_optin"] > 48 * 1024 and info["l2_bytes"] > 0


def test_device_array_round_trip():
    a = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32)
    d = DeviceArray.from_numpy(a)
    assert d.owned and d.shape == a.shape and d.strides == a.strides and d.nbytes == a.nbytes
    np.testing.assert_array_equal(d.to_numpy(), a)
    d.fill_bytes(0xFF)
    assert (d.to_numpy().view(np.uint8) == 0xFF).all()
    d.copy_from(a * 2)
    e = DeviceArray.empty(a.shape, a.dtype)
    rt.memcpy_dtod(e, d)
    rt.synchronize()
    np.testing.assert_array_equal(e.to_numpy(), a * 2)
    # A strided view of owned memory, gathered on the host.
    v = DeviceArray(d.ptr + 4, (3, 5, 3), np.float32, (140, 28, 8), owner=d)
    np.testing.assert_array_equal(v.to_numpy(), (a * 2)[:, :, 1::2])
    # Non-contiguous numpy input is made contiguous on the way in.
    t = DeviceArray.from_numpy(a.transpose(2, 0, 1))
    np.testing.assert_array_equal(t.to_numpy(), a.transpose(2, 0, 1))
    d.free()
    d.free()
    assert d.ptr == 0


def test_launch_write_tid(cache):
    fn = _fn(BASIC, "write_tid", cache)
    n, block = 1000, 128
    out = DeviceArray.empty((n,), np.int32)
    out.fill_bytes(0xAB)
    fn.launch(((n + block - 1) // block, 1, 1), (block, 1, 1), [("ptr", out.ptr), ("i32", n)])
    rt.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), np.arange(n) % block)
    attrs = fn.attributes()
    assert attrs["num_regs"] > 0 and attrs["max_threads_per_block"] >= 128
    times = rt.time_launch(lambda: fn.launch((8, 1, 1), (block, 1, 1), [("ptr", out), ("i32", n)]), 3)
    assert len(times) == 3 and all(t > 0 for t in times)


def test_scalar_arguments(cache):
    fn = _fn(BASIC, "scalars", cache)
    out = DeviceArray.empty((6,), np.float64)
    fn.launch((1, 1, 1), (1, 1, 1), [("ptr", out), ("i32", -7), ("i64", -(2**40)), ("u32", 2**31 + 5),
                                     ("f32", 1.5), ("f64", 2.25), ("u64", 2**50)])
    rt.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), [-7, -(2**40), 2**31 + 5, 1.5, 2.25, 2**50])


def test_tma_1d_with_out_of_bounds_tail(cache):
    fn = _fn(TMA, "tma_copy_1d", cache)
    n, tile = 1000, 256
    a = np.arange(n, dtype=np.float32) + 1
    src = DeviceArray.from_numpy(a)
    grid = (n + tile - 1) // tile
    out = DeviceArray.empty((grid * tile,), np.float32)
    out.fill_bytes(0xFF)  # NaN poison: zeros must come from the TMA out-of-bounds fill
    tmap = encode_tensor_map("src_1d", src, (tile,))
    assert len(tmap) == 128 and any(tmap)
    fn.launch((grid, 1, 1), (128, 1, 1), [("tmap", tmap), ("ptr", out)])
    rt.synchronize()
    expect = np.zeros(grid * tile, np.float32)
    expect[:n] = a
    np.testing.assert_array_equal(out.to_numpy(), expect)


def test_tma_2d_strided_view(cache):
    fn = _fn(TMA, "tma_copy_2d", cache)
    rows, cols, pitch, box_r, box_c = 50, 70, 72, 16, 32
    full = np.arange(rows * pitch, dtype=np.float32).reshape(rows, pitch)
    dev = DeviceArray.from_numpy(full)
    view = DeviceArray(dev.ptr, (rows, cols), np.float32, (pitch * 4, 4), owner=dev)
    grid = ((cols + box_c - 1) // box_c, (rows + box_r - 1) // box_r, 1)
    out_shape = (grid[1] * box_r, grid[0] * box_c)
    out = DeviceArray.empty(out_shape, np.float32)
    out.fill_bytes(0xFF)
    tmap = encode_tensor_map("src_2d", view, (box_r, box_c))
    fn.launch(grid, (128, 1, 1), [("tmap", tmap), ("ptr", out), ("i32", out_shape[1])])
    rt.synchronize()
    expect = np.zeros(out_shape, np.float32)
    expect[:rows, :cols] = full[:, :cols]
    np.testing.assert_array_equal(out.to_numpy(), expect)


def test_dynamic_shared_memory_over_48k(cache):
    fn = _fn(BASIC, "big_smem", cache)
    block, n = 256, 160 * 1024 // 4
    out = DeviceArray.empty((block,), np.float32)
    fn.launch((1, 1, 1), (block, 1, 1), [("ptr", out), ("i32", n)], shared_bytes=n * 4)
    rt.synchronize()
    vals = (n - 1 - np.arange(n)).reshape(-1, block)  # value read by thread t at step k
    np.testing.assert_array_equal(out.to_numpy(), vals.sum(axis=0).astype(np.float32))
    with pytest.raises(CodegenError, match="big_smem.*requests 400000 bytes"):
        fn.launch((1, 1, 1), (block, 1, 1), [("ptr", out), ("i32", n)], shared_bytes=400000)


def test_driver_errors_are_named():
    with pytest.raises(CudaError) as info:
        Module(b"definitely not a cubin")
    assert info.value.call == "cuModuleLoadData"
    assert info.value.code in ("CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_INVALID_VALUE")
    assert str(info.value).startswith(f"cuModuleLoadData failed: {info.value.code} (")
    m = Module(compile_cuda(BASIC, "write_tid", use_cache=False))
    with pytest.raises(CudaError, match="cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND"):
        m.function("no_such_kernel")


def test_torch_tensor_is_borrowed(cache):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    torch.cuda.synchronize()
    d = as_device_array(t)
    assert d.ptr == t.data_ptr() and d.shape == (3, 4) and d.dtype == np.float32 and not d.owned
    np.testing.assert_array_equal(d.to_numpy(), t.cpu().numpy())
    tt = as_device_array(t.t())
    assert tt.ptr == t.data_ptr() and tt.strides == (4, 16)
    np.testing.assert_array_equal(tt.to_numpy(), t.t().cpu().numpy())

    class OnlyDlpack:  # forces the DLPack capsule path
        def __init__(self, x):
            self.x = x

        def __dlpack__(self, stream=None):
            return self.x.__dlpack__()

        def __dlpack_device__(self):
            return self.x.__dlpack_device__()

    ints = torch.full((300,), -1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    di = as_device_array(OnlyDlpack(ints))
    assert di.ptr == ints.data_ptr() and di.shape == (300,) and di.dtype == np.int32
    _fn(BASIC, "write_tid", cache).launch((3, 1, 1), (100, 1, 1), [("ptr", di), ("i32", 300)])
    rt.synchronize()
    np.testing.assert_array_equal(ints.cpu().numpy(), np.arange(300) % 100)
