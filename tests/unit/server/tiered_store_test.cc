// BlockStore with a host tier and a RocksDB disk tier: demotion, promotion, restart, corruption.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/common/checksum.h"
#include "kvtier/server/block_store.h"
#include "storage/disk_tier.h"
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

std::vector<std::byte> Payload(uint32_t seed, uint64_t size = kBlock) {
  std::vector<std::byte> b(size);
  for (size_t i = 0; i < size; ++i) b[i] = static_cast<std::byte>((i * 131 + seed * 7919) >> 3);
  return b;
}

// Holds disk operations of one kind ("read", "write", "delete") while closed: the disk I/O hook of the
// store under test waits in Pass() until the test opens it again.
class DiskGate {
 public:
  void Close(const std::string& op) {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = op;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_.clear();
    }
    cv_.notify_all();
  }
  void Pass(const char* op) {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_ != op) return;
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return closed_ != op; });
    --waiting_;
  }
  // True once an operation waits at the gate (within 10 s).
  bool SomeoneWaits() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return waiting_ > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string closed_;
  int waiting_ = 0;
};

// True when `f` finishes within 10 s (a store call that waited on the stalled disk would not).
template <typename F>
bool FinishesWhileDiskIsStalled(F f) {
  auto done = std::async(std::launch::async, std::move(f));
  return done.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
}

class TieredStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kvtier-tier-" + std::to_string(getpid()) + "-" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override {
    gate_.Open();  // a failed test may leave the disk stalled
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Open(uint64_t host_blocks, uint64_t disk_blocks, bool promote = true, uint64_t lease_buffer_bytes = 0,
            uint64_t spill_buffer_bytes = 0, uint32_t admit_min_requests = 0) {
    store_.reset();
    auto s = BlockStore::Create({.capacity_bytes = host_blocks * kBlock,
                                 .slab_bytes = 4 * kBlock,
                                 .lease_buffer_bytes = lease_buffer_bytes,
                                 .disk_path = dir_.string(),
                                 .disk_capacity_bytes = disk_blocks * kBlock,
                                 .promote_on_hit = promote,
                                 .disk_admit_min_requests = admit_min_requests,
                                 .disk_before_io_for_test = [this](const char* op) { gate_.Pass(op); },
                                 .spill_buffer_bytes = spill_buffer_bytes});
    ASSERT_OK(s);
    store_ = std::move(s).value();
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

  // Reads block n; empty when absent. Checks the checksum the store reports.
  std::vector<std::byte> Read(uint32_t n) {
    const BlockKey k = Key(n);
    auto lease = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
    if (!lease.blocks[0].present) return {};
    std::vector<std::byte> out(lease.blocks[0].size_bytes);
    EXPECT_OK(store_->CopyOut(lease.lease_id, 0, 0, out));
    EXPECT_EQ(BlockChecksum(out.data(), out.size()), lease.blocks[0].checksum);
    store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
    return out;
  }

  std::filesystem::path dir_;
  DiskGate gate_;  // declared before store_: it outlives the store's disk writer
  std::unique_ptr<BlockStore> store_;
  NamespaceRef ns_{.id = 5, .tenant_id = TenantId("acme"), .block_bytes = kBlock};
};

TEST_F(TieredStoreTest, HostEvictionDemotesToDiskAndAHitPromotesBack) {
  Open(4, 16);
  for (uint32_t n = 0; n < 10; ++n) Put(n);
  for (uint32_t n = 0; n < 10; ++n) EXPECT_TRUE(Present(n)) << n;
  EXPECT_EQ(store_->stats().stored_blocks.load(), 4u);
  EXPECT_EQ(store_->stats().disk_blocks.load(), 6u);
  EXPECT_EQ(store_->stats().demotions.load(), 6u);
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kDisk);  // the oldest went down
  EXPECT_EQ(store_->TierOfForTest(Key(9)), Tier::kHost);
  EXPECT_EQ(Read(0), Payload(0));
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kHost);  // promoted by the hit
  EXPECT_EQ(store_->stats().promotions.load(), 1u);
  EXPECT_EQ(store_->stats().disk_blocks.load(), 6u);  // one up, one (the host LRU) down
  EXPECT_LE(store_->used_bytes(), 4 * kBlock);
}

