#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvtier/server/eviction_policy.h"

namespace kvtier::server {
namespace {

const auto kAny = [](EntryHandle) { return true; };

BlockAccess At(double seconds, uint32_t depth, uint64_t key_hash) {
  return {.depth = depth, .now_ns = static_cast<int64_t>(std::llround(seconds * 1e9)), .key_hash = key_hash};
}

std::unique_ptr<EvictionPolicy> Make(const std::string& name) {
  auto p = NewEvictionPolicy(name);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(p).value();
}

// One prompt: its blocks' keys, first to last, and its time.
struct Request {
  std::vector<uint64_t> keys;
  double t_s = 0;
};

// Replays `requests` through a cache of `capacity` blocks run by `name`, as BlockStore and policy_sim
// do: a request's hit is its leading run of present blocks; then its blocks are touched first to last
// (present: OnAccess; absent: evict while full, then OnInsert; handles reused last freed first).
// Returns the hit blocks.
uint64_t PrefixHits(const std::string& name, const std::vector<Request>& requests, size_t capacity) {
  auto policy = Make(name);
  absl::flat_hash_map<uint64_t, EntryHandle> handle_of;
  std::vector<uint64_t> key_of;
  std::vector<EntryHandle> free_handles;
  uint64_t hits = 0;
  for (const Request& r : requests) {
    size_t run = 0;
    while (run < r.keys.size() && handle_of.contains(r.keys[run])) ++run;
    hits += run;
    for (uint32_t d = 0; d < r.keys.size(); ++d) {
      const BlockAccess a = At(r.t_s, d, r.keys[d]);
      if (auto it = handle_of.find(r.keys[d]); it != handle_of.end()) {
        policy->OnAccess(it->second, a);
        continue;
      }
      while (handle_of.size() >= capacity) {
        const std::optional<EntryHandle> victim = policy->PickVictim(kAny);
        EXPECT_TRUE(victim.has_value());
        if (!victim.has_value()) return hits;
        policy->OnErase(*victim);
        handle_of.erase(key_of[*victim]);
        free_handles.push_back(*victim);
      }
      EntryHandle h;
      if (free_handles.empty()) {
        h = static_cast<EntryHandle>(key_of.size());
        key_of.push_back(0);
      } else {
        h = free_handles.back();
        free_handles.pop_back();
      }
      key_of[h] = r.keys[d];
      handle_of[r.keys[d]] = h;
      policy->OnInsert(h, a);
    }
  }
  return hits;
}

TEST(AdaptivePolicyTest, IsRegisteredBesideTheOthers) {
  const std::vector<std::string> names = EvictionPolicyNames();
  EXPECT_EQ(names.front(), "lru");
  EXPECT_NE(std::find(names.begin(), names.end(), "adaptive"), names.end());
  EXPECT_STREQ(Make("adaptive")->name(), "adaptive");
}

TEST(AdaptivePolicyTest, AChainGoesTailFirst) {
  auto p = Make("adaptive");
  for (EntryHandle h = 0; h < 4; ++h) p->OnInsert(h, At(0, h, 100 + h));
  EXPECT_EQ(p->PickVictim(kAny), 3u);
  p->OnErase(3);
  EXPECT_EQ(p->PickVictim(kAny), 2u);
  // A later prompt reuses the head of the chain: the tail left behind (block 2) still goes first, so
  // no block is evicted while a descendant of it stays.
  p->OnAccess(0, At(1, 0, 100));
  p->OnAccess(1, At(1, 1, 101));
  EXPECT_EQ(p->PickVictim(kAny), 2u);
  p->OnErase(2);
  EXPECT_EQ(p->PickVictim(kAny), 1u);
}

TEST(AdaptivePolicyTest, SkipsIneligibleCandidatesAndForgetsErasedOnes) {
  auto p = Make("adaptive");
  EXPECT_FALSE(p->PickVictim(kAny).has_value());
  for (EntryHandle h = 0; h < 3; ++h) p->OnInsert(h, At(h, 0, 10 + h));
  EXPECT_EQ(p->PickVictim(kAny), 0u);
  EXPECT_EQ(p->PickVictim([](EntryHandle h) { return h != 0; }), 1u);
  EXPECT_FALSE(p->PickVictim([](EntryHandle) { return false; }).has_value());
  p->OnErase(0);
  p->OnErase(0);                 // twice: ignored
  p->OnAccess(0, At(5, 0, 10));  // an erased handle: ignored
  EXPECT_EQ(p->PickVictim(kAny), 1u);
}

// Frequency pollution: 1,600 blocks are each used 10 times, 100 s apart, then never again, and the
// traffic moves to a working set of 1,280 blocks used in a loop every 12.8 s, which fits the
// 1,600-block cache. Recency keeps the loop after its first pass; frequency (with a half-life learnt
// from the first phase's gaps) keeps the dead set until its value decays below the loop's.
std::vector<Request> PollutionThenLoop() {
  std::vector<Request> requests;
  double t = 0;
  uint64_t one_off = 5'000'000;
  for (int round = 0; round < 10; ++round) {
    for (uint64_t k = 0; k < 1600; ++k) {
      requests.push_back({.keys = {1'000'000 + k}, .t_s = t += 0.02});
      for (int i = 0; i < 2; ++i) requests.push_back({.keys = {one_off++}, .t_s = t += 0.02});
    }
  }
  for (int pass = 0; pass < 30; ++pass) {
    for (uint64_t k = 0; k < 1280; ++k) requests.push_back({.keys = {2'000'000 + k}, .t_s = t += 0.01});
  }
  return requests;
}

TEST(AdaptivePolicyTest, FollowsRecencyWhenFrequencyKeepsDeadBlocks) {
  const std::vector<Request> requests = PollutionThenLoop();
  const uint64_t lru = PrefixHits("lru", requests, 1600);
  const uint64_t lrfu = PrefixHits("prefix_lrfu", requests, 1600);
  const uint64_t adaptive = PrefixHits("adaptive", requests, 1600);
  // The workload does what it is meant to: frequency alone loses to recency here.
  ASSERT_LT(static_cast<double>(lrfu), 0.9 * static_cast<double>(lru)) << "lru " << lru << " prefix_lrfu " << lrfu;
  EXPECT_GE(static_cast<double>(adaptive), 0.95 * static_cast<double>(lru))
      << "lru " << lru << " prefix_lrfu " << lrfu << " adaptive " << adaptive;
}

// A shared prefix of 16 blocks starts every 4th prompt; the prompts between are 32 blocks never seen
// again. The 64-block cache cannot hold the three one-off prompts between two uses of the prefix, so
// recency loses the prefix every time; frequency keeps it.
std::vector<Request> RepeatedPrefixAmongOneOffs() {
  std::vector<Request> requests;
  uint64_t next_key = 1;
  for (int i = 0; i < 4000; ++i) {
    Request r{.t_s = i * 2.0};
    if (i % 4 == 0) {
      for (uint64_t k = 0; k < 16; ++k) r.keys.push_back(9'000'000 + k);
    }
    while (r.keys.size() < 32) r.keys.push_back(next_key++);
    requests.push_back(std::move(r));
  }
  return requests;
}

TEST(AdaptivePolicyTest, FollowsFrequencyWhereAPrefixRepeats) {
  const std::vector<Request> requests = RepeatedPrefixAmongOneOffs();
  const uint64_t lru = PrefixHits("lru", requests, 64);
  const uint64_t lrfu = PrefixHits("prefix_lrfu", requests, 64);
  const uint64_t adaptive = PrefixHits("adaptive", requests, 64);
  // 1,000 uses of the prefix, 16 blocks each.
  EXPECT_LT(lru, 1000u) << "recency should lose the prefix";
  EXPECT_GT(adaptive, 10 * 16 * 9u) << "lru " << lru << " prefix_lrfu " << lrfu << " adaptive " << adaptive;
  EXPECT_GE(static_cast<double>(adaptive), 0.95 * static_cast<double>(lrfu));
}

// 2,000 blocks pass through the tier, each leaving as this policy's victim (an upper tier) or taken
// away without being named (promoted: a lower tier). Then block A is used 3 times in 2 s and block B
// once, 1 s later: frequency evicts B, recency A. Returns the victim between the two.
EntryHandle VictimAfterBlocksLeave(bool as_victims) {
  auto p = Make("adaptive");
  constexpr EntryHandle kFiller = 10, kA = 0, kB = 1;
  for (uint64_t i = 0; i < 2000; ++i) {
    p->OnInsert(kFiller, At(static_cast<double>(i) * 0.001, 0, 1'000'000 + i));
    if (as_victims) {
      EXPECT_EQ(p->PickVictim([](EntryHandle h) { return h == kFiller; }), kFiller);
    }
    p->OnErase(kFiller);
  }
  p->OnInsert(kA, At(10, 0, 1));
  p->OnAccess(kA, At(11, 0, 1));
  p->OnAccess(kA, At(12, 0, 1));
  p->OnInsert(kB, At(13, 0, 2));
  return *p->PickVictim(kAny);
}

TEST(AdaptivePolicyTest, AnUpperTierStartsWithFrequency) { EXPECT_EQ(VictimAfterBlocksLeave(true), 1u); }

TEST(AdaptivePolicyTest, ALowerTierFollowsRecency) { EXPECT_EQ(VictimAfterBlocksLeave(false), 0u); }

// The same replay twice gives the same hits (the policy is deterministic).
TEST(AdaptivePolicyTest, IsDeterministic) {
  const std::vector<Request> requests = PollutionThenLoop();
  EXPECT_EQ(PrefixHits("adaptive", requests, 1000), PrefixHits("adaptive", requests, 1000));
}

}  // namespace
}  // namespace kvtier::server
