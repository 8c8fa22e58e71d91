#include "kvtier/server/block_store.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <latch>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"
#include "kvtier/common/checksum.h"
#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

constexpr uint64_t kBlock = 4096;

BlockKey Key(uint32_t n, uint32_t shard = 0) {
  BlockKey k;
  std::memcpy(k.fingerprint.bytes.data(), &n, sizeof(n));
  k.fingerprint.bytes[31] = 0xab;
  k.shard = shard;
  return k;
}

std::vector<std::byte> Payload(uint32_t seed, uint64_t size = kBlock) {
  std::vector<std::byte> b(size);
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (auto& c : b) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<std::byte>(x);
  }
  return b;
}

class BlockStoreTest : public ::testing::Test {
 protected:
  void MakeStore(uint64_t capacity_blocks, absl::Duration lease = absl::Seconds(10),
                 absl::Duration reservation = absl::Seconds(30)) {
    auto s = BlockStore::Create({.capacity_bytes = capacity_blocks * kBlock,
                                 .slab_bytes = 16 * kBlock,
                                 .default_lease_ttl = lease,
                                 .max_lease_ttl = lease * 6,
                                 .reservation_ttl = reservation,
                                 .clock = &clock_});
    ASSERT_OK(s);
    store_ = std::move(s).value();
  }

  // Allocates, writes and commits one block; returns its allocate outcome.
  AllocateOutcome Put(uint32_t n, const NamespaceRef& ns, uint32_t seed) {
    const BlockKey k = Key(n);
    auto a = store_->Allocate(ns, std::span<const BlockKey>(&k, 1));
    EXPECT_OK(a);
    if (a->outcomes[0] != AllocateOutcome::kAllocated) return a->outcomes[0];
    auto bytes = Payload(seed, ns.block_bytes);
    EXPECT_OK(store_->Write(a->reservation_id, 0, 0, bytes));
    const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
    auto c = store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1));
    EXPECT_OK(c);
    EXPECT_EQ((*c)[0], CommitOutcome::kCommitted);
    return AllocateOutcome::kAllocated;
  }

  bool Present(uint32_t n, const NamespaceRef& ns) {
    const BlockKey k = Key(n);
    return store_->Lookup(ns, std::span<const BlockKey>(&k, 1), absl::ZeroDuration()).present[0];
  }

  std::vector<std::byte> ReadBack(uint32_t n, const NamespaceRef& ns) {
    const BlockKey k = Key(n);
    auto lease = store_->AcquireRead(ns, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
    if (!lease.blocks[0].present) return {};
    std::vector<std::byte> out(lease.blocks[0].size_bytes);
    EXPECT_OK(store_->CopyOut(lease.lease_id, 0, 0, out));
    EXPECT_EQ(BlockChecksum(out.data(), out.size()), lease.blocks[0].checksum);
    store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
    return out;
  }

  FakeClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceRef ns_{.id = 11, .tenant_id = 1, .block_bytes = kBlock};
};

TEST_F(BlockStoreTest, PutThenLookupAndReadReturnTheSameBytes) {
  MakeStore(8);
  EXPECT_FALSE(Present(1, ns_));
  EXPECT_EQ(Put(1, ns_, 7), AllocateOutcome::kAllocated);
  EXPECT_TRUE(Present(1, ns_));
  EXPECT_EQ(ReadBack(1, ns_), Payload(7));
  EXPECT_EQ(store_->stats().stored_blocks.load(), 1u);
  EXPECT_EQ(store_->stats().committed_blocks.load(), 1u);
}

TEST_F(BlockStoreTest, ReservedBlockIsInvisibleUntilCommitted) {
  MakeStore(8);
  const BlockKey k = Key(1);
  auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(a);
  ASSERT_EQ(a->outcomes[0], AllocateOutcome::kAllocated);
  EXPECT_FALSE(Present(1, ns_));
  auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
  EXPECT_FALSE(lease.blocks[0].present);
}

