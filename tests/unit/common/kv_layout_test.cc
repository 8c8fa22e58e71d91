#include "kvtier/common/kv_layout.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

// Llama-3.1-8B: 32 layers, 8 KV heads of 128, bf16.
KvLayout Llama8b() {
  return {.kind = LayoutKind::kStandard,
          .dtype = DType::kBf16,
          .codec = Codec::kNone,
          .num_layers = 32,
          .num_kv_heads = 8,
          .head_dim = 128,
          .latent_dim = 0,
          .block_tokens = 16,
          .tp_size = 1,
          .quant_group_size = 64};
}

// DeepSeek-V3: 61 layers, a 576-element latent per token (512 compressed KV + 64 RoPE).
KvLayout DeepSeekV3() {
  return {.kind = LayoutKind::kMla,
          .dtype = DType::kBf16,
          .codec = Codec::kNone,
          .num_layers = 61,
          .num_kv_heads = 0,
          .head_dim = 0,
          .latent_dim = 576,
          .block_tokens = 64,
          .tp_size = 1,
          .quant_group_size = 64};
}

struct BadLayout {
  std::string want;  // the start of the error message
  std::function<void(KvLayout&)> mutate;
};

TEST(KvLayoutTest, RealModelsAreValid) {
  EXPECT_TRUE(Llama8b().Validate().ok()) << Llama8b().Validate();
  EXPECT_TRUE(DeepSeekV3().Validate().ok()) << DeepSeekV3().Validate();
  KvLayout quantized = Llama8b();
  quantized.codec = Codec::kFp8E4m3;
  quantized.tp_size = 8;
  EXPECT_TRUE(quantized.Validate().ok()) << quantized.Validate();
  KvLayout fp8_engine = Llama8b();
  fp8_engine.dtype = DType::kFp8E4m3;  // an fp8 engine cache stored as it is
  EXPECT_TRUE(fp8_engine.Validate().ok()) << fp8_engine.Validate();
}

TEST(KvLayoutTest, ValidationErrorsNameTheField) {
  const std::vector<BadLayout> cases = {
      {"layout.kind:", [](KvLayout& l) { l.kind = static_cast<LayoutKind>(0); }},
      {"layout.kind:", [](KvLayout& l) { l.kind = static_cast<LayoutKind>(3); }},
      {"layout.dtype:", [](KvLayout& l) { l.dtype = static_cast<DType>(0); }},
      {"layout.dtype:", [](KvLayout& l) { l.dtype = static_cast<DType>(5); }},
      {"layout.codec:", [](KvLayout& l) { l.codec = static_cast<Codec>(3); }},
      {"layout.num_layers: must be > 0", [](KvLayout& l) { l.num_layers = 0; }},
      {"layout.block_tokens: must be > 0", [](KvLayout& l) { l.block_tokens = 0; }},
      {"layout.tp_size: must be > 0", [](KvLayout& l) { l.tp_size = 0; }},
      {"layout.num_kv_heads: must be > 0", [](KvLayout& l) { l.num_kv_heads = 0; }},
      {"layout.head_dim: must be > 0", [](KvLayout& l) { l.head_dim = 0; }},
      {"layout.num_kv_heads: must be divisible by tp_size", [](KvLayout& l) { l.tp_size = 3; }},
      {"layout.num_kv_heads: must be divisible by tp_size", [](KvLayout& l) { l.tp_size = 16; }},
      {"layout.codec: must be none when dtype is fp8_e4m3",
       [](KvLayout& l) {
         l.dtype = DType::kFp8E4m3;
         l.codec = Codec::kInt8;
       }},
      {"layout.quant_group_size: must be > 0",
       [](KvLayout& l) {
         l.codec = Codec::kInt8;
         l.quant_group_size = 0;
       }},
      {"layout.quant_group_size: must divide head_dim",
       [](KvLayout& l) {
         l.codec = Codec::kFp8E4m3;
         l.quant_group_size = 48;
       }},
      {"layout.quant_group_size: must divide head_dim",
       [](KvLayout& l) {
         l.codec = Codec::kInt8;
         l.quant_group_size = 256;
       }},
  };
  for (const BadLayout& c : cases) {
    KvLayout layout = Llama8b();
    c.mutate(layout);
    const absl::Status status = layout.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_TRUE(absl::StartsWith(status.message(), c.want)) << status << "; want " << c.want;
  }
}

