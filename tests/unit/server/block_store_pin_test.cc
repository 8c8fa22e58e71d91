// The zero-copy transfer pins of BlockStore (PinForSend/Unpin, PinForReceive/FinishReceive): what the
// UCX data plane relies on so that an expired lease or reservation never lets a transfer touch a slot
// that another block reuses.
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/common/checksum.h"
#include "kvtier/server/block_store.h"
#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

constexpr uint64_t kBlock = 4096;

BlockKey Key(uint32_t n) {
  BlockKey k;
  std::memcpy(k.fingerprint.bytes.data(), &n, sizeof(n));
  k.fingerprint.bytes[31] = 0xcd;
  return k;
}

std::vector<std::byte> Payload(uint32_t seed) {
  std::vector<std::byte> b(kBlock);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((i * 31 + seed * 7) & 0xff);
  return b;
}

class BlockStorePinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Room for exactly two blocks, so a freed slot is reused by the next allocation.
    auto s = BlockStore::Create({.capacity_bytes = 2 * kBlock,
                                 .slab_bytes = 2 * kBlock,
                                 .default_lease_ttl = absl::Seconds(1),
                                 .max_lease_ttl = absl::Seconds(6),
                                 .reservation_ttl = absl::Seconds(3),
                                 .clock = &clock_});
    ASSERT_OK(s);
    store_ = std::move(s).value();
  }

  // Allocate + PinForReceive + copy + FinishReceive + Commit, the way the UCX receive path does it.
  CommitOutcome PutByReceive(uint32_t n, uint32_t seed) {
    const BlockKey k = Key(n);
    auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
    EXPECT_OK(a);
    if (!a.ok() || a->outcomes[0] != AllocateOutcome::kAllocated) return CommitOutcome::kNotAllocated;
    auto pinned = store_->PinForReceive(a->reservation_id, 0);
    EXPECT_OK(pinned);
    const auto bytes = Payload(seed);
    std::memcpy(pinned->data, bytes.data(), bytes.size());
    store_->FinishReceive(a->reservation_id, 0, bytes.size(), true);
    const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
    auto c = store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1));
    EXPECT_OK(c);
    return c.ok() ? (*c)[0] : CommitOutcome::kNotAllocated;
  }

  FakeClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceRef ns_{.id = 1, .tenant_id = 2, .block_bytes = kBlock};
};

TEST_F(BlockStorePinTest, ReceivedBlockCommitsAndReadsBack) {
  ASSERT_EQ(PutByReceive(1, 5), CommitOutcome::kCommitted);
  const BlockKey k = Key(1);
  auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
  ASSERT_TRUE(lease.blocks[0].present);
  auto pinned = store_->PinForSend(lease.lease_id, 0);
  ASSERT_OK(pinned);
  EXPECT_EQ(pinned->size_bytes, kBlock);
  EXPECT_EQ(std::memcmp(pinned->data, Payload(5).data(), kBlock), 0);
  const std::span<std::byte> region = store_->HostRegion();
  EXPECT_GE(pinned->data, region.data());
  EXPECT_LE(pinned->data + kBlock, region.data() + region.size());
  store_->Unpin(lease.lease_id, 0);
  EXPECT_EQ(store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1)), 1u);
}

TEST_F(BlockStorePinTest, LeaseExpiringDuringASendKeepsTheSlotUntilUnpin) {
  ASSERT_EQ(PutByReceive(1, 5), CommitOutcome::kCommitted);
  ASSERT_EQ(PutByReceive(2, 6), CommitOutcome::kCommitted);  // the store is full now
  const BlockKey k = Key(1);
  auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
  auto pinned = store_->PinForSend(lease.lease_id, 0);
  ASSERT_OK(pinned);
  clock_.Advance(absl::Seconds(2));  // the lease expires mid-send
  store_->ExpireNow();
  // Block 1 is still leased (pinned): a new put must evict block 2, never reuse block 1's slot.
  ASSERT_EQ(PutByReceive(3, 7), CommitOutcome::kCommitted);
  EXPECT_EQ(std::memcmp(pinned->data, Payload(5).data(), kBlock), 0) << "the pinned slot was reused";
  EXPECT_FALSE(store_->PinForSend(lease.lease_id, 0).ok());  // no new transfer on an expired lease
  store_->Unpin(lease.lease_id, 0);                          // ends the lease
  EXPECT_EQ(store_->stats().active_leases.load(), 0u);
  EXPECT_EQ(PutByReceive(4, 8), CommitOutcome::kCommitted);  // block 1 is evictable again
}

TEST_F(BlockStorePinTest, ReservationExpiringDuringAReceiveIsFreedAtFinish) {
  const BlockKey k = Key(1);
  auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(a);
  auto pinned = store_->PinForReceive(a->reservation_id, 0);
  ASSERT_OK(pinned);
  clock_.Advance(absl::Seconds(4));
  store_->ExpireNow();
  EXPECT_EQ(store_->stats().active_reservations.load(), 1u);  // kept while the receive is in flight
  store_->FinishReceive(a->reservation_id, 0, kBlock, true);
  EXPECT_EQ(store_->stats().active_reservations.load(), 0u);
  EXPECT_EQ(store_->used_bytes(), 0u);
  const uint64_t sum = 0;
  EXPECT_FALSE(store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1)).ok());
}

