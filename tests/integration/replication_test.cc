// Replication against a real 3-process cluster: a put reaches all R owners (checked on each server with
// the admin InspectBlock RPC), reads fail over when the primary is killed, hinted handoff reaches an
// owner that was stopped (SIGSTOP) when it resumes, and hot blocks' reads spread over their owners.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/hash_ring.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::ServerProcess;

Namespace ReplNamespace(const std::string& model = "repl-test") {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = model;
  ns.layout = {.kind = LayoutKind::kMla,
               .dtype = DType::kFp8E4m3,
               .num_layers = 1,
               .latent_dim = 512,
               .block_tokens = 1,
               .tp_size = 1};
  return ns;
}

std::vector<Fingerprint> ReplChain(const Namespace& ns, size_t n, uint32_t seed) {
  std::vector<uint32_t> tokens(n * ns.layout.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 2654435761u) ^ seed) % 32000;
  auto fps = ChainFingerprints(ns, tokens);
  EXPECT_TRUE(fps.ok());
  return fps.ok() ? *fps : std::vector<Fingerprint>{};
}

// Bytes derived from the fingerprint, so any mix-up of blocks shows.
std::vector<std::byte> ReplPayload(const Fingerprint& fp, uint64_t size) {
  std::vector<std::byte> b(size);
  uint64_t x = fp.RingPosition() | 1;
  for (uint64_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b[i] = static_cast<std::byte>(x);
  }
  return b;
}

