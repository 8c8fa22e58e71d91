// BlockStore's HBM tier above host memory (and disk): promotion on a read hit, demotion HBM -> host ->
// disk, budgets, leases, and checksums on every move. The device memory here is EmulatedHbm (host
// memory behind the same interface); tests/integration/hbm_tier_cuda_test.cc runs the same store on a
// real CUDA device where one is usable.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/common/checksum.h"
#include "kvtier/server/block_store.h"
#include "testing/emulated_hbm.h"
#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

constexpr uint64_t kBlock = 4096;

BlockKey Key(uint32_t n) {
  BlockKey k;
  std::memcpy(k.fingerprint.bytes.data(), &n, sizeof(n));
  k.fingerprint.bytes[31] = 0xab;
  return k;
}

std::vector<std::byte> Payload(uint32_t seed) {
  std::vector<std::byte> b(kBlock);
  for (size_t i = 0; i < kBlock; ++i) b[i] = static_cast<std::byte>((i * 167 + seed * 7907) >> 2);
  return b;
}

class HbmTierTest : public ::testing::Test {
 protected:
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void Open(uint64_t hbm_blocks, uint64_t host_blocks, uint64_t disk_blocks = 0, bool promote = true) {
    hbm_ = std::make_shared<testing::EmulatedHbm>(hbm_blocks * kBlock);
    BlockStoreOptions o{.capacity_bytes = host_blocks * kBlock, .slab_bytes = 2 * kBlock};
    o.hbm_memory = hbm_;
    o.hbm_promote_on_hit = promote;
    if (disk_blocks > 0) {
      dir_ = std::filesystem::temp_directory_path() / ("kvtier-hbm-" + std::to_string(getpid()) + "-" +
                                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
      std::filesystem::remove_all(dir_);
      o.disk_path = dir_.string();
      o.disk_capacity_bytes = disk_blocks * kBlock;
    }
    auto s = BlockStore::Create(o);
    ASSERT_OK(s);
    store_ = std::move(s).value();
    ASSERT_TRUE(store_->has_hbm_tier());
    ASSERT_EQ(store_->hbm_capacity_bytes(), hbm_blocks * kBlock);
  }

  void Put(uint32_t n) {
    const BlockKey k = Key(n);
    auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
    ASSERT_OK(a);
    ASSERT_EQ(a->outcomes[0], AllocateOutcome::kAllocated) << n;
    auto bytes = Payload(n);
    ASSERT_OK(store_->Write(a->reservation_id, 0, 0, bytes));
    const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
    auto c = store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1));
    ASSERT_OK(c);
    ASSERT_EQ((*c)[0], CommitOutcome::kCommitted);
  }

  bool Present(uint32_t n) {
    const BlockKey k = Key(n);
    return store_->Lookup(ns_, std::span<const BlockKey>(&k, 1), absl::ZeroDuration()).present[0];
  }

  // Reads block n (empty when absent) through CopyOut and, when `keep_lease`, leaves the lease held.
  std::vector<std::byte> Read(uint32_t n, CapabilityId* keep_lease = nullptr) {
    const BlockKey k = Key(n);
    auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
    if (!lease.blocks[0].present) return {};
    std::vector<std::byte> out(lease.blocks[0].size_bytes);
    EXPECT_OK(store_->CopyOut(lease.lease_id, 0, 0, out));
    EXPECT_EQ(BlockChecksum(out.data(), out.size()), lease.blocks[0].checksum);
    if (keep_lease != nullptr) {
      *keep_lease = lease.lease_id;
    } else {
      store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
    }
    return out;
  }

  void ExpectBudgets(uint64_t hbm_blocks, uint64_t host_blocks) {
    EXPECT_LE(store_->stats().hbm_bytes.load(), hbm_blocks * kBlock);
    EXPECT_LE(store_->used_bytes(), host_blocks * kBlock);
  }

  std::filesystem::path dir_;
  std::shared_ptr<testing::EmulatedHbm> hbm_;
  std::unique_ptr<BlockStore> store_;
  NamespaceRef ns_{.id = 9, .tenant_id = TenantId("acme"), .block_bytes = kBlock};
};

TEST_F(HbmTierTest, PutsLandInHostAndAReadHitPromotesToHbm) {
  Open(2, 8);
  for (uint32_t n = 0; n < 4; ++n) Put(n);
  for (uint32_t n = 0; n < 4; ++n) EXPECT_EQ(store_->TierOfForTest(Key(n)), Tier::kHost) << n;
  EXPECT_EQ(Read(0), Payload(0));
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kHbm);
  EXPECT_EQ(store_->stats().hbm_promotions.load(), 1u);
  EXPECT_EQ(store_->stats().hbm_blocks.load(), 1u);
  EXPECT_EQ(store_->stats().stored_blocks.load(), 3u);  // host holds the other three
  EXPECT_EQ(Read(0), Payload(0));                       // served from HBM, byte for byte
  EXPECT_EQ(hbm_->copies_in.load(), 1u);                // no second promotion
}