TEST_F(BlockStoreTest, ChecksumMismatchFreesTheSlotAndNothingBecomesVisible) {
  MakeStore(1);
  const BlockKey k = Key(1);
  auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(a);
  auto bytes = Payload(3);
  ASSERT_OK(store_->Write(a->reservation_id, 0, 0, bytes));
  const uint64_t wrong = BlockChecksum(bytes.data(), bytes.size()) ^ 1;
  auto c = store_->Commit(a->reservation_id, std::span<const uint64_t>(&wrong, 1));
  ASSERT_OK(c);
  EXPECT_EQ((*c)[0], CommitOutcome::kChecksumMismatch);
  EXPECT_FALSE(Present(1, ns_));
  EXPECT_EQ(store_->stats().checksum_failures.load(), 1u);
  EXPECT_EQ(store_->used_bytes(), 0u);
  // The single slot is free again.
  EXPECT_EQ(Put(2, ns_, 4), AllocateOutcome::kAllocated);
}

TEST_F(BlockStoreTest, IncompleteBlockIsNotCommitted) {
  MakeStore(2);
  const BlockKey k = Key(1);
  auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(a);
  auto bytes = Payload(3);
  ASSERT_OK(store_->Write(a->reservation_id, 0, 0, std::span(bytes).first(100)));
  const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
  auto c = store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1));
  ASSERT_OK(c);
  EXPECT_EQ((*c)[0], CommitOutcome::kIncomplete);
  EXPECT_FALSE(Present(1, ns_));
}

