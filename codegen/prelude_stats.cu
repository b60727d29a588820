// cbrules prelude, block statistics (block_stats): the block's mean and M2 (sum of squared deviations)
// from each thread's own, merged pairwise (Chan, Golub and LeVeque's update) so that nothing cancels
// when the mean is large against the spread. Every merge joins two groups of the same count c, so
// mean = (ma + mb) / 2 and M2 = M2a + M2b + d^2 c / 2 (d = mb - ma): both partners of a butterfly
// compute the same bits (+ is commutative, d^2 = (-d)^2) and every thread ends with the same pair.
// N: elements a thread's pair covers; nthreads: a power-of-two count of whole warps (threads 0..).
__device__ __forceinline__ void cb_stats_merge(float& mean, float& m2, int o, float half_count) {
  const float mb = __shfl_xor_sync(0xffffffffu, mean, o), m2b = __shfl_xor_sync(0xffffffffu, m2, o);
  const float d = mb - mean;
  mean = 0.5f * (mean + mb);
  m2 = (m2 + m2b) + d * d * half_count;
}
// the warps' pairs go through `scratch` (2 * 32 floats); each warp then merges all of them itself (lane
// l takes warp l % nwarps's pair), so one sync suffices and no result is broadcast back
template <int N>
__device__ __forceinline__ void cb_block_stats_warps(float& mean, float& m2, float* scratch) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float c = 0.5f * N;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1, c *= 2.0f) cb_stats_merge(mean, m2, o, c);
  if (lane == 0) {
    scratch[warp] = mean;
    scratch[32 + warp] = m2;
  }
}
template <int N>
__device__ __forceinline__ void cb_block_stats_merge_warps(float& mean, float& m2, float* scratch,
                                                           unsigned nwarps) {
  const unsigned lane = threadIdx.x % 32;
  float c = 16.0f * N;
  mean = scratch[lane % nwarps];
  m2 = scratch[32 + lane % nwarps];
  for (unsigned o = 1; o < nwarps; o <<= 1, c *= 2.0f) cb_stats_merge(mean, m2, o, c);
}
// LAST: no scratch use can follow (codegen proved it), so the sync that guards scratch's reuse goes
// mean and m2 take the thread's own pair and return the block's
template <int N, bool LAST>
__device__ __forceinline__ void cb_block_stats(float own_mean, float own_m2, float& mean, float& m2,
                                               float* scratch) {
  mean = own_mean;
  m2 = own_m2;
  const unsigned nwarps = blockDim.x / 32;
  cb_block_stats_warps<N>(mean, m2, scratch);
  __syncthreads();
  cb_block_stats_merge_warps<N>(mean, m2, scratch, nwarps);
  if (!LAST) __syncthreads();  // scratch may be reused by the next reduction
}
// over threads 0 .. nthreads-1 only (the consumer warp groups), synchronised by named barrier `bar`
template <int N, bool LAST>
__device__ __forceinline__ void cb_block_stats_named(float own_mean, float own_m2, float& mean, float& m2,
                                                     float* scratch, unsigned bar, unsigned nthreads) {
  mean = own_mean;
  m2 = own_m2;
  cb_block_stats_warps<N>(mean, m2, scratch);
  cb_bar_sync(bar, nthreads);
  cb_block_stats_merge_warps<N>(mean, m2, scratch, nthreads / 32);
  if (!LAST) cb_bar_sync(bar, nthreads);
}
