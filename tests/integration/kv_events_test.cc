// KV events end to end: three kvtier-server processes publish while a workload runs through the client
// library; subscribers that follow from the start, join late, or stall and miss messages all rebuild an
// index equal to what the servers list (Admin ListBlocks).
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "kvtier/client/client.h"
#include "kvtier/client/event_subscriber.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/v1/events.grpc.pb.h"
#include "replayer.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::ServerProcess;
using BlockSet = std::map<std::tuple<std::string, uint32_t>, std::string>;  // (fp hex, shard) -> tier

constexpr int kBlocksPerPrompt = 8;
constexpr uint32_t kReplayBufferEvents = 256;

class KvEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvtier-events-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    config_ = std::string(dir) + "/server.yaml";
    std::ofstream(config_) << "events:\n"
                              "  enabled: true\n"
                              "  pub_endpoint: tcp://127.0.0.1:0\n"
                              "  replay_buffer_events: "
                           << kReplayBufferEvents
                           << "\n"
                              "  max_batch_events: 32\n"
                              "  heartbeat_interval: 100ms\n";
    for (int i = 1; i <= 3; ++i) {
      // 1 MiB of 4 KiB blocks per server: 256 blocks, so the workload evicts.
      auto p = ServerProcess::Start("node-" + std::to_string(i), {"--config=" + config_, "--host_cache_bytes=1MiB",
                                                                  "--slab_bytes=1MiB", "--max_block_bytes=1MiB"});
      ASSERT_OK(p);
      members_.push_back((*p)->address());
      procs_.push_back(std::move(p).value());
    }
    auto c = client::Client::Connect({.members = members_, .rpc_timeout = absl::Milliseconds(2000)});
    ASSERT_OK(c);
    client_ = std::move(c).value();
    auto ns = bench::ReplayNamespace(ro_);
    ASSERT_OK(ns);
    ns_ = *ns;
  }

  void TearDown() override { std::remove(config_.c_str()); }

  // Puts `prompts` prompts of kBlocksPerPrompt blocks; a prompt shares its first half with the previous
  // prompt half of the time (so puts also meet blocks already present), and reads half of them back.
  void Workload(int prompts) {
    for (int p = 0; p < prompts; ++p) {
      std::vector<uint32_t> tokens(kBlocksPerPrompt * ro_.block_tokens);
      for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<uint32_t>(rng_() % 50000);
      if (p % 2 == 1) std::copy(last_tokens_.begin(), last_tokens_.begin() + tokens.size() / 2, tokens.begin());
      last_tokens_ = tokens;
      auto fps = ChainFingerprints(ns_, tokens);
      ASSERT_OK(fps);
      std::vector<std::vector<std::byte>> data(fps->size(), std::vector<std::byte>(ro_.block_bytes));
      std::vector<std::span<const std::byte>> views;
      for (size_t i = 0; i < data.size(); ++i) {
        bench::BlockPayload(next_id_++, data[i]);
        views.emplace_back(data[i]);
      }
      ASSERT_OK(client_->Put(ns_, *fps, 0, views));
      if (p % 2 == 0) {
        std::vector<std::vector<std::byte>> out(fps->size(), std::vector<std::byte>(ro_.block_bytes));
        std::vector<std::span<std::byte>> dst;
        for (auto& o : out) dst.emplace_back(o);
        ASSERT_OK(client_->Get(ns_, *fps, 0, dst));
      }
    }
  }

  // What server i holds, paged through Admin ListBlocks as kvtierctl ls does.
  BlockSet Listed(int i) {
    auto stub = v1::AdminService::NewStub(grpc::CreateChannel(members_[i], grpc::InsecureChannelCredentials()));
    BlockSet out;
    uint64_t cursor = 0;
    do {
      v1::ListBlocksRequest req;
      req.set_cursor(cursor);
      req.set_limit(1000);
      v1::ListBlocksResponse resp;
      grpc::ClientContext ctx;
      const grpc::Status s = stub->ListBlocks(&ctx, req, &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      for (const auto& b : resp.blocks()) {
        Fingerprint fp;
        std::copy(b.fingerprint().begin(), b.fingerprint().end(), reinterpret_cast<char*>(fp.bytes.data()));
        out[{fp.Hex(), b.shard()}] = b.tier();
      }
      cursor = resp.next_cursor();
    } while (cursor != 0);
    return out;
  }

  static BlockSet Indexed(const client::EventSubscriber& sub, const std::string& node) {
    BlockSet out;
    for (const auto& b : sub.BlocksOf(node)) out[{b.key.fingerprint.Hex(), b.key.shard}] = b.tier;
    return out;
  }

  v1::GetEventsInfoResponse EventsInfo(int i) {
    auto stub = v1::EventService::NewStub(grpc::CreateChannel(members_[i], grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::GetEventsInfoResponse resp;
    EXPECT_TRUE(stub->GetEventsInfo(&ctx, v1::GetEventsInfoRequest(), &resp).ok());
    return resp;
  }

  std::unique_ptr<client::EventSubscriber> Subscribe() {
    auto s = client::EventSubscriber::Start({.members = members_, .retry_interval = absl::Milliseconds(200)});
    EXPECT_OK(s);
    return s.ok() ? std::move(s).value() : nullptr;
  }

  bench::ReplayOptions ro_{.block_tokens = 16, .block_bytes = 2 * 16 * 2 * 64};
  Namespace ns_;
  std::string config_;
  std::vector<std::string> members_;
  std::vector<std::unique_ptr<ServerProcess>> procs_;
  std::unique_ptr<client::Client> client_;
  std::mt19937_64 rng_{20240611};
  std::vector<uint32_t> last_tokens_;
  uint64_t next_id_ = 1;
};

TEST_F(KvEventsTest, EarlyLateAndStalledSubscribersRebuildTheServersBlockLists) {
  auto early = Subscribe();
  auto stalled = Subscribe();
  ASSERT_NE(early, nullptr);
  ASSERT_NE(stalled, nullptr);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(EventsInfo(i).pub_endpoint().rfind("tcp://127.0.0.1:", 0), 0u);

  Workload(10);
  ASSERT_OK(stalled->WaitForCatchUp(absl::Seconds(10)));

  // A short stall: the missed events are still in every server's replay buffer.
  const client::EventSubscriberStats before_short = stalled->stats();
  stalled->Pause();
  Workload(2);
  stalled->Resume();
  ASSERT_OK(stalled->WaitForCatchUp(absl::Seconds(10)));
  const client::EventSubscriberStats after_short = stalled->stats();
  EXPECT_GT(after_short.gaps, before_short.gaps);
  EXPECT_GT(after_short.replays, before_short.replays);
  EXPECT_EQ(after_short.snapshots, before_short.snapshots);

  // A long stall: each server numbers far more events than its buffer holds, so catching up needs a
  // snapshot.
  const uint64_t seq_before = EventsInfo(0).last_seq();
  stalled->Pause();
  Workload(200);
  ASSERT_GT(EventsInfo(0).last_seq() - seq_before, kReplayBufferEvents + 64);
  stalled->Resume();
  ASSERT_OK(stalled->WaitForCatchUp(absl::Seconds(10)));
  const client::EventSubscriberStats after_long = stalled->stats();
  EXPECT_GT(after_long.snapshots, after_short.snapshots);

  // A late subscriber: seq 1 left the buffers long ago, so it starts from snapshots.
  auto late = Subscribe();
  ASSERT_NE(late, nullptr);
  EXPECT_GE(late->stats().snapshots, 3u);

  // An operator's evict-all on node-2 is one AllBlocksCleared; then more work.
  {
    auto stub = v1::AdminService::NewStub(grpc::CreateChannel(members_[1], grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::EvictRequest req;
    req.set_all(true);
    v1::EvictResponse resp;
    ASSERT_TRUE(stub->Evict(&ctx, req, &resp).ok());
    EXPECT_GT(resp.evicted(), 0u);
  }
  Workload(10);

  for (auto* sub : {early.get(), stalled.get(), late.get()}) {
    ASSERT_OK(sub->WaitForCatchUp(absl::Seconds(10)));
    for (int i = 0; i < 3; ++i) {
      const std::string node = "node-" + std::to_string(i + 1);
      const BlockSet listed = Listed(i);
      EXPECT_GT(listed.size(), 10u) << node;  // node-2 holds only what came after its evict-all
      EXPECT_EQ(Indexed(*sub, node), listed) << node;
    }
    for (const auto& n : sub->Nodes()) EXPECT_TRUE(n.synced) << n.node_id;
    EXPECT_EQ(sub->stats().decode_errors, 0u);
    EXPECT_EQ(sub->stats().catch_up_failures, 0u);
  }
  // The subscriber from the start never needed a snapshot: the stream and its replays sufficed.
  EXPECT_EQ(early->stats().snapshots, 0u);

  // The router query: the last prompt's blocks are all found, each on the node that holds it.
  auto fps = ChainFingerprints(ns_, last_tokens_);
  ASSERT_OK(fps);
  size_t located = 0;
  for (const Fingerprint& fp : *fps) located += early->NodesHolding(BlockKey{.fingerprint = fp}).size();
  EXPECT_EQ(located, fps->size());
}

}  // namespace
}  // namespace kvtier