// disk_admit_min_requests 2: a block requested once (its put) is dropped at eviction, never written;
// one requested again (a hit, a put answered already present, or a put after it was dropped) spills.
TEST_F(TieredStoreTest, AdmissionSpillsOnlyBlocksRequestedAgain) {
  Open(2, 16, /*promote=*/true, 0, 0, /*admit_min_requests=*/2);
  Put(0);
  Put(1);
  Put(2);  // evicts 0 (LRU), requested once: dropped
  EXPECT_FALSE(Present(0));
  EXPECT_EQ(store_->stats().disk_admission_refused.load(), 1u);
  EXPECT_EQ(Read(1), Payload(1));  // 1 requested twice now
  const BlockKey k2 = Key(2);
  auto again = store_->Allocate(ns_, std::span<const BlockKey>(&k2, 1));  // 2: a put answered present
  ASSERT_OK(again);
  EXPECT_EQ(again->outcomes[0], AllocateOutcome::kAlreadyPresent);
  Put(3);  // evicts 1
  Put(4);  // evicts 2
  EXPECT_EQ(store_->TierOfForTest(Key(1)), Tier::kDisk);
  EXPECT_EQ(store_->TierOfForTest(Key(2)), Tier::kDisk);
  EXPECT_EQ(store_->stats().demotions.load(), 2u);
  Put(5);  // evicts 3, requested once: dropped
  EXPECT_FALSE(Present(3));
  EXPECT_EQ(store_->stats().disk_admission_refused.load(), 2u);
  // 0 comes back: its put is its second request (the store remembers the first), so it spills.
  Put(0);  // evicts 4, requested once: dropped
  Put(6);  // evicts 5, dropped
  Put(7);  // evicts 0
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kDisk);
  EXPECT_EQ(store_->stats().demotions.load(), 3u);
  EXPECT_EQ(store_->stats().disk_admission_refused.load(), 4u);
  store_->WaitForDiskWrites();
  EXPECT_EQ(Read(1), Payload(1));  // from disk, whole
  EXPECT_EQ(Read(0), Payload(0));
}

TEST_F(TieredStoreTest, FullDiskDropsItsLeastRecentlyUsedBlock) {
  Open(2, 3);
  for (uint32_t n = 0; n < 8; ++n) Put(n);
  EXPECT_EQ(store_->stats().disk_blocks.load(), 3u);
  EXPECT_LE(store_->stats().disk_bytes.load(), 3 * kBlock);
  EXPECT_EQ(store_->stats().disk_evictions.load(), 3u);
  for (uint32_t n = 0; n < 3; ++n) EXPECT_FALSE(Present(n)) << n;
  for (uint32_t n = 3; n < 8; ++n) EXPECT_TRUE(Present(n)) << n;
}

TEST_F(TieredStoreTest, WithoutPromotionReadsAreServedFromDisk) {
  Open(2, 8, /*promote=*/false);
  for (uint32_t n = 0; n < 5; ++n) Put(n);
  ASSERT_EQ(store_->TierOfForTest(Key(0)), Tier::kDisk);
  EXPECT_EQ(Read(0), Payload(0));
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kDisk);
  EXPECT_EQ(store_->stats().promotions.load(), 0u);
}

