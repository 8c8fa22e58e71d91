// numeric.h: exactness, round-to-nearest-even, saturation and special values; in CUDA builds, bit
// equality with CUDA's own conversions (their host implementations, so no GPU is needed).
#include "kvtier/kernels/numeric.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

#if KVTIER_HAVE_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace kvtier::kernels {
namespace {

TEST(NumericTest, EveryFp16ValueRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(f)))) << h;
    } else {
      ASSERT_EQ(FloatToFp16(f), h) << h;
    }
  }
}

TEST(NumericTest, EveryBf16ValueRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(f)))) << h;
    } else {
      ASSERT_EQ(FloatToBf16(f), h) << h;
    }
  }
}

TEST(NumericTest, EveryFp8ValueRoundTripsThroughFloat) {
  for (uint32_t v = 0; v < 0x100; ++v) {
    const float f = Fp8E4m3ToFloat(static_cast<uint8_t>(v));
    if ((v & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(f)) << v;
      EXPECT_EQ(FloatToFp8E4m3(f), 0x7F);
    } else {
      ASSERT_EQ(FloatToFp8E4m3(f), v) << v << " " << f;
    }
  }
  EXPECT_EQ(Fp8E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4m3ToFloat(0x08), std::ldexp(1.0f, -6));
}

TEST(NumericTest, RoundingIsToNearestEven) {
  EXPECT_EQ(FloatToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie -> even (1.0)
  EXPECT_EQ(FloatToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie -> even (mantissa 2)
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);             // half the smallest subnormal
  EXPECT_EQ(FloatToFp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToFp16(-std::ldexp(3.0f, -25)), 0x8002);  // 1.5 ulp ties to 2
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(FloatToFp8E4m3(1.0f + 1.0f / 16), 0x38);
  EXPECT_EQ(FloatToFp8E4m3(1.0f + 3.0f / 16), 0x3A);
  EXPECT_EQ(FloatToFp8E4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(FloatToFp8E4m3(-std::ldexp(1.0f, -10)), 0x80);
  EXPECT_EQ(FloatToFp8E4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal ulps -> 2
}

TEST(NumericTest, OverflowSaturatesOrGoesToInfinityAsDocumented) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7C00);
  EXPECT_EQ(FloatToFp16(-inf), 0xFC00);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(FloatToFp8E4m3(448.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4m3(463.9f), 0x7E);
  EXPECT_EQ(FloatToFp8E4m3(1e9f), 0x7E);
  EXPECT_EQ(FloatToFp8E4m3(-inf), 0xFE);
  EXPECT_EQ(FloatToFp8E4m3(std::nanf("")), 0x7F);
}

#if KVTIER_HAVE_CUDA
// Floats that matter for rounding: a sweep over all bit patterns plus, around every value of the
// narrow format, the exact midpoints and their neighbours.
template <typename Fn>
void ForInterestingFloats(Fn fn) {
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) fn(BitsToFloat(static_cast<uint32_t>(u)));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    for (float base : {Fp16ToFloat(static_cast<uint16_t>(h)), Bf16ToFloat(static_cast<uint16_t>(h))}) {
      if (!std::isfinite(base)) continue;
      const uint32_t b = FloatBits(base);
      for (int d = -3; d <= 3; ++d) fn(BitsToFloat(b + d));
      for (int shift : {12, 15}) {  // fp16 and bf16 midpoints
        for (int d = -1; d <= 1; ++d) fn(BitsToFloat(b + (1u << shift) + d));
      }
    }
  }
  for (uint32_t v = 0; v < 0x100; ++v) {
    const float base = Fp8E4m3ToFloat(static_cast<uint8_t>(v));
    if (std::isnan(base)) continue;
    const uint32_t b = FloatBits(base);
    for (int d = -3; d <= 3; ++d) fn(BitsToFloat(b + d));
    for (int shift : {19, 20, 21, 22}) {
      for (int d = -1; d <= 1; ++d) fn(BitsToFloat(b + (1u << shift) + d));
    }
  }
}

TEST(NumericCudaTest, ConversionsMatchCudasBitForBit) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    __half_raw hr;
    hr.x = static_cast<unsigned short>(h);
    const float want16 = __half2float(__half(hr));
    const float got16 = Fp16ToFloat(static_cast<uint16_t>(h));
    ASSERT_TRUE(FloatBits(got16) == FloatBits(want16) || (std::isnan(got16) && std::isnan(want16))) << h;
    __nv_bfloat16_raw br;
    br.x = static_cast<unsigned short>(h);
    const float wantb = __bfloat162float(__nv_bfloat16(br));
    const float gotb = Bf16ToFloat(static_cast<uint16_t>(h));
    ASSERT_TRUE(FloatBits(gotb) == FloatBits(wantb) || (std::isnan(gotb) && std::isnan(wantb))) << h;
  }
  for (uint32_t v = 0; v < 0x100; ++v) {
    const __half_raw hr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
    const float want = __half2float(__half(hr));
    const float got = Fp8E4m3ToFloat(static_cast<uint8_t>(v));
    ASSERT_TRUE(FloatBits(got) == FloatBits(want) || (std::isnan(got) && std::isnan(want))) << v;
  }
  int64_t checked = 0;
  ForInterestingFloats([&](float f) {
    ++checked;
    if (std::isnan(f)) return;
    const __half h = __float2half_rn(f);
    ASSERT_EQ(FloatToFp16(f), static_cast<__half_raw>(h).x) << f << " bits " << FloatBits(f);
    const __nv_bfloat16 b = __float2bfloat16_rn(f);
    ASSERT_EQ(FloatToBf16(f), static_cast<__nv_bfloat16_raw>(b).x) << f << " bits " << FloatBits(f);
    ASSERT_EQ(FloatToFp8E4m3(f), __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3)) << f << " bits " << FloatBits(f);
  });
  EXPECT_GT(checked, 2000000);
}
#endif  // KVTIER_HAVE_CUDA

}  // namespace
}  // namespace kvtier::kernels
