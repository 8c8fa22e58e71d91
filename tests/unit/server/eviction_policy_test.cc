#include "kvtier/server/eviction_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

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

TEST(LruPolicyTest, ReusedHandleIsTrackedAfresh) {
  auto lru = NewLruPolicy();
  for (EntryHandle h = 0; h < 3; ++h) lru->OnInsert(h, {});
  lru->OnErase(0);
  lru->OnErase(0);       // erasing twice is harmless
  lru->OnInsert(0, {});  // handle 0 now names a new, most recent block
  EXPECT_EQ(lru->PickVictim([](EntryHandle) { return true; }), 1u);
}

TEST(EvictionPolicyTest, UnknownNameIsInvalidArgumentListingTheKnownOnes) {
  auto p = NewEvictionPolicy("fifo");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("lru, weighted, prefix_lrfu"), std::string::npos) << p.status();
  EXPECT_TRUE(NewEvictionPolicy("lru").ok());
}

TEST(EvictionPolicyTest, EveryNameBuildsThePolicyOfThatName) {
  const std::vector<std::string> names = EvictionPolicyNames();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "lru");  // the default
  for (const std::string& name : names) {
    auto p = NewEvictionPolicy(name, {});
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_EQ((*p)->name(), name);
  }
}

TEST(EvictionPolicyOptionsTest, DefaultsAreValidAndMatchTheOperatorsKnob) {
  const EvictionPolicyOptions o;
  EXPECT_TRUE(o.Validate().ok());
  EXPECT_DOUBLE_EQ(o.frequency_weight, 0.3);  // "frequency, recency" = 0.3, 0.7
  EXPECT_DOUBLE_EQ(o.recency_weight, 0.7);
  EXPECT_TRUE((EvictionPolicyOptions{.frequency_weight = 0, .recency_weight = 1}).Validate().ok());
  EXPECT_TRUE((EvictionPolicyOptions{.frequency_weight = 5, .recency_weight = 0}).Validate().ok());
}

TEST(EvictionPolicyOptionsTest, BadWeightsAreInvalidArgumentNamingTheField) {
  struct Case {
    EvictionPolicyOptions options;
    const char* field;
  };
  const Case cases[] = {
      {{.frequency_weight = -0.1}, "frequency_weight"},
      {{.recency_weight = -1}, "recency_weight"},
      {{.frequency_weight = std::nan("")}, "frequency_weight"},
      {{.recency_weight = std::numeric_limits<double>::infinity()}, "recency_weight"},
      {{.frequency_weight = 0, .recency_weight = 0}, "both 0"},
  };
  for (const Case& c : cases) {
    const absl::Status s = c.options.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s;
    auto p = NewEvictionPolicy("weighted", c.options);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
  }
}

}  // namespace
}  // namespace kvtier::server
