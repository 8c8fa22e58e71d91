// kvtierctl verify against blocks corrupted on disk while their server was stopped: two members with a
// disk tier (host memory for 4 blocks, so most of their blocks are demoted), stopped with SIGTERM; one
// byte of a block's payload is flipped in RocksDB's blob files (payloads are stored there uncompressed,
// storage/disk_tier.cc); restarted on the same disk path, verify must report the block and exit 4.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtierctl_runner.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::CtlResult;
using testing::ParseJson;
using testing::RunCtl;
using testing::ServerProcess;

Namespace TestNamespace() {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "llama-verify";
  ns.layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64, .block_tokens = 16};  // 16 KiB blocks
  return ns;
}

// Flips one byte, 100 bytes into `payload`'s first 64 bytes' match, in every *.blob file under `dir`
// (an obsolete blob file may still hold an old copy). Returns how many copies were changed.
int FlipPayloadByte(const std::filesystem::path& dir, const std::vector<std::byte>& payload) {
  const std::string needle(reinterpret_cast<const char*>(payload.data()), 64);
  int flipped = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".blob") continue;
    std::string bytes;
    {
      std::ifstream in(entry.path(), std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    bool changed = false;
    for (size_t at = bytes.find(needle); at != std::string::npos; at = bytes.find(needle, at + 1)) {
      if (at + payload.size() > bytes.size()) continue;
      bytes[at + 100] = static_cast<char>(bytes[at + 100] ^ 0x01);
      changed = true;
      ++flipped;
    }
    if (changed) {
      std::ofstream out(entry.path(), std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
  }
  return flipped;
}

class KvtierctlVerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/kvtier-verify-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    ids_ = {"ver-a", "ver-b", "ver-c"};
    servers_.resize(3);
    for (size_t i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(Start(i));
  }
  void TearDown() override {
    servers_.clear();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // ver-b and ver-c have a disk tier and host memory for 4 blocks; ver-a has only host memory.
  std::vector<std::string> Args(size_t i) const {
    if (i == 0) return {};
    const uint64_t size = TestNamespace().layout.ShardBytes();
    return {"--disk_path=" + DiskPath(i), "--disk_capacity_bytes=64MiB",
            "--host_cache_bytes=" + std::to_string(4 * size)};
  }
  std::string DiskPath(size_t i) const { return dir_ + "/" + ids_[i] + ".db"; }
  void Start(size_t i) {
    auto p = ServerProcess::Start(ids_[i], Args(i));
    ASSERT_OK(p);
    servers_[i] = std::move(p).value();
  }
  void Stop(size_t i) { ASSERT_EQ(servers_[i]->KillAndWait(SIGTERM), 0) << "a clean exit on SIGTERM"; }
  std::string Members() const {
    std::vector<std::string> a;
    for (const auto& s : servers_) a.push_back(s->address());
    return absl::StrJoin(a, ",");
  }
  std::string Ctl(const std::string& rest) const {
    return absl::StrCat("--members ", Members(), " --timeout-ms 5000 ", rest);
  }

  std::string dir_;
  std::vector<std::string> ids_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
};

TEST_F(KvtierctlVerifyTest, BlocksCorruptedOnDiskAreReportedAndVerifyExitsFour) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 60, 21);
  ASSERT_OK(p);
  {
    // Batches of 4 blocks, each committed before the next: puts stream through the small host tiers.
    std::vector<std::string> members;
    for (const auto& s : servers_) members.push_back(s->address());
    auto c = client::Client::Connect({.members = members, .put_batch_blocks = 4});
    ASSERT_OK(c);
    ASSERT_OK(testing::PutPrompt(**c, ns, *p));
  }
  // One block on disk of each of ver-b and ver-c.
  std::vector<size_t> victims;  // prompt index, for ver-b then ver-c
  for (size_t i : {size_t{1}, size_t{2}}) {
    const CtlResult r = RunCtl(Ctl(absl::StrCat("ls --json --limit 0 --tier disk --node ", ids_[i])));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json j = ParseJson(r.output);
    ASSERT_FALSE(j.is_discarded()) << r.output;
    ASSERT_GT(j["count"].get<int>(), 0) << ids_[i] << " demoted nothing: " << r.output;
    const std::string hex = j["blocks"][0]["fingerprint"].get<std::string>();
    auto it = std::find_if(p->fps.begin(), p->fps.end(), [&](const Fingerprint& f) { return f.Hex() == hex; });
    ASSERT_NE(it, p->fps.end());
    victims.push_back(static_cast<size_t>(it - p->fps.begin()));
  }

  for (size_t k = 0; k < 2; ++k) {
    const size_t i = k + 1;
    ASSERT_NO_FATAL_FAILURE(Stop(i));
    // RocksDB writes blob files when it flushes a memtable; what was still only in the write-ahead log
    // gets flushed when the database is opened again. So: one restart, if the payload is not there yet.
    int flipped = FlipPayloadByte(DiskPath(i), p->data[victims[k]]);
    if (flipped == 0) {
      ASSERT_NO_FATAL_FAILURE(Start(i));
      ASSERT_NO_FATAL_FAILURE(Stop(i));
      flipped = FlipPayloadByte(DiskPath(i), p->data[victims[k]]);
    }
    ASSERT_GT(flipped, 0) << "block " << victims[k] << "'s payload is in no blob file of " << DiskPath(i);
    ASSERT_NO_FATAL_FAILURE(Start(i));
  }

  // ver-b alone, as a table: exit 4, the block named.
  const std::string b_hex = p->fps[victims[0]].Hex();
  const std::string c_hex = p->fps[victims[1]].Hex();
  const CtlResult b = RunCtl(Ctl("verify --node ver-b"), /*with_stderr=*/true);
  EXPECT_EQ(b.exit_code, 4) << b.output;
  EXPECT_NE(b.output.find("CORRUPT"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("ver-b: corrupt " + b_hex), std::string::npos) << b.output;

  // The whole cluster, as JSON: ver-b's block is gone (verify dropped it), ver-c's is reported.
  const CtlResult all = RunCtl(Ctl("verify --json"));
  EXPECT_EQ(all.exit_code, 4) << all.output;
  const nlohmann::json j = ParseJson(all.output);
  ASSERT_FALSE(j.is_discarded()) << all.output;
  EXPECT_EQ(j["totals"]["corrupt"].get<int>(), 1) << all.output;
  EXPECT_EQ(j["totals"]["members_verified"].get<int>(), 3);
  for (const auto& m : j["members"]) {
    if (m["node_id"] == "ver-c") {
      EXPECT_EQ(m["corrupt_fingerprints"], nlohmann::json::array({c_hex})) << m;
    } else {
      EXPECT_EQ(m["corrupt"].get<int>(), 0) << m;
    }
  }
  // Dropped, counted, and never served: a worker misses them; a new scrub is clean.
  EXPECT_EQ(RunCtl(Ctl("inspect " + b_hex)).exit_code, 1);
  EXPECT_EQ(RunCtl(Ctl("inspect " + c_hex)).exit_code, 1);
  const CtlResult stats = RunCtl(Ctl("stats --json"));
  EXPECT_EQ(ParseJson(stats.output)["totals"]["disk_checksum_failures"].get<int>(), 2) << stats.output;
  const CtlResult again = RunCtl(Ctl("verify --json"));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(ParseJson(again.output)["totals"]["corrupt"].get<int>(), 0) << again.output;
}

}  // namespace
}  // namespace kvtier
