#include "kvtier/server/eviction_policy.h"

#include <gtest/gtest.h>

namespace kvtier::server {
namespace {

TEST(LruPolicyTest, EvictsLeastRecentlyUsedFirst) {
  auto lru = NewLruPolicy();
  for (EntryHandle h = 0; h < 5; ++h) lru->OnInsert(h, {});
  lru->OnAccess(0, {});  // order now (MRU..LRU): 0 4 3 2 1
  EXPECT_EQ(lru->PickVictim([](EntryHandle) { return true; }), 1u);
  lru->OnErase(1);
  EXPECT_EQ(lru->PickVictim([](EntryHandle) { return true; }), 2u);
}

TEST(LruPolicyTest, SkipsIneligibleCandidates) {
  auto lru = NewLruPolicy();
  for (EntryHandle h = 0; h < 3; ++h) lru->OnInsert(h, {});
  EXPECT_EQ(lru->PickVictim([](EntryHandle h) { return h != 0; }), 1u);
  EXPECT_FALSE(lru->PickVictim([](EntryHandle) { return false; }).has_value());
}

TEST(LruPolicyTest, AccessOfUnknownHandleIsIgnoredAndReinsertMovesToFront) {
  auto lru = NewLruPolicy();
  lru->OnAccess(7, {});
  EXPECT_FALSE(lru->PickVictim([](EntryHandle) { return true; }).has_value());
  lru->OnInsert(1, {});
  lru->OnInsert(2, {});
  lru->OnInsert(1, {});
  EXPECT_EQ(lru->PickVictim([](EntryHandle) { return true; }), 2u);
}

TEST(EvictionPolicyTest, UnknownNameIsInvalidArgument) {
  auto p = NewEvictionPolicy("fifo");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(NewEvictionPolicy("lru").ok());
}

}  // namespace
}  // namespace kvtier::server
