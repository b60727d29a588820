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
