// CPU reference of quantize/dequantize: the layout, the documented error bound for fp16 and bf16 inputs
// and both codecs (all-zero groups, the largest magnitudes, negative values, subnormals, underflow), and
// argument errors.
#include "kvtier/kernels/quantize.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"

namespace kvtier::kernels {
namespace {

using testing::Bytes;

struct Case {
  FloatType float_type;
  QuantCodec codec;
  BlockKind kind;
  int32_t dim;  // head_dim or latent_dim
  int32_t group;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.float_type == FloatType::kFp16 ? "fp16 " : "bf16 ") << (c.codec == QuantCodec::kInt8 ? "int8 " : "fp8 ")
      << (c.kind == BlockKind::kMla ? "mla " : "std ") << c.dim << " g" << c.group;
}

QuantSpec SpecOf(const Case& c) {
  QuantSpec spec;
  spec.float_type = c.float_type;
  spec.codec = c.codec;
  spec.quant_group_size = c.group;
  spec.block.kind = c.kind;
  spec.block.num_layers = 2;
  spec.block.block_tokens = 4;
  if (c.kind == BlockKind::kMla) {
    spec.block.latent_dim = c.dim;
  } else {
    spec.block.num_kv_heads = 2;
    spec.block.head_dim = c.dim;
  }
  return spec;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.float_type == FloatType::kFp16 ? "fp16" : "bf16") + "_" +
         (c.codec == QuantCodec::kInt8 ? "int8" : "fp8") + "_" + (c.kind == BlockKind::kMla ? "mla" : "std") +
         std::to_string(c.dim) + "_g" + std::to_string(c.group);
}

class QuantizeTest : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizeTest, RoundTripStaysWithinTheDocumentedBound) {
  const QuantSpec spec = SpecOf(GetParam());
  ASSERT_TRUE(spec.Validate().ok());
  std::mt19937_64 rng(7);
  const int32_t num_blocks = 3;
  std::vector<Bytes> in, quantized, out;
  for (int b = 0; b < num_blocks; ++b) {
    in.push_back(testing::MakeFloatBlock(spec, rng));
    quantized.emplace_back(spec.QuantizedBlockBytes(), 0xCD);
    out.emplace_back(spec.FloatBlockBytes(), 0xCD);
  }
  KernelStatus s =
      QuantizeCpu(spec, testing::ConstPointers(in).data(), num_blocks, testing::Pointers<void>(quantized).data());
  ASSERT_TRUE(s.ok()) << s.message;
  s = DequantizeCpu(spec, testing::ConstPointers(quantized).data(), num_blocks, testing::Pointers<void>(out).data());
  ASSERT_TRUE(s.ok()) << s.message;

  const float qmax = spec.codec == QuantCodec::kInt8 ? 127.0f : 448.0f;
  const int64_t group = spec.quant_group_size;
  double worst_ratio = 0;  // the largest |x - x^| / bound seen: the bound must not be vacuous
  int64_t zero_groups = 0, max_groups = 0;
  for (int b = 0; b < num_blocks; ++b) {
    for (int64_t g = 0; g < spec.NumGroups(); ++g) {
      float amax = 0;
      for (int64_t i = 0; i < group; ++i) {
        uint16_t bits;
        std::memcpy(&bits, &in[b][(g * group + i) * 2], 2);
        amax = std::fmax(amax, std::fabs(testing::FromBits(spec.float_type, bits)));
      }
      const float scale = testing::ScaleAt(spec, quantized[b], g);
      if (amax == 0) {
        ASSERT_EQ(scale, 0.0f);
        ++zero_groups;
      } else {
        ASSERT_EQ(scale, std::fmax(amax / qmax, FLT_MIN)) << "group " << g;
      }
      if (amax == testing::MaxFinite(spec.float_type)) ++max_groups;
      for (int64_t i = 0; i < group; ++i) {
        const int64_t e = g * group + i;
        uint16_t xb, yb;
        std::memcpy(&xb, &in[b][e * 2], 2);
        std::memcpy(&yb, &out[b][e * 2], 2);
        const double x = testing::FromBits(spec.float_type, xb);
        const double y = testing::FromBits(spec.float_type, yb);
        ASSERT_TRUE(std::isfinite(y)) << "block " << b << " element " << e << " x=" << x;
        const double bound = testing::QuantBound(spec, x, scale);
        ASSERT_LE(std::fabs(x - y), bound)
            << "block " << b << " element " << e << " x=" << x << " x^=" << y << " scale=" << scale;
        if (amax == 0) {
          ASSERT_EQ(y, 0.0);
        }
        if (spec.codec == QuantCodec::kInt8) {
          ASSERT_NE(quantized[b][e], 0x80) << "int8 code -128 is never produced";
        }
        if (std::fabs(x) > 0.01 * scale) worst_ratio = std::fmax(worst_ratio, std::fabs(x - y) / bound);
      }
    }
  }
  EXPECT_GT(zero_groups, 0);
  EXPECT_GT(max_groups, 0);
  EXPECT_GT(worst_ratio, 0.25) << "the data never came near the bound";
}

