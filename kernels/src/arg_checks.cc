#include "arg_checks.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kvtier/kernels/block_shape.h"

namespace kvtier::kernels {

using internal::InvalidArgument;

namespace {

KernelStatus CheckPositive(const char* field, int64_t value) {
  if (value > 0) return {};
  return InvalidArgument(std::string(field) + " is " + std::to_string(value) + ", want > 0");
}

}  // namespace

KernelStatus BlockShape::Validate() const {
  KernelStatus s;
  if (kind != BlockKind::kStandard && kind != BlockKind::kMla) {
    return InvalidArgument("block.kind " + std::to_string(static_cast<int>(kind)) + " is unknown");
  }
  if (!(s = CheckPositive("block.num_layers", num_layers)).ok()) return s;
  if (!(s = CheckPositive("block.block_tokens", block_tokens)).ok()) return s;
  if (kind == BlockKind::kStandard) {
    if (!(s = CheckPositive("block.num_kv_heads", num_kv_heads)).ok()) return s;
    if (!(s = CheckPositive("block.head_dim", head_dim)).ok()) return s;
  } else {
    if (!(s = CheckPositive("block.latent_dim", latent_dim)).ok()) return s;
  }
  // In double: the int64 product could overflow for absurd fields.
  const double elements =
      static_cast<double>(num_layers) * NumKv() * block_tokens *
      (kind == BlockKind::kMla ? static_cast<double>(latent_dim) : static_cast<double>(num_kv_heads) * head_dim);
  if (elements > 1099511627776.0) {  // 2^40
    return InvalidArgument("block has " + std::to_string(elements) + " elements, want <= 2^40");
  }
  return {};
}

KernelStatus PagedCacheSpec::Validate() const {
  KernelStatus s = block.Validate();
  if (!s.ok()) return s;
  switch (layout) {
    case EngineLayout::kKvFirst:
    case EngineLayout::kPageFirst:
      if (block.kind != BlockKind::kStandard) {
        return InvalidArgument("layout kKvFirst/kPageFirst needs block.kind kStandard, got kMla");
      }
      break;
    case EngineLayout::kMla:
      if (block.kind != BlockKind::kMla) {
        return InvalidArgument("layout kMla needs block.kind kMla, got kStandard");
      }
      break;
    default:
      return InvalidArgument("layout " + std::to_string(static_cast<int>(layout)) + " is unknown");
  }
  if (!(s = CheckPositive("num_pages", num_pages)).ok()) return s;
  if (!(s = CheckPositive("page_size", page_size)).ok()) return s;
  if (block.block_tokens % page_size != 0) {
    return InvalidArgument("block_tokens " + std::to_string(block.block_tokens) + " is not a multiple of page_size " +
                           std::to_string(page_size));
  }
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4) {
    return InvalidArgument("element_bytes is " + std::to_string(element_bytes) + ", want 1, 2 or 4");
  }
  const double layer_bytes = static_cast<double>(num_pages) * block.NumKv() * page_size *
                             static_cast<double>(block.TokenElements()) * element_bytes;
  if (layer_bytes > 70368744177664.0) {  // 2^46
    return InvalidArgument("one layer's cache is " + std::to_string(layer_bytes) + " bytes, want <= 2^46");
  }
  return {};
}

KernelStatus QuantSpec::Validate() const {
  KernelStatus s = block.Validate();
  if (!s.ok()) return s;
  if (float_type != FloatType::kFp16 && float_type != FloatType::kBf16) {
    return InvalidArgument("float_type " + std::to_string(static_cast<int>(float_type)) + " is unknown");
  }
  if (codec != QuantCodec::kFp8E4m3 && codec != QuantCodec::kInt8) {
    return InvalidArgument("codec " + std::to_string(static_cast<int>(codec)) + " is unknown");
  }
  if (!(s = CheckPositive("quant_group_size", quant_group_size)).ok()) return s;
  if (block.InnerDim() % quant_group_size != 0) {
    return InvalidArgument("quant_group_size " + std::to_string(quant_group_size) + " does not divide " +
                           (block.kind == BlockKind::kMla ? "latent_dim " : "head_dim ") +
                           std::to_string(block.InnerDim()));
  }
  return {};
}

namespace internal {

KernelStatus CheckPagedCopy(const PagedCacheSpec& spec, const void* const* layer_caches, const int32_t* block_table,
                            int32_t num_blocks, const void* const* blocks, bool check_entries, bool unique_pages) {
  KernelStatus s = spec.Validate();
  if (!s.ok()) return s;
  if (num_blocks < 0) return InvalidArgument("num_blocks is " + std::to_string(num_blocks));
  if (num_blocks == 0) return {};
  if (layer_caches == nullptr) return InvalidArgument("layer_caches is null");
  if (block_table == nullptr) return InvalidArgument("block_table is null");
  if (blocks == nullptr) return InvalidArgument("blocks is null");
  if (!check_entries) return {};
  for (int32_t l = 0; l < spec.block.num_layers; ++l) {
    if (layer_caches[l] == nullptr) return InvalidArgument("layer_caches[" + std::to_string(l) + "] is null");
  }
  for (int32_t b = 0; b < num_blocks; ++b) {
    if (blocks[b] == nullptr) return InvalidArgument("blocks[" + std::to_string(b) + "] is null");
  }
  const int64_t n = static_cast<int64_t>(num_blocks) * spec.PagesPerBlock();
  for (int64_t i = 0; i < n; ++i) {
    if (block_table[i] < 0 || block_table[i] >= spec.num_pages) {
      return InvalidArgument("block_table[" + std::to_string(i) + "] is page " + std::to_string(block_table[i]) +
                             ", want [0, " + std::to_string(spec.num_pages) + ")");
    }
  }
  if (unique_pages) {
    std::vector<int32_t> sorted(block_table, block_table + n);
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) {
      return InvalidArgument("scatter names page " + std::to_string(*dup) +
                             " more than once; each page may be written by one block only");
    }
  }
  return {};
}

KernelStatus CheckQuant(const QuantSpec& spec, const void* const* in_blocks, int32_t num_blocks,
                        const void* const* out_blocks, bool check_entries) {
  KernelStatus s = spec.Validate();
  if (!s.ok()) return s;
  if (num_blocks < 0) return InvalidArgument("num_blocks is " + std::to_string(num_blocks));
  if (num_blocks == 0) return {};
  if (in_blocks == nullptr) return InvalidArgument("input block array is null");
  if (out_blocks == nullptr) return InvalidArgument("output block array is null");
  if (!check_entries) return {};
  for (int32_t b = 0; b < num_blocks; ++b) {
    if (in_blocks[b] == nullptr) return InvalidArgument("input block " + std::to_string(b) + " is null");
    if (out_blocks[b] == nullptr) return InvalidArgument("output block " + std::to_string(b) + " is null");
  }
  return {};
}

}  // namespace internal
}  // namespace kvtier::kernels
