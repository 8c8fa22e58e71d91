// BlockStore's administration: listing, inspect, evict by filter, verify (scrub) and drain.
#include <cstring>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/common/checksum.h"
#include "kvtier/server/block_store.h"
#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

constexpr uint64_t kBlock = 1024;

BlockKey Key(uint32_t n) {
  BlockKey k;
  std::memcpy(k.fingerprint.bytes.data(), &n, sizeof(n));
  k.fingerprint.bytes[30] = 0x11;
  return k;
}

class BlockStoreAdminTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = BlockStore::Create({.capacity_bytes = 64 * kBlock, .slab_bytes = 16 * kBlock, .clock = &clock_});
    ASSERT_OK(s);
    store_ = std::move(s).value();
  }

  void Put(const NamespaceRef& ns, uint32_t n, uint32_t depth = 0) {
    const BlockKey k = Key(n);
    const uint32_t d = depth;
    auto a = store_->Allocate(ns, std::span<const BlockKey>(&k, 1), std::span<const uint32_t>(&d, 1));
    ASSERT_OK(a);
    ASSERT_EQ(a->outcomes[0], AllocateOutcome::kAllocated);
    std::vector<std::byte> bytes(ns.block_bytes, std::byte{static_cast<uint8_t>(n)});
    ASSERT_OK(store_->Write(a->reservation_id, 0, 0, bytes));
    const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
    ASSERT_OK(store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1)));
  }

  FakeClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceRef a_{.id = 1, .tenant_id = TenantId("acme"), .block_bytes = kBlock};
  NamespaceRef b_{.id = 2, .tenant_id = TenantId("globex"), .block_bytes = kBlock};
};

TEST_F(BlockStoreAdminTest, ListPagesThroughEveryBlockOnceWithFilters) {
  for (uint32_t n = 0; n < 10; ++n) Put(n < 6 ? a_ : b_, n);
  std::set<uint32_t> seen;
  uint64_t cursor = 0;
  int pages = 0;
  do {
    auto [page, next] = store_->ListBlocks({}, cursor, 3);
    EXPECT_LE(page.size(), 3u);
    for (const auto& b : page) {
      uint32_t n;
      std::memcpy(&n, b.key.fingerprint.bytes.data(), 4);
      EXPECT_TRUE(seen.insert(n).second) << "block " << n << " listed twice";
    }
    cursor = next;
    ++pages;
  } while (cursor != 0 && pages < 10);
  EXPECT_EQ(seen.size(), 10u);
  auto [only_b, next] = store_->ListBlocks({.tenant_id = TenantId("globex")}, 0, 100);
  EXPECT_EQ(only_b.size(), 4u);
  EXPECT_EQ(next, 0u);
  for (const auto& b : only_b) EXPECT_EQ(b.namespace_id, 2u);
}

TEST_F(BlockStoreAdminTest, InspectReportsTierSizeChecksumDepthAgeAndLeases) {
  Put(a_, 7, /*depth=*/3);
  clock_.Advance(absl::Seconds(5));
  const BlockKey k = Key(7);
  auto lease = store_->AcquireRead(a_, std::span<const BlockKey>(&k, 1), absl::Seconds(30));
  auto info = store_->Inspect(k);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->tier, Tier::kHost);
  EXPECT_EQ(info->size_bytes, kBlock);
  EXPECT_EQ(info->depth, 3u);
  EXPECT_EQ(info->access_count, 2u);  // the put and the read
  EXPECT_EQ(info->lease_count, 1u);
  EXPECT_EQ(clock_.Now() - info->inserted, absl::Seconds(5));
  EXPECT_EQ(info->last_access, clock_.Now());
  EXPECT_FALSE(store_->Inspect(Key(8)).has_value());
  store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
}

TEST_F(BlockStoreAdminTest, EvictByTenantSkipsLeasedBlocks) {
  for (uint32_t n = 0; n < 6; ++n) Put(n % 2 ? a_ : b_, n);
  const BlockKey k = Key(1);  // tenant a
  auto lease = store_->AcquireRead(a_, std::span<const BlockKey>(&k, 1), absl::Seconds(30));
  auto [evicted, leased] = store_->Evict({.tenant_id = TenantId("acme")});
  EXPECT_EQ(evicted, 2u);
  EXPECT_EQ(leased, 1u);
  EXPECT_TRUE(store_->Inspect(Key(1)).has_value());
  EXPECT_FALSE(store_->Inspect(Key(3)).has_value());
  EXPECT_TRUE(store_->Inspect(Key(0)).has_value());  // tenant b untouched
  EXPECT_FALSE(store_->EvictKey(Key(1)));            // still leased
  store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
  EXPECT_TRUE(store_->EvictKey(Key(1)));
}

TEST_F(BlockStoreAdminTest, VerifyFindsAndDropsACorruptBlock) {
  for (uint32_t n = 0; n < 20; ++n) Put(a_, n);
  ASSERT_OK(store_->CorruptBlockForTest(Key(13), 3));
  uint64_t last_done = 0;
  auto r = store_->Verify([&](uint64_t done, uint64_t total) {
    EXPECT_LE(done, total);
    EXPECT_GE(done, last_done);
    last_done = done;
  });
  EXPECT_EQ(r.checked, 20u);
  EXPECT_EQ(r.corrupt, 1u);
  ASSERT_EQ(r.corrupt_keys.size(), 1u);
  EXPECT_EQ(r.corrupt_keys[0], Key(13));
  EXPECT_FALSE(store_->Inspect(Key(13)).has_value());
  EXPECT_EQ(last_done, 20u);
  EXPECT_EQ(store_->Verify().corrupt, 0u);
}

TEST_F(BlockStoreAdminTest, DrainingRefusesNewBlocksButServesAndRefreshesOldOnes) {
  Put(a_, 1);
  store_->SetDraining(true);
  const BlockKey fresh = Key(2), old = Key(1);
  auto a = store_->Allocate(a_, std::span<const BlockKey>(&fresh, 1));
  ASSERT_OK(a);
  EXPECT_EQ(a->outcomes[0], AllocateOutcome::kNoSpace);
  auto again = store_->Allocate(a_, std::span<const BlockKey>(&old, 1));
  ASSERT_OK(again);
  EXPECT_EQ(again->outcomes[0], AllocateOutcome::kAlreadyPresent);
  EXPECT_TRUE(store_->AcquireRead(a_, std::span<const BlockKey>(&old, 1), absl::ZeroDuration()).blocks[0].present);
  store_->SetDraining(false);
  auto resumed = store_->Allocate(a_, std::span<const BlockKey>(&fresh, 1));
  ASSERT_OK(resumed);
  EXPECT_EQ(resumed->outcomes[0], AllocateOutcome::kAllocated);
}

}  // namespace
}  // namespace kvtier::server
