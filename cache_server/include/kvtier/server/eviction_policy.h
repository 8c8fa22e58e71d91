// Eviction policies: which committed, unleased block to drop when a tier is full.
#ifndef KVTIER_SERVER_EVICTION_POLICY_H_
#define KVTIER_SERVER_EVICTION_POLICY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace kvtier::server {

// Dense handle of an index entry (BlockStore reuses handles after erase).
using EntryHandle = uint32_t;

// What a policy learns of each insert and access. A KV cache knows more than a generic cache: where a
// block sits in its prompt's chain and which namespace (model, layout) it belongs to.
struct BlockAccess {
  uint32_t depth = 0;          // index of the block in its prompt's fingerprint chain (0 = first block)
  uint64_t namespace_id = 0;   // Namespace::Id()
  uint64_t size_bytes = 0;     // the block's bytes
  int64_t now_ns = 0;          // the store's clock at the access, ns since the Unix epoch
};

// Tracks the entries of one tier and orders them as eviction candidates. The store calls OnInsert when
// a block becomes visible, OnAccess on every hit or repeated put, OnErase when it leaves the tier.
// Thread-safety: none; the owning store serialises calls.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual void OnInsert(EntryHandle h, const BlockAccess& access) = 0;
  virtual void OnAccess(EntryHandle h, const BlockAccess& access) = 0;
  virtual void OnErase(EntryHandle h) = 0;
  // Offers candidates from the best victim onward to `eligible` and returns the first it accepts, or
  // nullopt when it accepts none (e.g. everything is leased). Does not remove the victim.
  virtual std::optional<EntryHandle> PickVictim(absl::FunctionRef<bool(EntryHandle)> eligible) = 0;
  virtual const char* name() const = 0;
};

// Least recently used: an intrusive doubly linked list over entry handles. O(1) per call, plus the
// candidates skipped in PickVictim.
std::unique_ptr<EvictionPolicy> NewLruPolicy();

// The policy called `name` ("lru"). Errors: InvalidArgument listing the known names.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> NewEvictionPolicy(const std::string& name);

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_EVICTION_POLICY_H_
