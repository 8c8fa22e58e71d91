#include "kvtier/reference_worker/paged_kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvtier::reference_worker {

PagedKvCache::PagedKvCache(int32_t num_layers, int32_t num_pages, int32_t page_size, int32_t num_kv_heads,
                           int32_t head_dim)
    : num_layers_(num_layers),
      num_pages_(num_pages),
      page_size_(page_size),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim) {
  const size_t layer_elements = size_t{2} * num_pages * page_size * static_cast<size_t>(num_kv_heads) * head_dim;
  layers_.assign(num_layers, std::vector<uint16_t>(layer_elements, 0));
  for (auto& l : layers_) {
    layer_ptrs_.push_back(l.data());
    const_layer_ptrs_.push_back(l.data());
  }
  // Pushed in increasing order and popped from the back: a fresh cache hands out pages in decreasing
  // order, so page tables are never the identity and gather/scatter must follow them.
  free_.reserve(num_pages);
  for (int32_t p = 0; p < num_pages; ++p) free_.push_back(p);
}

absl::StatusOr<std::vector<int32_t>> PagedKvCache::Allocate(int32_t num_tokens) {
  if (num_tokens < 0) return absl::InvalidArgumentError(absl::StrCat("num_tokens is ", num_tokens));
  const int32_t pages = (num_tokens + page_size_ - 1) / page_size_;
  if (pages > static_cast<int32_t>(free_.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat(num_tokens, " tokens need ", pages, " pages, ", free_.size(), " of ", num_pages_, " are free"));
  }
  std::vector<int32_t> table(free_.end() - pages, free_.end());
  std::reverse(table.begin(), table.end());
  free_.resize(free_.size() - pages);
  return table;
}

void PagedKvCache::Free(std::span<const int32_t> page_table) {
  for (auto it = page_table.rbegin(); it != page_table.rend(); ++it) free_.push_back(*it);
}

int64_t PagedKvCache::RowOffset(int32_t kv, int32_t page, int32_t row, int32_t kv_head) const {
  return (((static_cast<int64_t>(kv) * num_pages_ + page) * page_size_ + row) * num_kv_heads_ + kv_head) * head_dim_;
}

uint16_t* PagedKvCache::Row(int32_t layer, int32_t kv, std::span<const int32_t> page_table, int32_t position,
                            int32_t kv_head) {
  return layers_[layer].data() + RowOffset(kv, page_table[position / page_size_], position % page_size_, kv_head);
}

const uint16_t* PagedKvCache::Row(int32_t layer, int32_t kv, std::span<const int32_t> page_table, int32_t position,
                                  int32_t kv_head) const {
  return layers_[layer].data() + RowOffset(kv, page_table[position / page_size_], position % page_size_, kv_head);
}

}  // namespace kvtier::reference_worker
