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