// Disk blocks read without moving up live in the lease's own buffers; those are bounded, so readers
// cannot take the server's memory past host capacity plus leases.buffer_bytes: past the bound a block
// is answered absent (a miss, counted), and a released lease gives its bytes back.
TEST_F(TieredStoreTest, LeaseBuffersForDiskReadsAreBounded) {
  Open(2, 8, /*promote=*/false, /*lease_buffer_bytes=*/2 * kBlock);
  for (uint32_t n = 0; n < 5; ++n) Put(n);
  const BlockKey keys[] = {Key(0), Key(1), Key(2)};
  for (const BlockKey& k : keys) ASSERT_EQ(store_->TierOfForTest(k), Tier::kDisk);
  auto lease = store_->AcquireRead(ns_, keys, absl::Seconds(5));
  EXPECT_TRUE(lease.blocks[0].present);
  EXPECT_TRUE(lease.blocks[1].present);
  EXPECT_FALSE(lease.blocks[2].present) << "a third buffer would pass the bound";
  EXPECT_EQ(store_->stats().lease_refusals_buffer.load(), 1u);
  EXPECT_EQ(store_->stats().lease_buffer_bytes.load(), 2 * kBlock);
  std::vector<std::byte> out(kBlock);
  ASSERT_OK(store_->CopyOut(lease.lease_id, 1, 0, out));
  EXPECT_EQ(out, Payload(1));
  // A second reader finds the bound taken.
  EXPECT_TRUE(Read(2).empty());
  EXPECT_EQ(store_->stats().lease_refusals_buffer.load(), 2u);
  store_->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
  EXPECT_EQ(store_->stats().lease_buffer_bytes.load(), 0u);
  EXPECT_EQ(Read(2), Payload(2)) << "the released lease's bytes are free again";
  EXPECT_EQ(store_->stats().lease_buffer_bytes.load(), 0u);
  EXPECT_EQ(store_->TierOfForTest(Key(2)), Tier::kDisk);
}

TEST_F(TieredStoreTest, DiskTierSurvivesARestartWithUsageAndHits) {
  Open(2, 32);
  for (uint32_t n = 0; n < 12; ++n) Put(n);
  const uint64_t on_disk = store_->stats().disk_blocks.load();
  ASSERT_EQ(on_disk, 10u);
  Open(2, 32);  // a new store over the same directory: host memory is gone, the disk is not
  EXPECT_EQ(store_->stats().recovered_blocks.load(), on_disk);
  EXPECT_EQ(store_->stats().disk_blocks.load(), on_disk);
  EXPECT_EQ(store_->stats().disk_bytes.load(), on_disk * kBlock);
  for (uint32_t n = 0; n < 10; ++n) EXPECT_EQ(Read(n), Payload(n)) << n;
  EXPECT_FALSE(Present(10));  // these were in host memory only
  EXPECT_FALSE(Present(11));
}

TEST_F(TieredStoreTest, RestartWithASmallerBudgetDropsDownToIt) {
  Open(1, 16);
  for (uint32_t n = 0; n < 9; ++n) Put(n);
  ASSERT_EQ(store_->stats().disk_blocks.load(), 8u);
  Open(1, 4);
  EXPECT_EQ(store_->stats().disk_blocks.load(), 4u);
  EXPECT_LE(store_->stats().disk_bytes.load(), 4 * kBlock);
}

TEST_F(TieredStoreTest, CorruptBytesOnDiskAreDetectedAndNeverServed) {
  Open(2, 16);
  for (uint32_t n = 0; n < 6; ++n) Put(n);
  ASSERT_EQ(store_->TierOfForTest(Key(1)), Tier::kDisk);
  ASSERT_OK(store_->CorruptBlockForTest(Key(1), 100));
  EXPECT_TRUE(Read(1).empty());
  EXPECT_EQ(store_->stats().disk_checksum_failures.load(), 1u);
  EXPECT_FALSE(Present(1));  // dropped
  EXPECT_EQ(Read(2), Payload(2));
}

TEST_F(TieredStoreTest, CorruptHostBytesNeverReachDisk) {
  Open(1, 16);
  Put(0);
  ASSERT_OK(store_->CorruptBlockForTest(Key(0), 7));
  Put(1);  // demotes block 0, whose checksum no longer matches
  EXPECT_FALSE(Present(0));
  EXPECT_EQ(store_->stats().checksum_failures.load(), 1u);
  EXPECT_EQ(store_->stats().disk_blocks.load(), 0u);
}

