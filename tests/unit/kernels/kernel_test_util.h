// Helpers shared by the kernel tests: random data, the naive index-by-index gather reference, block
// tables, float blocks with hard regimes for quantization, the documented error bound, and (CUDA builds)
// device buffers.
#ifndef KVTIER_TESTS_UNIT_KERNELS_KERNEL_TEST_UTIL_H_
#define KVTIER_TESTS_UNIT_KERNELS_KERNEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvtier/kernels/gather_scatter.h"
#include "kvtier/kernels/numeric.h"
#include "kvtier/kernels/quantize.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::kernels::testing {

using Bytes = std::vector<unsigned char>;

inline Bytes RandomBytes(size_t n, std::mt19937_64& rng) {
  Bytes out(n);
  for (auto& b : out) b = static_cast<unsigned char>(rng());
  return out;
}

inline std::string LayoutName(EngineLayout layout) {
  switch (layout) {
    case EngineLayout::kKvFirst:
      return "kv_first";
    case EngineLayout::kPageFirst:
      return "page_first";
    case EngineLayout::kMla:
      return "mla";
  }
  return "?";
}

// A small spec of each layout; odd head_dim/latent_dim exercise the narrow copy paths.
inline PagedCacheSpec SmallSpec(EngineLayout layout, int32_t element_bytes, int32_t page_size = 4,
                                int32_t block_tokens = 12, int32_t dim = 8) {
  PagedCacheSpec spec;
  spec.layout = layout;
  spec.num_pages = 23;
  spec.page_size = page_size;
  spec.element_bytes = element_bytes;
  spec.block.num_layers = 3;
  spec.block.block_tokens = block_tokens;
  if (layout == EngineLayout::kMla) {
    spec.block.kind = BlockKind::kMla;
    spec.block.latent_dim = dim;
  } else {
    spec.block.num_kv_heads = 2;
    spec.block.head_dim = dim;
  }
  return spec;
}

// Page ids in [0, num_pages), with repeats and in no order.
inline std::vector<int32_t> RandomTable(const PagedCacheSpec& spec, int32_t num_blocks, std::mt19937_64& rng) {
  std::vector<int32_t> table(static_cast<size_t>(num_blocks) * spec.PagesPerBlock());
  std::uniform_int_distribution<int32_t> page(0, spec.num_pages - 1);
  for (auto& p : table) p = page(rng);
  if (table.size() >= 2) table[1] = table[0];  // at least one repeat
  return table;
}

