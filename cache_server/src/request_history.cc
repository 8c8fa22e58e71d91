#include "kvtier/server/request_history.h"

#include <algorithm>

namespace kvtier::server {

void RequestHistory::Remember(uint64_t key_hash, uint32_t requests, size_t max_entries) {
  max_entries = std::max<size_t>(max_entries, 1);
  const uint64_t seq = next_seq_++;
  counts_[key_hash] = Count{.requests = requests, .seq = seq};
  order_.emplace_back(key_hash, seq);
  while (counts_.size() > max_entries || order_.size() > 2 * max_entries + 16) {
    const auto [oldest, oldest_seq] = order_.front();
    order_.pop_front();
    auto it = counts_.find(oldest);
    if (it != counts_.end() && it->second.seq == oldest_seq) counts_.erase(it);  // else stale: taken or renewed
  }
}

uint32_t RequestHistory::Take(uint64_t key_hash) {
  auto it = counts_.find(key_hash);
  if (it == counts_.end()) return 0;
  const uint32_t requests = it->second.requests;
  counts_.erase(it);
  return requests;
}

}  // namespace kvtier::server
