// The element of a TMA-swizzled tile holding logical element i: its byte offset with the 16-byte
// chunk XORed by the 128-byte row, within the pattern of `span` bytes (only kernels that use it).
__device__ __forceinline__ int cb_swizzle(int i, int esize, int span) {
  const int o = i * esize;
  return (o ^ (((o >> 7) & (span / 16 - 1)) << 4)) / esize;
}