TEST_P(QuantizeTest, ExtremeValuesAreReconstructedExactlyWhereTheCodecAllows) {
  // Each group: +max at one place, -max at another, zeros elsewhere. The extremes map to the codec's
  // largest code (+-127 or +-448) and come back as the same float value.
  const QuantSpec spec = SpecOf(GetParam());
  const float max = testing::MaxFinite(spec.float_type);
  Bytes in(spec.FloatBlockBytes(), 0);
  for (int64_t g = 0; g < spec.NumGroups(); ++g) {
    const uint16_t pos = testing::ToBits(spec.float_type, max);
    const uint16_t neg = testing::ToBits(spec.float_type, -max);
    std::memcpy(&in[(g * spec.quant_group_size) * 2], &pos, 2);
    std::memcpy(&in[(g * spec.quant_group_size + spec.quant_group_size - 1) * 2], &neg, 2);
  }
  Bytes q(spec.QuantizedBlockBytes()), out(spec.FloatBlockBytes());
  const void* in_p = in.data();
  void* q_p = q.data();
  ASSERT_TRUE(QuantizeCpu(spec, &in_p, 1, &q_p).ok());
  const void* q_c = q.data();
  void* out_p = out.data();
  ASSERT_TRUE(DequantizeCpu(spec, &q_c, 1, &out_p).ok());
  const uint8_t top = spec.codec == QuantCodec::kInt8 ? 127 : 0x7E;
  EXPECT_EQ(q[0], top);
  EXPECT_EQ(q[spec.quant_group_size - 1], static_cast<uint8_t>(spec.codec == QuantCodec::kInt8 ? 0x81 : 0xFE));
  for (int64_t e = 0; e < spec.block.NumElements(); ++e) {
    uint16_t xb, yb;
    std::memcpy(&xb, &in[e * 2], 2);
    std::memcpy(&yb, &out[e * 2], 2);
    const float x = testing::FromBits(spec.float_type, xb);
    const float y = testing::FromBits(spec.float_type, yb);
    ASSERT_LE(std::fabs(x - y), testing::QuantBound(spec, x, testing::ScaleAt(spec, q, e / spec.quant_group_size)))
        << e;
    if (x == 0) {
      ASSERT_EQ(y, 0.0f) << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, QuantizeTest,
                         ::testing::Values(Case{FloatType::kFp16, QuantCodec::kInt8, BlockKind::kStandard, 128, 64},
                                           Case{FloatType::kFp16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 128, 64},
                                           Case{FloatType::kBf16, QuantCodec::kInt8, BlockKind::kStandard, 128, 64},
                                           Case{FloatType::kBf16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 128, 64},
                                           Case{FloatType::kFp16, QuantCodec::kInt8, BlockKind::kStandard, 128, 128},
                                           Case{FloatType::kBf16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 64, 8},
                                           Case{FloatType::kFp16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 72, 24},
                                           Case{FloatType::kBf16, QuantCodec::kInt8, BlockKind::kStandard, 96, 3},
                                           Case{FloatType::kFp16, QuantCodec::kFp8E4m3, BlockKind::kMla, 576, 64},
                                           Case{FloatType::kBf16, QuantCodec::kInt8, BlockKind::kMla, 576, 576}),
                         CaseName);

TEST(QuantSpecTest, LayoutSizes) {
  const QuantSpec spec = SpecOf({FloatType::kBf16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 128, 64});
  const int64_t n = 2 * 2 * 4 * 2 * 128;
  EXPECT_EQ(spec.block.NumElements(), n);
  EXPECT_EQ(spec.NumGroups(), n / 64);
  EXPECT_EQ(spec.FloatBlockBytes(), 2 * n);
  EXPECT_EQ(spec.ScalesOffsetBytes(), n);
  EXPECT_EQ(spec.QuantizedBlockBytes(), n + 4 * (n / 64));
}

TEST(QuantSpecTest, GroupNotDividingHeadDimIsRejected) {
  QuantSpec spec = SpecOf({FloatType::kFp16, QuantCodec::kInt8, BlockKind::kStandard, 128, 48});
  KernelStatus s = spec.Validate();
  EXPECT_EQ(s.code, kKernelInvalidArgument);
  EXPECT_NE(s.message.find("quant_group_size 48 does not divide head_dim 128"), std::string::npos) << s.message;
  Bytes in(spec.FloatBlockBytes()), out(spec.QuantizedBlockBytes());
  const void* in_p = in.data();
  void* out_p = out.data();
  EXPECT_EQ(QuantizeCpu(spec, &in_p, 1, &out_p).code, kKernelInvalidArgument);
  EXPECT_EQ(DequantizeCpu(spec, &in_p, 1, &out_p).code, kKernelInvalidArgument);

  spec = SpecOf({FloatType::kFp16, QuantCodec::kInt8, BlockKind::kMla, 576, 128});
  s = spec.Validate();
  EXPECT_EQ(s.code, kKernelInvalidArgument);
  EXPECT_NE(s.message.find("latent_dim 576"), std::string::npos) << s.message;

  spec.quant_group_size = 0;
  EXPECT_EQ(spec.Validate().code, kKernelInvalidArgument);
  spec.quant_group_size = -64;
  EXPECT_EQ(spec.Validate().code, kKernelInvalidArgument);
}

TEST(QuantSpecTest, NullBlocksAreRejectedAndZeroBlocksIsANoOp) {
  const QuantSpec spec = SpecOf({FloatType::kFp16, QuantCodec::kInt8, BlockKind::kStandard, 128, 64});
  Bytes in(spec.FloatBlockBytes());
  const void* in_p = in.data();
  void* null_out = nullptr;
  EXPECT_EQ(QuantizeCpu(spec, &in_p, 1, &null_out).code, kKernelInvalidArgument);
  EXPECT_EQ(QuantizeCpu(spec, nullptr, 1, &null_out).code, kKernelInvalidArgument);
  EXPECT_TRUE(QuantizeCpu(spec, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(DequantizeCpu(spec, nullptr, 0, nullptr).ok());
}

TEST(QuantizeBoundTest, Int8ErrorReachesHalfAScaleButNotMore) {
  // A hand-made group: amax 127 gives scale 1, and x = k + 0.5 - tiny rounds to k with error ~0.5.
  QuantSpec spec = SpecOf({FloatType::kFp16, QuantCodec::kInt8, BlockKind::kStandard, 8, 8});
  spec.block.num_layers = 1;
  spec.block.block_tokens = 1;
  spec.block.num_kv_heads = 1;
  const float values[8] = {127.0f, 2.5f, -3.5f, 0.49f, 100.25f, -126.5f, 0.0f, 64.0f};
  Bytes in(spec.FloatBlockBytes(), 0);  // K: the values below; V: zeros
  ASSERT_EQ(in.size(), 32u);
  for (int i = 0; i < 8; ++i) {
    const uint16_t bits = FloatToFp16(values[i]);
    std::memcpy(&in[2 * i], &bits, 2);
  }
  Bytes q(spec.QuantizedBlockBytes()), out(spec.FloatBlockBytes());
  const void* in_p = in.data();
  void* q_p = q.data();
  ASSERT_TRUE(QuantizeCpu(spec, &in_p, 1, &q_p).ok());
  EXPECT_EQ(testing::ScaleAt(spec, q, 0), 1.0f);
  // Ties go to even: 2.5 -> 2, -3.5 -> -4, -126.5 -> -126.
  const int8_t want[8] = {127, 2, -4, 0, 100, -126, 0, 64};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(static_cast<int8_t>(q[i]), want[i]) << i;
  const void* q_c = q.data();
  void* out_p = out.data();
  ASSERT_TRUE(DequantizeCpu(spec, &q_c, 1, &out_p).ok());
  for (int i = 0; i < 8; ++i) {
    uint16_t bits;
    std::memcpy(&bits, &out[2 * i], 2);
    EXPECT_EQ(Fp16ToFloat(bits), static_cast<float>(want[i])) << i;
  }
}

TEST(QuantizeBoundTest, Fp8SmallValuesUnderflowWithinTheAbsoluteBound) {
  // amax 448 gives scale 1: 2^-10 rounds to zero (tie to even), 1.5 * 2^-10 to 2^-9, and 2^-6 and up
  // keep 3 mantissa bits.
  QuantSpec spec = SpecOf({FloatType::kFp16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 8, 8});
  spec.block.num_layers = 1;
  spec.block.block_tokens = 1;
  spec.block.num_kv_heads = 1;
  const float values[8] = {448.0f,
                           std::ldexp(1.0f, -10),
                           1.5f * std::ldexp(1.0f, -10),
                           -std::ldexp(1.0f, -6),
                           1.0f + 1.0f / 16,
                           1.0f + 3.0f / 16,
                           300.0f,
                           -0.0f};
  const float want[8] = {448.0f, 0.0f, std::ldexp(1.0f, -9), -std::ldexp(1.0f, -6), 1.0f, 1.25f, 288.0f, -0.0f};
  Bytes in(spec.FloatBlockBytes(), 0);  // K: the values below; V: zeros
  ASSERT_EQ(in.size(), 32u);
  for (int i = 0; i < 8; ++i) {
    const uint16_t bits = FloatToFp16(values[i]);
    std::memcpy(&in[2 * i], &bits, 2);
  }
  Bytes q(spec.QuantizedBlockBytes()), out(spec.FloatBlockBytes());
  const void* in_p = in.data();
  void* q_p = q.data();
  ASSERT_TRUE(QuantizeCpu(spec, &in_p, 1, &q_p).ok());
  EXPECT_EQ(testing::ScaleAt(spec, q, 0), 1.0f);
  const void* q_c = q.data();
  void* out_p = out.data();
  ASSERT_TRUE(DequantizeCpu(spec, &q_c, 1, &out_p).ok());
  for (int i = 0; i < 8; ++i) {
    uint16_t bits;
    std::memcpy(&bits, &out[2 * i], 2);
    EXPECT_EQ(Fp16ToFloat(bits), want[i]) << i;
    EXPECT_EQ(std::signbit(Fp16ToFloat(bits)), std::signbit(want[i])) << i;
  }
}

}  // namespace
}  // namespace kvtier::kernels
