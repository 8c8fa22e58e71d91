// CUDA quantize/dequantize against the CPU reference, bit for bit (and so within the bound the CPU tests
// check): both float types, both codecs, the vectorized and the generic kernels, unaligned buffers,
// host and device tables. Skips without a GPU.
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kvtier/kernels/device.h"
#include "kvtier/kernels/quantize.h"

namespace kvtier::kernels {
namespace {

using testing::Bytes;

QuantSpec MakeSpec(FloatType type, QuantCodec codec, BlockKind kind, int32_t dim, int32_t group) {
  QuantSpec spec;
  spec.float_type = type;
  spec.codec = codec;
  spec.quant_group_size = group;
  spec.block.kind = kind;
  spec.block.num_layers = 3;
  spec.block.block_tokens = 8;
  if (kind == BlockKind::kMla) {
    spec.block.latent_dim = dim;
  } else {
    spec.block.num_kv_heads = 2;
    spec.block.head_dim = dim;
  }
  return spec;
}

TEST(QuantizeCudaTest, ArgumentsAreCheckedEvenWithoutADevice) {
  QuantSpec spec = MakeSpec(FloatType::kFp16, QuantCodec::kInt8, BlockKind::kStandard, 128, 48);
  Bytes in(spec.FloatBlockBytes()), out(spec.QuantizedBlockBytes() + 64);
  const void* in_p = in.data();
  void* out_p = out.data();
  EXPECT_EQ(QuantizeCuda(spec, &in_p, 1, &out_p).code, kKernelInvalidArgument);
  EXPECT_EQ(DequantizeCuda(spec, &in_p, 1, &out_p).code, kKernelInvalidArgument);
  if (CudaAvailable()) return;
  spec.quant_group_size = 64;
  const KernelStatus s = QuantizeCuda(spec, &in_p, 1, &out_p);
  EXPECT_EQ(s.code, kKernelNoCuda) << s.message;
}

#if KVTIER_HAVE_CUDA
using testing::DeviceBuffer;

struct Case {
  FloatType float_type;
  QuantCodec codec;
  BlockKind kind;
  int32_t dim;
  int32_t group;
  int32_t misalign;  // bytes added to every block pointer
  bool tables_on_device;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.float_type == FloatType::kFp16 ? "fp16 " : "bf16 ") << (c.codec == QuantCodec::kInt8 ? "int8 " : "fp8 ")
      << (c.kind == BlockKind::kMla ? "mla " : "std ") << c.dim << " g" << c.group << " misalign " << c.misalign
      << (c.tables_on_device ? " device tables" : " host tables");
}

class QuantizeCudaTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(QuantizeCudaTest, MatchesTheCpuReferenceBitForBit) {
  const Case& c = GetParam();
  const QuantSpec spec = MakeSpec(c.float_type, c.codec, c.kind, c.dim, c.group);
  ASSERT_TRUE(spec.Validate().ok());
  std::mt19937_64 rng(21);
  const int32_t num_blocks = 4;
  std::vector<Bytes> in, want_q, want_f;
  std::vector<DeviceBuffer> d_in, d_q, d_f;
  std::vector<const void*> in_ptrs, q_const;
  std::vector<void*> q_ptrs, f_ptrs;
  for (int b = 0; b < num_blocks; ++b) {
    in.push_back(testing::MakeFloatBlock(spec, rng));
    want_q.emplace_back(spec.QuantizedBlockBytes());
    want_f.emplace_back(spec.FloatBlockBytes());
    Bytes padded(c.misalign, 0);
    padded.insert(padded.end(), in.back().begin(), in.back().end());
    d_in.emplace_back(padded);
    d_q.emplace_back(spec.QuantizedBlockBytes() + c.misalign);
    d_f.emplace_back(spec.FloatBlockBytes() + c.misalign);
    ASSERT_TRUE(d_in.back().ok() && d_q.back().ok() && d_f.back().ok());
    in_ptrs.push_back(d_in.back().get() + c.misalign);
    q_ptrs.push_back(d_q.back().get() + c.misalign);
    q_const.push_back(q_ptrs.back());
    f_ptrs.push_back(d_f.back().get() + c.misalign);
  }
  ASSERT_TRUE(
      QuantizeCpu(spec, testing::ConstPointers(in).data(), num_blocks, testing::Pointers<void>(want_q).data()).ok());
  ASSERT_TRUE(
      DequantizeCpu(spec, testing::ConstPointers(want_q).data(), num_blocks, testing::Pointers<void>(want_f).data())
          .ok());