// Polls `done` every 50 ms for at most `limit`; true when it became true.
template <typename Fn>
bool WaitFor(Fn done, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

class ReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Reservations of puts that timed out against a stopped server expire in 2 s rather than 30 s, so
    // that its hints (answered "in progress" until then) are delivered within the test.
    config_ = absl::StrCat("/tmp/kvtier-replication-test-", getpid(), ".yaml");
    {
      std::ofstream out(config_);
      out << "leases:\n  reservation_ttl: 2s\n";
    }
    for (int i = 1; i <= 3; ++i) {
      auto p = ServerProcess::Start("node-" + std::to_string(i), {"--config=" + config_});
      ASSERT_OK(p);
      members_.push_back((*p)->address());
      procs_.push_back(std::move(p).value());
    }
  }

  client::ClientOptions Options() const {
    client::ClientOptions o;
    o.members = members_;
    o.rpc_timeout = absl::Milliseconds(1000);
    o.transport = "grpc";
    o.replication_factor = 2;
    o.health_check_interval = absl::Milliseconds(200);
    o.health_check_timeout = absl::Milliseconds(300);
    o.hint_retry_interval = absl::Milliseconds(200);
    return o;
  }

  std::unique_ptr<client::Client> Connect(const client::ClientOptions& o) {
    auto c = client::Client::Connect(o);
    EXPECT_OK(c);
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Index of the server whose node id is `id`.
  int Server(const std::string& id) const {
    for (size_t i = 0; i < procs_.size(); ++i) {
      if (procs_[i]->node_id() == id) return static_cast<int>(i);
    }
    ADD_FAILURE() << "no server " << id;
    return 0;
  }

  std::unique_ptr<v1::AdminService::Stub> Admin(int i) const {
    return v1::AdminService::NewStub(grpc::CreateChannel(members_[i], grpc::InsecureChannelCredentials()));
  }

  // Whether server i holds shard 0 of `fp` (admin InspectBlock).
  bool Holds(int i, const Fingerprint& fp) const {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::InspectBlockRequest req;
    req.set_fingerprint(std::string(reinterpret_cast<const char*>(fp.bytes.data()), fp.bytes.size()));
    req.set_shard(0);
    v1::InspectBlockResponse resp;
    const grpc::Status s = Admin(i)->InspectBlock(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.found();
  }

  v1::GetStatsResponse Stats(int i) const {
    grpc::ClientContext ctx;
    v1::GetStatsResponse resp;
    EXPECT_TRUE(Admin(i)->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok());
    return resp;
  }

  // Puts `fps` (payloads from ReplPayload) at depths first_block_index.. and waits for the replicas.
  void PutAll(client::Client& c, const Namespace& ns, const std::vector<Fingerprint>& fps,
              uint32_t first_block_index = 0) {
    const uint64_t size = ns.layout.ShardBytes();
    std::vector<std::vector<std::byte>> payloads;
    for (const Fingerprint& fp : fps) payloads.push_back(ReplPayload(fp, size));
    std::vector<std::span<const std::byte>> views(payloads.begin(), payloads.end());
    auto put = c.Put(ns, fps, 0, views, first_block_index);
    ASSERT_OK(put);
    EXPECT_OK(c.FlushReplicas(absl::Seconds(20)));
  }

  // Gets every block of `fps`; returns how many arrived with the right bytes.
  size_t GetAll(client::Client& c, const Namespace& ns, const std::vector<Fingerprint>& fps) {
    const uint64_t size = ns.layout.ShardBytes();
    std::vector<std::vector<std::byte>> out(fps.size(), std::vector<std::byte>(size));
    std::vector<std::span<std::byte>> views(out.begin(), out.end());
    auto got = c.Get(ns, fps, 0, views);
    EXPECT_OK(got);
    if (!got.ok()) return 0;
    size_t good = 0;
    for (size_t i = 0; i < fps.size(); ++i) {
      good += (*got)[i] == client::GetResult::kHit && out[i] == ReplPayload(fps[i], size);
    }
    return good;
  }

  void TearDown() override {
    procs_.clear();
    std::remove(config_.c_str());
  }

  std::string config_;
  std::vector<std::string> members_;
  std::vector<std::unique_ptr<ServerProcess>> procs_;
};

TEST_F(ReplicationTest, APutReachesEveryReplicaOwnerAndNoOther) {
  client::ClientOptions o = Options();
  // R = 3 for one model of the tenant, by (tenant, model): the namespace's fields are not touched.
  o.replication_overrides = {{.tenant = "acme", .model = "repl-three", .replication_factor = 3}};
  auto c = Connect(o);
  ASSERT_NE(c, nullptr);
  const HashRing ring = c->ring();
  const Namespace ns = ReplNamespace();
  const std::vector<Fingerprint> fps = ReplChain(ns, 48, 1);
  PutAll(*c, ns, fps);
  EXPECT_EQ(c->stats().replica_puts.load(), fps.size());  // one replica each (R = 2)
  EXPECT_EQ(c->stats().replica_put_failures.load(), 0u);
  for (const Fingerprint& fp : fps) {
    std::set<std::string> owners;
    for (uint32_t m : ring.Owners(fp, 2)) owners.insert(ring.node_ids()[m]);
    ASSERT_EQ(owners.size(), 2u);
    for (size_t i = 0; i < procs_.size(); ++i) {
      EXPECT_EQ(Holds(static_cast<int>(i), fp), owners.contains(procs_[i]->node_id()))
          << procs_[i]->node_id() << " " << fp.Hex();
    }
  }
  const Namespace three = ReplNamespace("repl-three");
  const std::vector<Fingerprint> fps3 = ReplChain(three, 16, 2);
  PutAll(*c, three, fps3);
  for (const Fingerprint& fp : fps3) {
    for (size_t i = 0; i < procs_.size(); ++i) EXPECT_TRUE(Holds(static_cast<int>(i), fp));
  }
  EXPECT_EQ(c->stats().replica_puts.load(), fps.size() + 2 * fps3.size());
}

TEST_F(ReplicationTest, ReadsFailOverToTheReplicaWhenThePrimaryIsKilled) {
  auto c = Connect(Options());
  ASSERT_NE(c, nullptr);
  const Namespace ns = ReplNamespace();
  const std::vector<Fingerprint> fps = ReplChain(ns, 64, 3);
  PutAll(*c, ns, fps);
  const HashRing ring = c->ring();
  size_t primaries_on_victim = 0;
  for (const Fingerprint& fp : fps) primaries_on_victim += ring.node_ids()[ring.Primary(fp)] == "node-1";
  ASSERT_GT(primaries_on_victim, 0u);

  procs_[Server("node-1")]->KillAndWait(SIGKILL);
  // At once, while node-1 is still in the ring: its blocks come from their replicas.
  auto hit = c->LookupPrefix(ns, fps);
  ASSERT_OK(hit);
  EXPECT_EQ(hit->prefix_blocks, fps.size());
  EXPECT_EQ(hit->blocks_from_errors, 0u);
  EXPECT_EQ(GetAll(*c, ns, fps), fps.size());
  EXPECT_EQ(c->stats().misses_from_errors.load(), 0u);
  EXPECT_GE(c->stats().replica_read_blocks.load(), 2 * primaries_on_victim);  // lookup and get
  // And after the health checks have taken node-1 out of the ring.
  ASSERT_TRUE(WaitFor([&] { return c->ring().node_ids().size() == 2; }));
  hit = c->LookupPrefix(ns, fps);
  ASSERT_OK(hit);
  EXPECT_EQ(hit->prefix_blocks, fps.size());
  EXPECT_EQ(GetAll(*c, ns, fps), fps.size());
  EXPECT_EQ(c->stats().misses_from_errors.load(), 0u);
}

TEST_F(ReplicationTest, AHintedReplicaReachesItsOwnerWhenItResumes) {
  client::ClientOptions o = Options();
  o.rpc_timeout = absl::Milliseconds(500);
  auto c = Connect(o);
  ASSERT_NE(c, nullptr);
  const Namespace ns = ReplNamespace();
  const std::vector<Fingerprint> fps = ReplChain(ns, 48, 4);
  const HashRing ring = c->ring();
  std::vector<Fingerprint> replica_on_victim;  // blocks whose second owner is node-2
  for (const Fingerprint& fp : fps) {
    if (ring.node_ids()[ring.Owners(fp, 2)[1]] == "node-2") replica_on_victim.push_back(fp);
  }
  ASSERT_FALSE(replica_on_victim.empty());
  const int victim = Server("node-2");
  ASSERT_EQ(kill(procs_[victim]->pid(), SIGSTOP), 0);  // alive but silent: every RPC to it times out
  PutAll(*c, ns, fps);
  EXPECT_GE(c->stats().hints_queued.load(), replica_on_victim.size());
  EXPECT_EQ(c->stats().hints_delivered.load(), 0u);
  ASSERT_EQ(kill(procs_[victim]->pid(), SIGCONT), 0);
  ASSERT_TRUE(WaitFor([&] { return c->stats().hints_delivered.load() >= replica_on_victim.size(); }))
      << "delivered " << c->stats().hints_delivered.load() << " of " << replica_on_victim.size();
  for (const Fingerprint& fp : replica_on_victim) EXPECT_TRUE(Holds(victim, fp)) << fp.Hex();
  EXPECT_EQ(c->stats().hints_dropped.load(), 0u);
  // Every block ends up on both of its owners: node-2's primaries were put on their replica while it
  // was stopped, and are handed to node-2 from the hint queue after it resumed (in whatever order the
  // queue delivers them, so wait for the end state rather than for a count).
  auto on_both_owners = [&](const Fingerprint& fp) {
    for (uint32_t m : ring.Owners(fp, 2)) {
      if (!Holds(Server(ring.node_ids()[m]), fp)) return false;
    }
    return true;
  };
  EXPECT_TRUE(WaitFor([&] {
    for (const Fingerprint& fp : fps) {
      if (!on_both_owners(fp)) return false;
    }
    return true;
  })) << "delivered "
      << c->stats().hints_delivered.load() << " of " << c->stats().hints_queued.load() << " hints";
  for (const Fingerprint& fp : fps) EXPECT_TRUE(on_both_owners(fp)) << fp.Hex();
  EXPECT_EQ(c->stats().hints_dropped.load(), 0u);
}

// Blocks read per server (lookup keys answered plus blocks served by Read) since `before`.
std::vector<double> ReadsSince(const std::vector<v1::GetStatsResponse>& before,
                               const std::vector<v1::GetStatsResponse>& after) {
  std::vector<double> reads;
  for (size_t i = 0; i < before.size(); ++i) {
    const auto total = [](const v1::GetStatsResponse& s) {
      return s.lookup_blocks_hit() + s.lookup_blocks_miss() + s.read_blocks() + s.read_blocks_miss();
    };
    reads.push_back(static_cast<double>(total(after[i]) - total(before[i])));
  }
  return reads;
}

double MaxOverMean(const std::vector<double>& v) {
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  return *std::max_element(v.begin(), v.end()) / mean;
}

TEST_F(ReplicationTest, HotBlockReadsSpreadOverTheirOwners) {
  const Namespace ns = ReplNamespace();
  const std::vector<Fingerprint> fps = ReplChain(ns, 4, 5);  // a shared 4-block system prompt
  auto measure = [&](uint32_t hot_read_replicas) {
    client::ClientOptions o = Options();
    o.replication_factor = 1;
    o.hot_read_replicas = hot_read_replicas;
    o.hot_depth = 4;
    auto c = Connect(o);
    EXPECT_NE(c, nullptr);
    if (c == nullptr) return std::vector<double>{};
    PutAll(*c, ns, fps);
    // The first read's hits make the blocks hot: their read replicas are put then.
    EXPECT_EQ(GetAll(*c, ns, fps), fps.size());
    EXPECT_OK(c->FlushReplicas(absl::Seconds(20)));
    std::vector<v1::GetStatsResponse> before;
    for (int i = 0; i < 3; ++i) before.push_back(Stats(i));
    for (int r = 0; r < 30; ++r) {
      auto hit = c->LookupPrefix(ns, fps);
      EXPECT_OK(hit);
      if (hit.ok()) {
        EXPECT_EQ(hit->prefix_blocks, fps.size());
      }
      EXPECT_EQ(GetAll(*c, ns, fps), fps.size());
    }
    std::vector<v1::GetStatsResponse> after;
    for (int i = 0; i < 3; ++i) after.push_back(Stats(i));
    return ReadsSince(before, after);
  };
  const std::vector<double> spread = measure(2);  // 4 blocks on all 3 servers once read
  // With R + 2 = 3 owners and round robin per call, each server answers a third of the reads (all hits:
  // no fall-back to the primary).
  for (double reads : spread) EXPECT_GT(reads, 0.0);
  EXPECT_LT(MaxOverMean(spread), 1.15);
  for (const Fingerprint& fp : fps) {
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(Holds(i, fp));
  }
  const std::vector<double> primary_only = measure(0);
  EXPECT_LT(MaxOverMean(spread), MaxOverMean(primary_only));
}

}  // namespace
}  // namespace kvtier
