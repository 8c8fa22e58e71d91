// CPU reference for quantize/dequantize. Follows quantize.h's formulas operation by operation, in the
// same fp32 order as quantize.cu, so that both give the same bytes.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "arg_checks.h"
#include "kvtier/kernels/numeric.h"
#include "kvtier/kernels/quantize.h"

namespace kvtier::kernels {
namespace {

float LoadFloat(const unsigned char* p, FloatType type) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return type == FloatType::kFp16 ? Fp16ToFloat(bits) : Bf16ToFloat(bits);
}

void StoreFloat(unsigned char* p, FloatType type, float v) {
  const uint16_t bits = type == FloatType::kFp16 ? FloatToFp16(v) : FloatToBf16(v);
  std::memcpy(p, &bits, 2);
}

void QuantizeBlock(const QuantSpec& spec, const unsigned char* in, unsigned char* out) {
  const int64_t group = spec.quant_group_size;
  const bool fp8 = spec.codec == QuantCodec::kFp8E4m3;
  const float qmax = fp8 ? kFp8E4m3Max : 127.0f;
  unsigned char* scales = out + spec.ScalesOffsetBytes();
  for (int64_t g = 0; g < spec.NumGroups(); ++g) {
    const unsigned char* x = in + g * group * 2;
    unsigned char* q = out + g * group;
    float amax = 0.0f;
    for (int64_t i = 0; i < group; ++i) amax = std::fmax(amax, std::fabs(LoadFloat(x + 2 * i, spec.float_type)));
    float scale = 0.0f;
    float inv = 0.0f;
    if (amax > 0.0f) {
      scale = std::fmax(amax / qmax, FLT_MIN);
      inv = 1.0f / scale;
    }
    for (int64_t i = 0; i < group; ++i) {
      const float y = std::fmin(std::fmax(LoadFloat(x + 2 * i, spec.float_type) * inv, -qmax), qmax);
      if (fp8) {
        q[i] = FloatToFp8E4m3(y);
      } else {
        q[i] = static_cast<unsigned char>(static_cast<int8_t>(std::nearbyint(y)));
      }
    }
    std::memcpy(scales + 4 * g, &scale, 4);
  }
}

void DequantizeBlock(const QuantSpec& spec, const unsigned char* in, unsigned char* out) {
  const int64_t group = spec.quant_group_size;
  const bool fp8 = spec.codec == QuantCodec::kFp8E4m3;
  const unsigned char* scales = in + spec.ScalesOffsetBytes();
  for (int64_t g = 0; g < spec.NumGroups(); ++g) {
    float scale;
    std::memcpy(&scale, scales + 4 * g, 4);
    const unsigned char* q = in + g * group;
    unsigned char* x = out + g * group * 2;
    for (int64_t i = 0; i < group; ++i) {
      const float decoded = fp8 ? Fp8E4m3ToFloat(q[i]) : static_cast<float>(static_cast<int8_t>(q[i]));
      StoreFloat(x + 2 * i, spec.float_type, decoded * scale);
    }
  }
}

}  // namespace

KernelStatus QuantizeCpu(const QuantSpec& spec, const void* const* float_blocks, int32_t num_blocks,
                         void* const* quantized_blocks) {
  KernelStatus s = internal::CheckQuant(spec, float_blocks, num_blocks, quantized_blocks, true);
  if (!s.ok()) return s;
  for (int32_t b = 0; b < num_blocks; ++b) {
    QuantizeBlock(spec, static_cast<const unsigned char*>(float_blocks[b]),
                  static_cast<unsigned char*>(quantized_blocks[b]));
  }
  return {};
}

KernelStatus DequantizeCpu(const QuantSpec& spec, const void* const* quantized_blocks, int32_t num_blocks,
                           void* const* float_blocks) {
  KernelStatus s = internal::CheckQuant(spec, quantized_blocks, num_blocks, float_blocks, true);
  if (!s.ok()) return s;
  for (int32_t b = 0; b < num_blocks; ++b) {
    DequantizeBlock(spec, static_cast<const unsigned char*>(quantized_blocks[b]),
                    static_cast<unsigned char*>(float_blocks[b]));
  }
  return {};
}

}  // namespace kvtier::kernels
