// Client's get and put logic (client.cc over read_plan.h, data_path.h) driven through fake BlockPaths
// (the test seam SetBlockPathFactoryForTest): fail-over to a replica, hot-block rotation, the attempts'
// deadlines and the UCX-to-gRPC fallback. Members are configured with their node ids and health checks
// are an hour apart, so no RPC is made: the members' channels never connect.
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "client/data_path.h"
#include "fake_block_paths.h"
#include "kvtier/client/client.h"
#include "testing/status_matchers.h"

namespace kvtier::client {
namespace {

using fakes::FakeCluster;
using fakes::FakePaths;
using fakes::Fp;
using fakes::kBlockBytes;
using fakes::Ns;

class ClientPathsTest : public ::testing::Test {
 protected:
  ~ClientPathsTest() override {
    client_.reset();
    SetBlockPathFactoryForTest(nullptr);
  }

  void Connect(ClientOptions o) {
    o.members = {"node-1=127.0.0.1:1", "node-2=127.0.0.1:2", "node-3=127.0.0.1:3"};
    o.health_check_interval = absl::Hours(1);
    SetBlockPathFactoryForTest([this] { return std::make_unique<FakePaths>(cluster_); });
    auto c = Client::Connect(o);
    ASSERT_OK(c.status());
    client_ = *std::move(c);
    ASSERT_EQ(Ns().layout.ShardBytes(), kBlockBytes);
  }

  std::string AddressOf(uint32_t ring_index) const {
    return "127.0.0.1:" + client_->ring().node_ids()[ring_index].substr(5);
  }

  void PutBlocks(const std::vector<Fingerprint>& fps) {
    std::vector<std::vector<std::byte>> bytes;
    std::vector<std::span<const std::byte>> blocks;
    for (size_t i = 0; i < fps.size(); ++i) bytes.emplace_back(kBlockBytes, std::byte(i + 1));
    for (const auto& b : bytes) blocks.emplace_back(b);
    auto put = client_->Put(Ns(), fps, 0, blocks, 0);
    ASSERT_OK(put.status());
    for (PutResult r : *put) ASSERT_EQ(r, PutResult::kStored);
    ASSERT_OK(client_->FlushReplicas(absl::Seconds(10)));
  }

  std::vector<GetResult> Get(const std::vector<Fingerprint>& fps) {
    std::vector<std::vector<std::byte>> bytes(fps.size(), std::vector<std::byte>(kBlockBytes));
    std::vector<std::span<std::byte>> buffers;
    for (auto& b : bytes) buffers.emplace_back(b);
    auto got = client_->Get(Ns(), fps, 0, buffers, 0);
    EXPECT_OK(got.status());
    for (size_t i = 0; got.ok() && i < fps.size(); ++i) {
      if ((*got)[i] == GetResult::kHit) {
        EXPECT_EQ(bytes[i][0], std::byte(i + 1)) << i;
      }
    }
    return got.ok() ? *got : std::vector<GetResult>();
  }