TEST_F(BlockStoreTest, WritesOutOfOrderOrPastTheEndAreRefused) {
  MakeStore(2);
  const BlockKey k = Key(1);
  auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(a);
  auto bytes = Payload(3);
  EXPECT_EQ(store_->Write(a->reservation_id, 0, 10, std::span(bytes).first(10)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::byte> too_long(kBlock + 1);
  EXPECT_EQ(store_->Write(a->reservation_id, 0, 0, too_long).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Write(a->reservation_id, 5, 0, std::span(bytes).first(10)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Write(CapabilityId::Random(), 0, 0, std::span(bytes).first(10)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Commit(a->reservation_id, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BlockStoreTest, DuplicatePutIsInProgressThenAlreadyPresent) {
  MakeStore(4);
  const BlockKey k = Key(1);
  auto first = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(first);
  auto second = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(second);
  EXPECT_EQ(second->outcomes[0], AllocateOutcome::kInProgress);
  EXPECT_TRUE(second->reservation_id.null());
  auto bytes = Payload(9);
  ASSERT_OK(store_->Write(first->reservation_id, 0, 0, bytes));
  const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
  ASSERT_OK(store_->Commit(first->reservation_id, std::span<const uint64_t>(&sum, 1)));
  EXPECT_EQ(Put(1, ns_, 10), AllocateOutcome::kAlreadyPresent);
  EXPECT_EQ(ReadBack(1, ns_), Payload(9));  // first committed copy wins
  EXPECT_EQ(store_->stats().stored_blocks.load(), 1u);
}

TEST_F(BlockStoreTest, UncommittedReservationExpiresAndAnotherWriterCanPut) {
  MakeStore(1, absl::Seconds(10), absl::Seconds(5));
  const BlockKey k = Key(1);
  auto abandoned = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(abandoned);
  ASSERT_EQ(abandoned->outcomes[0], AllocateOutcome::kAllocated);
  EXPECT_EQ(Put(1, ns_, 1), AllocateOutcome::kInProgress);
  clock_.Advance(absl::Seconds(6));
  store_->ExpireNow();
  EXPECT_EQ(store_->stats().expired_reservations.load(), 1u);
  EXPECT_EQ(store_->stats().active_reservations.load(), 0u);
  EXPECT_EQ(Put(1, ns_, 2), AllocateOutcome::kAllocated);
  EXPECT_EQ(ReadBack(1, ns_), Payload(2));
  // The expired reservation can no longer write or commit.
  auto bytes = Payload(1);
  EXPECT_EQ(store_->Write(abandoned->reservation_id, 0, 0, bytes).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(BlockStoreTest, EvictsLeastRecentlyUsedWhenFull) {
  MakeStore(3);
  Put(1, ns_, 1);
  Put(2, ns_, 2);
  Put(3, ns_, 3);
  ReadBack(1, ns_);  // 1 is now most recent; 2 is the LRU
  Put(4, ns_, 4);
  EXPECT_TRUE(Present(1, ns_));
  EXPECT_FALSE(Present(2, ns_));
  EXPECT_TRUE(Present(3, ns_));
  EXPECT_TRUE(Present(4, ns_));
  EXPECT_EQ(store_->stats().evictions.load(), 1u);
  // A repeated put refreshes recency like an access: 3 survives the next eviction, 1 goes.
  EXPECT_EQ(Put(3, ns_, 3), AllocateOutcome::kAlreadyPresent);
  Put(5, ns_, 5);
  EXPECT_FALSE(Present(1, ns_));
  EXPECT_TRUE(Present(3, ns_));
}

TEST_F(BlockStoreTest, LookupDoesNotCountAsAnAccess) {
  MakeStore(2);
  Put(1, ns_, 1);
  Put(2, ns_, 2);
  EXPECT_TRUE(Present(1, ns_));  // probing 1 must not protect it
  Put(3, ns_, 3);
  EXPECT_FALSE(Present(1, ns_));
  EXPECT_TRUE(Present(2, ns_));
}

TEST_F(BlockStoreTest, LeasedBlockSurvivesEvictionPressureAndIsFreedAfterRelease) {
  MakeStore(2);
  Put(1, ns_, 1);
  Put(2, ns_, 2);
  const BlockKey k = Key(1);
  auto lookup = store_->Lookup(ns_, std::span<const BlockKey>(&k, 1), absl::Seconds(5));
  ASSERT_FALSE(lookup.lease_id.null());
  for (uint32_t n = 10; n < 20; ++n) Put(n, ns_, n);
  EXPECT_TRUE(Present(1, ns_));  // 1 was the LRU but is leased
  EXPECT_EQ(store_->Release(std::span<const CapabilityId>(&lookup.lease_id, 1)), 1u);
  Put(30, ns_, 30);
  Put(31, ns_, 31);
  EXPECT_FALSE(Present(1, ns_));
}

TEST_F(BlockStoreTest, LeaseExpiresSoAbandonedReadersCannotPinMemory) {
  MakeStore(1, absl::Seconds(2));
  Put(1, ns_, 1);
  const BlockKey k = Key(1);
  auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
  ASSERT_FALSE(lease.lease_id.null());
  EXPECT_EQ(Put(2, ns_, 2), AllocateOutcome::kNoSpace);  // everything leased: fast rejection
  EXPECT_EQ(store_->stats().rejections_no_space.load(), 1u);
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(Put(2, ns_, 2), AllocateOutcome::kAllocated);
  EXPECT_EQ(store_->stats().expired_leases.load(), 1u);
  std::vector<std::byte> out(kBlock);
  EXPECT_EQ(store_->CopyOut(lease.lease_id, 0, 0, out).code(), absl::StatusCode::kFailedPrecondition);
}

// Ids are capabilities bound to their tenant: another tenant presenting a live id gets exactly what an
// unknown id gets (code and message), on every call that takes one, and changes nothing.
TEST_F(BlockStoreTest, AnotherTenantsLiveIdIsAnsweredExactlyAsAnUnknownOne) {
  MakeStore(8);
  const NamespaceRef other{.id = 12, .tenant_id = 2, .block_bytes = kBlock};
  Put(1, ns_, 1);
  const BlockKey k1 = Key(1), k2 = Key(2);
  auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k1, 1), absl::ZeroDuration());
  ASSERT_FALSE(lease.lease_id.null());
  auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k2, 1));
  ASSERT_OK(a);
  ASSERT_FALSE(a->reservation_id.null());
  EXPECT_EQ(store_->LeaseTenant(lease.lease_id), ns_.tenant_id);
  EXPECT_EQ(store_->ReservationTenant(a->reservation_id), ns_.tenant_id);
  const CapabilityId unknown = CapabilityId::Random();
  const IdHolder b = other.tenant_id;
  const auto bytes = Payload(2);
  const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());

  auto same = [](const absl::Status& foreign, const absl::Status& unknown_answer) {
    EXPECT_FALSE(foreign.ok());
    EXPECT_EQ(foreign.code(), unknown_answer.code());
    EXPECT_EQ(foreign.message(), unknown_answer.message());
    EXPECT_EQ(foreign.ToString(), unknown_answer.ToString());
  };
  same(store_->PinForSend(lease.lease_id, 0, b).status(), store_->PinForSend(unknown, 0, b).status());
  same(store_->PinForSend(lease.lease_id, 0, b).status(), UnknownLeaseError());
  same(store_->PinForReceive(a->reservation_id, 0, b).status(), store_->PinForReceive(unknown, 0, b).status());
  same(store_->Write(a->reservation_id, 0, 0, bytes, b), store_->Write(unknown, 0, 0, bytes, b));
  same(store_->Write(a->reservation_id, 0, 0, bytes, b), UnknownReservationError());
  same(store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1), b).status(),
       store_->Commit(unknown, std::span<const uint64_t>(&sum, 1), b).status());
  EXPECT_EQ(UnknownLeaseError().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(UnknownLeaseError().message(), "unknown or expired lease");
  EXPECT_EQ(UnknownReservationError().message(), "unknown or expired reservation");
  // Release and Abort: both skipped alike, and the owner's lease and reservation live on.
  EXPECT_EQ(store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1), b), 0u);
  EXPECT_EQ(store_->Release(std::span<const CapabilityId>(&unknown, 1), b), 0u);
  store_->Abort(a->reservation_id, b);
  store_->Abort(unknown, b);
  // A null id (what the RPC layer decodes from a field that is not 16 bytes) names nothing either.
  same(store_->PinForSend(CapabilityId(), 0).status(), UnknownLeaseError());
  same(store_->Write(CapabilityId(), 0, 0, bytes), UnknownReservationError());

  std::vector<std::byte> out(kBlock);
  ASSERT_OK(store_->CopyOut(lease.lease_id, 0, 0, out));
  EXPECT_EQ(out, Payload(1));
  ASSERT_OK(store_->Write(a->reservation_id, 0, 0, bytes, ns_.tenant_id));  // the owner, bound
  auto c = store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1), ns_.tenant_id);
  ASSERT_OK(c);
  EXPECT_EQ((*c)[0], CommitOutcome::kCommitted);
  EXPECT_EQ(ReadBack(2, ns_), Payload(2));
  EXPECT_EQ(store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1), ns_.tenant_id), 1u);
}

