// A full disk tier degrades a real kvtier-server to its memory tiers and never takes it down: the disk
// directory is on a small tmpfs this test mounts (mount(2); skipped where that is not permitted), the
// server is filled under load past what the volume holds and restarted on the full volume, and once a
// filler file is deleted the disk tier comes back by itself.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "integration/kvtierctl_runner.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "testing/scrape_metrics.h"
#include "testing/server_process.h"
#include "testing/sized_blocks.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using client::Client;
using client::GetResult;
using client::PutResult;
using testing::ServerProcess;

constexpr uint64_t kMiB = 1ULL << 20;
constexpr uint64_t kVolumeBytes = 64 * kMiB;
constexpr uint64_t kBlockBytes = 64 << 10;
constexpr size_t kChainBlocks = 10;  // blocks per prompt (one put each)

Namespace DiskNamespace() { return testing::SizedNamespace("acme", "disk-full", static_cast<uint32_t>(kBlockBytes)); }

// Bytes derived from the fingerprint, so that a wrong block cannot pass for the right one.
std::vector<std::byte> Payload(const Fingerprint& fp) { return testing::FingerprintPayload(fp, kBlockBytes); }

// Prompt `seed`'s kChainBlocks fingerprints (distinct seeds: distinct blocks).
std::vector<Fingerprint> Chain(const Namespace& ns, uint32_t seed) {
  std::vector<uint32_t> tokens(kChainBlocks);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = seed * 7919 + static_cast<uint32_t>(i) * 31 + 1;
  auto fps = ChainFingerprints(ns, tokens);
  return fps.ok() ? *fps : std::vector<Fingerprint>{};
}

uint64_t VolumeFree(const std::string& dir) {
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

// Appends zeros to `path` until the volume has at most `leave` bytes free (0: until it is full).
void Fill(const std::string& path, uint64_t leave) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << strerror(errno);
  const std::vector<char> chunk(256 << 10, 0);
  const std::string dir = std::filesystem::path(path).parent_path();
  while (VolumeFree(dir) > leave) {
    const uint64_t want = std::min<uint64_t>(chunk.size(), VolumeFree(dir) - leave);
    const ssize_t n = write(fd, chunk.data(), want);
    if (n <= 0) break;  // ENOSPC: full
  }
  close(fd);
}

