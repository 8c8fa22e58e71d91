// Which blocks are committed, sharded by key: what a lookup without a lease reads, without the
// store's lock.
#ifndef KVTIER_SERVER_SRC_COMMITTED_INDEX_H_
#define KVTIER_SERVER_SRC_COMMITTED_INDEX_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvtier/common/block_key.h"
#include "kvtier/server/timed_mutex.h"

namespace kvtier::server {

// Committed block key -> the namespace and tenant it was committed in, in `shards` independently
// locked maps (a key's shard: its fingerprint's ring position and shard mixed, modulo the count), so
// lookups of different blocks do not serialize on one lock. BlockStore keeps it equal to its own
// index's committed entries (Insert when a block commits or is recovered from disk, Erase when a
// committed block is dropped from its last tier), both under the store's lock; lock order: the
// store's lock before a shard's.
// Thread-safety: every method may be called concurrently.
class CommittedIndex {
 public:
  // `shards` >= 1 (0 is taken as 1).
  explicit CommittedIndex(uint32_t shards);

  void Insert(const BlockKey& key, uint64_t namespace_id, uint64_t tenant_id);
  void Erase(const BlockKey& key);
  // present[i] = keys[i] is committed in (namespace_id, tenant_id); `present` must hold keys.size()
  // values (the others are left as they are). Returns how many are.
  uint64_t Find(uint64_t namespace_id, uint64_t tenant_id, std::span<const BlockKey> keys,
                std::vector<bool>& present) const;
  // Keys indexed, over every shard (not a snapshot: shards are read one after another).
  size_t size() const;
  uint32_t shard_count() const { return count_; }

 private:
  struct Owner {
    uint64_t namespace_id;
    uint64_t tenant_id;
  };
  struct alignas(64) Shard {
    mutable TimedMutex mu{TimedMutex::Kind::kIndexShard};
    absl::flat_hash_map<BlockKey, Owner> map;  // guarded by mu
  };
  Shard& ShardOf(const BlockKey& key) const;

  uint32_t count_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_COMMITTED_INDEX_H_