// Ids are random: distinct, never sequential, and live reservations never share a UCX tag prefix.
TEST_F(BlockStoreTest, IdsAreRandomAndReservationsKeepDistinctTagPrefixes) {
  MakeStore(1200);
  std::vector<CapabilityId> ids;
  absl::flat_hash_set<uint64_t> prefixes, firsts;
  for (uint32_t n = 0; n < 1000; ++n) {
    const BlockKey k = Key(n + 100);
    auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
    ASSERT_OK(a);
    ASSERT_FALSE(a->reservation_id.null());
    EXPECT_TRUE(prefixes.insert(a->reservation_id.tag_prefix()).second);
    EXPECT_TRUE(firsts.insert(a->reservation_id.low64()).second);
    EXPECT_TRUE(store_->PutTagFreeFor(a->reservation_id));
    ids.push_back(a->reservation_id);
  }
  // An id that shares a live reservation's tag prefix but is not that reservation: its tags are taken.
  auto sharing = ids[0].bytes();
  sharing[15] ^= 1;
  EXPECT_FALSE(store_->PutTagFreeFor(CapabilityId::FromArray(sharing)));
  store_->Abort(ids[0]);
  EXPECT_TRUE(store_->PutTagFreeFor(CapabilityId::FromArray(sharing)));  // the prefix left with it
  for (size_t i = 1; i < ids.size(); ++i) {
    int differ = 0;
    for (size_t b = 0; b < CapabilityId::kBytes; ++b) {
      differ += std::popcount(static_cast<uint8_t>(ids[i].bytes()[b] ^ ids[i - 1].bytes()[b]));
    }
    EXPECT_GE(differ, 24) << i;
  }
}

TEST_F(BlockStoreTest, LeaseTtlIsCappedAtTheMaximum) {
  MakeStore(2, absl::Seconds(1));  // max = 6 s
  Put(1, ns_, 1);
  const BlockKey k = Key(1);
  auto lookup = store_->Lookup(ns_, std::span<const BlockKey>(&k, 1), absl::Hours(1));
  EXPECT_EQ(lookup.lease_ttl, absl::Seconds(6));
}