struct Tally {
  uint64_t stored = 0, hits = 0, misses = 0, wrong = 0, errors = 0;
};

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvtier-disk-full-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    mount_ = dir;
    if (mount("tmpfs", mount_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=0700") != 0) {
      const std::string why = strerror(errno);
      rmdir(mount_.c_str());
      mount_.clear();
      GTEST_SKIP() << "mounting a 64 MiB tmpfs is not permitted here (mount(2): " << why
                   << "); the test needs root with CAP_SYS_ADMIN";
    }
    mounted_ = true;
    ASSERT_NEAR(static_cast<double>(VolumeFree(mount_)), static_cast<double>(kVolumeBytes), 1.0 * kMiB);
  }
  void TearDown() override {
    server_.reset();
    if (mounted_ && umount2(mount_.c_str(), MNT_DETACH) != 0) {
      ADD_FAILURE() << "umount " << mount_ << ": " << strerror(errno);
    }
    if (!mount_.empty()) rmdir(mount_.c_str());
  }

  std::vector<std::string> ServerArgs() const {
    return {"--host_cache_bytes=4MiB", "--slab_bytes=256KiB", "--max_block_bytes=256KiB",
            "--disk_path=" + mount_ + "/db", "--disk_capacity_bytes=1GiB"};
  }

  void StartServer() {
    auto s = ServerProcess::Start("disk-full", ServerArgs());
    ASSERT_OK(s) << "kvtier-server did not come up on the volume";
    server_ = *std::move(s);
    admin_ = v1::AdminService::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    auto c = Client::Connect({.members = {server_->address()}, .rpc_timeout = absl::Seconds(10)});
    ASSERT_OK(c);
    client_ = *std::move(c);
  }

  // The disk tier's entry of GetInfo (state, reason, free bytes); an empty one when it fails.
  v1::TierInfo DiskInfo() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetInfoRequest req;
    v1::GetInfoResponse resp;
    if (!admin_->GetInfo(&ctx, req, &resp).ok()) return {};
    for (const v1::TierInfo& t : resp.tiers()) {
      if (t.tier() == "disk") return t;
    }
    return {};
  }
  v1::GetStatsResponse Stats() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetStatsRequest req;
    v1::GetStatsResponse resp;
    EXPECT_TRUE(admin_->GetStats(&ctx, req, &resp).ok());
    return resp;
  }
  double Metric(const std::string& series) {
    return testing::MetricValue(testing::ScrapeMetrics(server_->metrics_port()), series);
  }
  // Polls (every 200 ms, up to `timeout`) until the disk tier reports `state`.
  bool WaitForState(const std::string& state, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (DiskInfo().state() == state) return true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  }

  // Puts prompts [first, first + count) and counts what was stored.
  void PutPrompts(uint32_t first, uint32_t count, Tally* t) {
    const Namespace ns = DiskNamespace();
    for (uint32_t p = first; p < first + count; ++p) {
      const std::vector<Fingerprint> fps = Chain(ns, p);
      std::vector<std::vector<std::byte>> data;
      for (const auto& fp : fps) data.push_back(Payload(fp));
      std::vector<std::span<const std::byte>> in(data.begin(), data.end());
      auto put = client_->Put(ns, fps, 0, in);
      ASSERT_OK(put);
      for (PutResult r : *put) {
        if (r == PutResult::kStored || r == PutResult::kAlreadyPresent) ++t->stored;
        if (r == PutResult::kError) ++t->errors;
      }
    }
  }
  // Gets prompts [first, first + count): every block is the right bytes or a miss.
  void GetPrompts(uint32_t first, uint32_t count, Tally* t) {
    const Namespace ns = DiskNamespace();
    for (uint32_t p = first; p < first + count; ++p) {
      const std::vector<Fingerprint> fps = Chain(ns, p);
      std::vector<std::vector<std::byte>> out(fps.size(), std::vector<std::byte>(kBlockBytes));
      std::vector<std::span<std::byte>> views(out.begin(), out.end());
      auto got = client_->Get(ns, fps, 0, views);
      ASSERT_OK(got);
      for (size_t i = 0; i < fps.size(); ++i) {
        switch ((*got)[i]) {
          case GetResult::kHit:
            ++t->hits;
            if (out[i] != Payload(fps[i])) ++t->wrong;
            break;
          case GetResult::kMiss:
            ++t->misses;
            break;
          default:
            ++t->errors;
        }
      }
    }
  }

  // What a churn saw of the disk tier: the least free space, the largest database, the first state
  // other than ok (and after how many prompts).
  struct ChurnWatch {
    uint64_t least_free = kVolumeBytes;
    uint64_t most_database = 0;
    std::string not_ok;
  };
  void Watch(uint32_t done, uint32_t total, ChurnWatch* w) {
    const v1::TierInfo disk = DiskInfo();
    w->least_free = std::min<uint64_t>(w->least_free, disk.volume_free_bytes());
    w->most_database = std::max<uint64_t>(w->most_database, Stats().disk_database_bytes());
    if (disk.state() != "ok" && w->not_ok.empty()) {
      w->not_ok = absl::StrCat(disk.state(), " after ", done, " of ", total, " prompts: ", disk.state_reason());
    }
  }

  std::string ServerLog() const {
    std::ifstream in(server_->log_path());
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::string mount_;
  bool mounted_ = false;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<Client> client_;
};