// A reader may be reading a leased block's host slot (a UCX send from PinForSend): another read must
// not move that block up to HBM and free the slot under it.
TEST_F(HbmTierTest, AHostBlockAnotherLeaseHoldsIsNotPromoted) {
  Open(2, 8);
  Put(0);
  const BlockKey k = Key(0);
  const auto held = store_->Lookup(ns_, std::span<const BlockKey>(&k, 1), absl::Seconds(10));
  ASSERT_TRUE(held.present[0]);
  ASSERT_FALSE(held.lease_id.null());
  auto pinned = store_->PinForSend(held.lease_id, 0);
  ASSERT_OK(pinned);
  EXPECT_EQ(Read(0), Payload(0));  // a second reader, with promotion on
  EXPECT_EQ(store_->TierOfForTest(k), Tier::kHost);
  EXPECT_EQ(store_->stats().hbm_promotions.load(), 0u);
  const std::vector<std::byte> seen(pinned->data, pinned->data + pinned->size_bytes);
  EXPECT_EQ(seen, Payload(0));  // the first reader's slot still holds the block
  auto hbm = store_->AcquireHbmRead(ns_, std::span<const BlockKey>(&k, 1), absl::Seconds(1));
  ASSERT_OK(hbm);
  EXPECT_FALSE(hbm->blocks[0].has_value());
  EXPECT_EQ(store_->TierOfForTest(k), Tier::kHost);  // not moved for the device path either
  if (!hbm->lease_id.null()) store_->Release(std::span<const CapabilityId>(&hbm->lease_id, 1));
  store_->Unpin(held.lease_id, 0);
  store_->Release(std::span<const CapabilityId>(&held.lease_id, 1));
  EXPECT_EQ(Read(0), Payload(0));  // nobody else holds it now: it moves up
  EXPECT_EQ(store_->TierOfForTest(k), Tier::kHbm);
}

TEST_F(HbmTierTest, AFullHbmDemotesItsLeastRecentBlockToHost) {
  Open(2, 8);
  for (uint32_t n = 0; n < 4; ++n) Put(n);
  EXPECT_EQ(Read(0), Payload(0));
  EXPECT_EQ(Read(1), Payload(1));
  EXPECT_EQ(Read(2), Payload(2));  // HBM full: block 0 goes down
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kHost);
  EXPECT_EQ(store_->TierOfForTest(Key(1)), Tier::kHbm);
  EXPECT_EQ(store_->TierOfForTest(Key(2)), Tier::kHbm);
  EXPECT_EQ(store_->stats().hbm_demotions.load(), 1u);
  EXPECT_EQ(Read(0), Payload(0));  // and comes back up, intact
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kHbm);
  ExpectBudgets(2, 8);
  for (uint32_t n = 0; n < 4; ++n) EXPECT_TRUE(Present(n)) << n;
}

TEST_F(HbmTierTest, DemotionCascadesHbmToHostToDisk) {
  Open(2, 2, 16);
  for (uint32_t n = 0; n < 6; ++n) Put(n);  // host 4,5; disk 0..3
  EXPECT_EQ(store_->stats().disk_blocks.load(), 4u);
  // Reading disk blocks brings them up through host into HBM; each arrival pushes older blocks down.
  for (uint32_t n = 0; n < 6; ++n) EXPECT_EQ(Read(n), Payload(n)) << n;
  EXPECT_EQ(store_->TierOfForTest(Key(4)), Tier::kHbm);
  EXPECT_EQ(store_->TierOfForTest(Key(5)), Tier::kHbm);
  EXPECT_EQ(store_->stats().hbm_blocks.load(), 2u);
  // A block read from disk passes through host memory on its way up, so host may be left with a free
  // slot; nothing is lost: every block is in exactly one tier.
  EXPECT_LE(store_->stats().stored_blocks.load(), 2u);
  EXPECT_EQ(
      store_->stats().hbm_blocks.load() + store_->stats().stored_blocks.load() + store_->stats().disk_blocks.load(),
      6u);
  EXPECT_GT(store_->stats().hbm_demotions.load(), 0u);
  EXPECT_GT(store_->stats().demotions.load(), 4u);
  for (uint32_t n = 0; n < 6; ++n) {
    EXPECT_TRUE(Present(n)) << n;
    EXPECT_EQ(Read(n), Payload(n)) << n;
  }
  ExpectBudgets(2, 2);
  EXPECT_LE(store_->stats().disk_bytes.load(), 16 * kBlock);
}