TEST_F(BlockStoreTest, OtherTenantOrNamespaceNeverSeesTheBlock) {
  MakeStore(4);
  Put(1, ns_, 1);
  NamespaceRef other_tenant = ns_;
  other_tenant.tenant_id = 2;
  NamespaceRef other_ns = ns_;
  other_ns.id = 12;
  EXPECT_FALSE(Present(1, other_tenant));
  EXPECT_FALSE(Present(1, other_ns));
  EXPECT_TRUE(ReadBack(1, other_tenant).empty());
  // Nor can it overwrite it.
  EXPECT_EQ(Put(1, other_tenant, 99), AllocateOutcome::kInProgress);
  EXPECT_EQ(ReadBack(1, ns_), Payload(1));
}

TEST_F(BlockStoreTest, BlocksLargerThanASlabAreInvalid) {
  MakeStore(4);
  NamespaceRef big = ns_;
  big.block_bytes = 17 * kBlock;
  const BlockKey k = Key(1);
  EXPECT_EQ(store_->Allocate(big, std::span<const BlockKey>(&k, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BlockStoreTest, MixedBlockSizesShareTheCapacity) {
  MakeStore(32);  // two slabs of 16 blocks
  NamespaceRef half = ns_;
  half.id = 20;
  half.block_bytes = kBlock / 2;
  for (uint32_t n = 0; n < 40; ++n) Put(n, ns_, n);      // fills both slabs, evicting
  for (uint32_t n = 100; n < 110; ++n) Put(n, half, n);  // must reclaim a slab from the other class
  EXPECT_TRUE(Present(109, half));
  EXPECT_LE(store_->used_bytes(), store_->capacity_bytes());
}

TEST_F(BlockStoreTest, CapacityHoldsUnderThreeTimesOverfillWithConcurrentLeasedReaders) {
  constexpr uint32_t kCapacity = 64;
  MakeStore(kCapacity);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> max_used{0};
  std::atomic<uint64_t> read_errors{0};
  std::latch start(3);
  auto reader = [&](uint32_t first) {
    start.arrive_and_wait();
    uint32_t n = first;
    while (!stop.load()) {
      const BlockKey k = Key(n++ % (3 * kCapacity));
      auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
      if (lease.blocks[0].present) {
        std::vector<std::byte> out(kBlock);
        if (!store_->CopyOut(lease.lease_id, 0, 0, out).ok() ||
            BlockChecksum(out.data(), out.size()) != lease.blocks[0].checksum) {
          read_errors.fetch_add(1);
        }
        store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
      }
      const uint64_t used = store_->used_bytes();
      uint64_t prev = max_used.load();
      while (used > prev && !max_used.compare_exchange_weak(prev, used)) {
      }
    }
  };
  std::thread r1(reader, 0), r2(reader, 77);
  start.arrive_and_wait();
  uint32_t no_space = 0;
  for (uint32_t n = 0; n < 3 * kCapacity; ++n) no_space += Put(n, ns_, n) == AllocateOutcome::kNoSpace;
  stop = true;
  r1.join();
  r2.join();
  EXPECT_LE(max_used.load(), kCapacity * kBlock);
  EXPECT_LE(store_->used_bytes(), kCapacity * kBlock);
  EXPECT_EQ(read_errors.load(), 0u);
  // Two readers lease at most two blocks at a time, so there is always a victim.
  EXPECT_EQ(no_space, 0u);
  EXPECT_EQ(store_->stats().stored_blocks.load(), kCapacity);
  EXPECT_EQ(store_->stats().evictions.load(), 2 * kCapacity);
}

TEST_F(BlockStoreTest, ConcurrentPutsOfOneKeyLeaveOneCopyWithoutMixedBytes) {
  MakeStore(16);
  constexpr int kWriters = 4;
  std::latch start(kWriters);
  std::atomic<int> allocated{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      const BlockKey k = Key(42);
      auto bytes = Payload(1000 + w);
      start.arrive_and_wait();
      auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
      if (!a.ok() || a->outcomes[0] != AllocateOutcome::kAllocated) return;
      allocated.fetch_add(1);
      // Write in several chunks so an interleaving would mix bytes if two writers shared a slot.
      for (uint64_t off = 0; off < kBlock; off += 512) {
        ASSERT_OK(store_->Write(a->reservation_id, 0, off, std::span(bytes).subspan(off, 512)));
      }
      const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
      ASSERT_OK(store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1)));
    });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(allocated.load(), 1);
  auto got = ReadBack(42, ns_);
  bool matches_one = false;
  for (int w = 0; w < kWriters; ++w) matches_one |= got == Payload(1000 + w);
  EXPECT_TRUE(matches_one);
  EXPECT_EQ(store_->stats().stored_blocks.load(), 1u);
}

