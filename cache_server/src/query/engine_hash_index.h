// EngineHashIndex: which committed blocks carry a given engine block hash (the `hash` of their
// BlockMeta), for the /query_by_hash endpoint (docs/query.md).
#ifndef KVTIER_SERVER_SRC_QUERY_ENGINE_HASH_INDEX_H_
#define KVTIER_SERVER_SRC_QUERY_ENGINE_HASH_INDEX_H_

#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/block_meta.h"
#include "kvtier/server/block_event_sink.h"

namespace kvtier::server {

// A BlockEventSink that keeps engine hash -> block keys for the blocks whose writer gave an engine
// hash, and forwards every call to `next` (the event publisher, or null). Attach it with
// BlockStore::SetEventSink, which restates the store's blocks to it, so it starts complete.
// The index says which keys carried a hash; the tier of a key is read from the store when asked.
// Thread-safety: the sink calls come with the store's mutex held; Find() may be called from any thread
// (an internal mutex, never held while calling `next` or the store).
class EngineHashIndex final : public BlockEventSink {
 public:
  // `next` is not owned and must outlive this index (or be null).
  explicit EngineHashIndex(BlockEventSink* next) : next_(next) {}

  void OnStored(const EventBlockInfo& block) override;
  void OnRemoved(const EventBlockInfo& block) override;
  void OnMoved(const EventBlockInfo& block, Tier from) override;
  void OnCleared() override;

  // The committed blocks (one per TP shard) whose engine hash is `hash`, in no particular order;
  // empty when none (or `hash` is empty).
  std::vector<BlockKey> Find(const EngineBlockHash& hash) const;
  // How many distinct engine hashes are indexed.
  size_t size() const;

 private:
  // The map key: the form as one byte, then the value (8 bytes little-endian, or the bytes).
  static std::string KeyOf(const EngineBlockHash& hash);

  BlockEventSink* const next_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::vector<BlockKey>> by_hash_;  // guarded by mu_
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_QUERY_ENGINE_HASH_INDEX_H_