// Distinct page ids in no order (num_blocks * PagesPerBlock() <= num_pages).
inline std::vector<int32_t> UniqueTable(const PagedCacheSpec& spec, int32_t num_blocks, std::mt19937_64& rng) {
  std::vector<int32_t> pages(spec.num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  pages.resize(static_cast<size_t>(num_blocks) * spec.PagesPerBlock());
  return pages;
}

// The definition of gather, one element at a time, straight from the layouts in gather_scatter.h.
inline std::vector<Bytes> NaiveGather(const PagedCacheSpec& spec, const std::vector<Bytes>& caches,
                                      const std::vector<int32_t>& table, int32_t num_blocks) {
  const BlockShape& s = spec.block;
  const int64_t e = spec.element_bytes;
  const int32_t heads = s.kind == BlockKind::kMla ? 1 : s.num_kv_heads;
  const int32_t dim = s.kind == BlockKind::kMla ? s.latent_dim : s.head_dim;
  std::vector<Bytes> blocks(num_blocks, Bytes(spec.BlockBytes()));
  for (int32_t b = 0; b < num_blocks; ++b) {
    for (int32_t l = 0; l < s.num_layers; ++l) {
      for (int32_t kv = 0; kv < s.NumKv(); ++kv) {
        for (int32_t t = 0; t < s.block_tokens; ++t) {
          const int64_t page = table[static_cast<size_t>(b) * spec.PagesPerBlock() + t / spec.page_size];
          const int64_t row = t % spec.page_size;
          for (int32_t h = 0; h < heads; ++h) {
            for (int32_t d = 0; d < dim; ++d) {
              int64_t src;
              switch (spec.layout) {
                case EngineLayout::kKvFirst:
                  src = (((kv * spec.num_pages + page) * spec.page_size + row) * heads + h) * dim + d;
                  break;
                case EngineLayout::kPageFirst:
                  src = (((page * 2 + kv) * spec.page_size + row) * heads + h) * dim + d;
                  break;
                default:
                  src = (page * spec.page_size + row) * dim + d;
                  break;
              }
              const int64_t dst = (((int64_t{l} * s.NumKv() + kv) * s.block_tokens + t) * heads + h) * dim + d;
              std::memcpy(&blocks[b][dst * e], &caches[l][src * e], e);
            }
          }
        }
      }
    }
  }
  return blocks;
}

template <typename T>
std::vector<T*> Pointers(std::vector<Bytes>& buffers) {
  std::vector<T*> out;
  for (auto& b : buffers) out.push_back(reinterpret_cast<T*>(b.data()));
  return out;
}

inline std::vector<const void*> ConstPointers(const std::vector<Bytes>& buffers) {
  std::vector<const void*> out;
  for (const auto& b : buffers) out.push_back(b.data());
  return out;
}

// ---- quantization ----

inline uint16_t ToBits(FloatType type, float v) { return type == FloatType::kFp16 ? FloatToFp16(v) : FloatToBf16(v); }

inline float FromBits(FloatType type, uint16_t bits) {
  return type == FloatType::kFp16 ? Fp16ToFloat(bits) : Bf16ToFloat(bits);
}

inline float MaxFinite(FloatType type) { return type == FloatType::kFp16 ? 65504.0f : Bf16ToFloat(0x7F7F); }

// A float block whose groups cycle through hard regimes: plain Gaussian, large and small magnitudes,
// all zero (+0 and -0), the type's largest magnitude next to ordinary values, all negative, fp16
// subnormals (bf16: ~1e-30), and one large value beside tiny ones (fp8's underflow range).
inline Bytes MakeFloatBlock(const QuantSpec& spec, std::mt19937_64& rng) {
  const int64_t n = spec.block.NumElements();
  const int64_t group = spec.quant_group_size;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Bytes out(n * 2);
  const bool fp16 = spec.float_type == FloatType::kFp16;
  for (int64_t g = 0; g < n / group; ++g) {
    const int regime = static_cast<int>(g % 8);
    for (int64_t i = 0; i < group; ++i) {
      float v = normal(rng);
      switch (regime) {
        case 0:
          break;
        case 1:
          v *= 1000.0f;
          break;
        case 2:
          v = (i % 2) ? -0.0f : 0.0f;
          break;
        case 3:
          v = (i == group / 2) ? MaxFinite(spec.float_type) : (i == 0 ? -MaxFinite(spec.float_type) : v * 100.0f);
          break;
        case 4:
          v *= 1e-3f;
          break;
        case 5:
          v = -std::fabs(v) - 0.25f;
          break;
        case 6:
          v *= fp16 ? 3e-6f : 1e-30f;
          break;  // fp16 subnormals are below 6.1e-5
        default:
          v = (i == 1) ? 300.0f : v * 1e-3f;
          break;
      }
      const uint16_t bits = ToBits(spec.float_type, v);
      std::memcpy(&out[(g * group + i) * 2], &bits, 2);
    }
  }
  return out;
}

// Half an ulp of `type` at magnitude v (>= 0): the most that rounding v to `type` can move it.
inline double HalfUlp(FloatType type, double v) {
  const int mant_bits = type == FloatType::kFp16 ? 10 : 7;
  const int min_exp = type == FloatType::kFp16 ? -14 : -126;
  int e = min_exp;
  if (v > 0) {
    int fe;
    std::frexp(v, &fe);  // v = m * 2^fe, m in [0.5, 1)
    e = std::max(fe - 1, min_exp);
  }
  return std::ldexp(1.0, e - mant_bits - 1);
}

// quantize.h's bound for |x - x^|, including the final rounding to the float type.
inline double QuantBound(const QuantSpec& spec, double x, double scale) {
  const double slack = 1.0 + std::ldexp(1.0, -13);
  const double ax = std::fabs(x);
  if (spec.codec == QuantCodec::kInt8) {
    return scale / 2 * slack + HalfUlp(spec.float_type, ax + scale);
  }
  const double core = std::max(std::ldexp(ax, -4), std::ldexp(scale, -10)) * slack;
  return core + HalfUlp(spec.float_type, ax + core);
}

inline float ScaleAt(const QuantSpec& spec, const Bytes& quantized, int64_t group) {
  float s;
  std::memcpy(&s, &quantized[spec.ScalesOffsetBytes() + 4 * group], 4);
  return s;
}

#if KVTIER_HAVE_CUDA
// Device memory (cudaMalloc), copied to and from host vectors. Tests only; errors fail the test via
// ok().
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr_ = nullptr;
  }
  DeviceBuffer(const Bytes& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  bool ok() const { return ptr_ != nullptr; }
  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }
  bool Upload(const Bytes& host) {
    return cudaMemcpy(ptr_, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess;
  }
  Bytes Download(size_t offset, size_t bytes) const {
    Bytes out(bytes);
    if (cudaMemcpy(out.data(), get() + offset, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) out.clear();
    return out;
  }
  Bytes Download() const { return Download(0, bytes_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

inline std::string CudaSync() {
  const cudaError_t err = cudaDeviceSynchronize();
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}
#endif  // KVTIER_HAVE_CUDA

}  // namespace kvtier::kernels::testing

#endif  // KVTIER_TESTS_UNIT_KERNELS_KERNEL_TEST_UTIL_H_