// (a) Filling under load: 1,100 distinct 64 KiB blocks (69 MiB, more than the 64 MiB volume), then a
// filler file that takes the volume under its floor while 300 more arrive. The server stays up, every
// get is the right bytes or a miss, the disk tier says degraded-full (GetInfo, kvtierctl status, the
// kvtier_disk_tier_state gauge, the log) and host evictions are dropped instead of spilled.
TEST_F(DiskFullTest, FillingTheVolumeUnderLoadDegradesToMemoryNeverCrashes) {
  StartServer();
  ASSERT_EQ(DiskInfo().state(), "ok");
  Tally put1;
  PutPrompts(0, 110, &put1);  // 1,100 blocks
  ASSERT_TRUE(server_->Running()) << "the server died filling its disk:\n" << ServerLog();
  EXPECT_EQ(put1.errors, 0u);
  EXPECT_EQ(put1.stored, 1100u);
  const v1::GetStatsResponse s1 = Stats();
  EXPECT_GT(s1.demotions(), 0u) << "nothing spilled to disk";
  EXPECT_GT(s1.disk_blocks(), 0u);
  // The budget in force is bounded by the volume: half of (64 MiB less the floor).
  EXPECT_LE(s1.disk_capacity_bytes(), kVolumeBytes / 2);
  EXPECT_LE(s1.disk_bytes(), s1.disk_capacity_bytes());
  std::fprintf(
      stderr, "after 1,100 puts: %llu on disk (%llu bytes of a %llu budget), %llu demoted, state %s, %.1f MiB free\n",
      static_cast<unsigned long long>(s1.disk_blocks()), static_cast<unsigned long long>(s1.disk_bytes()),
      static_cast<unsigned long long>(s1.disk_capacity_bytes()), static_cast<unsigned long long>(s1.demotions()),
      s1.disk_state().c_str(), static_cast<double>(VolumeFree(mount_)) / kMiB);

  // Something else takes the volume: 1 MiB left, under the floor.
  Fill(mount_ + "/filler", 1 * kMiB);
  Tally put2;
  PutPrompts(110, 30, &put2);  // 300 blocks more: host evictions find the disk full
  ASSERT_TRUE(server_->Running()) << "the server died on a full disk:\n" << ServerLog();
  EXPECT_EQ(put2.errors, 0u);
  EXPECT_EQ(put2.stored, 300u);
  const v1::TierInfo disk = DiskInfo();
  EXPECT_EQ(disk.state(), "degraded-full") << disk.state_reason();
  EXPECT_NE(disk.state_reason(), "");
  // Under the level at which the tier resumes (1.5x the floor); RocksDB may free some space meanwhile.
  EXPECT_LT(disk.volume_free_bytes(), disk.min_free_bytes() * 3 / 2);
  const v1::GetStatsResponse s2 = Stats();
  EXPECT_GT(s2.disk_spill_refused(), 0u) << "host evictions should have been dropped, not spilled";
  EXPECT_EQ(Metric("kvtier_disk_tier_state{state=\"degraded-full\"}"), 1);
  EXPECT_EQ(Metric("kvtier_disk_tier_state{state=\"ok\"}"), 0);
  EXPECT_GT(Metric("kvtier_disk_spill_refused_total"), 0);
  EXPECT_NE(ServerLog().find("-> degraded-full"), std::string::npos) << ServerLog();

  // Every block is the right bytes or a miss; the newest are served from memory, older ones from disk.
  Tally got;
  GetPrompts(0, 140, &got);
  EXPECT_EQ(got.wrong, 0u);
  EXPECT_EQ(got.errors, 0u);
  EXPECT_GT(got.hits, 0u);
  EXPECT_EQ(client_->stats().checksum_failures.load(), 0u);
  ASSERT_TRUE(server_->Running()) << ServerLog();
  std::fprintf(stderr, "full volume: %llu spills refused; gets of 1,400: %llu hits, %llu misses, %llu wrong\n",
               static_cast<unsigned long long>(s2.disk_spill_refused()), static_cast<unsigned long long>(got.hits),
               static_cast<unsigned long long>(got.misses), static_cast<unsigned long long>(got.wrong));

  // What the operator reads in the log.
  std::istringstream log(ServerLog());
  for (std::string line; std::getline(log, line);) {
    if (line.find("disk tier") != std::string::npos) std::fprintf(stderr, "server log: %s\n", line.c_str());
  }

  // kvtierctl status says it, with the reason, in the table and in JSON.
  const testing::CtlResult table = testing::RunCtl(absl::StrCat("--members ", server_->address(), " status"));
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("DISK STATE"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("disk tier degraded-full: "), std::string::npos) << table.output;
  const testing::CtlResult json = testing::RunCtl(absl::StrCat("--members ", server_->address(), " status --json"));
  const nlohmann::json j = testing::ParseJson(json.output);
  ASSERT_FALSE(j.is_discarded()) << json.output;
  bool seen = false;
  for (const auto& t : j["members"][0]["tiers"]) {
    if (t["tier"] == "disk") {
      seen = true;
      EXPECT_EQ(t["state"], "degraded-full");
      EXPECT_NE(t["state_reason"], "");
    }
  }
  EXPECT_TRUE(seen) << json.output;
}

