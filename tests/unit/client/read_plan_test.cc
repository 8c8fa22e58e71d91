// Read planning (client/read_plan.h): owner grouping and batching, replica order and hot-block
// rotation, attempt deadlines on a fake clock (plain absl::Time values), and which blocks go on to
// their next owner. Pure functions: no members, no sockets.
#include "client/read_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/common/hash_ring.h"
#include "testing/status_matchers.h"

namespace kvtier::client {
namespace {

Fingerprint Fp(uint8_t a, uint8_t b = 0) {
  Fingerprint fp;
  fp.bytes[0] = a;
  fp.bytes[1] = b;
  fp.bytes[7] = static_cast<uint8_t>(a * 37 + b);  // spread the ring positions
  return fp;
}

HashRing Ring(size_t n) {
  std::vector<std::string> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back("node-" + std::to_string(i));
  auto ring = HashRing::Create(ids, /*virtual_nodes=*/64);
  EXPECT_TRUE(ring.ok()) << ring.status();
  return *std::move(ring);
}

std::vector<Fingerprint> Fps(size_t n) {
  std::vector<Fingerprint> fps;
  for (size_t i = 0; i < n; ++i) fps.push_back(Fp(static_cast<uint8_t>(i), static_cast<uint8_t>(i * 3)));
  return fps;
}

TEST(GroupByOwnerTest, GroupsInOrderOfFirstBlockAndKeepsBlockOrder) {
  const std::vector<uint32_t> owner = {2, 0, 2, 1, 0};
  const std::vector<uint32_t> idx = {0, 1, 2, 3, 4};
  const OwnerGroups groups = GroupByOwner(
      idx, [&](uint32_t i) { return owner[i]; }, /*batch=*/16);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0], (std::pair<uint32_t, std::vector<uint32_t>>{2, {0, 2}}));
  EXPECT_EQ(groups[1], (std::pair<uint32_t, std::vector<uint32_t>>{0, {1, 4}}));
  EXPECT_EQ(groups[2], (std::pair<uint32_t, std::vector<uint32_t>>{1, {3}}));
}