TEST_F(TieredStoreTest, BudgetsHoldUnderThreeTimesOverfillWithLeasedReaders) {
  Open(8, 16);
  std::vector<CapabilityId> leases;
  for (uint32_t n = 0; n < 72; ++n) {
    Put(n);
    if (n % 18 == 0) {  // a reader that never releases (4 of the 8 host slots end up pinned)
      const BlockKey k = Key(n);
      auto l = store_->AcquireRead(ns_, std::span<const BlockKey>(&k, 1), absl::Seconds(60));
      leases.push_back(l.lease_id);
    }
    ASSERT_LE(store_->used_bytes(), 8 * kBlock);
    ASSERT_LE(store_->stats().disk_bytes.load(), 16 * kBlock);
  }
  for (uint32_t n = 0; n < 72; n += 18) EXPECT_TRUE(Present(n)) << "leased block " << n << " was evicted";
}

// The writer of the test below runs in a child process that re-executes this binary with
// KVTIER_DISK_WRITER_DIR set: it writes blocks until killed. A fresh exec (not a bare fork) keeps the
// child free of the parent's threads, which ThreadSanitizer requires.
const bool kIsDiskWriter = [] {
  const char* dir = std::getenv("KVTIER_DISK_WRITER_DIR");
  if (dir == nullptr) return false;
  // Spills skip the WAL: the probe flushes the write buffers (every 4 blocks here), so the kill lands
  // between flushes, in a write, or in a flush.
  auto disk = DiskTier::OpenOrDegrade({.path = dir, .flush_interval = std::chrono::milliseconds(0)});
  if (disk->state() != DiskTierState::kOk) _exit(3);
  for (uint32_t n = 0;; ++n) {
    if (n % 4 == 3) disk->Probe();
    auto bytes = Payload(n, 256 << 10);
    const DiskBlockMeta meta{.namespace_id = 1,
                             .tenant_id = 2,
                             .size_bytes = bytes.size(),
                             .checksum = BlockChecksum(bytes.data(), bytes.size())};
    if (!disk->Put(Key(n), meta, bytes).ok()) _exit(4);
  }
}();

TEST(DiskTierTest, ProcessKilledMidWriteNeverLeavesAHalfWrittenBlock) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvtier-kill-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  const std::string env = "KVTIER_DISK_WRITER_DIR=" + dir.string();
  char* const child_env[] = {const_cast<char*>(env.c_str()), nullptr};
  char* const child_argv[] = {const_cast<char*>("disk-writer"), nullptr};
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execve("/proc/self/exe", child_argv, child_env);
    _exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped by itself with " << status;

  auto disk = DiskTier::Open(dir.string());
  ASSERT_OK(disk);
  uint64_t blocks = 0, bad = 0;
  std::vector<std::pair<BlockKey, DiskBlockMeta>> all;
  ASSERT_OK((*disk)->ForEach([&](const BlockKey& k, const DiskBlockMeta& m) { all.push_back({k, m}); }, &bad));
  EXPECT_EQ(bad, 0u);
  for (const auto& [k, m] : all) {
    std::vector<std::byte> out(m.size_bytes);
    EXPECT_OK((*disk)->Get(k, m, out));
    ++blocks;
  }
  EXPECT_GT(blocks, 0u) << "the writer wrote nothing in 300 ms";
  disk->reset();
  std::filesystem::remove_all(dir);
}

// A volume under the disk tier's floor (here a floor above any volume's size): the tier says
// degraded-full, host evictions are dropped and counted instead of spilled, memory keeps serving, and
// the probe leaves it so while there is no room.
TEST_F(TieredStoreTest, DiskUnderItsFreeSpaceFloorDropsHostEvictionsAndSaysDegradedFull) {
  auto s = BlockStore::Create({.capacity_bytes = 4 * kBlock,
                               .slab_bytes = 4 * kBlock,
                               .disk_path = dir_.string(),
                               .disk_capacity_bytes = 64 * kBlock,
                               .disk_min_free_bytes = 1ULL << 60});
  ASSERT_OK(s);
  store_ = std::move(s).value();
  EXPECT_EQ(store_->disk_status().state, "degraded-full");
  EXPECT_NE(store_->disk_status().reason, "");
  EXPECT_EQ(store_->disk_status().min_free_bytes, 1ULL << 60);
  for (uint32_t n = 0; n < 10; ++n) Put(n);
  EXPECT_EQ(store_->stats().disk_blocks.load(), 0u);
  EXPECT_EQ(store_->stats().demotions.load(), 0u);
  EXPECT_EQ(store_->stats().disk_spill_refused.load(), 6u);
  EXPECT_EQ(store_->stats().disk_errors.load(), 0u);
  for (uint32_t n = 6; n < 10; ++n) EXPECT_EQ(Read(n), Payload(n)) << n;  // host memory serves on
  store_->ProbeDisk();
  EXPECT_EQ(store_->disk_status().state, "degraded-full");
}

