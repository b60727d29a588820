// 8-bit float storage types (OCP FP8; the conversions need sm_89 or later). A load converts up
// exactly (through f16, which holds every e4m3 and e5m2 value); a store rounds to nearest even and
// saturates to the largest finite value (cvt.rn.satfinite: 448 for e4m3, 57344 for e5m2), NaN stays NaN.
struct cb_e4m3 {
  unsigned char bits;
  cb_e4m3() = default;
  __device__ __forceinline__ cb_e4m3(float f) {
    unsigned short h;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(0.0f), "f"(f));
    bits = (unsigned char)h;
  }
  __device__ __forceinline__ operator float() const {
    unsigned h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((unsigned short)bits));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(h2 & 0xFFFFu)));
    return f;
  }
};
struct cb_e5m2 {
  unsigned char bits;
  cb_e5m2() = default;
  __device__ __forceinline__ cb_e5m2(float f) {
    unsigned short h;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(h) : "f"(0.0f), "f"(f));
    bits = (unsigned char)h;
  }
  __device__ __forceinline__ operator float() const {
    unsigned h2;
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"((unsigned short)bits));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(h2 & 0xFFFFu)));
    return f;
  }
};
