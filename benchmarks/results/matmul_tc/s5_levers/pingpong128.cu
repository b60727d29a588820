// cbrules prelude: self-contained device helpers (no CUDA headers); PTX through inline asm.
struct __align__(64) CUtensorMap { unsigned long long opaque[16]; };

__device__ __forceinline__ unsigned cb_smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ int cb_ceil_div(int a, int b) { return (a + b - 1) / b; }
template <typename T> __device__ __forceinline__ T cb_min(T a, T b) { return a < b ? a : b; }
template <typename T> __device__ __forceinline__ T cb_max(T a, T b) { return a > b ? a : b; }

// elect.sync must be executed by every lane of the warp: callers test the warp first.
__device__ __forceinline__ bool cb_elect_sync() {
  unsigned pred = 0;
  asm volatile("{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}\n" : "=r"(pred));
  return pred != 0;
}

__device__ __forceinline__ void cb_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void cb_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void cb_mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cb_mbar_wait(unsigned bar, unsigned parity) {
  asm volatile("{\n .reg .pred p;\n CB_WAIT:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               " @!p bra CB_WAIT;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void cb_mbar_inval(unsigned bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void cb_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void cb_fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void cb_bar_sync(unsigned id, unsigned count) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(count) : "memory");
}

// TMA tile loads; coordinates innermost first, as the tensor map's dimensions are.
__device__ __forceinline__ void cb_tma_load(unsigned dst, const CUtensorMap* m, unsigned bar, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3}], [%2];"
               :: "r"(dst), "l"(m), "r"(bar), "r"(c0) : "memory");
}
__device__ __forceinline__ void cb_tma_load(unsigned dst, const CUtensorMap* m, unsigned bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
               :: "r"(dst), "l"(m), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void cb_tma_load(unsigned dst, const CUtensorMap* m, unsigned bar, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
               :: "r"(dst), "l"(m), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
// TMA tile stores: issue, commit, and wait until shared memory may be reused.
__device__ __forceinline__ void cb_tma_store_wait() {
  asm volatile("cp.async.bulk.commit_group;\n cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void cb_tma_store(const CUtensorMap* m, unsigned src, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%2}], [%1];"
               :: "l"(m), "r"(src), "r"(c0) : "memory");
  cb_tma_store_wait();
}
__device__ __forceinline__ void cb_tma_store(const CUtensorMap* m, unsigned src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"(m), "r"(src), "r"(c0), "r"(c1) : "memory");
  cb_tma_store_wait();
}
__device__ __forceinline__ void cb_tma_store(const CUtensorMap* m, unsigned src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
               :: "l"(m), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
  cb_tma_store_wait();
}

// Block-wide reduction of whole warps: warp shuffles, then one value per warp through `scratch`.
template <typename T, typename Op>
__device__ __forceinline__ T cb_block_reduce(T v, T identity, Op op, T* scratch) {
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned nwarps = (blockDim.x * blockDim.y * blockDim.z) / 32;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (tid % 32 == 0) scratch[tid / 32] = v;
  __syncthreads();
  if (tid < 32) {
    v = tid < nwarps ? scratch[tid] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (tid == 0) scratch[0] = v;
  }
  __syncthreads();
  v = scratch[0];
  __syncthreads();  // scratch may be reused by the next reduction
  return v;
}
struct CbSum { template <typename T> __device__ T operator()(T a, T b) const { return a + b; } };
struct CbMax { template <typename T> __device__ T operator()(T a, T b) const { return a > b ? a : b; } };
struct CbMin { template <typename T> __device__ T operator()(T a, T b) const { return a < b ? a : b; } };

// Half-precision storage types (no CUDA headers: NVRTC ships none for them). Registers compute in
// float; a load converts up exactly, a store rounds to nearest even (cvt.rn), as numpy does.
struct cb_half {
  unsigned short bits;
  cb_half() = default;
  __device__ __forceinline__ cb_half(float f) { asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f)); }
  __device__ __forceinline__ operator float() const {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
  }
};
struct cb_bf16 {
  unsigned short bits;
  cb_bf16() = default;
  __device__ __forceinline__ cb_bf16(float f) { asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(f)); }
  __device__ __forceinline__ operator float() const {
    float f;
    asm("cvt.f32.bf16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
  }
};

