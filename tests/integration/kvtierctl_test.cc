// kvtierctl as a real process against a real 3-process cluster: status (table and JSON), stats after
// puts and lookups made with the client library, ls, inspect, lookup, evict, drain, verify, a killed
// member, and usage errors. (Corruption found by verify: kvtierctl_verify_test.cc.)
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtierctl_runner.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::CtlResult;
using testing::ParseJson;
using testing::RunCtl;
using testing::ServerProcess;

constexpr uint64_t kHostCacheBytes = 64ULL << 20;  // what ServerProcess gives each server

Namespace TestNamespace() {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "llama-ctl";
  ns.layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64, .block_tokens = 16};
  return ns;
}

class KvtierctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* id : {"ctl-a", "ctl-b", "ctl-c"}) {
      auto p = ServerProcess::Start(id);
      ASSERT_OK(p);
      servers_.push_back(std::move(p).value());
    }
  }

  std::string Members() const {
    std::vector<std::string> addrs;
    for (const auto& s : servers_) addrs.push_back(s->address());
    return absl::StrJoin(addrs, ",");
  }
  // Global options every call uses; a generous deadline, since the 2-core CI machine is shared.
  std::string Ctl(const std::string& rest) const {
    return absl::StrCat("--members ", Members(), " --timeout-ms 5000 ", rest);
  }

  std::vector<std::unique_ptr<ServerProcess>> servers_;
};

