// 8-bit float storage types (OCP FP8; the conversions need sm_89 or later). A load converts up
// exactly (through f16, which holds every e4m3 and e5m2 value); a store rounds to nearest even and
// saturates to the largest finite value (cvt.rn.satfinite: 448 for e4m3, 57344 for e5m2), NaN stays NaN.
// One definition for both types: T the struct, F8X2 the PTX type of a pair.
#define CB_FP8_TYPE(T, F8X2)                                                              \
  struct T {                                                                              \
    unsigned char bits;                                                                   \
    T() = default;                                                                        \
    __device__ __forceinline__ T(float f) {                                               \
      unsigned short h;                                                                   \
      asm("cvt.rn.satfinite." F8X2 ".f32 %0, %1, %2;" : "=h"(h) : "f"(0.0f), "f"(f));     \
      bits = (unsigned char)h;                                                            \
    }                                                                                     \
    __device__ __forceinline__ operator float() const {                                   \
      unsigned h2;                                                                        \
      asm("cvt.rn.f16x2." F8X2 " %0, %1;" : "=r"(h2) : "h"((unsigned short)bits));        \
      float f;                                                                            \
      asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(h2 & 0xFFFFu)));         \
      return f;                                                                           \
    }                                                                                     \
  };
CB_FP8_TYPE(cb_e4m3, "e4m3x2")
CB_FP8_TYPE(cb_e5m2, "e5m2x2")
#undef CB_FP8_TYPE
