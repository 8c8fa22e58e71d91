// CommittedIndex, and BlockStore's lookups without a lease that read it instead of the store's lock.
#include "committed_index.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <latch>
#include <random>
#include <thread>
#include <vector>

#include "kvtier/common/checksum.h"
#include "kvtier/server/block_store.h"
#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

constexpr uint64_t kBlock = 4096;

BlockKey Key(uint32_t n, uint32_t shard = 0) {
  BlockKey k;
  std::memcpy(k.fingerprint.bytes.data(), &n, sizeof(n));
  k.fingerprint.bytes[31] = 0x5c;
  k.shard = shard;
  return k;
}

TEST(CommittedIndexTest, AnswersOnlyForTheNamespaceAndTenantOfTheCommit) {
  CommittedIndex index(8);
  index.Insert(Key(1), /*namespace_id=*/10, /*tenant_id=*/100);
  index.Insert(Key(2), 10, 100);
  index.Insert(Key(3), 11, 100);
  index.Insert(Key(2, /*shard=*/1), 10, 200);
  const std::vector<BlockKey> keys = {Key(1), Key(2), Key(3), Key(2, 1), Key(4)};
  std::vector<bool> present(keys.size(), false);
  EXPECT_EQ(index.Find(10, 100, keys, present), 2u);
  EXPECT_EQ(present, (std::vector<bool>{true, true, false, false, false}));
  std::vector<bool> other(keys.size(), false);
  EXPECT_EQ(index.Find(10, 200, keys, other), 1u);
  EXPECT_EQ(other, (std::vector<bool>{false, false, false, true, false}));
  EXPECT_EQ(index.size(), 4u);

  index.Erase(Key(2));
  index.Erase(Key(9));  // absent: nothing happens
  std::vector<bool> after(keys.size(), false);
  EXPECT_EQ(index.Find(10, 100, keys, after), 1u);
  EXPECT_EQ(after, (std::vector<bool>{true, false, false, false, false}));
  EXPECT_EQ(index.size(), 3u);
}

TEST(CommittedIndexTest, ZeroShardsIsOneAndKeysSpreadOverShards) {
  EXPECT_EQ(CommittedIndex(0).shard_count(), 1u);
  CommittedIndex one(1);
  CommittedIndex many(64);
  for (uint32_t i = 0; i < 1000; ++i) {
    one.Insert(Key(i), 1, 1);
    many.Insert(Key(i), 1, 1);
  }
  EXPECT_EQ(one.size(), 1000u);
  EXPECT_EQ(many.size(), 1000u);
}

TEST(CommittedIndexTest, ConcurrentWritersAndReadersOfDifferentKeys) {
  CommittedIndex index(16);
  constexpr uint32_t kPerThread = 2000;
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&index, t] {
      for (uint32_t i = 0; i < kPerThread; ++i) {
        const BlockKey k = Key(t * kPerThread + i);
        index.Insert(k, 1, 1);
        std::vector<bool> p(1, false);
        EXPECT_EQ(index.Find(1, 1, std::span<const BlockKey>(&k, 1), p), 1u);
        if (i % 2 == 1) index.Erase(k);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(index.size(), 4 * kPerThread / 2);
}

class LookupWithoutLeaseTest : public ::testing::Test {
 protected:
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void MakeStore(uint64_t host_blocks, uint64_t disk_blocks) {
    BlockStoreOptions o{.capacity_bytes = host_blocks * kBlock, .slab_bytes = 16 * kBlock, .index_shards = 8};
    if (disk_blocks > 0) {
      if (dir_.empty()) {
        dir_ =
            (std::filesystem::temp_directory_path() / ("kvtier-committed-index-" + std::to_string(getpid()))).string();
      }
      o.disk_path = dir_;
      o.disk_capacity_bytes = disk_blocks * kBlock;
    }
    auto s = BlockStore::Create(o);
    ASSERT_OK(s);
    store_ = std::move(s).value();
  }
  void Put(const NamespaceRef& ns, uint32_t n) {
    const BlockKey k = Key(n);
    auto a = store_->Allocate(ns, std::span<const BlockKey>(&k, 1));
    ASSERT_OK(a);
    if (a->outcomes[0] != AllocateOutcome::kAllocated) return;
    std::vector<std::byte> bytes(kBlock, static_cast<std::byte>(n));
    ASSERT_OK(store_->Write(a->reservation_id, 0, 0, bytes));
    const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
    ASSERT_OK(store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1)));
  }
  // What a lookup without a lease answers (the committed index) against what a leasing lookup answers
  // (the store's own index, under its lock), for keys 0..n-1 of `ns`.
  void ExpectIndexesAgree(const NamespaceRef& ns, uint32_t n) {
    std::vector<BlockKey> keys;
    for (uint32_t i = 0; i < n; ++i) keys.push_back(Key(i));
    for (size_t at = 0; at < keys.size(); at += 64) {
      const std::span<const BlockKey> batch(keys.data() + at, std::min<size_t>(64, keys.size() - at));
      const auto plain = store_->Lookup(ns, batch, absl::ZeroDuration());
      const auto leased = store_->Lookup(ns, batch, absl::Seconds(5));
      ASSERT_EQ(plain.present, leased.present) << "keys from " << at;
      if (!leased.lease_id.null()) store_->Release(std::span<const CapabilityId>(&leased.lease_id, 1));
    }
  }

  std::string dir_;
  std::unique_ptr<BlockStore> store_;
};

