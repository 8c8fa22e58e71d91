#include "kvtier/server/slab_allocator.h"

#include <set>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

TEST(SlabAllocatorTest, HandsOutExactlyCapacityOverSlotBytesSlots) {
  // 2.5 slabs of 1 MiB; 64 KiB slots: 16 + 16 + 8 = 40 slots, never more.
  auto a = SlabAllocator::Create({.capacity_bytes = 5 * (512ULL << 10), .slab_bytes = 1ULL << 20});
  ASSERT_OK(a);
  std::vector<SlotRef> slots;
  while (auto s = (*a)->Allocate(64 << 10)) slots.push_back(*s);
  EXPECT_EQ(slots.size(), 40u);
  EXPECT_EQ((*a)->used_bytes(), 40u * (64 << 10));
  EXPECT_LE((*a)->used_bytes(), (*a)->capacity_bytes());
  std::set<std::byte*> distinct;
  for (SlotRef s : slots) {
    std::byte* p = (*a)->Data(s);
    EXPECT_TRUE(distinct.insert(p).second);
    // Every slot lies inside the region.
    EXPECT_LE(static_cast<uint64_t>(p + (64 << 10) - (*a)->Data(slots.front())), (*a)->capacity_bytes());
  }
}

TEST(SlabAllocatorTest, ABlockWhoseSlotExceedsEverySlabIsRefusedAtOnce) {
  // 1000001-byte slabs: a 1000001-byte block rounds up to a 1000064-byte slot, which no slab holds.
  auto a = SlabAllocator::Create({.capacity_bytes = 4 * 1000001ULL, .slab_bytes = 1000001});
  ASSERT_OK(a);
  EXPECT_EQ((*a)->max_block_bytes(), 1000000u);
  EXPECT_EQ(SlabAllocator::LargestBlockBytes({.capacity_bytes = 4 * 1000001ULL, .slab_bytes = 1000001}), 1000000u);
  EXPECT_FALSE((*a)->Allocate(1000001).has_value());
  EXPECT_EQ((*a)->free_slabs(), 4u);  // nothing taken for it
  EXPECT_TRUE((*a)->Allocate(1000000).has_value());
  // A region shorter than one slab: its one slab is the region.
  EXPECT_EQ(SlabAllocator::LargestBlockBytes({.capacity_bytes = 100000, .slab_bytes = 1 << 20}), 99968u);
  EXPECT_EQ(SlabAllocator::LargestBlockBytes({.capacity_bytes = 1 << 20, .slab_bytes = 32}), 0u);
}

TEST(SlabAllocatorTest, FreedSlotIsReused) {
  auto a = SlabAllocator::Create({.capacity_bytes = 1ULL << 20, .slab_bytes = 1ULL << 20});
  ASSERT_OK(a);
  std::vector<SlotRef> slots;
  while (auto s = (*a)->Allocate(256 << 10)) slots.push_back(*s);
  ASSERT_EQ(slots.size(), 4u);
  (*a)->Free(slots[2]);
  auto again = (*a)->Allocate(256 << 10);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, slots[2]);
  EXPECT_FALSE((*a)->Allocate(256 << 10).has_value());
}

TEST(SlabAllocatorTest, EmptySlabMovesToAnotherSizeClass) {
  auto a = SlabAllocator::Create({.capacity_bytes = 2ULL << 20, .slab_bytes = 1ULL << 20});
  ASSERT_OK(a);
  std::vector<SlotRef> small;
  while (auto s = (*a)->Allocate(128 << 10)) small.push_back(*s);
  ASSERT_EQ(small.size(), 16u);
  EXPECT_FALSE((*a)->Allocate(512 << 10).has_value());
  // Free one whole slab's worth (slots of one slab), then the large class can take that slab.
  const uint32_t slab = small.front().slab;
  for (SlotRef s : small) {
    if (s.slab == slab) (*a)->Free(s);
  }
  EXPECT_EQ((*a)->free_slabs(), 1u);
  auto big = (*a)->Allocate(512 << 10);
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->slab, slab);
  EXPECT_EQ((*a)->SlotBytesOf(*big), 512u << 10);
}