TEST(GroupByOwnerTest, SplitsAGroupIntoAdjacentBatchesOfAtMostBatch) {
  const std::vector<uint32_t> idx = {0, 1, 2, 3, 4, 5, 6};
  const OwnerGroups groups = GroupByOwner(
      idx, [](uint32_t i) { return i % 2; }, /*batch=*/2);
  // Owner 0 has 0,2,4,6 (two batches), owner 1 has 1,3,5 (two batches); an owner's batches are adjacent.
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].first, 0u);
  EXPECT_EQ(groups[0].second, (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(groups[1].first, 0u);
  EXPECT_EQ(groups[1].second, (std::vector<uint32_t>{4, 6}));
  EXPECT_EQ(groups[2].first, 1u);
  EXPECT_EQ(groups[2].second, (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(groups[3].first, 1u);
  EXPECT_EQ(groups[3].second, (std::vector<uint32_t>{5}));
}

TEST(GroupByOwnerTest, OnlyTheGivenIndicesAreGrouped) {
  const std::vector<uint32_t> idx = {3, 1};
  const OwnerGroups groups = GroupByOwner(
      idx, [](uint32_t) { return 7u; }, /*batch=*/8);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].second, (std::vector<uint32_t>{3, 1}));
}

TEST(PlanReadsTest, ColdBlocksAskThePrimaryThenTheReplicasClockwise) {
  const HashRing ring = Ring(4);
  const std::vector<Fingerprint> fps = Fps(20);
  const ReadPlan plan = PlanReads(ring, fps, /*replication_factor=*/3, /*hot_read_replicas=*/2, /*hot=*/{},
                                  /*spread=*/5);
  for (size_t i = 0; i < fps.size(); ++i) {
    EXPECT_EQ(plan.owners[i], ring.Owners(fps[i], 3)) << i;
    EXPECT_EQ(plan.owners[i][0], ring.Primary(fps[i]));
    EXPECT_FALSE(plan.retry_miss[i]);
  }
}

TEST(PlanReadsTest, AHotBlockRotatesOverAllItsOwnersAcrossCalls) {
  const HashRing ring = Ring(5);
  const std::vector<Fingerprint> fps = {Fp(9, 1)};
  const std::vector<uint32_t> all = ring.Owners(fps[0], 3 + 2);
  ASSERT_EQ(all.size(), 5u);
  std::vector<uint32_t> first;
  for (uint64_t spread = 0; spread < 5; ++spread) {
    const ReadPlan plan = PlanReads(ring, fps, 3, 2, /*hot=*/{true}, spread);
    ASSERT_EQ(plan.owners[0].size(), 5u);
    // Owner number `spread` first; the others keep their ring order after it.
    EXPECT_EQ(plan.owners[0][0], all[spread]);
    std::vector<uint32_t> rest;
    for (size_t o = 0; o < all.size(); ++o) {
      if (o != spread) rest.push_back(all[o]);
    }
    EXPECT_EQ(std::vector<uint32_t>(plan.owners[0].begin() + 1, plan.owners[0].end()), rest);
    // A read replica may not have the block yet: its miss goes on to the primary.
    EXPECT_EQ(plan.retry_miss[0], spread != 0);
    first.push_back(plan.owners[0][0]);
  }
  std::sort(first.begin(), first.end());
  std::vector<uint32_t> sorted_all = all;
  std::sort(sorted_all.begin(), sorted_all.end());
  EXPECT_EQ(first, sorted_all);  // five calls, five different first owners
}

TEST(PlanReadsTest, OnlyHotBlocksGetReadReplicas) {
  const HashRing ring = Ring(6);
  const std::vector<Fingerprint> fps = Fps(2);
  const ReadPlan plan = PlanReads(ring, fps, 2, 3, /*hot=*/{false, true}, /*spread=*/0);
  EXPECT_EQ(plan.owners[0].size(), 2u);
  EXPECT_EQ(plan.owners[1].size(), 5u);
  EXPECT_EQ(plan.owners[1][0], ring.Primary(fps[1]));  // spread 0: the primary first
  EXPECT_FALSE(plan.retry_miss[1]);
}

TEST(PlanReadsTest, OwnersAreCappedByTheRingSize) {
  const HashRing ring = Ring(2);
  const std::vector<Fingerprint> fps = Fps(3);
  const ReadPlan plan = PlanReads(ring, fps, 3, 4, /*hot=*/{true, true, true}, /*spread=*/7);
  for (const auto& o : plan.owners) EXPECT_EQ(o.size(), 2u);
}

TEST(ReadPlanTest, OwnersLeftIsTheMostAmongTheBatchAndAtLeastOne) {
  ReadPlan plan;
  plan.owners = {{0, 1, 2}, {1}, {2, 0}};
  plan.retry_miss = {false, false, false};
  const std::vector<uint32_t> all = {0, 1, 2};
  EXPECT_EQ(plan.OwnersLeft(all, 0), 3u);
  EXPECT_EQ(plan.OwnersLeft(all, 1), 2u);
  const std::vector<uint32_t> two = {0, 2};
  EXPECT_EQ(plan.OwnersLeft(two, 2), 1u);
}

TEST(GroupByAttemptTest, AttemptNGroupsByEachBlocksNthOwner) {
  ReadPlan plan;
  plan.owners = {{0, 1}, {1, 2}, {0, 2}};
  plan.retry_miss = {false, false, false};
  const std::vector<uint32_t> pending = {0, 1, 2};
  const OwnerGroups first = GroupByAttempt(plan, pending, /*attempt=*/0, /*batch=*/8);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0], (std::pair<uint32_t, std::vector<uint32_t>>{0, {0, 2}}));
  EXPECT_EQ(first[1], (std::pair<uint32_t, std::vector<uint32_t>>{1, {1}}));
  const OwnerGroups second = GroupByAttempt(plan, pending, /*attempt=*/1, /*batch=*/8);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0], (std::pair<uint32_t, std::vector<uint32_t>>{1, {0}}));
  EXPECT_EQ(second[1], (std::pair<uint32_t, std::vector<uint32_t>>{2, {1, 2}}));
}

TEST(DeadlineTest, TheCallKeepsAReserveOfTwoPercentBetweenTwoAndTwentyMs) {
  const absl::Time start = absl::UnixEpoch() + absl::Hours(1);  // a fake clock: plain times
  EXPECT_EQ(CallDeadline(start, absl::Seconds(1)), start + absl::Milliseconds(980));
  EXPECT_EQ(CallDeadline(start, absl::Seconds(10)), start + absl::Seconds(10) - absl::Milliseconds(20));
  EXPECT_EQ(CallDeadline(start, absl::Milliseconds(50)), start + absl::Milliseconds(48));
  // Never more than half of a tiny rpc_timeout.
  EXPECT_EQ(CallDeadline(start, absl::Milliseconds(2)), start + absl::Milliseconds(1));
}

