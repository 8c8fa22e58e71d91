// RequestHistory: how many times blocks that are no longer stored were requested, bounded, so that a
// block stored again continues its count (the disk tier's admission rule, BlockStoreOptions::
// disk_admit_min_requests). A block dropped from every tier is remembered by its key hash; the oldest
// entries are forgotten first. Not thread-safe: BlockStore calls it under its lock.
#ifndef KVTIER_SERVER_REQUEST_HISTORY_H_
#define KVTIER_SERVER_REQUEST_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace kvtier::server {

class RequestHistory {
 public:
  // Remembers that the block of `key_hash` was requested `requests` times before it was dropped
  // (replacing what was remembered for it), then forgets the oldest entries beyond `max_entries`
  // (at least 1). Amortized O(1); memory about 40 bytes per entry.
  void Remember(uint64_t key_hash, uint32_t requests, size_t max_entries);
  // The requests remembered for `key_hash`, which is forgotten (it is stored again); 0 if none.
  uint32_t Take(uint64_t key_hash);
  size_t size() const { return counts_.size(); }

 private:
  struct Count {
    uint32_t requests = 0;
    uint64_t seq = 0;  // of its entry in order_
  };
  absl::flat_hash_map<uint64_t, Count> counts_;
  std::deque<std::pair<uint64_t, uint64_t>> order_;  // (key hash, seq), oldest first; stale ones skipped
  uint64_t next_seq_ = 0;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_REQUEST_HISTORY_H_