TEST(KvLayoutTest, MlaValidation) {
  KvLayout no_latent = DeepSeekV3();
  no_latent.latent_dim = 0;
  EXPECT_EQ(no_latent.Validate().message(), "layout.latent_dim: must be > 0");

  // MLA ignores the head fields, and tp_size need not divide anything.
  KvLayout tp3 = DeepSeekV3();
  tp3.tp_size = 3;
  tp3.num_kv_heads = 7;
  EXPECT_TRUE(tp3.Validate().ok()) << tp3.Validate();

  KvLayout bad_group = DeepSeekV3();
  bad_group.codec = Codec::kInt8;
  bad_group.quant_group_size = 100;
  EXPECT_TRUE(absl::StartsWith(bad_group.Validate().message(), "layout.quant_group_size: must divide latent_dim"))
      << bad_group.Validate();
  bad_group.quant_group_size = 64;  // 576 = 9 x 64
  EXPECT_TRUE(bad_group.Validate().ok()) << bad_group.Validate();
}

TEST(KvLayoutTest, UnquantizedLayoutIgnoresTheGroupSize) {
  KvLayout layout = Llama8b();
  layout.quant_group_size = 0;
  EXPECT_TRUE(layout.Validate().ok());
  layout.quant_group_size = 7;
  EXPECT_TRUE(layout.Validate().ok());
}

TEST(KvLayoutTest, ShardBytesOfAStandardLayout) {
  // 32 layers x K,V x 16 tokens x 8 heads x 128 x 2 bytes.
  EXPECT_EQ(Llama8b().ShardBytes(), 32u * 2 * 16 * 8 * 128 * 2);
  EXPECT_EQ(Llama8b().ShardBytes(), 2u << 20);
  KvLayout tp2 = Llama8b();
  tp2.tp_size = 2;
  EXPECT_EQ(tp2.ShardBytes(), 1u << 20);  // each rank keeps 4 of the 8 heads
  KvLayout fp32 = Llama8b();
  fp32.dtype = DType::kFp32;
  EXPECT_EQ(fp32.ShardBytes(), 4u << 20);
  KvLayout fp8 = Llama8b();
  fp8.dtype = DType::kFp8E4m3;
  EXPECT_EQ(fp8.ShardBytes(), 1u << 20);
}

TEST(KvLayoutTest, ShardBytesOfAQuantizedLayoutAddsTheScales) {
  KvLayout int8 = Llama8b();
  int8.codec = Codec::kInt8;
  int8.quant_group_size = 64;
  // 1-byte values, then fp32 scales [32][2][16][8][128 / 64].
  EXPECT_EQ(int8.ShardBytes(), 32u * 2 * 16 * 8 * 128 + 32u * 2 * 16 * 8 * 2 * 4);
  EXPECT_EQ(int8.ShardBytes(), 1114112u);
  KvLayout fp8_g32_tp4 = int8;
  fp8_g32_tp4.codec = Codec::kFp8E4m3;
  fp8_g32_tp4.quant_group_size = 32;
  fp8_g32_tp4.tp_size = 4;
  EXPECT_EQ(fp8_g32_tp4.ShardBytes(), 32u * 2 * 16 * 2 * 128 + 32u * 2 * 16 * 2 * 4 * 4);
}

TEST(KvLayoutTest, ShardBytesOfAnMlaLayout) {
  // 61 layers x 64 tokens x 576 x 2 bytes; TP ranks each keep the whole latent.
  EXPECT_EQ(DeepSeekV3().ShardBytes(), 61u * 64 * 576 * 2);
  KvLayout tp8 = DeepSeekV3();
  tp8.tp_size = 8;
  EXPECT_EQ(tp8.ShardBytes(), DeepSeekV3().ShardBytes());
  KvLayout fp8 = DeepSeekV3();
  fp8.codec = Codec::kFp8E4m3;
  EXPECT_EQ(fp8.ShardBytes(), 61u * 64 * 576 + 61u * 64 * 9 * 4);
  EXPECT_EQ(fp8.ShardBytes(), 2389248u);
}