TEST_F(HbmTierTest, CorruptBytesInHbmAreNeverServed) {
  Open(2, 8);
  Put(0);
  Put(1);
  EXPECT_EQ(Read(0), Payload(0));
  ASSERT_EQ(store_->TierOfForTest(Key(0)), Tier::kHbm);
  ASSERT_OK(store_->CorruptBlockForTest(Key(0), 17));
  EXPECT_TRUE(Read(0).empty());  // caught when copied out for the lease: a miss, not bad bytes
  EXPECT_EQ(store_->stats().checksum_failures.load(), 1u);
  EXPECT_FALSE(Present(0));  // and dropped
  EXPECT_EQ(store_->stats().hbm_blocks.load(), 0u);
  EXPECT_EQ(Read(1), Payload(1));
}

TEST_F(HbmTierTest, VerifyFindsACorruptHbmBlock) {
  Open(4, 8);
  for (uint32_t n = 0; n < 3; ++n) Put(n);
  for (uint32_t n = 0; n < 3; ++n) Read(n);
  ASSERT_OK(store_->CorruptBlockForTest(Key(1), 0));
  const BlockStore::VerifyResult v = store_->Verify();
  EXPECT_EQ(v.checked, 3u);
  ASSERT_EQ(v.corrupt, 1u);
  EXPECT_EQ(v.corrupt_keys[0], Key(1));
  EXPECT_FALSE(Present(1));
  EXPECT_TRUE(Present(0));
}

TEST_F(HbmTierTest, CorruptBytesAreCaughtWhenDemotedToHost) {
  Open(1, 8);
  Put(0);
  Put(1);
  EXPECT_EQ(Read(0), Payload(0));
  ASSERT_OK(store_->CorruptBlockForTest(Key(0), 100));
  EXPECT_EQ(Read(1), Payload(1));  // 0 is demoted: its bytes fail the check on arrival in host memory
  EXPECT_FALSE(Present(0));
  EXPECT_EQ(store_->stats().checksum_failures.load(), 1u);
  EXPECT_EQ(store_->stats().hbm_demotions.load(), 0u);
}

TEST_F(HbmTierTest, AFailedDeviceCopyLeavesTheBlockInHost) {
  Open(2, 8);
  Put(0);
  hbm_->fail_copies = true;
  EXPECT_EQ(Read(0), Payload(0));  // served from host memory all the same
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kHost);
  EXPECT_EQ(store_->stats().hbm_errors.load(), 1u);
  hbm_->fail_copies = false;
  EXPECT_EQ(Read(0), Payload(0));
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kHbm);
}

TEST_F(HbmTierTest, LeasedHbmBlocksAreNeverEvicted) {
  Open(2, 8);
  for (uint32_t n = 0; n < 3; ++n) Put(n);
  CapabilityId l0, l1;
  EXPECT_EQ(Read(0, &l0), Payload(0));
  EXPECT_EQ(Read(1, &l1), Payload(1));
  EXPECT_EQ(Read(2), Payload(2));  // HBM full of leased blocks: 2 stays in host and is served from there
  EXPECT_EQ(store_->TierOfForTest(Key(2)), Tier::kHost);
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kHbm);
  EXPECT_EQ(store_->TierOfForTest(Key(1)), Tier::kHbm);
  ExpectBudgets(2, 8);
  const CapabilityId leases[] = {l0, l1};
  EXPECT_EQ(store_->Release(leases), 2u);
  EXPECT_EQ(Read(2), Payload(2));
  EXPECT_EQ(store_->TierOfForTest(Key(2)), Tier::kHbm);
}

TEST_F(HbmTierTest, PromotionCanBeTurnedOff) {
  Open(2, 8, 0, /*promote=*/false);
  Put(0);
  EXPECT_EQ(Read(0), Payload(0));
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kHost);
  EXPECT_EQ(store_->stats().hbm_promotions.load(), 0u);
}

TEST_F(HbmTierTest, AdminListsAndEvictsHbmBlocks) {
  Open(4, 8);
  for (uint32_t n = 0; n < 3; ++n) Put(n);
  Read(0);
  Read(1);
  BlockStore::BlockFilter hbm_only{.tier = Tier::kHbm};
  auto [page, next] = store_->ListBlocks(hbm_only, 0, 10);
  EXPECT_EQ(page.size(), 2u);
  EXPECT_EQ(next, 0u);
  for (const auto& b : page) EXPECT_EQ(b.tier, Tier::kHbm);
  ASSERT_TRUE(store_->Inspect(Key(0)).has_value());
  EXPECT_EQ(store_->Inspect(Key(0))->tier, Tier::kHbm);
  EXPECT_EQ(store_->Evict(hbm_only), (std::pair<uint64_t, uint64_t>{2, 0}));
  EXPECT_EQ(store_->stats().hbm_blocks.load(), 0u);
  EXPECT_EQ(store_->stats().hbm_bytes.load(), 0u);
  EXPECT_FALSE(Present(0));
  EXPECT_TRUE(Present(2));
  EXPECT_STREQ(TierName(Tier::kHbm), "hbm");
}

}  // namespace
}  // namespace kvtier::server