// (b) A restart on a volume with no byte free comes up and serves from memory, the disk tier not ok
// (degraded-full, read-only or off: whatever the volume allowed) and saying why; (c) once the filler is
// deleted the tier resumes by itself (the probe, every second) and new blocks spill to disk again.
TEST_F(DiskFullTest, RestartOnAFullVolumeServesFromMemoryAndTheDiskTierResumesWhenSpaceReturns) {
  StartServer();
  Tally before;
  PutPrompts(0, 20, &before);  // 200 blocks: most of them spill
  ASSERT_GT(Stats().disk_blocks(), 0u);
  server_->KillAndWait(SIGKILL);

  Fill(mount_ + "/filler", 0);  // not a byte left
  ASSERT_LT(VolumeFree(mount_), 64u << 10);
  StartServer();
  ASSERT_TRUE(server_->Running()) << ServerLog();
  const v1::TierInfo disk = DiskInfo();
  EXPECT_NE(disk.state(), "ok") << "a volume with no free byte cannot take a spill";
  EXPECT_NE(disk.state(), "");
  EXPECT_NE(disk.state_reason(), "");
  std::fprintf(stderr, "restart on the full volume: disk tier %s (%s)\n", disk.state().c_str(),
               disk.state_reason().c_str());
  EXPECT_EQ(Metric(absl::StrCat("kvtier_disk_tier_state{state=\"", disk.state(), "\"}")), 1);
  // It serves from memory: 40 new blocks (host memory holds 64) come back byte for byte.
  Tally fresh_put, fresh_get, old_get;
  PutPrompts(100, 4, &fresh_put);
  EXPECT_EQ(fresh_put.stored, 40u);
  GetPrompts(100, 4, &fresh_get);
  EXPECT_EQ(fresh_get.hits, 40u);
  EXPECT_EQ(fresh_get.wrong, 0u);
  // What it had on disk is the right bytes or a miss.
  GetPrompts(0, 20, &old_get);
  EXPECT_EQ(old_get.wrong, 0u);
  EXPECT_EQ(old_get.errors, 0u);
  ASSERT_TRUE(server_->Running()) << ServerLog();
  const uint64_t demotions_full = Stats().demotions();

  // Space returns: the tier is ok again without a restart, and spills again.
  ASSERT_TRUE(std::filesystem::remove(mount_ + "/filler"));
  const absl::Time freed = absl::Now();
  ASSERT_TRUE(WaitForState("ok", absl::Seconds(30)))
      << "the disk tier stayed " << DiskInfo().state() << ": " << DiskInfo().state_reason() << "\n"
      << ServerLog();
  std::fprintf(stderr, "disk tier ok again %.1f s after the filler was deleted\n",
               absl::ToDoubleSeconds(absl::Now() - freed));
  EXPECT_EQ(Metric("kvtier_disk_tier_state{state=\"ok\"}"), 1);
  Tally resumed_put, resumed_get;
  PutPrompts(200, 15, &resumed_put);  // 150 blocks: more than host memory holds
  EXPECT_EQ(resumed_put.stored, 150u);
  const v1::GetStatsResponse s = Stats();
  EXPECT_GT(s.demotions(), demotions_full) << "nothing spilled after the tier resumed";
  EXPECT_GT(s.disk_blocks(), 0u);
  EXPECT_EQ(s.disk_state(), "ok");
  GetPrompts(200, 15, &resumed_get);
  EXPECT_EQ(resumed_get.wrong, 0u);
  EXPECT_EQ(resumed_get.errors, 0u);
  EXPECT_EQ(resumed_get.hits, 150u) << "the blocks spilled after the resume should all be served";
  EXPECT_EQ(client_->stats().checksum_failures.load(), 0u);
  ASSERT_TRUE(server_->Running()) << ServerLog();
}