  CudaLaunchOptions options;
  options.tables_on_device = c.tables_on_device;
  auto to_device = [](const auto& ptrs) {
    const auto* p = reinterpret_cast<const unsigned char*>(ptrs.data());
    return DeviceBuffer(Bytes(p, p + sizeof(void*) * ptrs.size()));
  };
  DeviceBuffer d_in_ptrs = to_device(in_ptrs), d_q_ptrs = to_device(q_ptrs), d_f_ptrs = to_device(f_ptrs);
  const void* const* in_arg =
      c.tables_on_device ? reinterpret_cast<const void* const*>(d_in_ptrs.get()) : in_ptrs.data();
  void* const* q_arg = c.tables_on_device ? reinterpret_cast<void* const*>(d_q_ptrs.get()) : q_ptrs.data();
  const void* const* q_in_arg =
      c.tables_on_device ? reinterpret_cast<const void* const*>(d_q_ptrs.get()) : q_const.data();
  void* const* f_arg = c.tables_on_device ? reinterpret_cast<void* const*>(d_f_ptrs.get()) : f_ptrs.data();

  KernelStatus s = QuantizeCuda(spec, in_arg, num_blocks, q_arg, options);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(testing::CudaSync(), "");
  for (int b = 0; b < num_blocks; ++b) {
    const Bytes got = d_q[b].Download(c.misalign, spec.QuantizedBlockBytes());
    ASSERT_EQ(got.size(), want_q[b].size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want_q[b][i]) << "block " << b << " byte " << i
                                      << (static_cast<int64_t>(i) >= spec.ScalesOffsetBytes() ? " (scales)"
                                                                                              : " (codes)");
    }
  }
  // Dequantize the GPU's own codes (identical to the CPU's, as just checked).
  s = DequantizeCuda(spec, q_in_arg, num_blocks, f_arg, options);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(testing::CudaSync(), "");
  for (int b = 0; b < num_blocks; ++b) {
    EXPECT_EQ(d_f[b].Download(c.misalign, spec.FloatBlockBytes()), want_f[b]) << "block " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, QuantizeCudaTest,
                         ::testing::Values(
                             // Vec8 kernels (group / 8 a power of two <= 32).
                             Case{FloatType::kFp16, QuantCodec::kInt8, BlockKind::kStandard, 128, 64, 0, false},
                             Case{FloatType::kFp16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 128, 64, 0, true},
                             Case{FloatType::kBf16, QuantCodec::kInt8, BlockKind::kStandard, 128, 64, 0, false},
                             Case{FloatType::kBf16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 128, 128, 0, false},
                             Case{FloatType::kBf16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 64, 8, 0, false},
                             Case{FloatType::kFp16, QuantCodec::kInt8, BlockKind::kMla, 512, 256, 0, false},
                             Case{FloatType::kFp16, QuantCodec::kFp8E4m3, BlockKind::kMla, 576, 64, 0, false},
                             // Vec8 kernels on unaligned buffers (byte-wise fallback inside).
                             Case{FloatType::kFp16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 128, 64, 2, false},
                             Case{FloatType::kBf16, QuantCodec::kInt8, BlockKind::kStandard, 128, 32, 5, true},
                             // Generic kernels: group not a power-of-two multiple of 8, or above 256.
                             Case{FloatType::kFp16, QuantCodec::kFp8E4m3, BlockKind::kStandard, 72, 24, 0, false},
                             Case{FloatType::kBf16, QuantCodec::kInt8, BlockKind::kStandard, 96, 3, 1, false},
                             Case{FloatType::kBf16, QuantCodec::kFp8E4m3, BlockKind::kMla, 576, 576, 0, true},
                             Case{FloatType::kFp16, QuantCodec::kInt8, BlockKind::kStandard, 80, 40, 0, false}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return std::string(c.float_type == FloatType::kFp16 ? "fp16" : "bf16") + "_" +
                                  (c.codec == QuantCodec::kInt8 ? "int8" : "fp8") + "_" +
                                  (c.kind == BlockKind::kMla ? "mla" : "std") + std::to_string(c.dim) + "_g" +
                                  std::to_string(c.group) + "_m" + std::to_string(c.misalign) +
                                  (c.tables_on_device ? "_dev" : "_host");
                         });
#endif  // KVTIER_HAVE_CUDA

}  // namespace
}  // namespace kvtier::kernels