  FakeCluster cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientPathsTest, AGetFailsOverToAReplicaWhenThePrimaryIsDown) {
  ClientOptions o;
  o.transport = "grpc";
  o.replication_factor = 2;
  Connect(o);
  std::vector<Fingerprint> fps;
  for (uint32_t n = 0; n < 12; ++n) fps.push_back(Fp(n));
  PutBlocks(fps);
  const uint32_t down = client_->ring().Primary(fps[0]);
  size_t on_down = 0;
  for (const Fingerprint& fp : fps) on_down += client_->ring().Primary(fp) == down;
  ASSERT_GT(on_down, 0u);
  ASSERT_LT(on_down, fps.size());
  {
    std::lock_guard<std::mutex> lock(cluster_.mu);
    cluster_.servers[AddressOf(down)].down = true;
  }
  EXPECT_EQ(Get(fps), std::vector<GetResult>(fps.size(), GetResult::kHit));
  EXPECT_EQ(client_->stats().replica_read_blocks.load(), on_down);
  EXPECT_EQ(client_->stats().misses_from_errors.load(), 0u);
}

TEST_F(ClientPathsTest, EachAttemptGetsAShareOfTheCallsDeadline) {
  ClientOptions o;
  o.transport = "grpc";
  o.replication_factor = 2;
  o.rpc_timeout = absl::Seconds(4);
  Connect(o);
  const std::vector<Fingerprint> fps = {Fp(1)};
  PutBlocks(fps);
  const std::vector<uint32_t> owners = client_->ring().Owners(fps[0], 2);
  {
    std::lock_guard<std::mutex> lock(cluster_.mu);
    cluster_.servers[AddressOf(owners[0])].down = true;
  }
  const absl::Time start = absl::Now();
  EXPECT_EQ(Get(fps), std::vector<GetResult>{GetResult::kHit});
  const absl::Time end = absl::Now();
  std::lock_guard<std::mutex> lock(cluster_.mu);
  const auto& first = cluster_.servers[AddressOf(owners[0])].read_deadlines;
  const auto& second = cluster_.servers[AddressOf(owners[1])].read_deadlines;
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  // The call ends 20 ms before rpc_timeout (its reserve); the primary gets half of that, the replica
  // all that is left.
  const absl::Time call_deadline_max = end + absl::Seconds(4) - absl::Milliseconds(20);
  const absl::Time call_deadline_min = start + absl::Seconds(4) - absl::Milliseconds(20);
  EXPECT_GE(first[0], start + absl::Milliseconds(1900));
  EXPECT_LE(first[0], end + absl::Milliseconds(1990));
  EXPECT_GE(second[0], call_deadline_min);
  EXPECT_LE(second[0], call_deadline_max);
}

TEST_F(ClientPathsTest, HotBlockReadsRotateOverAllTheirOwners) {
  ClientOptions o;
  o.transport = "grpc";
  o.replication_factor = 1;
  o.hot_read_replicas = 2;
  Connect(o);
  const std::vector<Fingerprint> fps = {Fp(7)};
  PutBlocks(fps);
  EXPECT_EQ(Get(fps), std::vector<GetResult>{GetResult::kHit});  // a hit at depth 0: hot, copied to 2 more
  ASSERT_OK(client_->FlushReplicas(absl::Seconds(10)));
  std::map<std::string, int> before;
  {
    std::lock_guard<std::mutex> lock(cluster_.mu);
    for (const auto& [address, s] : cluster_.servers) before[address] = s.reads;
  }
  for (int call = 0; call < 3; ++call) EXPECT_EQ(Get(fps), std::vector<GetResult>{GetResult::kHit});
  std::lock_guard<std::mutex> lock(cluster_.mu);
  ASSERT_EQ(cluster_.servers.size(), 3u);
  for (const auto& [address, s] : cluster_.servers) EXPECT_EQ(s.reads - before[address], 1) << address;
}

TEST_F(ClientPathsTest, AutoFallsBackToGrpcWhenUcxDoesNotMoveTheBytes) {
  cluster_.ucx_endpoint = true;
  cluster_.ucx_moves = false;
  ClientOptions o;
  o.transport = "auto";
  Connect(o);
  const std::vector<Fingerprint> fps = {Fp(1), Fp(2), Fp(3)};
  PutBlocks(fps);
  EXPECT_EQ(Get(fps), std::vector<GetResult>(3, GetResult::kHit));
  std::lock_guard<std::mutex> lock(cluster_.mu);
  int ucx_reads = 0, reads = 0;
  for (const auto& [address, s] : cluster_.servers) {
    ucx_reads += s.ucx_reads;
    reads += s.reads;
    EXPECT_EQ(s.ucx_reads, s.reads) << address;  // every batch offered to UCX first, then gRPC
  }
  EXPECT_GE(ucx_reads, 1);
  EXPECT_EQ(reads, ucx_reads);
}

TEST_F(ClientPathsTest, UcxOnlyMakesMissesFromErrorWithoutAnEndpoint) {
  cluster_.ucx_endpoint = false;
  ClientOptions o;
  o.transport = "ucx";
  Connect(o);
  const std::vector<Fingerprint> fps = {Fp(1), Fp(2)};
  std::vector<std::byte> b0(kBlockBytes), b1(kBlockBytes);
  const std::vector<std::span<const std::byte>> blocks = {b0, b1};
  auto put = client_->Put(Ns(), fps, 0, blocks, 0);
  ASSERT_OK(put.status());
  EXPECT_EQ(*put, std::vector<PutResult>(2, PutResult::kError));
  EXPECT_EQ(Get(fps), std::vector<GetResult>(2, GetResult::kMissFromError));
  std::lock_guard<std::mutex> lock(cluster_.mu);
  for (const auto& [address, s] : cluster_.servers) EXPECT_EQ(s.reads, 0) << address;
}

}  // namespace
}  // namespace kvtier::client