// (d) A cache churns its disk: every spill past the budget deletes an older block, and RocksDB keeps a
// deleted block's bytes in its blob file until garbage collection rewrites that file. Ten budgets'
// worth of distinct blocks through the tier: the database's own garbage never takes the volume under
// its floor, so the tier stays ok, refuses no spill and sees no I/O error.
TEST_F(DiskFullTest, ChurningTenBudgetsThroughTheDiskKeepsTheFloor) {
  StartServer();
  const uint64_t budget = Stats().disk_capacity_bytes();
  ASSERT_GT(budget, 0u);
  const uint32_t prompts = static_cast<uint32_t>(10 * budget / (kChainBlocks * kBlockBytes));
  ChurnWatch watch;
  Tally put;
  for (uint32_t first = 0; first < prompts; first += 20) {
    PutPrompts(first, 20, &put);
    ASSERT_TRUE(server_->Running()) << ServerLog();
    Watch(first + 20, prompts, &watch);
  }
  EXPECT_EQ(watch.not_ok, "") << ServerLog();
  const uint64_t least_free = watch.least_free, most_database = watch.most_database;
  EXPECT_EQ(put.errors, 0u);
  const v1::GetStatsResponse s = Stats();
  EXPECT_EQ(s.disk_spill_refused(), 0u);
  EXPECT_EQ(s.disk_errors(), 0u);
  EXPECT_GT(s.disk_evictions(), 0u) << "the churn never went past the budget";
  EXPECT_GE(least_free, DiskInfo().min_free_bytes());
  std::fprintf(stderr,
               "churn of %u prompts (%.0f MiB) through a %.1f MiB budget: database at most %.1f MiB (%.2fx the "
               "budget), least free %.1f MiB (floor %.1f MiB), %llu disk evictions\n",
               prompts, static_cast<double>(prompts) * kChainBlocks * kBlockBytes / kMiB,
               static_cast<double>(budget) / kMiB, static_cast<double>(most_database) / kMiB,
               static_cast<double>(most_database) / static_cast<double>(budget), static_cast<double>(least_free) / kMiB,
               static_cast<double>(DiskInfo().min_free_bytes()) / kMiB,
               static_cast<unsigned long long>(s.disk_evictions()));
  Tally got;
  GetPrompts(prompts - 20, 20, &got);
  EXPECT_EQ(got.wrong, 0u);
  EXPECT_EQ(got.errors, 0u);
}

// (d') The churn of (d), but ten blocks, each in a different blob file, are read from disk every round
// and never promoted (promote_on_hit off), so they stay recent and each keeps its whole blob file
// alive. Without garbage collection those files pile up; the tier turns it on when its files pass 1.5x
// the blocks' bytes, and the floor holds.
TEST_F(DiskFullTest, HotBlocksThatPinTheirBlobFilesDoNotFillTheVolume) {
  const std::string config = mount_ + "/../kvtier-disk-full-hot.yaml";
  {
    std::ofstream out(config);
    out << "disk_tier:\n  promote_on_hit: false\n";
  }
  auto args = ServerArgs();
  args.push_back("--config=" + config);
  auto started = ServerProcess::Start("disk-full", args);
  std::filesystem::remove(config);
  ASSERT_OK(started);
  server_ = *std::move(started);
  admin_ = v1::AdminService::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  auto c = Client::Connect({.members = {server_->address()}, .rpc_timeout = absl::Seconds(10)});
  ASSERT_OK(c);
  client_ = *std::move(c);

  const Namespace ns = DiskNamespace();
  const uint64_t budget = Stats().disk_capacity_bytes();
  const uint32_t prompts = static_cast<uint32_t>(10 * budget / (kChainBlocks * kBlockBytes));
  // One hot block every 4 prompts (2.5 MiB apart: blob files here are 2 MiB).
  std::vector<Fingerprint> hot;
  for (uint32_t p = 0; p < 40; p += 4) hot.push_back(Chain(ns, p)[0]);
  auto read_hot = [&](Tally* t) {
    std::vector<std::vector<std::byte>> out(hot.size(), std::vector<std::byte>(kBlockBytes));
    std::vector<std::span<std::byte>> views(out.begin(), out.end());
    for (size_t i = 0; i < hot.size(); ++i) {
      auto got =
          client_->Get(ns, std::span<const Fingerprint>(&hot[i], 1), 0, std::span<std::span<std::byte>>(&views[i], 1));
      ASSERT_OK(got);
      if ((*got)[0] == GetResult::kHit) {
        ++t->hits;
        if (out[i] != Payload(hot[i])) ++t->wrong;
      } else {
        ++t->misses;
      }
    }
  };
  Tally put, hot_reads;
  PutPrompts(0, 40, &put);
  ChurnWatch watch;
  for (uint32_t first = 40; first < prompts; first += 10) {
    read_hot(&hot_reads);
    PutPrompts(first, 10, &put);
    ASSERT_TRUE(server_->Running()) << ServerLog();
    Watch(first + 10, prompts, &watch);
    absl::SleepFor(absl::Milliseconds(20));  // lets the probe (every second) see the growth
  }
  EXPECT_EQ(watch.not_ok, "") << ServerLog();
  const uint64_t least_free = watch.least_free, most_database = watch.most_database;
  EXPECT_EQ(put.errors, 0u);
  EXPECT_EQ(hot_reads.wrong, 0u);
  EXPECT_GT(hot_reads.hits, hot_reads.misses) << "the hot blocks should stay on disk";
  const v1::GetStatsResponse s = Stats();
  EXPECT_EQ(s.disk_spill_refused(), 0u);
  EXPECT_EQ(s.disk_errors(), 0u);
  std::fprintf(stderr,
               "churn with 10 hot blocks on disk: database at most %.1f MiB (%.2fx the %.1f MiB budget), least free "
               "%.1f MiB (floor %.1f MiB); hot reads %llu hits, %llu misses\n",
               static_cast<double>(most_database) / kMiB,
               static_cast<double>(most_database) / static_cast<double>(budget), static_cast<double>(budget) / kMiB,
               static_cast<double>(least_free) / kMiB, static_cast<double>(DiskInfo().min_free_bytes()) / kMiB,
               static_cast<unsigned long long>(hot_reads.hits), static_cast<unsigned long long>(hot_reads.misses));
  EXPECT_NE(ServerLog().find("collecting blob garbage"), std::string::npos)
      << "the hot blocks should have made the tier collect garbage";
}

