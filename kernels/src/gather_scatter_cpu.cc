// CPU reference for gather/scatter: one memcpy per (block, layer, K|V, page) run (gather_scatter.h).
#include <cstdint>
#include <cstring>

#include "arg_checks.h"
#include "kvtier/kernels/gather_scatter.h"

namespace kvtier::kernels {
namespace {

// Byte offset of (kv, page) inside one layer's engine tensor.
int64_t CacheOffset(const PagedCacheSpec& spec, int32_t kv, int32_t page) {
  const int64_t page_bytes = spec.PageBytes();
  if (spec.layout == EngineLayout::kKvFirst) {
    return (static_cast<int64_t>(kv) * spec.num_pages + page) * page_bytes;
  }
  // kPageFirst, and kMla (NumKv() == 1, kv == 0).
  return (static_cast<int64_t>(page) * spec.block.NumKv() + kv) * page_bytes;
}

// Byte offset of (layer, kv, page_in_block) inside one block.
int64_t BlockOffset(const PagedCacheSpec& spec, int32_t layer, int32_t kv, int32_t page_in_block) {
  return ((static_cast<int64_t>(layer) * spec.block.NumKv() + kv) * spec.PagesPerBlock() + page_in_block) *
         spec.PageBytes();
}

void CopyRuns(const PagedCacheSpec& spec, const int32_t* block_table, int32_t num_blocks, void* const* layer_caches,
              void* const* blocks, bool gather) {
  const int32_t pages_per_block = spec.PagesPerBlock();
  const int64_t page_bytes = spec.PageBytes();
  for (int32_t b = 0; b < num_blocks; ++b) {
    char* block = static_cast<char*>(blocks[b]);
    for (int32_t layer = 0; layer < spec.block.num_layers; ++layer) {
      char* cache = static_cast<char*>(layer_caches[layer]);
      for (int32_t kv = 0; kv < spec.block.NumKv(); ++kv) {
        for (int32_t p = 0; p < pages_per_block; ++p) {
          const int32_t page = block_table[static_cast<int64_t>(b) * pages_per_block + p];
          char* c = cache + CacheOffset(spec, kv, page);
          char* k = block + BlockOffset(spec, layer, kv, p);
          if (gather) {
            std::memcpy(k, c, page_bytes);
          } else {
            std::memcpy(c, k, page_bytes);
          }
        }
      }
    }
  }
}

}  // namespace

KernelStatus GatherCpu(const PagedCacheSpec& spec, const void* const* layer_caches, const int32_t* block_table,
                       int32_t num_blocks, void* const* blocks) {
  KernelStatus s = internal::CheckPagedCopy(spec, layer_caches, block_table, num_blocks, blocks,
                                            /*check_entries=*/true, /*unique_pages=*/false);
  if (!s.ok() || num_blocks == 0) return s;
  CopyRuns(spec, block_table, num_blocks, const_cast<void* const*>(layer_caches), blocks, true);
  return {};
}

KernelStatus ScatterCpu(const PagedCacheSpec& spec, const void* const* blocks, const int32_t* block_table,
                        int32_t num_blocks, void* const* layer_caches) {
  KernelStatus s = internal::CheckPagedCopy(spec, layer_caches, block_table, num_blocks, blocks,
                                            /*check_entries=*/true, /*unique_pages=*/true);
  if (!s.ok() || num_blocks == 0) return s;
  CopyRuns(spec, block_table, num_blocks, layer_caches, const_cast<void* const*>(blocks), false);
  return {};
}

}  // namespace kvtier::kernels
