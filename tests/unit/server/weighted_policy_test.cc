#include <gtest/gtest.h>

#include "kvtier/server/eviction_policy.h"

namespace kvtier::server {
namespace {

const auto kAny = [](EntryHandle) { return true; };

BlockAccess Depth(uint32_t depth) { return {.depth = depth}; }

std::unique_ptr<EvictionPolicy> Weighted(double frequency, double recency) {
  auto p = NewEvictionPolicy("weighted", {.frequency_weight = frequency, .recency_weight = recency});
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(p).value();
}

TEST(WeightedPolicyTest, RecencyAloneEvictsTheLeastRecentPromptFirst) {
  auto p = Weighted(0, 1);
  p->OnInsert(0, Depth(0));  // prompt A: blocks 0, 1 (start 1)
  p->OnInsert(1, Depth(1));
  p->OnInsert(2, Depth(0));  // prompt B: block 2 (start 3)
  p->OnAccess(0, Depth(0));  // prompt C reuses block 0 (start 4)
  EXPECT_EQ(p->PickVictim(kAny), 1u);
  p->OnErase(1);
  EXPECT_EQ(p->PickVictim(kAny), 2u);
  p->OnErase(2);
  EXPECT_EQ(p->PickVictim(kAny), 0u);
}

TEST(WeightedPolicyTest, BlocksOfOnePromptGoTailFirst) {
  auto p = Weighted(0.3, 0.7);
  for (EntryHandle h = 0; h < 3; ++h) p->OnInsert(h, Depth(h));
  EXPECT_EQ(p->PickVictim(kAny), 2u);
  p->OnErase(2);
  EXPECT_EQ(p->PickVictim(kAny), 1u);
}

TEST(WeightedPolicyTest, FrequencyAloneEvictsTheLeastUsedFirst) {
  auto p = Weighted(1, 0);
  p->OnInsert(0, {});
  p->OnAccess(0, {});
  p->OnAccess(0, {});  // 3 touches
  p->OnInsert(1, {});  // 1
  p->OnInsert(2, {});
  p->OnAccess(2, {});  // 2
  EXPECT_EQ(p->PickVictim(kAny), 1u);
  p->OnErase(1);
  EXPECT_EQ(p->PickVictim(kAny), 2u);
}

// Entry 0 has 4 touches (start 4); entries 1 and 2 one each (starts 5 and 6). Over the resident set:
// recency 0, 0.5, 1; frequency log2(5)/log2(5) = 1, log2(2)/log2(5) = 0.43, 0.43.
TEST(WeightedPolicyTest, WeightsTradeRecencyAgainstFrequency) {
  auto build = [](double frequency, double recency) {
    auto p = Weighted(frequency, recency);
    p->OnInsert(0, {});
    for (int i = 0; i < 3; ++i) p->OnAccess(0, {});
    p->OnInsert(1, {});
    p->OnInsert(2, {});
    return p;
  };
  // Default (0.3, 0.7): scores 0.30, 0.48, 0.83: the old, frequent entry goes.
  EXPECT_EQ(build(0.3, 0.7)->PickVictim(kAny), 0u);
  // (0.7, 0.3): scores 0.70, 0.45, 0.60: the frequent entry stays, the older one-off entry goes.
  EXPECT_EQ(build(0.7, 0.3)->PickVictim(kAny), 1u);
}

TEST(WeightedPolicyTest, ReusedHandleStartsAfresh) {
  auto p = Weighted(1, 0);
  p->OnInsert(0, {});
  for (int i = 0; i < 5; ++i) p->OnAccess(0, {});
  p->OnInsert(1, {});
  p->OnAccess(1, {});
  p->OnErase(0);
  p->OnInsert(0, {});  // a different block in the same handle: 1 touch, not 7
  EXPECT_EQ(p->PickVictim(kAny), 0u);
  p->OnAccess(7, {});  // unknown handles are ignored
  p->OnErase(7);
  EXPECT_EQ(p->PickVictim(kAny), 0u);
}

TEST(WeightedPolicyTest, SkipsIneligibleCandidates) {
  auto p = Weighted(0.3, 0.7);
  EXPECT_FALSE(p->PickVictim(kAny).has_value());
  for (EntryHandle h = 0; h < 3; ++h) p->OnInsert(h, {});
  EXPECT_EQ(p->PickVictim(kAny), 0u);
  EXPECT_EQ(p->PickVictim([](EntryHandle h) { return h != 0; }), 1u);
  EXPECT_FALSE(p->PickVictim([](EntryHandle) { return false; }).has_value());
}

TEST(WeightedPolicyTest, ManyCountsStayOrdered) {
  auto p = Weighted(1, 0);
  // Counts 1..40 span exact classes and octave classes; the least used goes first.
  for (EntryHandle h = 0; h < 40; ++h) {
    p->OnInsert(h, {});
    for (EntryHandle i = 0; i < 40 - h - 1; ++i) p->OnAccess(h, {});
  }
  EXPECT_EQ(p->PickVictim(kAny), 39u);
  p->OnErase(39);
  EXPECT_EQ(p->PickVictim(kAny), 38u);
}

}  // namespace
}  // namespace kvtier::server
