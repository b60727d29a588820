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