// TMA stores in bulk async-groups: issue and commit now, wait later (only kernels that use them).
__device__ __forceinline__ void cb_tma_store_async(const CUtensorMap* m, unsigned src, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%2}], [%1];\n cp.async.bulk.commit_group;"
               :: "l"(m), "r"(src), "r"(c0) : "memory");
}
__device__ __forceinline__ void cb_tma_store_async(const CUtensorMap* m, unsigned src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n cp.async.bulk.commit_group;"
               :: "l"(m), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void cb_tma_store_async(const CUtensorMap* m, unsigned src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n cp.async.bulk.commit_group;"
               :: "l"(m), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
// All but the newest N groups of this thread have read their source (.read) or completed.
template <int N> __device__ __forceinline__ void cb_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void cb_bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" :: "n"(N) : "memory");
}

// The element of a TMA-swizzled tile holding logical element i: its byte offset with the 16-byte
// chunk XORed by the 128-byte row, within the pattern of `span` bytes (only kernels that use it).
__device__ __forceinline__ int cb_swizzle(int i, int esize, int span) {
  const int o = i * esize;
  return (o ^ (((o >> 7) & (span / 16 - 1)) << 4)) / esize;
}

// cbrules prelude, warp specialization: helpers of kernels whose roles run on different warp groups.
// One thread of warp w (every lane of that warp must get here: elect.sync takes the full mask).
__device__ __forceinline__ bool cb_elect_warp(int w) {
  return static_cast<int>(threadIdx.x) / 32 == w && cb_elect_sync();
}
// cb_block_reduce over threads 0 .. nthreads-1 only (the consumer warp groups), synchronised by
// named barrier `bar`: the producer warp group never reaches a __syncthreads the consumers wait in.
template <typename T, typename Op>
__device__ __forceinline__ T cb_block_reduce_named(T v, T identity, Op op, T* scratch, unsigned bar,
                                                   unsigned nthreads) {
  const unsigned tid = threadIdx.x;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (tid % 32 == 0) scratch[tid / 32] = v;
  cb_bar_sync(bar, nthreads);
  if (tid < 32) {
    v = tid < nthreads / 32 ? scratch[tid] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (tid == 0) scratch[0] = v;
  }
  cb_bar_sync(bar, nthreads);
  v = scratch[0];
  cb_bar_sync(bar, nthreads);  // scratch may be reused by the next reduction
  return v;
}

// warpgroup MMA ordering (wgmma.fence / commit_group / wait_group)
__device__ __forceinline__ void cb_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void cb_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cb_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// keeps the compiler from moving reads or writes of accumulator registers across an asynchronous MMA
template <int N> __device__ __forceinline__ void cb_fence_acc(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
// a shared-memory matrix descriptor: the start address (bits 0-13, in 16-byte units) over the
// constant fields (leading / stride byte offsets, base offset, swizzle mode), given as two halves
__device__ __forceinline__ unsigned long long cb_wgmma_desc(unsigned addr, unsigned hi, unsigned lo) {
  return ((unsigned long long)hi << 32 | lo) | (unsigned long long)((addr & 0x3FFFF) >> 4);
}
__device__ __forceinline__ void cb_wgmma_n128_bf16(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(da), "l"(db), "r"(scale_d) : "memory");
}

// the consumer warp group's own elected thread (cb_elect_one elects in warp 0 only)
__device__ __forceinline__ bool cb_elect_wg() { return threadIdx.x % 128 < 32 && cb_elect_sync(); }
__device__ __forceinline__ void cb_bar_arrive(unsigned id, unsigned count) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ bool cb_elect_one() { return threadIdx.x < 32 && cb_elect_sync(); }

extern "C" __global__ void __launch_bounds__(384, 1) matmul_tc(int M, int N, int K, const cb_bf16* __restrict__ a, const cb_bf16* __restrict__ b, cb_bf16* __restrict__ c, const __grid_constant__ CUtensorMap a_tmap, const __grid_constant__ CUtensorMap b_tmap, const __grid_constant__ CUtensorMap c_tmap) {
  extern __shared__ __align__(1024) unsigned char cb_smem[];
  unsigned long long* cb_empty_7 = reinterpret_cast<unsigned long long*>(cb_smem + 0);
  unsigned long long* cb_full_7 = reinterpret_cast<unsigned long long*>(cb_smem + 32);
  cb_bf16* cb_stage_11 = reinterpret_cast<cb_bf16*>(cb_smem + 1024);
  cb_bf16* a_tile = reinterpret_cast<cb_bf16*>(cb_smem + 66560);
  cb_bf16* b_tile = reinterpret_cast<cb_bf16*>(cb_smem + 132096);
  float v0 = 0;
  if (cb_elect_one()) {  // pre-prologue
    for (int cb_s = 0; cb_s < 4; cb_s += 1) {  // pre-prologue
      cb_mbar_init(cb_smem_addr(&cb_full_7[cb_s]), 1);
      cb_mbar_init(cb_smem_addr(&cb_empty_7[cb_s]), 128);
    }
    cb_fence_proxy_async();  // pre-prologue
  }
  __syncthreads();  // pre-prologue
  if ((int)threadIdx.x < 256) {
    const int cb_wg = (int)threadIdx.x / 128;
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    float acc[128];
    #pragma unroll
    for (int acc_zero = 0; acc_zero < 128; acc_zero += 1) {
      acc[acc_zero] = 0.0f;
    }
    if (cb_wg == 0) for (int cb_k = 0; cb_k < 4; cb_k += 1) {  // pre-prologue
      cb_mbar_arrive(cb_smem_addr(&cb_empty_7[cb_k]));
    }
    for (int tile = (int)blockIdx.x + cb_wg * 132; tile < cb_ceil_div(M, 128) * cb_ceil_div(N, 128); tile += 2 * 132) {
      if (tile != (int)blockIdx.x) cb_bar_sync(3 + cb_wg, 256);  // the tensor core's turn
      for (int t = 0; t < cb_ceil_div(K, 64); t += 1) {  // consumer
        cb_mbar_wait(cb_smem_addr(&cb_full_7[((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) % 4]), ((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) / 4 % 2);
        cb_wgmma_fence();
        { const unsigned cb_a = cb_smem_addr(a_tile + ((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) % 4 * 8192);
  const unsigned cb_b = cb_smem_addr(b_tile + ((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) % 4 * 8192);
  cb_wgmma_n128_bf16(acc + 0, cb_wgmma_desc(cb_a + 0, 1073741888, 65536), cb_wgmma_desc(cb_b + 0, 1073741888, 65536), 1);
  cb_wgmma_n128_bf16(acc + 0, cb_wgmma_desc(cb_a + 32, 1073741888, 65536), cb_wgmma_desc(cb_b + 32, 1073741888, 65536), 1);
  cb_wgmma_n128_bf16(acc + 0, cb_wgmma_desc(cb_a + 64, 1073741888, 65536), cb_wgmma_desc(cb_b + 64, 1073741888, 65536), 1);
  cb_wgmma_n128_bf16(acc + 0, cb_wgmma_desc(cb_a + 96, 1073741888, 65536), cb_wgmma_desc(cb_b + 96, 1073741888, 65536), 1);
  cb_wgmma_n128_bf16(acc + 64, cb_wgmma_desc(cb_a + 8192, 1073741888, 65536), cb_wgmma_desc(cb_b + 0, 1073741888, 65536), 1);
  cb_wgmma_n128_bf16(acc + 64, cb_wgmma_desc(cb_a + 8224, 1073741888, 65536), cb_wgmma_desc(cb_b + 32, 1073741888, 65536), 1);
  cb_wgmma_n128_bf16(acc + 64, cb_wgmma_desc(cb_a + 8256, 1073741888, 65536), cb_wgmma_desc(cb_b + 64, 1073741888, 65536), 1);
  cb_wgmma_n128_bf16(acc + 64, cb_wgmma_desc(cb_a + 8288, 1073741888, 65536), cb_wgmma_desc(cb_b + 96, 1073741888, 65536), 1); }
        cb_wgmma_commit();
        cb_wgmma_wait<1>();
        if (t > 0) {
          cb_mbar_arrive(cb_smem_addr(&cb_empty_7[((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t + 3) % 4]));
        }
        if (t == cb_ceil_div(K, 64) - 1) {
          if (tile + 132 < cb_ceil_div(M, 128) * cb_ceil_div(N, 128)) cb_bar_arrive(4 - cb_wg, 256);  // hand it over
          cb_wgmma_wait<0>(); cb_fence_acc<128>(acc);
          cb_mbar_arrive(cb_smem_addr(&cb_empty_7[((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) % 4]));
        }
      }
      cb_wgmma_wait<0>(); cb_fence_acc<128>(acc);
      #pragma unroll
      for (int acc_q = 0; acc_q < 2; acc_q += 1) {
        #pragma unroll
        for (int acc_j = 0; acc_j < 2; acc_j += 1) {
          #pragma unroll
          for (int acc_r = 0; acc_r < 32; acc_r += 1) {
            v0 = acc[acc_j * 64 + (acc_q * 32 + acc_r)];
            cb_stage_11[cb_swizzle((acc_j * 64 + (int)threadIdx.x / 32 % 4 * 16 + (int)threadIdx.x % 32 / 4 + (acc_q * 32 + acc_r) / 2 % 2 * 8) * 64 + ((acc_q * 32 + acc_r) / 4 * 8 + (int)threadIdx.x % 32 % 4 * 2 + (acc_q * 32 + acc_r) % 2) - acc_q * 64, 2, 128) + acc_q * 8192 + cb_wg * 16384] = v0;
          }
        }
        cb_fence_proxy_async();
        if ((int)threadIdx.x % 128 < 32) cb_bulk_wait_read<0>();
        cb_bar_sync(5 + cb_wg, 128);
        if (cb_elect_wg()) {
          cb_tma_store_async(&c_tmap, cb_smem_addr(cb_stage_11 + acc_q * 8192 + cb_wg * 16384), tile % (cb_ceil_div(N, 128) * 16) / cb_min(cb_ceil_div(M, 128) - tile / (cb_ceil_div(N, 128) * 16) * 16, 16) * 128 + acc_q * 64, (tile / (cb_ceil_div(N, 128) * 16) * 16 + tile % (cb_ceil_div(N, 128) * 16) % cb_min(cb_ceil_div(M, 128) - tile / (cb_ceil_div(N, 128) * 16) * 16, 16)) * 128);
        }
      }
      #pragma unroll
      for (int acc_zero = 0; acc_zero < 128; acc_zero += 1) {
        acc[acc_zero] = 0.0f;
      }
    }
    if (cb_elect_wg()) {
      cb_bulk_wait<0>();
    }
    cb_bar_sync(2, 256);  // post-epilogue
    if (cb_elect_one()) {  // post-epilogue
      for (int cb_s = 0; cb_s < 4; cb_s += 1) {  // post-epilogue
        cb_mbar_inval(cb_smem_addr(&cb_full_7[cb_s]));
        cb_mbar_inval(cb_smem_addr(&cb_empty_7[cb_s]));
      }
    }
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    for (int tile = (int)blockIdx.x; tile < cb_ceil_div(M, 128) * cb_ceil_div(N, 128); tile += 132) {
      for (int t = 0; t < cb_ceil_div(K, 64); t += 1) {  // producer
        if (cb_elect_warp(8)) {
          cb_mbar_wait(cb_smem_addr(&cb_empty_7[((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) % 4]), ((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) / 4 % 2);
        }
        if (cb_elect_warp(8)) {
          cb_mbar_arrive_expect_tx(cb_smem_addr(&cb_full_7[((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) % 4]), 32768);
          cb_tma_load(cb_smem_addr(a_tile + ((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) % 4 * 8192), &a_tmap, cb_smem_addr(&cb_full_7[((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) % 4]), t * 64, (tile / (cb_ceil_div(N, 128) * 16) * 16 + tile % (cb_ceil_div(N, 128) * 16) % cb_min(cb_ceil_div(M, 128) - tile / (cb_ceil_div(N, 128) * 16) * 16, 16)) * 128);
          cb_tma_load(cb_smem_addr(b_tile + ((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) % 4 * 8192), &b_tmap, cb_smem_addr(&cb_full_7[((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t) % 4]), t * 64, tile % (cb_ceil_div(N, 128) * 16) / cb_min(cb_ceil_div(M, 128) - tile / (cb_ceil_div(N, 128) * 16) * 16, 16) * 128);
        }
      }
    }
  }
}
