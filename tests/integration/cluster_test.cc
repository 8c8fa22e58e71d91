// A 3-process cluster on loopback: placement over all owners, replay through the real client, a server
// killed mid-replay, and hit counters that agree between client and servers.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "replayer.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"
#include "workload.h"

namespace kvtier {
namespace {

using testing::ServerProcess;

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 1; i <= 3; ++i) {
      auto p = ServerProcess::Start("node-" + std::to_string(i));
      ASSERT_OK(p);
      members_.push_back((*p)->address());
      procs_.push_back(std::move(p).value());
    }
    auto c = client::Client::Connect({.members = members_, .rpc_timeout = absl::Milliseconds(1000)});
    ASSERT_OK(c);
    client_ = std::move(c).value();
  }

  v1::GetStatsResponse Stats(int i) {
    auto stub = v1::AdminService::NewStub(grpc::CreateChannel(members_[i], grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::GetStatsResponse resp;
    EXPECT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok());
    return resp;
  }

  std::vector<std::string> members_;
  std::vector<std::unique_ptr<ServerProcess>> procs_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(ClusterTest, ConnectRefusesAMemberWhosePortIsOutOfRange) {
  // A port 65536 above a live server's would reach it if it were taken modulo 2^16.
  const std::string wrapped = absl::StrCat("127.0.0.1:", procs_[0]->grpc_port() + 65536);
  for (const std::string& member : {wrapped, std::string("127.0.0.1:-1"), "node-9=" + wrapped}) {
    auto c = client::Client::Connect({.members = {member}, .connect_timeout = absl::Seconds(2)});
    ASSERT_FALSE(c.ok()) << member;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_NE(c.status().message().find(member), std::string::npos) << c.status();
  }
}

TEST_F(ClusterTest, LookupOfBlocksSpanningAllOwnersIsOneQueryPerOwner) {
  bench::ReplayOptions ro{.block_tokens = 16, .block_bytes = 2 * 16 * 2 * 64};
  auto ns = bench::ReplayNamespace(ro);
  ASSERT_OK(ns);
  std::vector<uint32_t> tokens(64 * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 13 % 50000);
  auto fps = ChainFingerprints(*ns, tokens);
  ASSERT_OK(fps);
  std::set<uint32_t> owners;
  for (const auto& fp : *fps) owners.insert(client_->ring().Primary(fp));
  ASSERT_EQ(owners.size(), 3u) << "64 blocks should land on all three members";

  std::vector<std::vector<std::byte>> data(fps->size(), std::vector<std::byte>(ro.block_bytes));
  std::vector<std::span<const std::byte>> views;
  for (size_t i = 0; i < data.size(); ++i) {
    bench::BlockPayload(i, data[i]);
    views.emplace_back(data[i]);
  }
  auto put = client_->Put(*ns, *fps, 0, views);
  ASSERT_OK(put);
  for (auto r : *put) EXPECT_EQ(r, client::PutResult::kStored);
  auto look = client_->LookupPrefix(*ns, *fps);
  ASSERT_OK(look);
  EXPECT_EQ(look->prefix_blocks, 64u);
  uint64_t requests = 0, blocks = 0;
  for (int i = 0; i < 3; ++i) {
    const auto s = Stats(i);
    EXPECT_EQ(s.lookup_requests(), 1u) << "one batched query per owner";
    requests += s.lookup_requests();
    blocks += s.lookup_blocks_hit();
    EXPECT_GT(s.committed_blocks(), 0u);
  }
  EXPECT_EQ(requests, 3u);
  EXPECT_EQ(blocks, 64u);
}

TEST_F(ClusterTest, ReplayCountersAgreeBetweenClientAndServers) {
  auto requests = bench::SyntheticWorkload({.sessions = 40, .max_turns = 5, .block_tokens = 64});
  bench::ReplayOptions ro{.block_tokens = 64, .block_bytes = 2 * 64 * 2 * 32, .capacity_blocks = 1'000'000};
  auto rep = bench::Replay(*client_, requests, ro);
  ASSERT_OK(rep);
  EXPECT_EQ(rep->payload_mismatches, 0u);
  EXPECT_EQ(rep->client_errors, 0u);
  EXPECT_EQ(rep->misses_from_errors, 0u);
  // Nothing is evicted (64 MiB per server), so the cluster matches an infinite reference cache exactly.
  EXPECT_EQ(rep->hit_blocks, rep->lru_sim_hit_blocks);
  EXPECT_GT(rep->block_hit_ratio(), 0.3);
  const client::ClientStats& cs = client_->stats();
  EXPECT_LE(cs.prefix_hit_blocks.load(), cs.lookup_blocks.load());
  EXPECT_LE(cs.retrieve_hit_blocks.load(), cs.get_blocks.load());
  EXPECT_EQ(cs.prefix_hit_blocks.load(), rep->lookup_prefix_blocks);
  EXPECT_EQ(cs.retrieve_hit_blocks.load(), rep->hit_blocks);
  uint64_t lookup_blocks = 0, read_blocks = 0, read_bytes = 0, committed = 0;
  for (int i = 0; i < 3; ++i) {
    const auto s = Stats(i);
    lookup_blocks += s.lookup_blocks_hit() + s.lookup_blocks_miss();
    read_blocks += s.read_blocks();
    read_bytes += s.read_bytes();
    committed += s.committed_blocks();
  }
  EXPECT_EQ(lookup_blocks, cs.lookup_blocks.load());  // each block asked of exactly one owner
  EXPECT_EQ(read_blocks, cs.retrieve_hit_blocks.load());
  EXPECT_EQ(read_bytes, rep->bytes_fetched);
  EXPECT_EQ(committed, cs.put_stored_blocks.load());
}

TEST_F(ClusterTest, ServerKilledDuringReplayTurnsIntoCountedMissesNeverErrorsOrWrongBytes) {
  auto requests = bench::SyntheticWorkload({.sessions = 60, .max_turns = 6, .block_tokens = 64});
  ASSERT_GT(requests.size(), 100u);
  bench::ReplayOptions ro{.block_tokens = 64, .block_bytes = 2 * 64 * 2 * 32};
  const size_t kill_at = requests.size() / 2;
  ro.after_request = [&](size_t r) {
    if (r == kill_at) procs_[1]->KillAndWait(SIGKILL);
  };
  auto rep = bench::Replay(*client_, requests, ro);
  ASSERT_OK(rep);
  EXPECT_EQ(rep->requests, requests.size());
  EXPECT_EQ(rep->payload_mismatches, 0u);
  EXPECT_EQ(rep->client_errors, 0u);
  EXPECT_GT(rep->misses_from_errors, 0u);
  EXPECT_GT(rep->put_errors, 0u);
  EXPECT_GT(rep->hit_blocks, 0u);
  // A dead owner fails fast (connection refused), far inside the 1 s deadline.
  EXPECT_LT(rep->lookup_ms.max, 1000.0 + 200.0);
  EXPECT_EQ(client_->stats().misses_from_errors.load(), rep->misses_from_errors);
}

TEST_F(ClusterTest, TraceReplayBinaryReplaysTheChatTraceSlice) {
  const std::string trace = testing::SourceDir() + "/../shared/data/conversation_trace.jsonl";
  std::string cmd = testing::BinaryDir() +
                    "/bench/trace_replay/trace_replay --json --limit=300 --capacity_blocks=3000 " +
                    "--members=" + members_[0] + "," + members_[1] + "," + members_[2];
  if (FILE* f = std::fopen(trace.c_str(), "r"); f != nullptr) {
    std::fclose(f);
    cmd += " --trace=" + trace;
  }
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  ASSERT_EQ(pclose(p), 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["requests"].get<uint64_t>(), 300u);
  EXPECT_EQ(j["payload_mismatches"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["client_errors"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["misses_from_errors"].get<uint64_t>(), 0u);
  EXPECT_GT(j["block_hit_ratio"].get<double>(), 0.0);
  EXPECT_LE(j["block_hit_ratio"].get<double>(), j["lru_sim_hit_ratio"].get<double>() + 0.05);
  for (const char* k : {"token_hit_ratio", "lookup_latency_ms", "get_latency_ms", "put_latency_ms", "blocks",
                        "capacity_blocks", "ttft_estimate_s"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
}

}  // namespace
}  // namespace kvtier
