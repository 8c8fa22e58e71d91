// MemoryTier (cache_server/src/memory_tier.h): the slab allocator, eviction policy and gauges of one
// memory tier, as BlockStore uses it for host memory and HBM alike.
#include "memory_tier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "kvtier/server/eviction_policy.h"
#include "kvtier/server/slab_allocator.h"

namespace kvtier::server {
namespace {

constexpr uint64_t kSlab = 64 << 10;  // 64 KiB slabs

class MemoryTierTest : public ::testing::Test {
 protected:
  // A tier of `slabs` slabs of 64 KiB, with LRU, counting into blocks_ and bytes_. map_region false:
  // the tier hands out offsets only, as the HBM tier does.
  void Make(uint64_t slabs) {
    auto alloc = SlabAllocator::Create({.capacity_bytes = slabs * kSlab, .slab_bytes = kSlab, .map_region = false});
    ASSERT_TRUE(alloc.ok()) << alloc.status();
    auto policy = NewEvictionPolicy("lru", {});
    ASSERT_TRUE(policy.ok()) << policy.status();
    tier_ = std::make_unique<MemoryTier>(std::move(alloc).value(), std::move(policy).value(), blocks_, bytes_);
  }

  // Stores a committed block of `bytes` as entry h (slot kept in slots_[h]); false when no slot is free.
  bool Store(EntryHandle h, uint64_t bytes) {
    std::optional<SlotRef> slot = tier_->Allocate(bytes);
    if (!slot.has_value()) return false;
    if (slots_.size() <= h) slots_.resize(h + 1);
    slots_[h] = *slot;
    tier_->Insert(h, BlockAccess{.now_ns = static_cast<int64_t>(h) + 1});
    return true;
  }

  std::atomic<uint64_t> blocks_{0};
  std::atomic<uint64_t> bytes_{0};
  std::unique_ptr<MemoryTier> tier_;
  std::vector<SlotRef> slots_;
};

TEST_F(MemoryTierTest, GaugesCountSlotsFromAllocateToFreeAndBlocksFromInsertToErase) {
  Make(4);
  std::optional<SlotRef> reserved = tier_->Allocate(1000);  // a reservation: a slot, no policy entry
  ASSERT_TRUE(reserved.has_value());
  const uint64_t slot = tier_->allocator().SlotBytesOf(*reserved);
  EXPECT_EQ(slot, 1024u) << "1000 bytes round up to the 64-byte alignment";
  EXPECT_EQ(bytes_.load(), slot);
  EXPECT_EQ(blocks_.load(), 0u) << "a reserved block is not a stored block";
  tier_->Insert(7, BlockAccess{});
  EXPECT_EQ(blocks_.load(), 1u);
  tier_->Erase(7);
  tier_->Free(*reserved);
  EXPECT_EQ(bytes_.load(), 0u);
  EXPECT_EQ(blocks_.load(), 0u);
  EXPECT_EQ(tier_->allocator().used_bytes(), 0u) << "the gauge and the allocator agree";
}

TEST_F(MemoryTierTest, AllocateEvictingCallsTheEvictorUntilASlotIsFree) {
  Make(1);  // one slab: 16 slots of 4 KiB
  for (EntryHandle h = 0; h < 16; ++h) ASSERT_TRUE(Store(h, 4096)) << h;
  int calls = 0;
  std::optional<SlotRef> slot = tier_->AllocateEvicting(4096, [&](uint64_t slot_bytes) {
    EXPECT_EQ(slot_bytes, 4096u) << "the evictor is told the size class it must free";
    ++calls;
    if (calls < 3) return true;  // claims room but frees nothing: asked again
    const std::optional<EntryHandle> victim = tier_->PickVictimFor(
        slot_bytes, [](EntryHandle) { return true; }, [&](EntryHandle h) { return slots_[h]; });
    EXPECT_EQ(victim, std::optional<EntryHandle>(0)) << "LRU: the first block stored";
    tier_->Erase(*victim);
    tier_->Free(slots_[*victim]);
    return true;
  });
  ASSERT_TRUE(slot.has_value());
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(bytes_.load(), 16u * 4096);
  EXPECT_EQ(blocks_.load(), 15u);

  // An evictor that cannot free anything: nullopt, nothing counted.
  calls = 0;
  EXPECT_FALSE(tier_->AllocateEvicting(4096, [&](uint64_t) { return ++calls, false; }).has_value());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(bytes_.load(), 16u * 4096);
}

TEST_F(MemoryTierTest, AVictimMustFreeASlotOfTheSizeAsked) {
  Make(2);
  // Slab A: 4 KiB slots, entries 0 and 1. Slab B: one 8 KiB slot, entry 2.
  ASSERT_TRUE(Store(0, 4096));
  ASSERT_TRUE(Store(1, 4096));
  ASSERT_TRUE(Store(2, 8192));
  const auto slot_of = [&](EntryHandle h) { return slots_[h]; };
  const auto any = [](EntryHandle) { return true; };
  // 4 KiB: the least recent 4 KiB block.
  EXPECT_EQ(tier_->PickVictimFor(4096, any, slot_of), std::optional<EntryHandle>(0));
  // 8 KiB: entry 2 has that size; entry 0 shares its slab with entry 1, so evicting it frees no slot of
  // 8 KiB and it is passed over although least recent.
  EXPECT_EQ(tier_->PickVictimFor(8192, any, slot_of), std::optional<EntryHandle>(2));
  // 16 KiB (no block of that size): only a block alone in its slab qualifies, here entry 2.
  EXPECT_EQ(tier_->PickVictimFor(16384, any, slot_of), std::optional<EntryHandle>(2));
  // The caller's filter (leased blocks) is applied first.
  EXPECT_EQ(tier_->PickVictimFor(
                16384, [](EntryHandle h) { return h != 2; }, slot_of),
            std::nullopt);
  EXPECT_EQ(tier_->PickVictimFor(
                4096, [](EntryHandle h) { return h != 0; }, slot_of),
            std::optional<EntryHandle>(1));
}

}  // namespace
}  // namespace kvtier::server
