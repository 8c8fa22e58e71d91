// BlockStore's event sink: every change to the set of committed blocks is reported, in order, and the
// reported stream rebuilds the store's contents exactly.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/common/checksum.h"
#include "kvtier/server/block_event_sink.h"
#include "kvtier/server/block_store.h"
#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

constexpr uint64_t kBlock = 4096;
const NamespaceRef kNs{.id = 7, .tenant_id = 9, .block_bytes = kBlock};

BlockKey Key(uint32_t n) {
  BlockKey k;
  std::memcpy(k.fingerprint.bytes.data(), &n, sizeof(n));
  k.fingerprint.bytes[31] = 0xcd;
  return k;
}

// Records the calls and applies them to a map, as a subscriber does.
class RecordingSink final : public BlockEventSink {
 public:
  struct Call {
    char kind;  // 'S'tored, 'R'emoved, 'M'oved, 'C'leared
    BlockKey key;
    Tier tier{};
    Tier from{};
  };
  void OnStored(const EventBlockInfo& b) override {
    calls.push_back({'S', b.key, b.tier});
    state[b.key.fingerprint.Hex()] = b.tier;
  }
  void OnRemoved(const EventBlockInfo& b) override {
    calls.push_back({'R', b.key, b.tier});
    EXPECT_EQ(state.erase(b.key.fingerprint.Hex()), 1u) << "removed a block never stored";
  }
  void OnMoved(const EventBlockInfo& b, Tier from) override {
    calls.push_back({'M', b.key, b.tier, from});
    ASSERT_TRUE(state.contains(b.key.fingerprint.Hex())) << "moved a block never stored";
    EXPECT_EQ(state[b.key.fingerprint.Hex()], from);
    state[b.key.fingerprint.Hex()] = b.tier;
  }
  void OnCleared() override {
    calls.push_back({'C', {}});
    state.clear();
  }
  std::string Kinds() const {
    std::string s;
    for (const Call& c : calls) s += c.kind;
    return s;
  }
  std::vector<Call> calls;
  std::map<std::string, Tier> state;  // fingerprint hex -> tier
};

class BlockStoreEventsTest : public ::testing::Test {
 protected:
  void MakeStore(uint64_t capacity_blocks, const std::string& disk_path = "", uint64_t disk_blocks = 0) {
    auto s = BlockStore::Create({.capacity_bytes = capacity_blocks * kBlock,
                                 .slab_bytes = 16 * kBlock,
                                 .disk_path = disk_path,
                                 .disk_capacity_bytes = disk_blocks * kBlock});
    ASSERT_OK(s);
    store_ = std::move(s).value();
  }

  void Put(uint32_t n) {
    const BlockKey k = Key(n);
    auto a = store_->Allocate(kNs, std::span<const BlockKey>(&k, 1));
    ASSERT_OK(a);
    ASSERT_EQ(a->outcomes[0], AllocateOutcome::kAllocated);
    std::vector<std::byte> bytes(kBlock, std::byte{static_cast<uint8_t>(n)});
    ASSERT_OK(store_->Write(a->reservation_id, 0, 0, bytes));
    const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
    auto c = store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1));
    ASSERT_OK(c);
    ASSERT_EQ((*c)[0], CommitOutcome::kCommitted);
  }

  // The store's committed blocks as fingerprint hex -> tier, through the admin listing.
  std::map<std::string, Tier> Listed() const {
    std::map<std::string, Tier> out;
    uint64_t cursor = 0;
    do {
      auto [page, next] = store_->ListBlocks({}, cursor, 1000);
      for (const auto& b : page) out[b.key.fingerprint.Hex()] = b.tier;
      cursor = next;
    } while (cursor != 0);
    return out;
  }

  std::unique_ptr<BlockStore> store_;
  RecordingSink sink_;
};

TEST_F(BlockStoreEventsTest, AttachingRestatesTheContentsAfterOneClear) {
  MakeStore(16);
  Put(1);
  Put(2);
  store_->SetEventSink(&sink_);
  EXPECT_EQ(sink_.Kinds(), "CSS");
  EXPECT_EQ(sink_.state, Listed());
  Put(3);
  EXPECT_EQ(sink_.Kinds(), "CSSS");
  EXPECT_EQ(sink_.calls.back().key, Key(3));
  EXPECT_EQ(sink_.calls.back().tier, Tier::kHost);
  store_->SetEventSink(nullptr);
}