// A transport bounds each transfer by the pin's expires_in (UcxServer cancels or closes it then), so
// that a dead peer's pin ends with its lease or reservation, not transfer_timeout later.
TEST_F(BlockStorePinTest, APinSaysHowLongItsLeaseOrReservationHasLeft) {
  const BlockKey k = Key(1);
  auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(a);
  clock_.Advance(absl::Milliseconds(1200));
  auto received = store_->PinForReceive(a->reservation_id, 0);
  ASSERT_OK(received);
  EXPECT_EQ(received->expires_in, absl::Seconds(3) - absl::Milliseconds(1200));  // reservation_ttl 3 s
  const auto bytes = Payload(4);
  std::memcpy(received->data, bytes.data(), bytes.size());
  store_->FinishReceive(a->reservation_id, 0, bytes.size(), true);
  const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
  ASSERT_OK(store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1)));

  auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::Seconds(5));
  ASSERT_TRUE(lease.blocks[0].present);
  clock_.Advance(absl::Seconds(2));
  auto sent = store_->PinForSend(lease.lease_id, 0);
  ASSERT_OK(sent);
  EXPECT_EQ(sent->expires_in, absl::Seconds(3));
  store_->Unpin(lease.lease_id, 0);
}

TEST_F(BlockStorePinTest, FailedOrShortReceiveLeavesTheBlockIncomplete) {
  const BlockKey keys[2] = {Key(1), Key(2)};
  auto a = store_->Allocate(ns_, keys);
  ASSERT_OK(a);
  ASSERT_OK(store_->PinForReceive(a->reservation_id, 0));
  ASSERT_OK(store_->PinForReceive(a->reservation_id, 1));
  store_->FinishReceive(a->reservation_id, 0, kBlock, false);     // transport error
  store_->FinishReceive(a->reservation_id, 1, kBlock - 1, true);  // short message
  const uint64_t sums[2] = {0, 0};
  auto c = store_->Commit(a->reservation_id, sums);
  ASSERT_OK(c);
  EXPECT_EQ((*c)[0], CommitOutcome::kIncomplete);
  EXPECT_EQ((*c)[1], CommitOutcome::kIncomplete);
  EXPECT_EQ(store_->used_bytes(), 0u);
}

TEST_F(BlockStorePinTest, ReceiveExcludesWritesAndCommitWaitsForIt) {
  const BlockKey k = Key(1);
  auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(a);
  ASSERT_OK(store_->PinForReceive(a->reservation_id, 0));
  EXPECT_EQ(store_->PinForReceive(a->reservation_id, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  const auto bytes = Payload(1);
  EXPECT_EQ(store_->Write(a->reservation_id, 0, 0, bytes).code(), absl::StatusCode::kFailedPrecondition);
  const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
  EXPECT_EQ(store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);  // a receive is in flight
  store_->FinishReceive(a->reservation_id, 0, 0, false);
  EXPECT_EQ(store_->PinForReceive(a->reservation_id, 7).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->PinForReceive(CapabilityId::Random(), 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->PinForSend(CapabilityId::Random(), 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(BlockStorePinTest, ChecksumComputedAtReceiveIsWhatCommitChecks) {
  const BlockKey keys[2] = {Key(1), Key(2)};
  auto a = store_->Allocate(ns_, keys);
  ASSERT_OK(a);
  const auto b0 = Payload(3), b1 = Payload(4);
  for (uint32_t i = 0; i < 2; ++i) {
    auto pinned = store_->PinForReceive(a->reservation_id, i);
    ASSERT_OK(pinned);
    std::memcpy(pinned->data, (i == 0 ? b0 : b1).data(), kBlock);
  }
  const uint64_t s0 = BlockChecksum(b0.data(), kBlock), s1 = BlockChecksum(b1.data(), kBlock);
  store_->FinishReceive(a->reservation_id, 0, kBlock, true, s0);
  store_->FinishReceive(a->reservation_id, 1, kBlock, true, s0);  // as if block 1 had landed as b0's bytes
  const uint64_t sums[2] = {s0, s1};
  auto c = store_->Commit(a->reservation_id, sums);
  ASSERT_OK(c);
  EXPECT_EQ((*c)[0], CommitOutcome::kCommitted);
  EXPECT_EQ((*c)[1], CommitOutcome::kChecksumMismatch);
  EXPECT_EQ(store_->stats().checksum_failures.load(), 1u);
}

TEST_F(BlockStorePinTest, ReleasedLeaseEndsAtTheLastUnpin) {
  ASSERT_EQ(PutByReceive(1, 5), CommitOutcome::kCommitted);
  const BlockKey k = Key(1);
  auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
  ASSERT_OK(store_->PinForSend(lease.lease_id, 0));
  ASSERT_OK(store_->PinForSend(lease.lease_id, 0));
  EXPECT_EQ(store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1)), 1u);
  EXPECT_EQ(store_->stats().active_leases.load(), 1u);
  store_->Unpin(lease.lease_id, 0);
  EXPECT_EQ(store_->stats().active_leases.load(), 1u);
  store_->Unpin(lease.lease_id, 0);
  EXPECT_EQ(store_->stats().active_leases.load(), 0u);
}

}  // namespace
}  // namespace kvtier::server
