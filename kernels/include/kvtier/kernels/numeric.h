// Bit-exact scalar conversions between fp32 and the 16- and 8-bit formats that KV caches use: IEEE
// fp16 (binary16), bf16, and fp8 e4m3 ("e4m3fn" of the OCP FP8 spec and CUDA's __nv_fp8_e4m3: bias 7,
// no infinities, one NaN pattern per sign, finite range +-448). The CPU reference kernels use these,
// and they give the same bits as CUDA's conversions (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h: checked in
// numeric_test.cc against CUDA's own host implementations), so CPU and GPU results compare exactly.
//
// Values travel as their raw bit patterns (uint16_t / uint8_t) in host byte order (little-endian on
// every supported machine). All functions are pure, inline and thread-safe; none touches the FPU
// rounding mode. Rounding is always to nearest, ties to even.
#ifndef KVTIER_KERNELS_NUMERIC_H_
#define KVTIER_KERNELS_NUMERIC_H_

#include <cstdint>
#include <cstring>

namespace kvtier::kernels {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// fp16 -> fp32; exact (every fp16 value, subnormals included, is an fp32 value).
inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mant << 13));  // inf, NaN
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;  // mant * 2^-24, exact
    return BitsToFloat(sign | FloatBits(v));
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// fp32 -> fp16, round to nearest even (as __float2half_rn). |f| >= 65520 gives +-inf; results
// below 2^-14 are fp16 subnormals; NaN stays NaN (quiet).
inline uint16_t FloatToFp16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0u));
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: overflows
  if (ax >= 0x38800000u) {                                              // >= 2^-14: normal fp16
    const uint32_t mant = ax & 0x7FFFFFu;
    uint32_t h = ((((ax >> 23) - 127u + 15u)) << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry correctly bumps the exponent
    return static_cast<uint16_t>(sign | h);
  }
  const uint32_t e = ax >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
  const uint32_t sig = (ax & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;  // value / 2^-24 = sig >> shift; shift in [14, 24]
  uint32_t h = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

// bf16 -> fp32; exact.
inline float Bf16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// fp32 -> bf16, round to nearest even (as __float2bfloat16_rn); overflow gives +-inf; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// Largest finite fp8 e4m3 magnitude.
inline constexpr float kFp8E4m3Max = 448.0f;

// fp8 e4m3 -> fp32; exact. 0x7F / 0xFF are NaN.
inline float Fp8E4m3ToFloat(uint8_t v) {
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t mant = v & 0x7u;
  float mag;
  if (exp == 0xF && mant == 0x7) {
    mag = BitsToFloat(0x7FC00000u);
  } else if (exp == 0) {
    mag = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9
  } else {
    mag = BitsToFloat(((exp + 120u) << 23) | (mant << 20));
  }
  return (v & 0x80u) ? -mag : mag;
}

// fp32 -> fp8 e4m3, round to nearest even, saturating to +-448 for finite and infinite inputs
// (CUDA's __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3)); any NaN gives 0x7F, as CUDA's does.
// Results below 2^-6 are subnormal (multiples of 2^-9); below 2^-10 they round to a signed zero.
inline uint8_t FloatToFp8E4m3(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return 0x7Fu;
  if (ax >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7Eu);  // >= 448 (incl. inf): saturate
  const uint32_t e = ax >> 23;
  if (e >= 121) {  // >= 2^-6: normal e4m3
    const uint32_t mant = ax & 0x7FFFFFu;
    uint32_t v = ((e - 120u) << 3) | (mant >> 20);
    const uint32_t rem = mant & 0xFFFFFu;
    if (rem > 0x80000u || (rem == 0x80000u && (v & 1u))) ++v;  // < 448 here, so never reaches NaN
    return static_cast<uint8_t>(sign | v);
  }
  if (e < 117) return static_cast<uint8_t>(sign);  // < 2^-10: rounds to zero
  const uint32_t sig = (ax & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 141u - e;  // value / 2^-9 = sig >> shift; shift in [21, 24]
  uint32_t v = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (v & 1u))) ++v;  // may become 0x08 = 2^-6, which is right
  return static_cast<uint8_t>(sign | v);
}

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_NUMERIC_H_