// A disk directory that cannot be created (a regular file is in its way): the store comes up with the
// disk tier off and serves from memory; once the path is usable the probe opens the database and the
// tier is ok and spills again.
TEST_F(TieredStoreTest, DiskThatCannotBeOpenedIsOffUntilTheProbeOpensIt) {
  std::filesystem::create_directories(dir_);
  const std::filesystem::path blocker = dir_ / "blocker";
  { std::ofstream(blocker) << "not a directory"; }
  auto s = BlockStore::Create({.capacity_bytes = 2 * kBlock,
                               .slab_bytes = 2 * kBlock,
                               .disk_path = (blocker / "db").string(),
                               .disk_capacity_bytes = 64 * kBlock});
  ASSERT_OK(s) << "a disk tier that cannot be opened must not stop the store";
  store_ = std::move(s).value();
  EXPECT_EQ(store_->disk_status().state, "off");
  EXPECT_NE(store_->disk_status().reason, "");
  EXPECT_GE(store_->disk_status().open_errors, 1u);
  for (uint32_t n = 0; n < 4; ++n) Put(n);
  EXPECT_EQ(store_->stats().disk_blocks.load(), 0u);
  EXPECT_EQ(Read(3), Payload(3));
  store_->ProbeDisk();
  EXPECT_EQ(store_->disk_status().state, "off");

  std::filesystem::remove(blocker);
  store_->ProbeDisk();
  EXPECT_EQ(store_->disk_status().state, "ok") << store_->disk_status().reason;
  for (uint32_t n = 10; n < 14; ++n) Put(n);
  EXPECT_GT(store_->stats().demotions.load(), 0u);
  EXPECT_GT(store_->stats().disk_blocks.load(), 0u);
  for (uint32_t n = 10; n < 14; ++n) EXPECT_EQ(Read(n), Payload(n)) << n;
}

// A database the store can only open read-only (another process holds its lock; a full volume does the
// same): the tier says read-only, its blocks are served, host evictions are dropped and nothing is
// written; once the lock is free the probe reopens it read-write, reconciles the index with what is on
// disk, and spills go on.
TEST_F(TieredStoreTest, ReadOnlyOpenServesDiskBlocksAndTheProbeReopensReadWrite) {
  Open(2, 16);
  for (uint32_t n = 0; n < 6; ++n) Put(n);
  ASSERT_EQ(store_->stats().disk_blocks.load(), 4u);
  store_.reset();
  // Another process holds the database's lock: the read-write open fails, the read-only one works.
  auto holder = DiskTier::Open(dir_.string());
  ASSERT_OK(holder);
  Open(2, 16);
  EXPECT_EQ(store_->disk_status().state, "read-only") << store_->disk_status().reason;
  EXPECT_EQ(store_->stats().disk_blocks.load(), 4u);
  EXPECT_EQ(Read(0), Payload(0));             // served from the read-only database, moved to memory
  for (uint32_t n = 20; n < 24; ++n) Put(n);  // host evictions are dropped, not written
  EXPECT_GT(store_->stats().disk_spill_refused.load(), 0u);
  EXPECT_EQ(store_->stats().disk_errors.load(), 0u);
  holder->reset();
  store_->ProbeDisk();
  EXPECT_EQ(store_->disk_status().state, "ok") << store_->disk_status().reason;
  for (uint32_t n = 1; n < 4; ++n) {
    const std::vector<std::byte> got = Read(n);
    if (!got.empty()) {
      EXPECT_EQ(got, Payload(n)) << n;
    }
  }
  for (uint32_t n = 30; n < 36; ++n) Put(n);
  EXPECT_GT(store_->stats().demotions.load(), 0u);
  EXPECT_EQ(store_->stats().disk_errors.load(), 0u);
}

