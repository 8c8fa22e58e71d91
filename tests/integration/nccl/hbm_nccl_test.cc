// The cache server's HBM tier behind the NCCL transport: HbmBlockSource resolves keys through
// BlockStore::AcquireHbmRead (blocks in host memory move up to HBM first) and the store's lease ends
// when the send has. NCCL is FakeNcclApi and the HBM tier EmulatedHbm (host memory behind the same
// interfaces), so this runs without a GPU; hbm_tier_cuda_test and the two-GPU test cover the devices.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "kvtier/common/checksum.h"
#include "kvtier/nccl/nccl_service.h"
#include "kvtier/nccl/nccl_worker.h"
#include "kvtier/server/block_store.h"
#include "testing/emulated_hbm.h"
#include "testing/fake_nccl_api.h"
#include "testing/status_matchers.h"
#include "transport/hbm_block_source.h"

namespace kvtier::server {
namespace {

Namespace TestNamespace() {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "tiny";
  ns.layout.num_layers = 2;
  ns.layout.num_kv_heads = 2;
  ns.layout.head_dim = 16;
  ns.layout.block_tokens = 4;
  return ns;
}

BlockKey Key(int i) {
  BlockKey k;
  k.fingerprint.bytes[0] = static_cast<uint8_t>(i);
  k.fingerprint.bytes[9] = 0x44;
  return k;
}

template <typename Pred>
bool Eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

class HbmNcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    block_bytes_ = ns_.layout.ShardBytes();
    hbm_ = std::make_shared<testing::EmulatedHbm>(2 * block_bytes_);
    BlockStoreOptions o{.capacity_bytes = 16 * block_bytes_, .slab_bytes = 2 * block_bytes_};
    o.hbm_memory = hbm_;
    o.hbm_promote_on_hit = false;  // only the NCCL path brings blocks up here
    auto store = BlockStore::Create(o);
    ASSERT_OK(store);
    store_ = std::move(store).value();
    source_ = std::make_unique<HbmBlockSource>(*store_, 0);
    nccl::NcclServiceOptions so;
    so.transfer_timeout = absl::Seconds(2);
    so.lease_ttl = absl::Seconds(8);
    so.channel.poll_interval = absl::Microseconds(50);
    auto svc = nccl::NcclService::Create(api_, *source_, so);
    ASSERT_OK(svc);
    service_ = std::move(svc).value();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_->grpc_service());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    nccl::NcclWorkerOptions wo;
    wo.server_address = "127.0.0.1:" + std::to_string(port);
    wo.worker_id = "worker-1";
    wo.channel.poll_interval = absl::Microseconds(50);
    auto w = nccl::NcclWorker::Create(api_, wo);
    ASSERT_OK(w);
    worker_ = std::move(w).value();
  }
  void TearDown() override {
    worker_.reset();
    if (server_ != nullptr) server_->Shutdown();
    service_.reset();
  }

  std::vector<std::byte> Pattern(int seed) const {
    std::vector<std::byte> b(block_bytes_);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(seed * 53 + i * 7);
    return b;
  }

  void Put(int i) {
    const BlockKey k = Key(i);
    const NamespaceRef ref{.id = ns_.Id(), .tenant_id = TenantId(ns_.tenant), .block_bytes = block_bytes_};
    auto a = store_->Allocate(ref, std::span<const BlockKey>(&k, 1));
    ASSERT_OK(a);
    const auto bytes = Pattern(i);
    ASSERT_OK(store_->Write(a->reservation_id, 0, 0, bytes));
    const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
    ASSERT_OK(store_->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1)));
  }

  Namespace ns_ = TestNamespace();
  uint64_t block_bytes_ = 0;
  testing::FakeNcclApi api_;
  std::shared_ptr<testing::EmulatedHbm> hbm_;
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<HbmBlockSource> source_;
  std::unique_ptr<nccl::NcclService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<nccl::NcclWorker> worker_;
};

TEST_F(HbmNcclTest, HostBlocksMoveUpToHbmAndReachTheWorkerByteForByte) {
  Put(0);
  Put(2);
  std::vector<BlockKey> keys = {Key(0), Key(1), Key(2)};
  std::vector<std::vector<std::byte>> bufs(3, std::vector<std::byte>(block_bytes_, std::byte{0xee}));
  std::vector<nccl::DeviceSpan> spans;
  for (auto& b : bufs) spans.push_back({b.data(), b.size()});
  auto got = worker_->Fetch(ns_, keys, spans, nullptr);
  ASSERT_OK(got);
  using R = nccl::NcclFetchResult;
  EXPECT_EQ(*got, (std::vector<R>{R::kHit, R::kMiss, R::kHit}));
  EXPECT_EQ(bufs[0], Pattern(0));
  EXPECT_EQ(bufs[2], Pattern(2));
  EXPECT_EQ(bufs[1], std::vector<std::byte>(block_bytes_, std::byte{0xee}));
  EXPECT_EQ(store_->TierOfForTest(Key(0)), Tier::kHbm);
  EXPECT_EQ(store_->TierOfForTest(Key(2)), Tier::kHbm);
  EXPECT_TRUE(Eventually([&] { return store_->stats().active_leases.load() == 0; }))
      << "the store's lease ends once the send has";
}

TEST_F(HbmNcclTest, BlocksThatDoNotFitInHbmAreMissesOnThisPathAndStayServable) {
  for (int i = 0; i < 3; ++i) Put(i);
  // Three blocks, HBM holds two: all are pinned by the same lease, so the third cannot be placed.
  std::vector<BlockKey> keys = {Key(0), Key(1), Key(2)};
  std::vector<std::vector<std::byte>> bufs(3, std::vector<std::byte>(block_bytes_));
  std::vector<nccl::DeviceSpan> spans;
  for (auto& b : bufs) spans.push_back({b.data(), b.size()});
  auto got = worker_->Fetch(ns_, keys, spans, nullptr);
  ASSERT_OK(got);
  using R = nccl::NcclFetchResult;
  EXPECT_EQ(*got, (std::vector<R>{R::kHit, R::kHit, R::kMiss}));
  EXPECT_EQ(bufs[1], Pattern(1));
  EXPECT_EQ(store_->TierOfForTest(Key(2)), Tier::kHost);  // still there for the host data path
  EXPECT_LE(store_->stats().hbm_bytes.load(), 2 * block_bytes_);
  EXPECT_TRUE(Eventually([&] { return store_->stats().active_leases.load() == 0; }));
  // Once the lease has ended, a later fetch can demote an HBM block to make room.
  got = worker_->Fetch(ns_, std::span(keys).subspan(2, 1), std::span(spans).subspan(2, 1), nullptr);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0], R::kHit);
  EXPECT_EQ(bufs[2], Pattern(2));
  EXPECT_EQ(store_->stats().hbm_demotions.load(), 1u);
}

TEST_F(HbmNcclTest, AStoreWithoutAnHbmTierRefuses) {
  auto plain = BlockStore::Create({.capacity_bytes = 1 << 20, .slab_bytes = 1 << 18});
  ASSERT_OK(plain);
  HbmBlockSource source(**plain, 0);
  const BlockKey k = Key(0);
  EXPECT_EQ(source.Resolve(ns_, std::span<const BlockKey>(&k, 1), absl::Seconds(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  Namespace bad = ns_;
  bad.tenant.clear();
  EXPECT_EQ(source_->Resolve(bad, std::span<const BlockKey>(&k, 1), absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::server