TEST_F(BlockStoreTest, AbortReturnsSlotsAtOnce) {
  MakeStore(1);
  const BlockKey k = Key(1);
  auto a = store_->Allocate(ns_, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(a);
  EXPECT_EQ(Put(2, ns_, 2), AllocateOutcome::kNoSpace);
  store_->Abort(a->reservation_id);
  EXPECT_EQ(store_->used_bytes(), 0u);
  EXPECT_EQ(Put(2, ns_, 2), AllocateOutcome::kAllocated);
}

TEST_F(BlockStoreTest, CorruptionHookChangesStoredBytes) {
  MakeStore(2);
  Put(1, ns_, 1);
  ASSERT_OK(store_->CorruptBlockForTest(Key(1), 5));
  const BlockKey k = Key(1);
  auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
  std::vector<std::byte> out(kBlock);
  ASSERT_OK(store_->CopyOut(lease.lease_id, 0, 0, out));
  EXPECT_NE(BlockChecksum(out.data(), out.size()), lease.blocks[0].checksum);
}

}  // namespace
}  // namespace kvtier::server

namespace kvtier::server {
namespace {

TEST_F(BlockStoreTest, DefragmentMovesBlocksOutOfTheEmptiestSlabAndKeepsTheirBytes) {
  MakeStore(48);  // three slabs of 16 blocks
  for (uint32_t n = 0; n < 48; ++n) Put(n, ns_, n);
  // Free most of slab 1 and some of slab 2 so that slab 1's remaining blocks fit elsewhere.
  std::vector<uint32_t> gone;
  for (uint32_t n = 16; n < 30; ++n) gone.push_back(n);
  for (uint32_t n = 32; n < 40; ++n) gone.push_back(n);
  for (uint32_t n : gone) ASSERT_TRUE(store_->EvictKey(Key(n)));
  const uint64_t used = store_->used_bytes();
  auto [moved, freed] = store_->Defragment();
  EXPECT_EQ(freed, 1u);
  EXPECT_EQ(moved, 2u);  // blocks 30 and 31
  EXPECT_EQ(store_->used_bytes(), used);
  EXPECT_EQ(store_->stats().slab_moves.load(), 1u);
  for (uint32_t n = 0; n < 48; ++n) {
    if (std::find(gone.begin(), gone.end(), n) != gone.end()) continue;
    EXPECT_EQ(ReadBack(n, ns_), Payload(n)) << n;
  }
  // The freed slab serves another block size at once, without evicting anything.
  NamespaceRef half = ns_;
  half.id = 77;
  half.block_bytes = kBlock / 2;
  const uint64_t evictions = store_->stats().evictions.load();
  for (uint32_t n = 1000; n < 1010; ++n) EXPECT_EQ(Put(n, half, n), AllocateOutcome::kAllocated);
  EXPECT_EQ(store_->stats().evictions.load(), evictions);
}

TEST_F(BlockStoreTest, DefragmentLeavesSlabsWithLeasedBlocksAlone) {
  MakeStore(32);
  for (uint32_t n = 0; n < 32; ++n) Put(n, ns_, n);
  for (uint32_t n = 16; n < 30; ++n) ASSERT_TRUE(store_->EvictKey(Key(n)));
  for (uint32_t n = 0; n < 4; ++n) ASSERT_TRUE(store_->EvictKey(Key(n)));
  const BlockKey k = Key(30);
  auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::Seconds(30));
  auto [moved, freed] = store_->Defragment();
  EXPECT_EQ(freed, 0u);
  EXPECT_EQ(moved, 0u);
  store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
  EXPECT_EQ(store_->Defragment().second, 1u);
  EXPECT_EQ(ReadBack(30, ns_), Payload(30));
}

TEST_F(BlockStoreTest, ABlockThatCouldNotFitAnEmptyTierEvictsNothing) {
  // Slabs of 1000001 bytes: a block of exactly that size needs a 1000064-byte slot, which none holds.
  auto s = BlockStore::Create({.capacity_bytes = 4 * 1000001ULL, .slab_bytes = 1000001, .clock = &clock_});
  ASSERT_OK(s);
  store_ = std::move(s).value();
  EXPECT_EQ(store_->max_block_bytes(), 1000000u);
  for (uint32_t n = 0; n < 200; ++n) ASSERT_EQ(Put(n, ns_, n), AllocateOutcome::kAllocated);
  NamespaceRef huge = ns_;
  huge.id = 12;
  huge.block_bytes = 1000001;
  const BlockKey k = Key(1000);
  auto a = store_->Allocate(huge, std::span<const BlockKey>(&k, 1));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("1..1000000"), std::string::npos) << a.status().message();
  EXPECT_EQ(store_->stats().evictions.load(), 0u);
  for (uint32_t n = 0; n < 200; ++n) EXPECT_TRUE(Present(n, ns_)) << n;
  // The largest block that fits is stored (evicting what it must).
  huge.block_bytes = 1000000;
  EXPECT_EQ(Put(1000, huge, 5), AllocateOutcome::kAllocated);
}