TEST_F(KvtierctlTest, StatusListsEveryMemberAndExitsZero) {
  const CtlResult r = RunCtl(Ctl("status"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const auto& s : servers_) {
    EXPECT_NE(r.output.find(s->node_id()), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(s->address()), std::string::npos) << r.output;
  }
  EXPECT_NE(r.output.find("SERVING"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("0 B / 64.0 MiB"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("3/3 members up"), std::string::npos) << r.output;

  // The member list may come from KVTIER_MEMBERS instead of --members.
  const std::string cmd =
      absl::StrCat("KVTIER_MEMBERS=", Members(), " ", testing::BinaryDir(), "/cli/kvtierctl status >/dev/null 2>&1");
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(KvtierctlTest, StatusJsonHasRingSharesSummingToOneAndTheClustersCapacity) {
  const CtlResult r = RunCtl(Ctl("status --json"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  ASSERT_EQ(j["members"].size(), 3u) << r.output;
  double shares = 0;
  std::set<std::string> ids;
  for (const auto& m : j["members"]) {
    EXPECT_EQ(m["health"], "SERVING");
    EXPECT_TRUE(m["up"].get<bool>());
    ids.insert(m["node_id"].get<std::string>());
    const double share = m["ring_share"].get<double>();
    EXPECT_GT(share, 0.2) << "1024 virtual nodes keep 3 members near 1/3 each";
    shares += share;
    ASSERT_EQ(m["tiers"].size(), 1u);
    EXPECT_EQ(m["tiers"][0]["tier"], "host");
    EXPECT_EQ(m["tiers"][0]["capacity_bytes"].get<uint64_t>(), kHostCacheBytes);
  }
  EXPECT_NEAR(shares, 1.0, 1e-9);
  EXPECT_EQ(ids, (std::set<std::string>{"ctl-a", "ctl-b", "ctl-c"}));
  EXPECT_EQ(j["totals"]["capacity_bytes"].get<uint64_t>(), 3 * kHostCacheBytes);
  EXPECT_EQ(j["totals"]["used_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["totals"]["members_up"].get<int>(), 3);
  EXPECT_EQ(j["totals"]["members_total"].get<int>(), 3);
}

TEST_F(KvtierctlTest, StatsJsonCountsThePutsReadsAndLookupsMade) {
  std::vector<std::string> addrs;
  for (const auto& s : servers_) addrs.push_back(s->address());
  auto client = client::Client::Connect({.members = addrs});
  ASSERT_OK(client);
  const Namespace ns = TestNamespace();
  constexpr size_t kBlocks = 24;
  std::vector<uint32_t> tokens(kBlocks * ns.layout.block_tokens);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i * 13 + 1;
  auto fps = ChainFingerprints(ns, tokens);
  ASSERT_OK(fps);
  const uint64_t size = ns.layout.ShardBytes();
  std::vector<std::vector<std::byte>> data(kBlocks, std::vector<std::byte>(size, std::byte{7}));
  std::vector<std::span<const std::byte>> in(data.begin(), data.end());
  auto put = (*client)->Put(ns, *fps, 0, in);
  ASSERT_OK(put);
  for (client::PutResult p : *put) ASSERT_EQ(p, client::PutResult::kStored);

  // One lookup of all the blocks (hits), one of 5 blocks nobody stored (misses); each sends one request
  // per owner of its blocks.
  std::vector<uint32_t> other(5 * ns.layout.block_tokens, 99);
  auto absent = ChainFingerprints(ns, other);
  ASSERT_OK(absent);
  auto owners = [&](const std::vector<Fingerprint>& f) {
    std::set<uint32_t> o;
    for (const Fingerprint& fp : f) o.insert((*client)->ring().Primary(fp));
    return o.size();
  };
  ASSERT_OK((*client)->LookupPrefix(ns, *fps));
  ASSERT_OK((*client)->LookupPrefix(ns, *absent));
  const uint64_t expected_lookup_requests = owners(*fps) + owners(*absent);
  // Read the first 4 blocks back.
  std::vector<std::vector<std::byte>> out(4, std::vector<std::byte>(size));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto got = (*client)->Get(ns, std::span<const Fingerprint>(*fps).first(4), 0, views);
  ASSERT_OK(got);
  for (client::GetResult g : *got) ASSERT_EQ(g, client::GetResult::kHit);

  const CtlResult r = RunCtl(Ctl("stats --json"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  const nlohmann::json& t = j["totals"];
  EXPECT_EQ(t["committed_blocks"].get<uint64_t>(), kBlocks);
  EXPECT_EQ(t["committed_bytes"].get<uint64_t>(), kBlocks * size);
  EXPECT_EQ(t["lookup_requests"].get<uint64_t>(), expected_lookup_requests);
  EXPECT_EQ(t["lookup_blocks_hit"].get<uint64_t>(), kBlocks);
  EXPECT_EQ(t["lookup_blocks_miss"].get<uint64_t>(), 5u);
  EXPECT_NEAR(t["existence_hit_ratio"].get<double>(), 24.0 / 29.0, 1e-9);
  EXPECT_EQ(t["read_blocks"].get<uint64_t>(), 4u);
  EXPECT_EQ(t["read_bytes"].get<uint64_t>(), 4 * size);
  EXPECT_EQ(t["members_answered"].get<int>(), 3);
  // The generic list (GetStatsResponse.counters), summed: it agrees with the typed fields.
  ASSERT_TRUE(t["counters"].is_object()) << r.output;
  EXPECT_EQ(t["counters"]["kvtier_committed_blocks_total"].get<uint64_t>(), kBlocks);
  EXPECT_EQ(t["counters"]["kvtier_read_bytes_total"].get<uint64_t>(), 4 * size);
  EXPECT_EQ(t["counters"]["kvtier_lookup_blocks_total{result=\"miss\"}"].get<uint64_t>(), 5u);
  EXPECT_TRUE(t["counters"].contains("kvtier_quota_evictions_total")) << r.output;
  for (const auto& m : j["members"]) {
    EXPECT_EQ(m["counters"].size(), t["counters"].size()) << m["node_id"];
  }
  // --counters prints them as a table, a row per sample.
  const CtlResult all = RunCtl(Ctl("stats --counters"));
  EXPECT_EQ(all.exit_code, 0) << all.output;
  EXPECT_NE(all.output.find("kvtier_committed_blocks_total"), std::string::npos) << all.output;
  EXPECT_NE(all.output.find("kvtier_lookup_blocks_total{result=\"miss\"}"), std::string::npos) << all.output;

  // Each member counts the blocks the ring gives it.
  ASSERT_EQ(j["members"].size(), 3u);
  uint64_t sum = 0;
  for (const auto& m : j["members"]) {
    const std::string id = m["node_id"].get<std::string>();
    uint64_t owned = 0;
    for (const Fingerprint& fp : *fps) owned += (*client)->ring().node_ids()[(*client)->ring().Primary(fp)] == id;
    EXPECT_EQ(m["committed_blocks"].get<uint64_t>(), owned) << id;
    sum += m["committed_blocks"].get<uint64_t>();
  }
  EXPECT_EQ(sum, kBlocks);

  // The table shows the same totals.
  const CtlResult table = RunCtl(Ctl("stats"));
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("TOTAL"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("0.828"), std::string::npos) << table.output;  // 24 / 29
}

TEST_F(KvtierctlTest, StatsWithAnIntervalReportsPerSecondRates) {
  const CtlResult r = RunCtl(Ctl("stats --interval-s 0.2 --json"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_GE(j["interval_s"].get<double>(), 0.2);
  EXPECT_EQ(j["totals"]["rates"]["committed_blocks_per_s"].get<double>(), 0.0);
  for (const auto& m : j["members"]) EXPECT_TRUE(m["rates"].is_object()) << m;
}

TEST_F(KvtierctlTest, StatusExitsThreeAndShowsAKilledMemberUnreachable) {
  const std::string dead_address = servers_[1]->address();
  servers_[1]->KillAndWait(SIGKILL);

  const CtlResult r = RunCtl(Ctl("status"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("ctl-a"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ctl-c"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ctl-b"), std::string::npos) << r.output;  // nobody reports that id now
  EXPECT_NE(r.output.find(dead_address), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("unreachable"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2/3 members up"), std::string::npos) << r.output;

  const CtlResult rj = RunCtl(Ctl("status --json"));
  EXPECT_EQ(rj.exit_code, 3) << rj.output;
  const nlohmann::json j = ParseJson(rj.output);
  ASSERT_FALSE(j.is_discarded()) << rj.output;
  double shares = 0;
  for (const auto& m : j["members"]) {
    if (m["address"] == dead_address) {
      EXPECT_EQ(m["health"], "unreachable");
      EXPECT_FALSE(m["up"].get<bool>());
      EXPECT_TRUE(m["node_id"].is_null());
      EXPECT_TRUE(m["ring_share"].is_null());
    } else {
      shares += m["ring_share"].get<double>();
    }
  }
  EXPECT_NEAR(shares, 1.0, 1e-9);  // the ring of the members that answered
  EXPECT_EQ(j["totals"]["members_up"].get<int>(), 2);
  EXPECT_EQ(j["totals"]["capacity_bytes"].get<uint64_t>(), 2 * kHostCacheBytes);

  const CtlResult stats = RunCtl(Ctl("stats --json"));
  EXPECT_EQ(stats.exit_code, 3) << stats.output;
  const nlohmann::json sj = ParseJson(stats.output);
  ASSERT_FALSE(sj.is_discarded()) << stats.output;
  EXPECT_EQ(sj["totals"]["members_answered"].get<int>(), 2);
}

TEST_F(KvtierctlTest, LsRefusesAMalformedCursor) {
  for (const char* cursor : {":", "0:", ":0", "0:99999999999999999999", "99999999999999999999:0", "0:1x", "-1:0"}) {
    const CtlResult r = RunCtl(Ctl(absl::StrCat("ls --cursor '", cursor, "'")), /*with_stderr=*/true);
    EXPECT_EQ(r.exit_code, 2) << cursor << ": " << r.output;
    EXPECT_NE(r.output.find("--cursor"), std::string::npos) << r.output;
  }
  EXPECT_EQ(RunCtl(Ctl("ls --cursor 0:0")).exit_code, 0);
}

TEST_F(KvtierctlTest, MembersMayCarryTheirNodeIds) {
  std::vector<std::string> specs;
  for (const auto& s : servers_) specs.push_back(absl::StrCat(s->node_id(), "=", s->address()));
  const CtlResult r = RunCtl(absl::StrCat("--members ", absl::StrJoin(specs, ","), " --timeout-ms 5000 status --json"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  for (const auto& m : j["members"]) EXPECT_TRUE(m["ring_share"].is_number()) << m;
}

// Runs kvtierctl expecting a usage error (exit 2) whose message contains `want`.
void ExpectUsageError(const std::string& args, const std::string& want) {
  const CtlResult r = RunCtl(args, /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(want), std::string::npos) << args << "\n" << r.output;
}

TEST(KvtierctlUsageTest, AMemberPortOutOfRangeOrAnEmptyHostIsNamed) {
  for (const char* bad :
       {"127.0.0.1:100403", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:0", "127.0.0.1:8x", ":80", "127.0.0.1:"}) {
    ExpectUsageError(absl::StrCat("--members 127.0.0.1:1,", bad, " status"), absl::StrCat("\"", bad, "\""));
  }
  ExpectUsageError("--members =127.0.0.1:80 status", "empty node id");
  // The same check for $KVTIER_MEMBERS.
  const std::string cmd =
      absl::StrCat("KVTIER_MEMBERS=127.0.0.1:100403 ", testing::BinaryDir(), "/cli/kvtierctl status >/dev/null 2>&1");
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

TEST(KvtierctlUsageTest, AnEmptyMemberListAndAnUnknownSubcommandAreNamed) {
  ExpectUsageError("--members ,,, status", "empty member list");
  ExpectUsageError("--members 127.0.0.1:1 bogus", "unknown subcommand \"bogus\"");
}

TEST(KvtierctlUsageTest, SecondsMustBeFinite) {
  ExpectUsageError("--members 127.0.0.1:1 stats --interval-s nan", "--interval-s");
  ExpectUsageError("--members 127.0.0.1:1 stats --interval-s inf", "--interval-s");
  ExpectUsageError("--members 127.0.0.1:1 verify --deadline-s nan", "--deadline-s");
}

TEST(KvtierctlUsageTest, TraceLineInputLengthMustFitAUint32) {
  for (const char* n : {"99999999999", "-5", "1.5", "\"7\""}) {
    ExpectUsageError(absl::StrCat("--members 127.0.0.1:1 lookup --replay-namespace --trace-line "
                                  "'{\"hash_ids\": [1], \"input_length\": ",
                                  n, "}'"),
                     "input_length");
  }
}

TEST(KvtierctlUsageTest, ATraceLineOfMoreTokensThanLookupTakesIsRefusedBeforeAllocating) {
  // One hash id of 2^32-1 tokens: 16 GiB of token ids if made.
  ExpectUsageError(
      "--members 127.0.0.1:1 lookup --tenant t --model m --num-layers 1 --kv-heads 1 --head-dim 1 "
      "--block-tokens 4294967295 --trace-line '{\"hash_ids\": [1]}'",
      "16777216 tokens");
  // 32769 hash ids of 512 tokens (--replay-namespace): 512 tokens more than the bound.
  std::vector<std::string> ids(32769, "0");
  ExpectUsageError(absl::StrCat("--members 127.0.0.1:1 lookup --replay-namespace --trace-line '{\"hash_ids\": [",
                                absl::StrJoin(ids, ","), "]}'"),
                   "16777216 tokens");
}

TEST(KvtierctlUsageTest, ReplayNamespaceWithZeroBlockTokensNamesTheFlag) {
  ExpectUsageError(
      "--members 127.0.0.1:1 lookup --replay-namespace --block-tokens 0 --trace-line '{\"hash_ids\": [1]}'",
      "--block-tokens: must be > 0");
}

TEST(KvtierctlUsageTest, AnUnreadableTlsFileIsAUsageError) {
  ExpectUsageError("--members 127.0.0.1:1 --tls-ca-file /nonexistent/ca.pem status", "/nonexistent/ca.pem");
}

TEST(KvtierctlUsageTest, BadFlagsExitTwo) {
  EXPECT_EQ(RunCtl("--members 127.0.0.1:1 status --no-such-flag").exit_code, 2);
  EXPECT_EQ(RunCtl("--members 127.0.0.1:1").exit_code, 2);  // no subcommand
  EXPECT_EQ(RunCtl("status").exit_code, 2);                 // no members
  EXPECT_EQ(RunCtl("--members not-an-address status").exit_code, 2);
  EXPECT_EQ(RunCtl("--members 127.0.0.1:1 --timeout-ms 0 status").exit_code, 2);
  EXPECT_EQ(RunCtl("--members 127.0.0.1:1 stats --interval-s -1").exit_code, 2);
  const CtlResult help = RunCtl("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("Exit codes"), std::string::npos) << help.output;
}

}  // namespace
}  // namespace kvtier