// A block dropped while the database is read-only (here: read, so it moved to memory, then evicted
// from memory while the disk could take nothing) cannot be deleted then; the tier remembers it and
// deletes it once writable, so the reopen does not index a copy the store dropped.
TEST(DiskTierTest, DeletesRefusedWhileReadOnlyHappenAfterTheReopen) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvtier-pending-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  auto bytes = Payload(1);
  const DiskBlockMeta meta{.namespace_id = 1,
                           .tenant_id = 2,
                           .size_bytes = bytes.size(),
                           .checksum = BlockChecksum(bytes.data(), bytes.size())};
  {
    auto writer = DiskTier::Open(dir.string());
    ASSERT_OK(writer);
    ASSERT_OK((*writer)->Put(Key(1), meta, bytes));
    ASSERT_OK((*writer)->Put(Key(2), meta, bytes));
  }
  auto holder = DiskTier::Open(dir.string());  // holds the lock: the next open is read-only
  ASSERT_OK(holder);
  auto tier = DiskTier::OpenOrDegrade({.path = dir.string()});
  ASSERT_EQ(tier->state(), DiskTierState::kReadOnly) << tier->reason();
  EXPECT_TRUE(absl::IsFailedPrecondition(tier->Delete(Key(1))));
  std::vector<BlockKey> seen;
  ASSERT_OK(tier->ForEach([&](const BlockKey& k, const DiskBlockMeta&) { seen.push_back(k); }));
  EXPECT_EQ(seen.size(), 1u) << "the dropped block is skipped while its delete waits";
  holder->reset();
  EXPECT_TRUE(tier->Probe()) << tier->reason();  // reopened read-write
  ASSERT_EQ(tier->state(), DiskTierState::kOk) << tier->reason();
  seen.clear();
  ASSERT_OK(tier->ForEach([&](const BlockKey& k, const DiskBlockMeta&) { seen.push_back(k); }));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], Key(2));
  tier.reset();
  auto again = DiskTier::Open(dir.string());  // and it stays deleted across a restart
  ASSERT_OK(again);
  seen.clear();
  ASSERT_OK((*again)->ForEach([&](const BlockKey& k, const DiskBlockMeta&) { seen.push_back(k); }));
  EXPECT_EQ(seen.size(), 1u);
  again->reset();
  std::filesystem::remove_all(dir);
}

// A payload that fails its checksum is DataLoss (the store counts a checksum failure), never an I/O error.
TEST(DiskTierTest, ACorruptPayloadIsDataLossNotAnIoError) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvtier-corrupt-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  auto tier = DiskTier::Open(dir.string());
  ASSERT_OK(tier);
  auto bytes = Payload(3);
  const DiskBlockMeta meta{.namespace_id = 1,
                           .tenant_id = 2,
                           .size_bytes = bytes.size(),
                           .checksum = BlockChecksum(bytes.data(), bytes.size())};
  ASSERT_OK((*tier)->Put(Key(3), meta, bytes));
  ASSERT_OK((*tier)->CorruptForTest(Key(3), 7));
  std::vector<std::byte> out(bytes.size());
  EXPECT_TRUE(absl::IsDataLoss((*tier)->Get(Key(3), meta, out)));
  EXPECT_EQ((*tier)->errors().read.load(), 0u);
  tier->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::server

