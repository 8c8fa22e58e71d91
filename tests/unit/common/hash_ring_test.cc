#include "kvtier/common/hash_ring.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kvtier/common/fingerprint.h"

namespace kvtier {
namespace {

std::vector<std::string> Members(int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back("gpu-node-" + std::to_string(i));
  return ids;
}

HashRing MakeRing(const std::vector<std::string>& ids, uint32_t virtual_nodes = 128) {
  absl::StatusOr<HashRing> ring = HashRing::Create(ids, virtual_nodes);
  EXPECT_TRUE(ring.ok()) << ring.status();
  return *std::move(ring);
}

// Deterministic pseudo-random fingerprints (a fixed seed, so a failure reproduces).
std::vector<Fingerprint> RandomFingerprints(size_t n, uint64_t seed = 42) {
  std::mt19937_64 rng(seed);
  std::vector<Fingerprint> fps(n);
  for (Fingerprint& fp : fps) {
    for (size_t i = 0; i < fp.bytes.size(); i += 8) {
      const uint64_t r = rng();
      for (size_t b = 0; b < 8; ++b) fp.bytes[i + b] = static_cast<uint8_t>(r >> (8 * b));
    }
  }
  return fps;
}

Fingerprint AtPosition(uint64_t position) {
  Fingerprint fp;
  for (int i = 0; i < 8; ++i) fp.bytes[i] = static_cast<uint8_t>(position >> (8 * i));
  return fp;
}

double MaxOverMean(const std::vector<double>& values) {
  const double mean = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  return *std::max_element(values.begin(), values.end()) / mean;
}

TEST(HashRingTest, CreateRejectsBadMemberLists) {
  EXPECT_EQ(HashRing::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HashRing::Create({"a", ""}).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<HashRing> dup = HashRing::Create({"a", "b", "a"});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("\"a\""), std::string::npos) << dup.status();
  EXPECT_EQ(HashRing::Create({"a"}, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HashRingTest, KeepsMembersInTheGivenOrder) {
  const HashRing ring = MakeRing({"c", "a", "b"}, 16);
  EXPECT_EQ(ring.node_ids(), (std::vector<std::string>{"c", "a", "b"}));
  EXPECT_EQ(ring.virtual_nodes(), 16u);
}

TEST(HashRingTest, SharesSumToOneAndAreBalanced) {
  for (int n : {3, 8}) {
    const std::vector<double> shares = MakeRing(Members(n)).Shares();
    ASSERT_EQ(shares.size(), static_cast<size_t>(n));
    EXPECT_NEAR(std::accumulate(shares.begin(), shares.end(), 0.0), 1.0, 1e-12);
    for (double s : shares) EXPECT_GT(s, 0.0);
    EXPECT_LT(MaxOverMean(shares), 1.25) << n << " members";
  }
}

TEST(HashRingTest, PlacedBlocksAreBalancedAndMatchTheShares) {
  const std::vector<Fingerprint> fps = RandomFingerprints(100000);
  for (int n : {3, 8}) {
    const HashRing ring = MakeRing(Members(n));
    std::vector<double> counts(n, 0.0);
    for (const Fingerprint& fp : fps) counts[ring.Primary(fp)] += 1;
    EXPECT_LT(MaxOverMean(counts), 1.25) << n << " members";
    const std::vector<double> shares = ring.Shares();
    for (int m = 0; m < n; ++m) {
      // Binomial standard deviation of a 1/3 share of 100k blocks is about 0.0015.
      EXPECT_NEAR(counts[m] / fps.size(), shares[m], 0.01) << "member " << m << " of " << n;
    }
  }
}

TEST(HashRingTest, OneMemberOwnsEverything) {
  const HashRing ring = MakeRing({"only"}, 1);
  EXPECT_EQ(ring.Shares(), std::vector<double>{1.0});
  for (const Fingerprint& fp : RandomFingerprints(100)) {
    EXPECT_EQ(ring.Primary(fp), 0u);
    EXPECT_EQ(ring.Owners(fp, 3), std::vector<uint32_t>{0});
  }
  EXPECT_EQ(ring.Primary(AtPosition(0)), 0u);
  EXPECT_EQ(ring.Primary(AtPosition(UINT64_MAX)), 0u);
}

TEST(HashRingTest, AddingAFourthMemberMovesAQuarterOfTheBlocksAllToIt) {
  const std::vector<std::string> three = Members(3);
  std::vector<std::string> four = three;
  four.push_back("gpu-node-3");
  const HashRing before = MakeRing(three);
  const HashRing after = MakeRing(four);
  const std::vector<Fingerprint> fps = RandomFingerprints(100000, 7);
  size_t moved = 0;
  for (const Fingerprint& fp : fps) {
    const std::string& old_owner = before.node_ids()[before.Primary(fp)];
    const std::string& new_owner = after.node_ids()[after.Primary(fp)];
    if (old_owner != new_owner) {
      ++moved;
      EXPECT_EQ(new_owner, "gpu-node-3") << "a block moved between two old members";
    }
  }
  const double fraction = static_cast<double>(moved) / fps.size();
  EXPECT_GT(fraction, 0.18);
  EXPECT_LT(fraction, 0.32);
}

TEST(HashRingTest, AddingAMemberChangesReplicaSetsOnlyByInsertingIt) {
  // With R = 2 of 4 members, the new member is in about R / 4 = 1/2 of the replica sets. Every other
  // replica set keeps its owners in order; one the new member joins keeps the old owners in order, less
  // the last (pushed out), with the new member inserted.
  constexpr uint32_t kR = 2;
  std::vector<std::string> four = Members(3);
  four.push_back("gpu-node-3");
  const HashRing before = MakeRing(Members(3));
  const HashRing after = MakeRing(four);
  const std::vector<Fingerprint> fps = RandomFingerprints(50000, 11);
  size_t changed = 0;
  for (const Fingerprint& fp : fps) {
    std::vector<std::string> old_set, new_set;
    for (uint32_t m : before.Owners(fp, kR)) old_set.push_back(before.node_ids()[m]);
    for (uint32_t m : after.Owners(fp, kR)) new_set.push_back(after.node_ids()[m]);
    ASSERT_EQ(new_set.size(), kR);
    auto joined = std::find(new_set.begin(), new_set.end(), "gpu-node-3");
    if (joined == new_set.end()) {
      EXPECT_EQ(new_set, old_set) << "a replica set changed without the new member";
      continue;
    }
    ++changed;
    new_set.erase(joined);
    old_set.pop_back();
    EXPECT_EQ(new_set, old_set) << "old owners were reordered or replaced by another old member";
  }
  const double fraction = static_cast<double>(changed) / fps.size();
  EXPECT_GT(fraction, 0.40);
  EXPECT_LT(fraction, 0.60);
}

TEST(HashRingTest, ReplicaSetsAreStableAcrossRingsAndDistinct) {
  // Two rings built from the same ids (in another order) give every block the same ordered owners.
  std::vector<std::string> ids = Members(5);
  const HashRing a = MakeRing(ids, 1024);
  std::reverse(ids.begin(), ids.end());
  const HashRing b = MakeRing(ids, 1024);
  for (const Fingerprint& fp : RandomFingerprints(5000, 12)) {
    std::vector<std::string> owners_a, owners_b;
    for (uint32_t m : a.Owners(fp, 3)) owners_a.push_back(a.node_ids()[m]);
    for (uint32_t m : b.Owners(fp, 3)) owners_b.push_back(b.node_ids()[m]);
    EXPECT_EQ(owners_a, owners_b);
    EXPECT_EQ(std::set<std::string>(owners_a.begin(), owners_a.end()).size(), 3u);
  }
}

TEST(HashRingTest, RemovingAMemberMovesOnlyItsBlocks) {
  const HashRing before = MakeRing(Members(8));
  std::vector<std::string> seven = Members(8);
  seven.erase(seven.begin() + 5);
  const HashRing after = MakeRing(seven);
  for (const Fingerprint& fp : RandomFingerprints(20000, 9)) {
    const std::string& old_owner = before.node_ids()[before.Primary(fp)];
    if (old_owner != "gpu-node-5") {
      EXPECT_EQ(after.node_ids()[after.Primary(fp)], old_owner);
    }
  }
}

TEST(HashRingTest, OwnersAreDistinctAndCappedAtTheMemberCount) {
  const HashRing ring = MakeRing(Members(5));
  for (const Fingerprint& fp : RandomFingerprints(2000, 3)) {
    EXPECT_TRUE(ring.Owners(fp, 0).empty());
    const std::vector<uint32_t> all = ring.Owners(fp, 100);
    ASSERT_EQ(all.size(), 5u);
    EXPECT_EQ(std::set<uint32_t>(all.begin(), all.end()).size(), 5u);
    for (uint32_t r = 1; r <= 5; ++r) {
      // Owners for R replicas are the first R of the full list; the first is the primary.
      const std::vector<uint32_t> owners = ring.Owners(fp, r);
      EXPECT_EQ(owners, std::vector<uint32_t>(all.begin(), all.begin() + r));
    }
    EXPECT_EQ(all[0], ring.Primary(fp));
    EXPECT_EQ(ring.Owners(fp), std::vector<uint32_t>{ring.Primary(fp)});
  }
}

TEST(HashRingTest, ManyReplicasOnALargeRingAreDistinct) {
  // Beyond 8 replicas Owners() switches from a linear search to a bitmap.
  const HashRing ring = MakeRing(Members(40), 32);
  for (const Fingerprint& fp : RandomFingerprints(200, 5)) {
    const std::vector<uint32_t> all = ring.Owners(fp, 40);
    for (uint32_t r : {8u, 9u, 40u}) {
      const std::vector<uint32_t> owners = ring.Owners(fp, r);
      ASSERT_EQ(owners.size(), r);
      EXPECT_EQ(std::set<uint32_t>(owners.begin(), owners.end()).size(), r);
      EXPECT_EQ(owners, std::vector<uint32_t>(all.begin(), all.begin() + r));
    }
  }
}

TEST(HashRingTest, OwnershipDoesNotDependOnMemberOrder) {
  const std::vector<std::string> ids = Members(6);
  std::vector<std::string> shuffled = {ids[3], ids[0], ids[5], ids[1], ids[4], ids[2]};
  const HashRing a = MakeRing(ids);
  const HashRing b = MakeRing(shuffled);
  for (const Fingerprint& fp : RandomFingerprints(10000, 11)) {
    std::vector<std::string> owners_a, owners_b;
    for (uint32_t m : a.Owners(fp, 3)) owners_a.push_back(a.node_ids()[m]);
    for (uint32_t m : b.Owners(fp, 3)) owners_b.push_back(b.node_ids()[m]);
    ASSERT_EQ(owners_a, owners_b);
  }
  std::vector<double> shares_b_by_id(6);
  for (size_t m = 0; m < shuffled.size(); ++m) {
    shares_b_by_id[std::find(ids.begin(), ids.end(), shuffled[m]) - ids.begin()] = b.Shares()[m];
  }
  const std::vector<double> shares_a = a.Shares();
  for (size_t m = 0; m < ids.size(); ++m) EXPECT_DOUBLE_EQ(shares_a[m], shares_b_by_id[m]);
}

TEST(HashRingTest, TheSameRingTwiceIsTheSameRing) {
  const HashRing a = MakeRing(Members(4));
  const HashRing b = MakeRing(Members(4));
  EXPECT_EQ(a.Shares(), b.Shares());
  for (const Fingerprint& fp : RandomFingerprints(1000, 13)) EXPECT_EQ(a.Owners(fp, 2), b.Owners(fp, 2));
}

TEST(HashRingTest, PositionsWrapAroundTheEndOfTheRing) {
  const HashRing ring = MakeRing(Members(3));
  // Past the last point, the block belongs to the member of the first point (the one at or after 0).
  EXPECT_EQ(ring.Primary(AtPosition(UINT64_MAX)), ring.Primary(AtPosition(0)));
  EXPECT_EQ(ring.Owners(AtPosition(UINT64_MAX), 3), ring.Owners(AtPosition(0), 3));
}

TEST(HashRingTest, MoreVirtualNodesBalanceBetter) {
  // Balance improves roughly as 1/sqrt(V); with one virtual node it is usually poor.
  const double coarse = MaxOverMean(MakeRing(Members(8), 4).Shares());
  const double fine = MaxOverMean(MakeRing(Members(8), 512).Shares());
  EXPECT_LT(fine, coarse);
  EXPECT_LT(fine, 1.15);
}

}  // namespace
}  // namespace kvtier