// (e) Killed mid-churn, the server leaves files RocksDB would have deleted and a WAL to replay. The
// restart opens the tier read-write (ok), not read-only for want of room, and keeps serving the disk.
TEST_F(DiskFullTest, KilledMidChurnTheRestartOpensTheDiskReadWrite) {
  StartServer();
  const uint64_t budget = Stats().disk_capacity_bytes();
  const uint32_t prompts = static_cast<uint32_t>(3 * budget / (kChainBlocks * kBlockBytes));
  Tally put;
  PutPrompts(0, prompts, &put);
  ASSERT_EQ(put.errors, 0u);
  server_->KillAndWait(SIGKILL);
  StartServer();
  ASSERT_TRUE(server_->Running()) << ServerLog();
  ASSERT_TRUE(WaitForState("ok", absl::Seconds(10)))
      << "after the restart the disk tier is " << DiskInfo().state() << ": " << DiskInfo().state_reason() << "\n"
      << ServerLog();
  const v1::GetStatsResponse s = Stats();
  EXPECT_GT(s.disk_blocks(), 0u) << "the restart lost the disk's blocks";
  Tally more, got;
  PutPrompts(prompts, 20, &more);
  EXPECT_EQ(more.stored, 200u);
  GetPrompts(0, prompts + 20, &got);
  EXPECT_EQ(got.wrong, 0u);
  EXPECT_EQ(got.errors, 0u);
  EXPECT_GT(got.hits, 200u);
  EXPECT_EQ(DiskInfo().state(), "ok") << DiskInfo().state_reason();
}

// (f) Files in the database's directory that its current version no longer references (a killed
// process's leftovers, deleted by RocksDB only after a read-write open) fill the volume: the restart
// deletes them, opens read-write and keeps the blocks it had.
TEST_F(DiskFullTest, ARestartDeletesTheDatabasesObsoleteFilesAndOpensReadWrite) {
  StartServer();
  Tally put;
  PutPrompts(0, 60, &put);
  const uint64_t had = Stats().disk_blocks();
  ASSERT_GT(had, 0u);
  server_->KillAndWait(SIGTERM);  // a clean stop flushes the write buffers
  Fill(mount_ + "/db/999999.blob", 0);
  ASSERT_LT(VolumeFree(mount_), 64u << 10);
  StartServer();
  ASSERT_TRUE(WaitForState("ok", absl::Seconds(10))) << DiskInfo().state() << ": " << DiskInfo().state_reason() << "\n"
                                                     << ServerLog();
  EXPECT_FALSE(std::filesystem::exists(mount_ + "/db/999999.blob"));
  EXPECT_NE(ServerLog().find("no longer references"), std::string::npos) << ServerLog();
  EXPECT_EQ(Stats().disk_blocks(), had) << "the blocks on disk should have survived";
  Tally got;
  GetPrompts(0, 60, &got);
  EXPECT_EQ(got.wrong, 0u);
  EXPECT_EQ(got.errors, 0u);
  EXPECT_EQ(got.hits, had) << "every block on disk before the restart should be served";
}