namespace kvtier::server {
namespace {

// A read of a disk block waits on the disk without the store's lock: lookups and reads of host blocks,
// and puts, go on while it is stalled, and the stalled read then gets its bytes.
TEST_F(TieredStoreTest, HostBlocksAreServedWhileADiskReadIsStalled) {
  Open(4, 16);
  for (uint32_t n = 0; n < 8; ++n) Put(n);
  store_->WaitForDiskWrites();
  ASSERT_EQ(store_->TierOfForTest(Key(0)), Tier::kDisk);
  gate_.Close("read");
  auto stalled = std::async(std::launch::async, [&] { return Read(0); });
  ASSERT_TRUE(gate_.SomeoneWaits());
  const bool served = FinishesWhileDiskIsStalled([&] {
    for (uint32_t n = 0; n < 8; ++n) EXPECT_TRUE(Present(n)) << n;
    for (uint32_t n = 4; n < 8; ++n) {
      if (store_->TierOfForTest(Key(n)) == Tier::kHost) {
        EXPECT_EQ(Read(n), Payload(n)) << n;
      }
    }
    Put(100);
  });
  gate_.Open();
  EXPECT_TRUE(served) << "a lookup, read or put of host blocks waited on the stalled disk read";
  EXPECT_EQ(stalled.get(), Payload(0));
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kHost);  // promoted once its read came back
  EXPECT_GE(store_->stats().disk_reads.load(), 1u);
}

// Spills are written by the disk writer: puts, lookups and reads go on while its writes are stalled,
// a block still on its way to disk is served from its copy, and once the disk catches up every block
// is where the index says.
TEST_F(TieredStoreTest, PutsAndReadsGoOnWhileDiskWritesAreStalled) {
  Open(4, 64);
  gate_.Close("write");
  const bool served = FinishesWhileDiskIsStalled([&] {
    for (uint32_t n = 0; n < 12; ++n) Put(n);
    for (uint32_t n = 0; n < 12; ++n) EXPECT_TRUE(Present(n)) << n;
  });
  if (!served) gate_.Open();
  ASSERT_TRUE(served) << "a put or lookup waited on the stalled disk write";
  EXPECT_TRUE(gate_.SomeoneWaits());
  EXPECT_GT(store_->stats().disk_spill_queue_bytes.load(), 0u);
  ASSERT_EQ(store_->TierOfForTest(Key(1)), Tier::kDisk);
  const bool read = FinishesWhileDiskIsStalled([&] { EXPECT_EQ(Read(1), Payload(1)); });  // from its copy
  gate_.Open();
  EXPECT_TRUE(read) << "a read of a block on its way to disk waited on the disk";
  store_->WaitForDiskWrites();
  EXPECT_EQ(store_->stats().disk_spill_queue_bytes.load(), 0u);
  EXPECT_EQ(store_->stats().disk_errors.load(), 0u);
  for (uint32_t n = 0; n < 12; ++n) EXPECT_EQ(Read(n), Payload(n)) << n;
  // Restarted, the disk holds what the index held.
  const uint64_t on_disk = store_->stats().disk_blocks.load();
  Open(4, 64);
  EXPECT_EQ(store_->stats().recovered_blocks.load(), on_disk);
}

// Copies waiting for the disk writer are bounded (spill_buffer_bytes): past the bound a host eviction
// drops its block, counted, rather than hold more memory.
TEST_F(TieredStoreTest, SpillsPastTheSpillBufferBoundAreDropped) {
  Open(2, 64, /*promote=*/true, /*lease_buffer_bytes=*/0, /*spill_buffer_bytes=*/2 * kBlock);
  gate_.Close("write");
  const bool served = FinishesWhileDiskIsStalled([&] {
    for (uint32_t n = 0; n < 10; ++n) Put(n);
  });
  if (!served) gate_.Open();
  ASSERT_TRUE(served);
  EXPECT_LE(store_->stats().disk_spill_queue_bytes.load(), 2 * kBlock);
  EXPECT_EQ(store_->stats().disk_spill_dropped_busy.load(), 6u);  // 8 evictions, 2 copies fit
  gate_.Open();
  store_->WaitForDiskWrites();
  EXPECT_EQ(store_->stats().disk_blocks.load(), 2u);
  EXPECT_EQ(Read(0), Payload(0));
  EXPECT_EQ(Read(1), Payload(1));
  EXPECT_TRUE(Read(5).empty());
}

}  // namespace
}  // namespace kvtier::server