// While another tenant holds blocks, a tenant's leases pin at most tenant_pinned_share (0.5 by default)
// of the tier; the blocks past it are answered absent, so the other tenant's puts still find blocks to
// evict.
TEST_F(BlockStoreTest, OneTenantsLeasesCannotPinTheTierAgainstAnother) {
  MakeStore(16);
  NamespaceRef other = ns_;
  other.id = 12;
  other.tenant_id = 2;
  ASSERT_EQ(Put(99, other, 99), AllocateOutcome::kAllocated);
  std::vector<BlockKey> keys;
  for (uint32_t n = 0; n < 15; ++n) {
    ASSERT_EQ(Put(n, ns_, n), AllocateOutcome::kAllocated);
    keys.push_back(Key(n));
  }
  auto read = store_->AcquireRead(ns_, keys, absl::Seconds(60));
  EXPECT_EQ(read.refused_pinned, 7u);
  for (uint32_t n = 0; n < 15; ++n) EXPECT_EQ(read.blocks[n].present, n < 8) << n;
  EXPECT_EQ(store_->TenantPinnedBytes(ns_.tenant_id), 8 * kBlock);
  EXPECT_EQ(store_->TenantPinnedBound(ns_.tenant_id), 8 * kBlock);
  // Leasing again what is already pinned stays within the bound; the rest stays refused, on Lookup too.
  auto again = store_->Lookup(ns_, keys, absl::Seconds(60));
  EXPECT_EQ(again.refused_pinned, 7u);
  for (uint32_t n = 0; n < 15; ++n) EXPECT_EQ(again.present[n], n < 8) << n;
  EXPECT_EQ(store_->stats().lease_refusals_pinned.load(), 14u);
  // Without a lease, Lookup answers what is present.
  auto plain = store_->Lookup(ns_, keys, absl::ZeroDuration());
  EXPECT_EQ(plain.refused_pinned, 0u);
  EXPECT_EQ(std::count(plain.present.begin(), plain.present.end(), true), 15);

  for (uint32_t n = 100; n < 140; ++n) EXPECT_EQ(Put(n, other, n), AllocateOutcome::kAllocated) << n;
  for (uint32_t n = 0; n < 8; ++n) EXPECT_EQ(ReadBack(n, ns_), Payload(n)) << "pinned block " << n;
  EXPECT_EQ(store_->stats().rejections_no_space.load(), 0u);

  // Released leases unpin: the tenant may lease up to its bound again.
  store_->Release(std::vector<CapabilityId>{read.lease_id, again.lease_id});
  EXPECT_EQ(store_->TenantPinnedBytes(ns_.tenant_id), 0u);
}