TEST_F(BlockStoreEventsTest, ReservationsAndAbortsAreInvisible) {
  MakeStore(16);
  store_->SetEventSink(&sink_);
  const BlockKey k = Key(5);
  auto a = store_->Allocate(kNs, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(a);
  store_->Abort(a->reservation_id);
  // A commit with a wrong checksum never becomes visible either.
  auto b = store_->Allocate(kNs, std::span<const BlockKey>(&k, 1));
  ASSERT_OK(b);
  std::vector<std::byte> bytes(kBlock, std::byte{1});
  ASSERT_OK(store_->Write(b->reservation_id, 0, 0, bytes));
  const uint64_t wrong = 42;
  ASSERT_OK(store_->Commit(b->reservation_id, std::span<const uint64_t>(&wrong, 1)));
  EXPECT_EQ(sink_.Kinds(), "C");
  store_->SetEventSink(nullptr);
}

TEST_F(BlockStoreEventsTest, HostEvictionWithoutDiskIsARemoval) {
  MakeStore(16);  // one slab of 16 blocks
  store_->SetEventSink(&sink_);
  for (uint32_t n = 0; n < 20; ++n) Put(n);
  EXPECT_EQ(std::count_if(sink_.calls.begin(), sink_.calls.end(), [](const auto& c) { return c.kind == 'R'; }), 4);
  EXPECT_EQ(sink_.calls[1].kind, 'S');
  EXPECT_EQ(sink_.state, Listed());
  EXPECT_EQ(sink_.state.size(), 16u);
  EXPECT_TRUE(store_->EvictKey(Key(19)));
  EXPECT_EQ(sink_.calls.back().kind, 'R');
  EXPECT_EQ(sink_.calls.back().key, Key(19));
  EXPECT_EQ(sink_.state, Listed());
  store_->SetEventSink(nullptr);
}

TEST_F(BlockStoreEventsTest, DemotionAndPromotionAreMovesThatKeepTheBlockPresent) {
  const std::string dir = ::testing::TempDir() + "/kvtier_events_disk";
  std::filesystem::remove_all(dir);
  MakeStore(16, dir, 64);
  store_->SetEventSink(&sink_);
  for (uint32_t n = 0; n < 20; ++n) Put(n);
  // Four host evictions became four moves to disk, no removal.
  std::string moves;
  for (const auto& c : sink_.calls) {
    if (c.kind == 'M') {
      EXPECT_EQ(c.from, Tier::kHost);
      EXPECT_EQ(c.tier, Tier::kDisk);
      moves += 'M';
    }
    EXPECT_NE(c.kind, 'R');
  }
  EXPECT_EQ(moves, "MMMM");
  EXPECT_EQ(sink_.state, Listed());
  EXPECT_EQ(sink_.state[Key(0).fingerprint.Hex()], Tier::kDisk);
  // A read of a disk block promotes it: a move back (and, the host being full, another demotion).
  const BlockKey k0 = Key(0);
  auto lease = store_->AcquireRead(kNs, std::span<const BlockKey>(&k0, 1), absl::ZeroDuration());
  ASSERT_TRUE(lease.blocks[0].present);
  store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
  EXPECT_EQ(sink_.state[Key(0).fingerprint.Hex()], Tier::kHost);
  EXPECT_EQ(sink_.state, Listed());
  store_->SetEventSink(nullptr);
  store_.reset();
  std::filesystem::remove_all(dir);
}

TEST_F(BlockStoreEventsTest, EvictingEverythingIsOneClearThenTheLeasedSurvivors) {
  MakeStore(16);
  for (uint32_t n = 0; n < 5; ++n) Put(n);
  store_->SetEventSink(&sink_);
  sink_.calls.clear();
  const BlockKey k2 = Key(2);
  auto lease = store_->AcquireRead(kNs, std::span<const BlockKey>(&k2, 1), absl::ZeroDuration());
  ASSERT_TRUE(lease.blocks[0].present);
  const auto [evicted, leased] = store_->Evict({});
  EXPECT_EQ(evicted, 4u);
  EXPECT_EQ(leased, 1u);
  EXPECT_EQ(sink_.Kinds(), "CS");
  EXPECT_EQ(sink_.calls[1].key, Key(2));
  EXPECT_EQ(sink_.state, Listed());
  // A filtered evict reports each block.
  store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
  store_->Evict({.namespace_id = kNs.id});
  EXPECT_EQ(sink_.Kinds(), "CSR");
  EXPECT_TRUE(sink_.state.empty());
  store_->SetEventSink(nullptr);
}

TEST_F(BlockStoreEventsTest, SnapshotCutSeesExactlyTheCallsBeforeIt) {
  MakeStore(16);
  store_->SetEventSink(&sink_);
  for (uint32_t n = 0; n < 20; ++n) Put(n);
  size_t calls_at_cut = 0;
  const auto blocks = store_->SnapshotForEvents([&] { calls_at_cut = sink_.calls.size(); });
  EXPECT_EQ(calls_at_cut, sink_.calls.size());
  std::map<std::string, Tier> snap;
  for (const auto& b : blocks) snap[b.key.fingerprint.Hex()] = b.tier;
  EXPECT_EQ(snap, sink_.state);
  store_->SetEventSink(nullptr);
}

}  // namespace
}  // namespace kvtier::server
