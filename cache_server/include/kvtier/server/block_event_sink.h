// BlockEventSink: what a BlockStore tells an observer about changes to its set of committed blocks.
#ifndef KVTIER_SERVER_BLOCK_EVENT_SINK_H_
#define KVTIER_SERVER_BLOCK_EVENT_SINK_H_

#include <cstdint>
#include <memory>

#include "kvtier/common/block_key.h"
#include "kvtier/common/block_meta.h"

namespace kvtier::server {

enum class Tier : uint8_t;  // kvtier/server/block_store.h

// One committed block as events describe it.
struct EventBlockInfo {
  BlockKey key;
  uint64_t namespace_id = 0;
  uint64_t tenant_id = 0;
  Tier tier{};         // the tier holding it (for a removal: the tier it left from)
  uint32_t depth = 0;  // index in its prompt's chain, as the writer reported it
  uint64_t size_bytes = 0;
  // The engine's metadata the writer gave (hash, parent hash, token ids, LoRA id); null when none.
  // Shared and immutable, so that an event costs a pointer copy, not a copy of the token ids.
  std::shared_ptr<const BlockMeta> block_meta;
};

// Receives every change to a BlockStore's set of committed blocks, in the order the changes happen.
// Only committed blocks are reported: reservations and their aborts are invisible to readers and so to
// events. Applying the calls in order to an empty set gives the store's committed blocks.
// Threading: the store calls these with its mutex held (that is what orders them), from whichever thread
// changed the store. Implementations must be quick and must not block or call back into the store:
// assign a sequence number, queue, return (EventPublisher does exactly that).
class BlockEventSink {
 public:
  virtual ~BlockEventSink() = default;
  // `block` became visible (a verified commit, or present when the sink was attached).
  virtual void OnStored(const EventBlockInfo& block) = 0;
  // `block` is gone from every tier; block.tier is the tier it left from.
  virtual void OnRemoved(const EventBlockInfo& block) = 0;
  // `block` moved from tier `from` to block.tier and stayed present throughout.
  virtual void OnMoved(const EventBlockInfo& block, Tier from) = 0;
  // The store holds nothing that earlier calls described (OnStored calls for any survivor follow).
  virtual void OnCleared() = 0;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_BLOCK_EVENT_SINK_H_