TEST(DeadlineTest, EachAttemptGetsAnEvenShareOfWhatIsLeft) {
  const absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  const absl::Time call_deadline = now + absl::Milliseconds(900);
  EXPECT_EQ(AttemptDeadline(call_deadline, 3, now), now + absl::Milliseconds(300));
  EXPECT_EQ(AttemptDeadline(call_deadline, 2, now), now + absl::Milliseconds(450));
  // The last owner gets all of it; so does one asked after the deadline.
  EXPECT_EQ(AttemptDeadline(call_deadline, 1, now), call_deadline);
  EXPECT_EQ(AttemptDeadline(call_deadline, 3, call_deadline + absl::Milliseconds(1)), call_deadline);
  // A silent primary that used its share leaves the rest to the next two.
  const absl::Time later = now + absl::Milliseconds(300);
  EXPECT_EQ(AttemptDeadline(call_deadline, 2, later), later + absl::Milliseconds(300));
}

TEST(RetryTest, AGetGoesOnToTheNextOwnerUnlessAHitOrAnAnsweredMiss) {
  EXPECT_FALSE(RetryGet(GetResult::kHit, /*retry_miss=*/false, 0));
  EXPECT_FALSE(RetryGet(GetResult::kMiss, false, 0));
  EXPECT_TRUE(RetryGet(GetResult::kMissFromError, false, 0));
  EXPECT_TRUE(RetryGet(GetResult::kChecksumMismatch, false, 1));
  // A hot block's first owner (a read replica) may not have it yet: its miss is asked of the primary once.
  EXPECT_TRUE(RetryGet(GetResult::kMiss, /*retry_miss=*/true, 0));
  EXPECT_FALSE(RetryGet(GetResult::kMiss, true, 1));
  EXPECT_FALSE(RetryGet(GetResult::kHit, true, 0));
}

TEST(RetryTest, ALookupGoesOnWhenUnansweredOrAHotBlocksFirstMiss) {
  EXPECT_TRUE(RetryLookup(/*answered=*/false, false, false, 0));
  EXPECT_TRUE(RetryLookup(false, false, false, 2));
  EXPECT_FALSE(RetryLookup(true, true, true, 0));
  EXPECT_FALSE(RetryLookup(true, false, false, 0));
  EXPECT_TRUE(RetryLookup(true, false, /*retry_miss=*/true, 0));
  EXPECT_FALSE(RetryLookup(true, false, true, 1));
}

TEST(RetryTest, AnAnsweredMissStandsWhenTheNextOwnerFails) {
  EXPECT_EQ(AfterRetry(GetResult::kMissFromError, GetResult::kMiss), GetResult::kMiss);
  EXPECT_EQ(AfterRetry(GetResult::kMissFromError, GetResult::kMissFromError), GetResult::kMissFromError);
  EXPECT_EQ(AfterRetry(GetResult::kHit, GetResult::kMiss), GetResult::kHit);
  EXPECT_EQ(AfterRetry(GetResult::kChecksumMismatch, GetResult::kMiss), GetResult::kChecksumMismatch);
}

TEST(ReplicationFactorTest, TheFirstMatchingOverrideWins) {
  ClientOptions o;
  o.replication_factor = 2;
  o.replication_overrides = {{.tenant = "a", .model = "m1", .replication_factor = 3},
                             {.tenant = "a", .model = "", .replication_factor = 4},
                             {.tenant = "a", .model = "", .replication_factor = 5}};
  EXPECT_EQ(ReplicationFactor(o, Namespace{.tenant = "a", .model = "m1"}), 3u);
  EXPECT_EQ(ReplicationFactor(o, Namespace{.tenant = "a", .model = "m2"}), 4u);
  EXPECT_EQ(ReplicationFactor(o, Namespace{.tenant = "b", .model = "m1"}), 2u);
}

TEST(ReplicationFactorTest, OnlyShallowBlocksMayBecomeHotAndOnlyWithReadReplicas) {
  ClientOptions o;
  o.hot_depth = 4;
  o.hot_read_replicas = 0;
  EXPECT_FALSE(ShallowEnough(o, 0));
  o.hot_read_replicas = 1;
  EXPECT_TRUE(ShallowEnough(o, 3));
  EXPECT_FALSE(ShallowEnough(o, 4));
}

}  // namespace
}  // namespace kvtier::client
