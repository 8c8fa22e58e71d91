#include <gtest/gtest.h>

#include <cmath>

#include "kvtier/server/eviction_policy.h"

namespace kvtier::server {
namespace {

const auto kAny = [](EntryHandle) { return true; };

// An access at `seconds` on the policy's clock.
BlockAccess At(double seconds, uint32_t depth = 0, uint64_t key_hash = 0) {
  return {.depth = depth, .now_ns = static_cast<int64_t>(std::llround(seconds * 1e9)), .key_hash = key_hash};
}

std::unique_ptr<EvictionPolicy> PrefixLrfu() {
  auto p = NewEvictionPolicy("prefix_lrfu");
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(p).value();
}

TEST(PrefixLrfuPolicyTest, AChainGoesTailFirst) {
  auto p = PrefixLrfu();
  for (EntryHandle h = 0; h < 4; ++h) p->OnInsert(h, At(0, h));
  EXPECT_EQ(p->PickVictim(kAny), 3u);
  p->OnErase(3);
  EXPECT_EQ(p->PickVictim(kAny), 2u);
  // A later prompt reuses the head of the chain: its tail (block 2) is still the first victim, and
  // the reused blocks now outrank it.
  p->OnAccess(0, At(1, 0));
  p->OnAccess(1, At(1, 1));
  EXPECT_EQ(p->PickVictim(kAny), 2u);
}

// The half-life starts at 60 s (no reuse gaps measured yet).
TEST(PrefixLrfuPolicyTest, AFrequentBlockOutlivesANewerOneOff) {
  auto p = PrefixLrfu();
  p->OnInsert(0, At(0));
  p->OnAccess(0, At(1));
  p->OnAccess(0, At(2));  // value about 3
  p->OnInsert(1, At(3));  // value 1
  EXPECT_EQ(p->PickVictim(kAny), 1u);
}

TEST(PrefixLrfuPolicyTest, AnOldFrequentBlockLosesToAFreshOne) {
  auto p = PrefixLrfu();
  p->OnInsert(0, At(0));
  p->OnAccess(0, At(1));
  p->OnAccess(0, At(2));
  p->OnInsert(1, At(1000));  // 3 x 2^(-998 / 60) << 1
  EXPECT_EQ(p->PickVictim(kAny), 0u);
}

TEST(PrefixLrfuPolicyTest, ValueSaturatesSoAHotBlockDoesNotLingerForever) {
  auto p = PrefixLrfu();
  p->OnInsert(0, At(0));
  for (int i = 0; i < 99; ++i) p->OnAccess(0, At(0));  // value 100, but it counts as 4
  p->OnInsert(1, At(150));  // 2.5 half-lives later: 4 x 2^-2.5 = 0.71 < 1 (100 x 2^-2.5 would be 17.7)
  EXPECT_EQ(p->PickVictim(kAny), 0u);
}

TEST(PrefixLrfuPolicyTest, AReturningBlockResumesItsHistory) {
  auto p = PrefixLrfu();
  constexpr uint64_t kA = 0xa1, kB = 0xb2, kC = 0xc3, kD = 0xd4;
  p->OnInsert(0, At(0, 0, kA));
  p->OnAccess(0, At(1, 0, kA));
  p->OnAccess(0, At(2, 0, kA));
  p->OnErase(0);                 // evicted with a value of about 3
  p->OnInsert(5, At(3, 0, kA));  // back, in another handle: about 3.9
  p->OnInsert(0, At(3, 0, kB));  // a new block in the old handle: 1
  p->OnInsert(1, At(3, 0, kC));
  p->OnAccess(1, At(3, 0, kC));  // 2
  EXPECT_EQ(p->PickVictim(kAny), 0u);
  p->OnErase(0);
  EXPECT_EQ(p->PickVictim(kAny), 1u);
  p->OnErase(1);
  p->OnInsert(1, At(3, 0, kD));  // handle 1 again, another new block: 1, not 2
  EXPECT_EQ(p->PickVictim(kAny), 1u);
}

TEST(PrefixLrfuPolicyTest, AReusedHandleWithoutKeyHashStartsAfresh) {
  auto p = PrefixLrfu();
  p->OnInsert(0, At(0));
  for (int i = 0; i < 4; ++i) p->OnAccess(0, At(0));
  p->OnInsert(1, At(0));
  p->OnAccess(1, At(0));
  p->OnErase(0);
  p->OnInsert(0, At(0));  // value 1: nothing to recognise it by
  EXPECT_EQ(p->PickVictim(kAny), 0u);
  p->OnAccess(9, At(0));  // unknown handles are ignored
  p->OnErase(9);
  EXPECT_EQ(p->PickVictim(kAny), 0u);
}

TEST(PrefixLrfuPolicyTest, SkipsIneligibleCandidates) {
  auto p = PrefixLrfu();
  EXPECT_FALSE(p->PickVictim(kAny).has_value());
  for (EntryHandle h = 0; h < 3; ++h) p->OnInsert(h, At(h));
  EXPECT_EQ(p->PickVictim(kAny), 0u);
  EXPECT_EQ(p->PickVictim([](EntryHandle h) { return h != 0; }), 1u);
  EXPECT_FALSE(p->PickVictim([](EntryHandle) { return false; }).has_value());
}

// 256 blocks, each touched every `gap_s` seconds, 40 times. With `churn`, every round also brings 256
// one-off blocks that are evicted at once, so blocks reside for about one gap, less than the 3.5-gap
// half-life the policy derives; without it nothing is evicted and blocks reside for the whole run.
// Then block P, touched 3 times in 0.2 s, against block Q touched once 20 s later: P has the higher
// value unless the half-life is a few seconds or less.
EntryHandle VictimAfterTraining(double gap_s, bool churn) {
  auto p = PrefixLrfu();
  constexpr EntryHandle kBlocks = 256, kP = 1000, kQ = 1001, kOneOff = 2000;
  double now = 0;
  uint64_t one_off_key = 1'000'000;
  for (int round = 0; round < 40; ++round) {
    for (EntryHandle h = 0; h < kBlocks; ++h) {
      now = round * gap_s + h * (gap_s / kBlocks);
      const BlockAccess a = At(now, 0, /*key_hash=*/h + 1);
      if (round == 0) {
        p->OnInsert(h, a);
      } else {
        p->OnAccess(h, a);
      }
      if (churn) {
        p->OnInsert(kOneOff, At(now, 0, ++one_off_key));
        p->OnErase(kOneOff);
      }
    }
  }
  p->OnInsert(kP, At(now, 0, 5000));
  p->OnAccess(kP, At(now + 0.1, 0, 5000));
  p->OnAccess(kP, At(now + 0.2, 0, 5000));
  p->OnInsert(kQ, At(now + 20, 0, 5001));
  return *p->PickVictim([](EntryHandle h) { return h == kP || h == kQ; });
}

TEST(PrefixLrfuPolicyTest, HalfLifeFollowsTheWorkloadsReuseGaps) {
  EXPECT_EQ(VictimAfterTraining(/*gap_s=*/1, /*churn=*/true), 1000u);    // tool-loop pace: P is stale
  EXPECT_EQ(VictimAfterTraining(/*gap_s=*/100, /*churn=*/true), 1001u);  // chat pace: P is the hotter block
}

TEST(PrefixLrfuPolicyTest, FadesToRecencyWhenBlocksOutstayTheirReuseGap) {
  // Nothing is evicted, so recency alone already keeps every reused block: the older P goes first.
  EXPECT_EQ(VictimAfterTraining(/*gap_s=*/100, /*churn=*/false), 1000u);
}

}  // namespace
}  // namespace kvtier::server