TEST(KvLayoutTest, ShardOfAtMostTwoToTheFortyBytes) {
  KvLayout layout = DeepSeekV3();
  layout.num_layers = 1;
  layout.block_tokens = 1 << 16;
  layout.latent_dim = 1 << 22;  // x 2 bytes: 2^39 per layer
  layout.num_layers = 2;
  EXPECT_EQ(layout.ShardBytes(), uint64_t{1} << 40);
  EXPECT_TRUE(layout.Validate().ok()) << layout.Validate();
  layout.num_layers = 3;
  const absl::Status status = layout.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("2^40"), std::string::npos) << status;
}

TEST(KvLayoutTest, HugeFieldsAreRejectedWithoutOverflow) {
  KvLayout layout = Llama8b();
  layout.num_layers = UINT32_MAX;
  layout.block_tokens = UINT32_MAX;
  layout.num_kv_heads = UINT32_MAX;
  layout.head_dim = UINT32_MAX;
  layout.dtype = DType::kFp32;
  EXPECT_EQ(layout.Validate().code(), absl::StatusCode::kInvalidArgument);
  // A product that wraps to a small number modulo 2^64 must not pass either.
  KvLayout wraps = Llama8b();
  wraps.dtype = DType::kFp8E4m3;
  wraps.num_layers = 1u << 31;
  wraps.block_tokens = 1u << 31;
  wraps.num_kv_heads = 1;
  wraps.head_dim = 4;  // 2^31 x 2 x 2^31 x 4 = 2^65: 0 modulo 2^64
  EXPECT_EQ(wraps.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvLayoutTest, DebugString) {
  EXPECT_EQ(Llama8b().DebugString(), "standard/bf16/none L32 H8x128 B16 tp1 g64");
  EXPECT_EQ(DeepSeekV3().DebugString(), "mla/bf16/none L61 latent576 B64 tp1 g64");
}

TEST(KvLayoutTest, NamesRoundTripThroughTheParsers) {
  for (DType d : {DType::kFp16, DType::kBf16, DType::kFp32, DType::kFp8E4m3}) {
    EXPECT_EQ(ParseDType(DTypeName(d)).value(), d);
  }
  for (Codec c : {Codec::kNone, Codec::kFp8E4m3, Codec::kInt8}) {
    EXPECT_EQ(ParseCodec(CodecName(c)).value(), c);
  }
  for (LayoutKind k : {LayoutKind::kStandard, LayoutKind::kMla}) {
    EXPECT_EQ(ParseLayoutKind(LayoutKindName(k)).value(), k);
  }
  EXPECT_STREQ(DTypeName(DType::kFp8E4m3), "fp8_e4m3");
  EXPECT_STREQ(CodecName(Codec::kInt8), "int8");
  EXPECT_STREQ(LayoutKindName(LayoutKind::kMla), "mla");
}

TEST(KvLayoutTest, ParsersRejectUnknownNamesAndListTheAcceptedOnes) {
  const absl::StatusOr<DType> dtype = ParseDType("BF16");
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dtype.status().message().find("bf16"), std::string::npos) << dtype.status();
  EXPECT_NE(dtype.status().message().find("fp8_e4m3"), std::string::npos) << dtype.status();
  const absl::StatusOr<Codec> codec = ParseCodec("fp4");
  EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(codec.status().message().find("int8"), std::string::npos) << codec.status();
  const absl::StatusOr<LayoutKind> kind = ParseLayoutKind("");
  EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(kind.status().message().find("mla"), std::string::npos) << kind.status();
}

TEST(KvLayoutTest, DTypeBytes) {
  EXPECT_EQ(DTypeBytes(DType::kFp16), 2u);
  EXPECT_EQ(DTypeBytes(DType::kBf16), 2u);
  EXPECT_EQ(DTypeBytes(DType::kFp32), 4u);
  EXPECT_EQ(DTypeBytes(DType::kFp8E4m3), 1u);
}

}  // namespace
}  // namespace kvtier