// A tenant alone leases freely; when another tenant is then refused space, the first takes no lease
// (not even on what it holds) until its leases expire, and stays under its bound from then on.
TEST_F(BlockStoreTest, ATenantAloneLeasesFreelyUntilAnotherIsRefusedSpace) {
  MakeStore(16, absl::Seconds(2));  // leases of at most 12 s
  std::vector<BlockKey> keys;
  for (uint32_t n = 0; n < 16; ++n) {
    ASSERT_EQ(Put(n, ns_, n), AllocateOutcome::kAllocated);
    keys.push_back(Key(n));
  }
  auto all = store_->Lookup(ns_, keys, absl::Seconds(12));
  EXPECT_EQ(all.refused_pinned, 0u);
  EXPECT_EQ(store_->TenantPinnedBytes(ns_.tenant_id), 16 * kBlock);
  NamespaceRef other = ns_;
  other.id = 12;
  other.tenant_id = 2;
  EXPECT_EQ(Put(100, other, 100), AllocateOutcome::kNoSpace);  // everything leased
  auto refused = store_->Lookup(ns_, keys, absl::Seconds(12));
  EXPECT_EQ(refused.refused_pinned, 16u) << "over its bound: no lease, not even on pinned blocks";
  clock_.Advance(absl::Seconds(13));
  store_->ExpireNow();
  EXPECT_EQ(store_->TenantPinnedBytes(ns_.tenant_id), 0u);
  EXPECT_EQ(Put(100, other, 100), AllocateOutcome::kAllocated);
  auto bounded = store_->Lookup(ns_, keys, absl::Seconds(12));
  EXPECT_EQ(std::count(bounded.present.begin(), bounded.present.end(), true), 8);
  EXPECT_EQ(store_->TenantPinnedBytes(ns_.tenant_id), 8 * kBlock);
}

TEST_F(BlockStoreTest, AQuotaBelowTheShareBoundsWhatItsTenantPins) {
  auto s = BlockStore::Create({.capacity_bytes = 16 * kBlock,
                               .slab_bytes = 16 * kBlock,
                               .clock = &clock_,
                               .tenant_quota_bytes = {{ns_.tenant_id, 6 * kBlock}}});
  ASSERT_OK(s);
  store_ = std::move(s).value();
  NamespaceRef other = ns_;
  other.id = 12;
  other.tenant_id = 2;
  ASSERT_EQ(Put(99, other, 99), AllocateOutcome::kAllocated);
  std::vector<BlockKey> keys;
  for (uint32_t n = 0; n < 6; ++n) {
    ASSERT_EQ(Put(n, ns_, n), AllocateOutcome::kAllocated);
    keys.push_back(Key(n));
  }
  EXPECT_EQ(store_->TenantPinnedBound(ns_.tenant_id), 6 * kBlock);  // min(0.5 x 16, 6) blocks
  auto read = store_->AcquireRead(ns_, keys, absl::Seconds(60));
  EXPECT_EQ(read.refused_pinned, 0u);
  EXPECT_EQ(store_->TenantPinnedBytes(ns_.tenant_id), 6 * kBlock);
  store_->Release(std::span<const CapabilityId>(&read.lease_id, 1));

  auto quarter_store = BlockStore::Create(
      {.capacity_bytes = 16 * kBlock, .slab_bytes = 16 * kBlock, .tenant_pinned_share = 0.25, .clock = &clock_});
  ASSERT_OK(quarter_store);
  store_ = std::move(quarter_store).value();
  ASSERT_EQ(Put(99, other, 99), AllocateOutcome::kAllocated);
  for (uint32_t n = 0; n < 6; ++n) ASSERT_EQ(Put(n, ns_, n), AllocateOutcome::kAllocated);
  auto quarter = store_->Lookup(ns_, keys, absl::Seconds(60));
  EXPECT_EQ(quarter.refused_pinned, 2u);  // 4 of 16 blocks may be pinned
  EXPECT_FALSE(BlockStore::Create({.capacity_bytes = 16 * kBlock, .tenant_pinned_share = 0}).ok());
}

}  // namespace
}  // namespace kvtier::server
