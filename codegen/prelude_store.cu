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
