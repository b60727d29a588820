// Vector accesses (the vectorize rules' copy op): one 4-, 8- or 16-byte load or store a thread
// instead of one per element. The rules proved both element indices multiples of the count; shared
// buffers and register arrays start 16-byte aligned and the launcher checks global tensors' addresses.
template <int B> struct cb_vec;
template <> struct __align__(4) cb_vec<4> { unsigned x; };
template <> struct __align__(8) cb_vec<8> { unsigned x, y; };
template <> struct __align__(16) cb_vec<16> { unsigned x, y, z, w; };
template <int B>
__device__ __forceinline__ void cb_vcopy(void* dst, const void* src) {
  *reinterpret_cast<cb_vec<B>*>(dst) = *reinterpret_cast<const cb_vec<B>*>(src);
}