TEST(SlabAllocatorTest, RoundsSlotsUpToAlignment) {
  auto a = SlabAllocator::Create({.capacity_bytes = 1ULL << 20, .slab_bytes = 1ULL << 20});
  ASSERT_OK(a);
  EXPECT_EQ((*a)->SlotBytes(1), 64u);
  EXPECT_EQ((*a)->SlotBytes(64), 64u);
  EXPECT_EQ((*a)->SlotBytes(65), 128u);
}

TEST(SlabAllocatorTest, RefusesBlocksLargerThanASlabAndBadOptions) {
  auto a = SlabAllocator::Create({.capacity_bytes = 4ULL << 20, .slab_bytes = 1ULL << 20});
  ASSERT_OK(a);
  EXPECT_FALSE((*a)->Allocate((1ULL << 20) + 1).has_value());
  EXPECT_FALSE((*a)->Allocate(0).has_value());
  EXPECT_FALSE(SlabAllocator::Create({.capacity_bytes = 0}).ok());
  EXPECT_FALSE(
      SlabAllocator::Create({.capacity_bytes = 1 << 20, .slab_bytes = 1 << 20, .slot_alignment_bytes = 48}).ok());
}

TEST(SlabAllocatorTest, RefusesCapacitiesAndSlabCountsItCannotHold) {
  // Near 2^64, the slab count and the mapping size used to wrap around.
  for (uint64_t capacity : {~uint64_t{0}, ~uint64_t{0} - 1, SlabAllocator::kMaxCapacityBytes + 1}) {
    auto a = SlabAllocator::Create({.capacity_bytes = capacity, .slab_bytes = 64ULL << 20});
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << capacity;
  }
  // 1-byte slabs of 1 GiB: a billion slab records, refused before any is made.
  auto tiny = SlabAllocator::Create({.capacity_bytes = 1ULL << 30, .slab_bytes = 1});
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tiny.status().message().find("slab_bytes"), std::string::npos) << tiny.status();
}

TEST(SlabAllocatorTest, IsLastInSlabTracksUse) {
  auto a = SlabAllocator::Create({.capacity_bytes = 1ULL << 20, .slab_bytes = 1ULL << 20});
  ASSERT_OK(a);
  auto s1 = (*a)->Allocate(256 << 10);
  ASSERT_TRUE(s1.has_value());
  EXPECT_TRUE((*a)->IsLastInSlab(*s1));
  auto s2 = (*a)->Allocate(256 << 10);
  ASSERT_TRUE(s2.has_value());
  EXPECT_FALSE((*a)->IsLastInSlab(*s1));
  (*a)->Free(*s2);
  EXPECT_TRUE((*a)->IsLastInSlab(*s1));
}

}  // namespace
}  // namespace kvtier::server

namespace kvtier::server {
namespace {

TEST(SlabAllocatorEvacuationTest, CandidateIsTheEmptiestSlabWhoseSlotsFitElsewhere) {
  auto a = SlabAllocator::Create({.capacity_bytes = 3ULL << 20, .slab_bytes = 1ULL << 20});
  ASSERT_OK(a);
  std::vector<SlotRef> slots;
  for (int i = 0; i < 12; ++i) slots.push_back(*(*a)->Allocate(256 << 10));  // 3 full slabs of 4
  EXPECT_FALSE((*a)->EvacuationCandidate(256 << 10).has_value());            // nowhere to move to
  (*a)->Free(slots[0]);
  (*a)->Free(slots[1]);
  (*a)->Free(slots[4]);  // slab 0: 2 used, slab 1: 3 used, slab 2: 4 used; free elsewhere: 1
  EXPECT_FALSE((*a)->EvacuationCandidate(256 << 10).has_value());
  (*a)->Free(slots[8]);  // slab 2 now has a free slot too: slab 0's 2 blocks fit in slabs 1 and 2
  auto c = (*a)->EvacuationCandidate(256 << 10);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, slots[2].slab);
  (*a)->SetEvacuating(*c, true);
  for (int i = 0; i < 2; ++i) {
    auto s = (*a)->Allocate(256 << 10);
    ASSERT_TRUE(s.has_value());
    EXPECT_NE(s->slab, *c) << "an evacuating slab handed out a slot";
  }
  (*a)->Free(slots[2]);
  (*a)->Free(slots[3]);
  EXPECT_TRUE((*a)->IsFreeSlab(*c));
}

}  // namespace
}  // namespace kvtier::server
