#include "committed_index.h"

#include <algorithm>
#include <mutex>

namespace kvtier::server {

CommittedIndex::CommittedIndex(uint32_t shards)
    : count_(std::max<uint32_t>(1, shards)), shards_(std::make_unique<Shard[]>(count_)) {}

CommittedIndex::Shard& CommittedIndex::ShardOf(const BlockKey& key) const {
  // Fingerprints are SHA-256 output: their ring position is uniform already.
  const uint64_t h = key.fingerprint.RingPosition() ^ (uint64_t{key.shard} * 0x9e3779b97f4a7c15ULL);
  return shards_[h % count_];
}

void CommittedIndex::Insert(const BlockKey& key, uint64_t namespace_id, uint64_t tenant_id) {
  Shard& s = ShardOf(key);
  std::lock_guard lock(s.mu);
  s.map.insert_or_assign(key, Owner{namespace_id, tenant_id});
}

void CommittedIndex::Erase(const BlockKey& key) {
  Shard& s = ShardOf(key);
  std::lock_guard lock(s.mu);
  s.map.erase(key);
}

uint64_t CommittedIndex::Find(uint64_t namespace_id, uint64_t tenant_id, std::span<const BlockKey> keys,
                              std::vector<bool>& present) const {
  uint64_t hits = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    Shard& s = ShardOf(keys[i]);
    std::lock_guard lock(s.mu);
    auto it = s.map.find(keys[i]);
    if (it == s.map.end() || it->second.namespace_id != namespace_id || it->second.tenant_id != tenant_id) continue;
    present[i] = true;
    ++hits;
  }
  return hits;
}

size_t CommittedIndex::size() const {
  size_t n = 0;
  for (uint32_t i = 0; i < count_; ++i) {
    std::lock_guard lock(shards_[i].mu);
    n += shards_[i].map.size();
  }
  return n;
}

}  // namespace kvtier::server
