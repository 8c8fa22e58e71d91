// MemoryTier: one memory tier of BlockStore (host memory or HBM), the same class for both.
#ifndef KVTIER_SERVER_SRC_MEMORY_TIER_H_
#define KVTIER_SERVER_SRC_MEMORY_TIER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/functional/function_ref.h"
#include "kvtier/server/eviction_policy.h"
#include "kvtier/server/slab_allocator.h"

namespace kvtier::server {

// Where a memory tier's slots come from (its slab allocator), which of its blocks leaves first (its
// eviction policy) and its two gauges, kept together so that every slot and every policy entry is
// counted exactly once:
//   - `bytes`: the slot bytes handed out (Allocate) and not yet returned (Free): committed blocks,
//     reserved ones being written, and slots being filled by a move into this tier;
//   - `blocks`: the committed blocks in the tier's policy (Insert to Erase).
// The gauges are BlockStoreStats fields (borrowed; they must outlive the tier), so that the store's
// counter visitor reads them without the lock.
// Thread-safety: none. The store calls every method with its lock (BlockStore::mu_) held.
class MemoryTier {
 public:
  MemoryTier(std::unique_ptr<SlabAllocator> allocator, std::unique_ptr<EvictionPolicy> policy,
             std::atomic<uint64_t>& blocks, std::atomic<uint64_t>& bytes)
      : allocator_(std::move(allocator)), policy_(std::move(policy)), blocks_(blocks), bytes_(bytes) {}
  MemoryTier(const MemoryTier&) = delete;
  MemoryTier& operator=(const MemoryTier&) = delete;

  SlabAllocator& allocator() const { return *allocator_; }
  EvictionPolicy& policy() const { return *policy_; }

  // A free slot for a block of `block_bytes`, its slot bytes counted; nullopt when none is free.
  std::optional<SlotRef> Allocate(uint64_t block_bytes) {
    std::optional<SlotRef> slot = allocator_->Allocate(block_bytes);
    if (slot.has_value()) bytes_.fetch_add(allocator_->SlotBytesOf(*slot), std::memory_order_relaxed);
    return slot;
  }
  // As Allocate, calling evict_one(slot bytes of the class) while no slot is free; evict_one frees room
  // (returning true) or cannot (false, and so does this: nullopt).
  std::optional<SlotRef> AllocateEvicting(uint64_t block_bytes, absl::FunctionRef<bool(uint64_t)> evict_one) {
    const uint64_t slot_bytes = allocator_->SlotBytes(block_bytes);
    std::optional<SlotRef> slot = Allocate(block_bytes);
    while (!slot.has_value() && evict_one(slot_bytes)) slot = Allocate(block_bytes);
    return slot;
  }
  // Returns `slot` (from Allocate, not yet freed) and uncounts its bytes.
  void Free(SlotRef slot) {
    bytes_.fetch_sub(allocator_->SlotBytesOf(slot), std::memory_order_relaxed);
    allocator_->Free(slot);
  }

  // A committed block `h` enters the tier's policy and block count, or leaves them. Its slot is Free'd
  // apart (a reserved block has a slot but no policy entry).
  void Insert(EntryHandle h, const BlockAccess& access) {
    policy_->OnInsert(h, access);
    blocks_.fetch_add(1, std::memory_order_relaxed);
  }
  void Erase(EntryHandle h) {
    policy_->OnErase(h);
    blocks_.fetch_sub(1, std::memory_order_relaxed);
  }
  void Access(EntryHandle h, const BlockAccess& access) { policy_->OnAccess(h, access); }

  // The policy's victim among the blocks `evictable` accepts whose eviction gives a slot of
  // `slot_bytes` at once: a slot of that size (reused as it is), or the last used slot of its slab
  // (which then serves any size). `slot_of(h)` is block h's slot in this tier. nullopt: none.
  std::optional<EntryHandle> PickVictimFor(uint64_t slot_bytes, absl::FunctionRef<bool(EntryHandle)> evictable,
                                           absl::FunctionRef<SlotRef(EntryHandle)> slot_of) {
    return policy_->PickVictim([&](EntryHandle h) {
      if (!evictable(h)) return false;
      const SlotRef s = slot_of(h);
      return allocator_->SlotBytesOf(s) == slot_bytes || allocator_->IsLastInSlab(s);
    });
  }

 private:
  const std::unique_ptr<SlabAllocator> allocator_;
  const std::unique_ptr<EvictionPolicy> policy_;
  std::atomic<uint64_t>& blocks_;
  std::atomic<uint64_t>& bytes_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_MEMORY_TIER_H_
