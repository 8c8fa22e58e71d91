// A client that misbehaves on purpose against a real in-process server: it takes leases and never
// releases them, starts puts and abandons them halfway through a stream, asks for more than the limits
// allow, and opens a flood of connections. The server must stay up, refuse what is out of bounds with a
// clear status, never pin memory past the lease and reservation times, and keep serving honest clients.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/server/block_store.h"
#include "kvtier/server/server.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/wire/wire.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using client::Client;
using client::PutResult;

constexpr uint64_t kBlocks = 16;  // host capacity in blocks

Namespace TestNamespace() {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "abuse-test";
  ns.layout = {.kind = LayoutKind::kStandard,
               .dtype = DType::kBf16,
               .num_layers = 2,
               .num_kv_heads = 2,
               .head_dim = 32,
               .block_tokens = 16,
               .tp_size = 1};
  return ns;
}

std::vector<Fingerprint> Chain(const Namespace& ns, uint32_t blocks, uint32_t seed) {
  std::vector<uint32_t> tokens(blocks * ns.layout.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7919 + seed * 104729) % 32000;
  auto fps = ChainFingerprints(ns, tokens);
  EXPECT_OK(fps);
  return fps.ok() ? *fps : std::vector<Fingerprint>{};
}

class AbusiveClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ns_ = TestNamespace();
    block_bytes_ = ns_.layout.ShardBytes();
    server::ServerOptions o{.node_id = "node-a",
                            .metrics_address = "",
                            .host_cache_bytes = kBlocks * block_bytes_,
                            .slab_bytes = kBlocks * block_bytes_,
                            .max_block_bytes = block_bytes_};
    o.default_lease_ttl = absl::Milliseconds(300);
    o.max_lease_ttl = absl::Milliseconds(600);
    o.reservation_ttl = absl::Milliseconds(600);
    o.expiry_interval = absl::Milliseconds(50);
    o.tenant_pinned_share = 1;  // one tenant, whose leases may pin the whole tier: these tests are about expiry
    auto s = server::Server::Start(o);
    ASSERT_OK(s);
    server_ = std::move(s).value();
    auto c = Client::Connect({.members = {Address()}, .rpc_timeout = absl::Seconds(2), .transport = "grpc"});
    ASSERT_OK(c);
    client_ = std::move(c).value();
    stub_ = v1::CacheService::NewStub(
        grpc::CreateCustomChannel(Address(), grpc::InsecureChannelCredentials(), wire::ChannelArgs(80 << 20)));
    wire::ToProto(ns_, &pns_);
  }

  std::string Address() const { return "127.0.0.1:" + std::to_string(server_->grpc_port()); }

  // Puts `fps` through the honest client; returns how many were stored or already present.
  size_t Put(std::span<const Fingerprint> fps) {
    std::vector<std::vector<std::byte>> data(fps.size(), std::vector<std::byte>(block_bytes_, std::byte{0x42}));
    std::vector<std::span<const std::byte>> views(data.begin(), data.end());
    auto r = client_->Put(ns_, fps, 0, views);
    EXPECT_OK(r);
    size_t ok = 0;
    if (r.ok()) {
      for (PutResult p : *r) ok += p == PutResult::kStored || p == PutResult::kAlreadyPresent;
    }
    return ok;
  }

  // Leases `fps` with a raw Lookup and never releases the lease.
  std::string LeaseAndAbandon(std::span<const Fingerprint> fps, uint32_t lease_ms) {
    v1::LookupRequest req;
    *req.mutable_namespace_() = pns_;
    std::vector<BlockKey> keys;
    for (const auto& fp : fps) keys.push_back({fp, 0});
    wire::EncodeKeys(keys, req.mutable_keys());
    req.set_lease_ms(lease_ms);
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->Lookup(&ctx, req, &resp).ok());
    return resp.lease_id();
  }

  Namespace ns_;
  uint64_t block_bytes_ = 0;
  v1::Namespace pns_;
  std::unique_ptr<server::Server> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::CacheService::Stub> stub_;
};

TEST_F(AbusiveClientTest, AbandonedLeasesCannotPinMemoryPastTheMaximumLeaseTime) {
  const auto first = Chain(ns_, kBlocks, 1);
  ASSERT_EQ(Put(first), kBlocks);
  // Lease everything for an hour and walk away: the server caps it at max_lease_ttl (600 ms).
  ASSERT_EQ(LeaseAndAbandon(first, 3'600'000).size(), CapabilityId::kBytes);
  const auto second = Chain(ns_, kBlocks, 2);
  EXPECT_EQ(Put(second), 0u) << "every slot is leased: puts are refused (no space), not queued";
  EXPECT_GT(server_->store_for_test().stats().rejections_no_space.load(), 0u);
  absl::SleepFor(absl::Milliseconds(900));
  EXPECT_EQ(Put(second), kBlocks) << "the abandoned lease expired and its blocks became evictable";
  EXPECT_GE(server_->store_for_test().stats().expired_leases.load(), 1u);
  EXPECT_EQ(server_->store_for_test().stats().active_leases.load(), 0u);
  EXPECT_LE(server_->store_for_test().used_bytes(), kBlocks * block_bytes_);
}