TEST_F(LookupWithoutLeaseTest, AgreesWithTheStoreThroughPutsEvictionsSpillsAndErasures) {
  MakeStore(/*host_blocks=*/64, /*disk_blocks=*/128);
  const NamespaceRef a{.id = 1, .tenant_id = 7, .block_bytes = kBlock};
  const NamespaceRef b{.id = 2, .tenant_id = 8, .block_bytes = kBlock};
  std::mt19937 rng(42);
  for (int round = 0; round < 6; ++round) {
    for (int i = 0; i < 80; ++i) Put(rng() % 2 ? a : b, static_cast<uint32_t>(rng() % 400));
    store_->WaitForDiskWrites();
    ExpectIndexesAgree(a, 400);
    ExpectIndexesAgree(b, 400);
    const BlockKey victim = Key(static_cast<uint32_t>(rng() % 400));
    store_->EvictKey(victim);
    ExpectIndexesAgree(a, 400);
    ExpectIndexesAgree(b, 400);
  }
  EXPECT_GT(store_->stats().evictions.load() + store_->stats().demotions.load(), 0u);
  EXPECT_GT(store_->stats().disk_blocks.load(), 0u);
  const auto [evicted, leased] = store_->Evict(BlockStore::BlockFilter{.tenant_id = 7});
  EXPECT_GT(evicted, 0u);
  EXPECT_EQ(leased, 0u);
  ExpectIndexesAgree(a, 400);
  std::vector<BlockKey> all;
  for (uint32_t i = 0; i < 400; ++i) all.push_back(Key(i));
  for (bool p : store_->Lookup(a, all, absl::ZeroDuration()).present) EXPECT_FALSE(p);

  // Blocks recovered from disk at a restart are found too.
  store_.reset();
  MakeStore(64, 128);
  uint64_t found = 0;
  for (bool p : store_->Lookup(b, all, absl::ZeroDuration()).present) found += p;
  EXPECT_GT(found, 0u);
  EXPECT_EQ(found, store_->stats().recovered_blocks.load());
  ExpectIndexesAgree(b, 400);
}

// Holds the store's lock (its sink is called under it) until released.
class StallingSink final : public BlockEventSink {
 public:
  void OnStored(const EventBlockInfo&) override {
    if (!stall_.load()) return;
    entered_.count_down();
    while (stall_.load()) std::this_thread::yield();
  }
  void OnRemoved(const EventBlockInfo&) override {}
  void OnMoved(const EventBlockInfo&, Tier) override {}
  void OnCleared() override {}

  std::atomic<bool> stall_{false};
  std::latch entered_{1};
};

TEST_F(LookupWithoutLeaseTest, AnswersWhileTheStoreLockIsHeld) {
  MakeStore(64, 0);
  const NamespaceRef ns{.id = 1, .tenant_id = 7, .block_bytes = kBlock};
  for (uint32_t i = 0; i < 8; ++i) Put(ns, i);
  StallingSink sink;
  store_->SetEventSink(&sink);
  sink.stall_ = true;
  std::thread writer([&] { Put(ns, 100); });  // its commit stalls in the sink, holding the store's lock
  sink.entered_.wait();
  std::vector<BlockKey> keys;
  for (uint32_t i = 0; i < 10; ++i) keys.push_back(Key(i));
  const auto r = store_->Lookup(ns, keys, absl::ZeroDuration());  // would hang here if it took the lock
  EXPECT_EQ(r.present, (std::vector<bool>{true, true, true, true, true, true, true, true, false, false}));
  sink.stall_ = false;
  writer.join();
  store_->SetEventSink(nullptr);
  EXPECT_TRUE(store_->Lookup(ns, std::vector<BlockKey>{Key(100)}, absl::ZeroDuration()).present[0]);
}

TEST(TimedMutexTest, CountsHoldsOnlyWhileMeasuring) {
  TimedMutex mu;
  const uint64_t before = TimedMutex::HeldNanosOfThisThread(TimedMutex::Kind::kStore);
  {
    std::lock_guard lock(mu);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(TimedMutex::HeldNanosOfThisThread(TimedMutex::Kind::kStore), before);
  TimedMutex::SetMeasuring(true);
  {
    std::lock_guard lock(mu);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  TimedMutex::SetMeasuring(false);
  EXPECT_GE(TimedMutex::HeldNanosOfThisThread(TimedMutex::Kind::kStore) - before, 2'000'000u);
  EXPECT_EQ(TimedMutex::HeldNanosOfThisThread(TimedMutex::Kind::kIndexShard), 0u);  // another kind
}

}  // namespace
}  // namespace kvtier::server