// (g) A damaged database (its CURRENT file garbage) opens neither read-write nor read-only: the tier is
// a cache, so the server starts it empty, says so in the log and kvtier_disk_recreated_total, and spills
// to it again.
TEST_F(DiskFullTest, ADamagedDatabaseIsStartedEmpty) {
  StartServer();
  Tally put;
  PutPrompts(0, 20, &put);
  server_->KillAndWait(SIGTERM);
  {
    std::ofstream current(mount_ + "/db/CURRENT", std::ios::trunc);
    current << "not a manifest name";
  }
  StartServer();
  ASSERT_TRUE(WaitForState("ok", absl::Seconds(10))) << DiskInfo().state() << ": " << DiskInfo().state_reason() << "\n"
                                                     << ServerLog();
  EXPECT_EQ(Metric("kvtier_disk_recreated_total"), 1);
  EXPECT_NE(ServerLog().find("starting the disk tier empty"), std::string::npos) << ServerLog();
  EXPECT_EQ(Stats().disk_blocks(), 0u);
  Tally more, old;
  PutPrompts(100, 20, &more);
  EXPECT_EQ(more.stored, 200u);
  EXPECT_GT(Stats().disk_blocks(), 0u) << "nothing spilled to the new database";
  GetPrompts(0, 20, &old);  // what the damaged database held is a miss, never wrong bytes
  EXPECT_EQ(old.wrong, 0u);
  EXPECT_EQ(old.errors, 0u);
}

// (h) The volume grows while the server runs (tmpfs remounted at twice its size): the floor and the
// budget in force follow it within a few probes, without a restart.
TEST_F(DiskFullTest, AVolumeGrownWhileRunningRaisesTheBudget) {
  StartServer();
  const uint64_t before = Stats().disk_capacity_bytes();
  const uint64_t floor_before = DiskInfo().min_free_bytes();
  ASSERT_EQ(mount("tmpfs", mount_.c_str(), "tmpfs", MS_REMOUNT | MS_NOSUID | MS_NODEV, "size=128m,mode=0700"), 0)
      << strerror(errno);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Stats().disk_capacity_bytes() == before && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(200));
  const uint64_t after = Stats().disk_capacity_bytes();
  const uint64_t floor_after = DiskInfo().min_free_bytes();
  std::fprintf(stderr, "volume 64 -> 128 MiB: budget %.1f -> %.1f MiB, floor %.1f -> %.1f MiB\n",
               static_cast<double>(before) / kMiB, static_cast<double>(after) / kMiB,
               static_cast<double>(floor_before) / kMiB, static_cast<double>(floor_after) / kMiB);
  EXPECT_EQ(floor_after, 2 * floor_before);  // the default floor is volume / 8 here
  EXPECT_EQ(after, (2 * kVolumeBytes - floor_after) / 2);
  EXPECT_NE(ServerLog().find("the disk budget in force is now"), std::string::npos) << ServerLog();
  Tally put;
  PutPrompts(0, 80, &put);  // 50 MiB: more than the old budget
  EXPECT_EQ(put.errors, 0u);
  EXPECT_GT(Stats().disk_bytes(), before) << "the disk should hold more than the old budget";
  EXPECT_EQ(DiskInfo().state(), "ok") << DiskInfo().state_reason();
}