TEST_F(AbusiveClientTest, AStreamAbandonedMidBlockNeverBecomesVisibleAndFreesItsSlots) {
  const auto fps = Chain(ns_, kBlocks, 3);
  v1::AllocateRequest areq;
  *areq.mutable_namespace_() = pns_;
  std::vector<BlockKey> keys;
  for (const auto& fp : fps) keys.push_back({fp, 0});
  wire::EncodeKeys(keys, areq.mutable_keys());
  v1::AllocateResponse aresp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Allocate(&ctx, areq, &aresp).ok());
  }
  ASSERT_EQ(aresp.reservation_id().size(), CapabilityId::kBytes);
  // Half of the first block, then the client vanishes without WritesDone or Commit.
  {
    grpc::ClientContext ctx;
    v1::WriteBlocksResponse wresp;
    auto w = stub_->WriteBlocks(&ctx, &wresp);
    v1::WriteBlocksRequest chunk;
    chunk.set_reservation_id(aresp.reservation_id());
    chunk.set_data(std::string(block_bytes_ / 2, 'h'));
    ASSERT_TRUE(w->Write(chunk));
    ctx.TryCancel();
    w->Finish();
  }
  // Every slot is reserved by the abandoned put: an honest put is refused until the reservation expires.
  const auto other = Chain(ns_, kBlocks, 4);
  EXPECT_EQ(Put(other), 0u);
  absl::SleepFor(absl::Milliseconds(900));
  EXPECT_GE(server_->store_for_test().stats().expired_reservations.load(), 1u);
  EXPECT_EQ(server_->store_for_test().stats().active_reservations.load(), 0u);
  EXPECT_EQ(Put(other), kBlocks);
  auto lookup = client_->LookupPrefix(ns_, fps);
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->prefix_blocks, 0u) << "no half-written block is ever visible";
}

TEST_F(AbusiveClientTest, HugeCountsAreRefusedBeforeAllocating) {
  v1::AllocateRequest areq;
  *areq.mutable_namespace_() = pns_;
  areq.mutable_keys()->set_fingerprints(std::string(32 * 70000, 'k'));  // above max_blocks_per_request
  v1::AllocateResponse aresp;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub_->Allocate(&ctx, areq, &aresp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->store_for_test().stats().active_reservations.load(), 0u);
  v1::ReadRequest rreq;
  *rreq.mutable_namespace_() = pns_;
  rreq.mutable_keys()->set_fingerprints(std::string(32 * 70000, 'k'));
  grpc::ClientContext rctx;
  auto reader = stub_->Read(&rctx, rreq);
  v1::ReadResponse rresp;
  while (reader->Read(&rresp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->store_for_test().stats().active_leases.load(), 0u);
}

TEST_F(AbusiveClientTest, AConnectionFloodLeavesTheServerServing) {
  const auto fps = Chain(ns_, 4, 5);
  ASSERT_EQ(Put(fps), 4u);
  // 64 threads, each with a channel of its own, hammering Lookup and Read-with-abandoned-lease.
  std::atomic<int> ok{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 64; ++t) {
    threads.emplace_back([&, t] {
      grpc::ChannelArguments args;
      args.SetInt("kvtier.flood_channel", t);  // a distinct channel (and connection) per thread
      auto stub =
          v1::CacheService::NewStub(grpc::CreateCustomChannel(Address(), grpc::InsecureChannelCredentials(), args));
      for (int i = 0; i < 20; ++i) {
        v1::LookupRequest req;
        *req.mutable_namespace_() = pns_;
        std::vector<BlockKey> keys;
        for (const auto& fp : fps) keys.push_back({fp, 0});
        wire::EncodeKeys(keys, req.mutable_keys());
        req.set_lease_ms(i % 2 == 0 ? 60'000 : 0);
        v1::LookupResponse resp;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        (stub->Lookup(&ctx, req, &resp).ok() ? ok : refused).fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load() + refused.load(), 64 * 20);
  EXPECT_GT(ok.load(), 0);
  // The honest client is still served, and the flood's 640 leases all expire.
  auto lookup = client_->LookupPrefix(ns_, fps);
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->prefix_blocks, 4u);
  absl::SleepFor(absl::Milliseconds(900));
  server_->store_for_test().ExpireNow();
  EXPECT_EQ(server_->store_for_test().stats().active_leases.load(), 0u);
  EXPECT_EQ(Put(Chain(ns_, kBlocks, 6)), kBlocks) << "no flood lease still pins memory";
}

}  // namespace
}  // namespace kvtier
