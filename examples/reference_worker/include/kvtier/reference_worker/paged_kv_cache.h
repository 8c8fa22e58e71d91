// PagedKvCache: an inference engine's paged KV cache as vLLM's FlashAttention backend keeps it, on the
// host. One tensor per layer, row-major, bf16 bit patterns (uint16_t):
//   [2 (K, V)][num_pages][page_size][num_kv_heads][head_dim]
// (kvtier::kernels::EngineLayout::kKvFirst). A sequence owns a page table: token t lives in page
// page_table[t / page_size] at row t % page_size. Pages are handed out from a free list, so a
// sequence's pages are generally neither contiguous nor in order.
// Thread-safety: none; one owner at a time (the reference worker serves one prompt at a time).
// Ownership: the cache owns its memory; pointers it returns live as long as the cache.
#ifndef KVTIER_REFERENCE_WORKER_PAGED_KV_CACHE_H_
#define KVTIER_REFERENCE_WORKER_PAGED_KV_CACHE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::reference_worker {

class PagedKvCache {
 public:
  // All counts > 0 (checked by the caller, TinyTransformer / ReferenceWorker). Memory:
  // num_layers * 2 * num_pages * page_size * num_kv_heads * head_dim * 2 bytes, zero-filled.
  PagedKvCache(int32_t num_layers, int32_t num_pages, int32_t page_size, int32_t num_kv_heads, int32_t head_dim);

  // Takes ceil(num_tokens / page_size) pages off the free list and returns them as a page table.
  // Errors: ResourceExhausted (not enough free pages; nothing is taken), InvalidArgument (num_tokens < 0).
  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t num_tokens);
  // Returns pages to the free list. Every page must have come from Allocate() and not been freed since.
  void Free(std::span<const int32_t> page_table);

  // The K (kv = 0) or V (kv = 1) row of token `position` of the sequence with `page_table`, for one
  // KV head: head_dim bf16 values.
  uint16_t* Row(int32_t layer, int32_t kv, std::span<const int32_t> page_table, int32_t position, int32_t kv_head);
  const uint16_t* Row(int32_t layer, int32_t kv, std::span<const int32_t> page_table, int32_t position,
                      int32_t kv_head) const;

  // Base pointers of the layer tensors, for kernels::GatherCpu / ScatterCpu (num_layers entries).
  const void* const* layer_pointers() const { return const_layer_ptrs_.data(); }
  void* const* mutable_layer_pointers() { return layer_ptrs_.data(); }

  int32_t num_layers() const { return num_layers_; }
  int32_t num_pages() const { return num_pages_; }
  int32_t page_size() const { return page_size_; }
  int32_t num_kv_heads() const { return num_kv_heads_; }
  int32_t head_dim() const { return head_dim_; }
  int32_t free_pages() const { return static_cast<int32_t>(free_.size()); }

 private:
  int64_t RowOffset(int32_t kv, int32_t page, int32_t row, int32_t kv_head) const;

  int32_t num_layers_, num_pages_, page_size_, num_kv_heads_, head_dim_;
  std::vector<std::vector<uint16_t>> layers_;  // one tensor per layer
  std::vector<void*> layer_ptrs_;
  std::vector<const void*> const_layer_ptrs_;
  std::vector<int32_t> free_;  // stack of free page ids
};

}  // namespace kvtier::reference_worker

#endif  // KVTIER_REFERENCE_WORKER_PAGED_KV_CACHE_H_