// (i) The volume shrinks under a full disk tier (tmpfs remounted from 128 to 72 MiB): the budget drops,
// the disk evicts down to it, and the deletes' garbage is collected even while the tier writes nothing
// (the probe flushes them), so the tier is ok again by itself; the write buffers, and with them the
// default floor, follow the new size.
TEST_F(DiskFullTest, AVolumeShrunkUnderAFullTierRecoversByItself) {
  ASSERT_EQ(mount("tmpfs", mount_.c_str(), "tmpfs", MS_REMOUNT | MS_NOSUID | MS_NODEV, "size=128m,mode=0700"), 0)
      << strerror(errno);
  StartServer();
  Tally put;
  PutPrompts(0, 120, &put);  // 75 MiB through a 56 MiB budget
  ASSERT_EQ(put.errors, 0u);
  ASSERT_EQ(mount("tmpfs", mount_.c_str(), "tmpfs", MS_REMOUNT | MS_NOSUID | MS_NODEV, "size=72m,mode=0700"), 0)
      << strerror(errno);
  const absl::Time shrunk = absl::Now();
  bool ok_again = false;
  for (uint32_t first = 1000; absl::Now() - shrunk < absl::Seconds(60) && !ok_again; first += 5) {
    PutPrompts(first, 5, &put);
    ASSERT_TRUE(server_->Running()) << ServerLog();
    ok_again = absl::Now() - shrunk > absl::Seconds(3) && DiskInfo().state() == "ok";
    absl::SleepFor(absl::Milliseconds(500));
  }
  const v1::TierInfo disk = DiskInfo();
  std::fprintf(stderr, "volume 128 -> 72 MiB under a full tier: %s after %.1f s; floor %.1f MiB, budget %.1f MiB\n",
               disk.state().c_str(), absl::ToDoubleSeconds(absl::Now() - shrunk),
               static_cast<double>(disk.min_free_bytes()) / kMiB,
               static_cast<double>(Stats().disk_capacity_bytes()) / kMiB);
  EXPECT_TRUE(ok_again) << disk.state() << ": " << disk.state_reason() << "\n" << ServerLog();
  EXPECT_EQ(disk.min_free_bytes(), 72 * kMiB / 8);
  EXPECT_EQ(Stats().disk_capacity_bytes(), (72 * kMiB - 72 * kMiB / 8) / 2);
  EXPECT_EQ(put.errors, 0u);
}

// (j) A file of the database damaged on disk fails every compaction that reads it (RocksDB's CRC),
// which would leave the tier read-only for good: the server starts the tier empty instead, and spills
// again. No damaged byte is ever served.
TEST_F(DiskFullTest, ADamagedDatabaseFileStartsTheTierEmptyInsteadOfLeavingItReadOnly) {
  StartServer();
  Tally put;
  PutPrompts(0, 40, &put);
  server_->KillAndWait(SIGTERM);  // flushes: every spilled block is in a blob file
  // Damage the data blocks of every SST (keys and blob references; the footer stays readable): the
  // next compaction reads them and fails its CRC.
  uint32_t damaged = 0;
  for (const auto& f : std::filesystem::directory_iterator(mount_ + "/db")) {
    if (f.path().extension() != ".sst" || f.file_size() < 4096) continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(f.file_size() / 8));
    const std::string junk(256, '\x5a');
    io.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    ++damaged;
  }
  ASSERT_GT(damaged, 0u);
  StartServer();
  Tally churn, got;
  bool recreated = false;
  const absl::Time restarted = absl::Now();
  for (uint32_t first = 100; absl::Now() - restarted < absl::Seconds(20) && !recreated; first += 20) {
    PutPrompts(first, 20, &churn);
    GetPrompts(0, 40, &got);  // the damaged blocks: a miss or the right bytes, never wrong ones
    ASSERT_TRUE(server_->Running()) << ServerLog();
    recreated = Metric("kvtier_disk_recreated_total") >= 1;
  }
  EXPECT_TRUE(recreated) << DiskInfo().state() << ": " << DiskInfo().state_reason() << "\n" << ServerLog();
  EXPECT_TRUE(WaitForState("ok", absl::Seconds(10))) << DiskInfo().state() << ": " << DiskInfo().state_reason();
  EXPECT_EQ(got.wrong, 0u);
  EXPECT_EQ(churn.errors, 0u);
  Tally more;
  PutPrompts(1000, 20, &more);
  EXPECT_GT(Stats().disk_blocks(), 0u) << "nothing spilled to the new database";
  std::fprintf(stderr, "%u damaged SST files: tier started empty, %llu checksum failures counted, 0 wrong bytes\n",
               damaged, static_cast<unsigned long long>(Stats().disk_checksum_failures()));
}

}  // namespace
}  // namespace kvtier
