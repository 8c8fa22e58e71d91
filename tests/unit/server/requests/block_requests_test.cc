// BlockRequests: the data plane's rules that every transport shares (tenants, limits, shadow mode,
// cancelled puts, id holders), driven directly, without a transport; and RpcScope's recording.
#include "block_requests.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/common/checksum.h"
#include "kvtier/wire/wire.h"
#include "rpc_scope.h"
#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

Principal Worker(const std::string& tenant) {
  return Principal{.role = Principal::Role::kWorker, .tenant = tenant, .tenant_id = TenantId(tenant)};
}
const Principal kAdmin{};

class BlockRequestsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.node_id = "n1";
    options_.max_block_bytes = 64 << 10;
    options_.max_blocks_per_request = 16;
    options_.namespaces.push_back(NamespaceOptions{.tenant = "shadowed", .shadow = true});
    auto store = BlockStore::Create(BlockStoreOptions{.capacity_bytes = 8 << 20});
    ASSERT_OK(store);
    store_ = std::move(store).value();
    metrics_ = std::make_unique<ServerMetrics>(*store_, "n1");
    auto auth = Authenticator::Create(options_, *metrics_);
    ASSERT_OK(auth);
    auth_ = std::move(auth).value();
    requests_ = std::make_unique<BlockRequests>(options_, *store_, *metrics_, namespaces_, *auth_);
  }

  static v1::Namespace Ns(const std::string& tenant, uint32_t head_dim = 8) {
    Namespace ns;
    ns.tenant = tenant;
    ns.model = "m";
    ns.layout.num_layers = 1;
    ns.layout.num_kv_heads = 1;
    ns.layout.head_dim = head_dim;
    ns.layout.block_tokens = 4;
    v1::Namespace out;
    wire::ToProto(ns, &out);
    return out;
  }
  static uint64_t BlockBytes(const v1::Namespace& ns) { return wire::FromProto(ns)->layout.ShardBytes(); }
  static std::vector<BlockKey> Keys(size_t n, uint8_t seed) {
    std::vector<BlockKey> keys(n);
    for (size_t i = 0; i < n; ++i) {
      keys[i].fingerprint.bytes[0] = seed;
      keys[i].fingerprint.bytes[1] = static_cast<uint8_t>(i);
    }
    return keys;
  }
  static v1::BlockKeys Proto(const std::vector<BlockKey>& keys) {
    v1::BlockKeys out;
    wire::EncodeKeys(keys, &out);
    return out;
  }

  // Puts `keys` into `ns` as `who` through Allocate, Write and Commit; every block filled with `fill`.
  void Put(const Principal& who, const v1::Namespace& ns, const std::vector<BlockKey>& keys, char fill) {
    v1::AllocateRequest alloc;
    *alloc.mutable_namespace_() = ns;
    *alloc.mutable_keys() = Proto(keys);
    v1::AllocateResponse reserved;
    ASSERT_OK(requests_->Allocate(
        who, alloc, [] { return false; }, &reserved));
    const std::string bytes(BlockBytes(ns), fill);
    const CapabilityId id = CapabilityId::FromWire(reserved.reservation_id());
    v1::CommitRequest commit;
    commit.set_reservation_id(reserved.reservation_id());
    for (uint32_t i = 0; i < keys.size(); ++i) {
      ASSERT_OK(requests_->Write(
          who, id, i, 0, std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size())));
      commit.add_checksums(BlockChecksum(bytes.data(), bytes.size()));
    }
    v1::CommitResponse committed;
    ASSERT_OK(requests_->Commit(who, commit, &committed));
    for (int r : committed.results()) ASSERT_EQ(r, v1::COMMIT_RESULT_COMMITTED);
  }

  ServerOptions options_;
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<Authenticator> auth_;
  NamespaceRegistry namespaces_;
  std::unique_ptr<BlockRequests> requests_;
};

TEST_F(BlockRequestsTest, AWorkerIsKeptToItsOwnTenant) {
  const std::vector<BlockKey> keys = Keys(3, 1);
  Put(Worker("acme"), Ns("acme"), keys, 'a');

  v1::LookupRequest lookup;
  *lookup.mutable_namespace_() = Ns("acme");
  *lookup.mutable_keys() = Proto(keys);
  v1::LookupResponse found;
  ASSERT_OK(requests_->Lookup(Worker("acme"), lookup, &found));
  EXPECT_EQ(std::vector<bool>(found.present().begin(), found.present().end()), std::vector<bool>(3, true));

  v1::LookupResponse refused;
  const absl::Status s = requests_->Lookup(Worker("other"), lookup, &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("namespace.tenant \"acme\""), absl::string_view::npos) << s;
  EXPECT_EQ(refused.present_size(), 0);
  // An admin (or any caller of a server without tokens) may read every tenant.
  v1::LookupResponse admin;
  ASSERT_OK(requests_->Lookup(kAdmin, lookup, &admin));
  EXPECT_EQ(admin.present_size(), 3);
}

TEST_F(BlockRequestsTest, AnotherTenantsLeaseIsAnUnknownLease) {
  const std::vector<BlockKey> keys = Keys(2, 2);
  Put(Worker("acme"), Ns("acme"), keys, 'b');
  v1::ReadRequest req;
  *req.mutable_namespace_() = Ns("acme");
  *req.mutable_keys() = Proto(keys);
  req.set_lease_ms(60000);
  v1::ReadResponse leased;
  ASSERT_OK(requests_->Lease(Worker("acme"), req, &leased));
  ASSERT_FALSE(leased.lease_id().empty());
  ASSERT_EQ(leased.blocks_size(), 2);
  EXPECT_TRUE(leased.blocks(0).present());
  EXPECT_EQ(leased.blocks(0).size_bytes(), BlockBytes(Ns("acme")));
  const std::string bytes(BlockBytes(Ns("acme")), 'b');
  EXPECT_EQ(leased.blocks(1).checksum(), BlockChecksum(bytes.data(), bytes.size()));

  const CapabilityId id = CapabilityId::FromWire(leased.lease_id());
  EXPECT_EQ(requests_->Release(Worker("other"), std::span<const CapabilityId>(&id, 1)), 0u);
  EXPECT_EQ(store_->stats().active_leases.load(), 1u);
  EXPECT_EQ(requests_->Release(Worker("acme"), std::span<const CapabilityId>(&id, 1)), 1u);
  EXPECT_EQ(store_->stats().active_leases.load(), 0u);
}

TEST_F(BlockRequestsTest, AShadowNamespaceIsStoredButNeverServed) {
  const std::vector<BlockKey> keys = Keys(4, 3);
  Put(kAdmin, Ns("shadowed"), keys, 'c');
  EXPECT_EQ(store_->stats().committed_blocks.load(), 4u);

  v1::LookupRequest lookup;
  *lookup.mutable_namespace_() = Ns("shadowed");
  *lookup.mutable_keys() = Proto(keys);
  lookup.set_lease_ms(1000);
  v1::LookupResponse found;
  ASSERT_OK(requests_->Lookup(kAdmin, lookup, &found));
  EXPECT_EQ(std::vector<bool>(found.present().begin(), found.present().end()), std::vector<bool>(4, false));
  EXPECT_TRUE(found.lease_id().empty() || CapabilityId::FromWire(found.lease_id()).null());
  EXPECT_EQ(metrics_->shadow_hit_blocks(), 4u);

  v1::ReadRequest read;
  *read.mutable_namespace_() = Ns("shadowed");
  *read.mutable_keys() = Proto(keys);
  v1::ReadResponse head;
  ASSERT_OK(requests_->Lease(kAdmin, read, &head));
  ASSERT_EQ(head.blocks_size(), 4);
  for (const v1::BlockStatus& b : head.blocks()) EXPECT_FALSE(b.present());
  EXPECT_EQ(store_->stats().active_leases.load(), 0u);
  EXPECT_EQ(metrics_->shadow_read_blocks(), 4u);
}

TEST_F(BlockRequestsTest, LimitsAreCheckedBeforeTheStore) {
  v1::AllocateRequest big;
  *big.mutable_namespace_() = Ns("acme", /*head_dim=*/8192);  // 1 x 1 x 8192 x 4 x 2 x 2 bytes: over 64 KiB
  *big.mutable_keys() = Proto(Keys(1, 4));
  v1::AllocateResponse resp;
  absl::Status s = requests_->Allocate(
      kAdmin, big, [] { return false; }, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("this server accepts at most 65536"), absl::string_view::npos) << s;

  v1::AllocateRequest many;
  *many.mutable_namespace_() = Ns("acme");
  *many.mutable_keys() = Proto(Keys(17, 4));
  EXPECT_EQ(requests_
                ->Allocate(
                    kAdmin, many, [] { return false; }, &resp)
                .code(),
            absl::StatusCode::kInvalidArgument);

  v1::AllocateRequest depths;
  *depths.mutable_namespace_() = Ns("acme");
  *depths.mutable_keys() = Proto(Keys(3, 4));
  depths.add_depths(0);
  s = requests_->Allocate(
      kAdmin, depths, [] { return false; }, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("depths: 1 for 3 keys"), absl::string_view::npos) << s;
  EXPECT_EQ(store_->stats().active_reservations.load(), 0u);
}

TEST_F(BlockRequestsTest, ACallerThatGaveUpHoldsNoReservation) {
  v1::AllocateRequest req;
  *req.mutable_namespace_() = Ns("acme");
  *req.mutable_keys() = Proto(Keys(2, 5));
  int asked = 0;
  v1::AllocateResponse resp;
  // Gives up while the store reserves: the reservation is aborted, not left to its TTL.
  const absl::Status s = requests_->Allocate(
      kAdmin, req, [&asked] { return ++asked > 1; }, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(store_->stats().active_reservations.load(), 0u);
  // The keys are free for the next writer.
  v1::AllocateResponse again;
  ASSERT_OK(requests_->Allocate(
      kAdmin, req, [] { return false; }, &again));
  ASSERT_EQ(again.results_size(), 2);
  EXPECT_EQ(again.results(0), v1::ALLOCATE_RESULT_ALLOCATED);
}

TEST_F(BlockRequestsTest, AnotherTenantsReservationCannotBeWrittenOrCommitted) {
  v1::AllocateRequest req;
  *req.mutable_namespace_() = Ns("acme");
  *req.mutable_keys() = Proto(Keys(1, 6));
  v1::AllocateResponse reserved;
  ASSERT_OK(requests_->Allocate(
      Worker("acme"), req, [] { return false; }, &reserved));
  const CapabilityId id = CapabilityId::FromWire(reserved.reservation_id());
  const std::string bytes(BlockBytes(Ns("acme")), 'x');
  const std::span<const std::byte> data(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
  EXPECT_FALSE(requests_->Write(Worker("other"), id, 0, 0, data).ok());
  v1::CommitRequest commit;
  commit.set_reservation_id(reserved.reservation_id());
  commit.add_checksums(BlockChecksum(bytes.data(), bytes.size()));
  v1::CommitResponse resp;
  EXPECT_FALSE(requests_->Commit(Worker("other"), commit, &resp).ok());
  requests_->Abort(Worker("other"), id);  // ignored, as an unknown id
  EXPECT_EQ(store_->stats().active_reservations.load(), 1u);
  ASSERT_OK(requests_->Write(Worker("acme"), id, 0, 0, data));
  ASSERT_OK(requests_->Commit(Worker("acme"), commit, &resp));
  EXPECT_EQ(resp.results(0), v1::COMMIT_RESULT_COMMITTED);
}

TEST(RpcScopeTest, RecordsTheReturnedCodeOnceAtScopeExit) {
  auto store = BlockStore::Create(BlockStoreOptions{.capacity_bytes = 1 << 20});
  ASSERT_OK(store);
  ServerMetrics metrics(**store, "n1");
  {
    RpcScope rpc(metrics, "Lookup");
    EXPECT_EQ(rpc.Return(absl::InvalidArgumentError("bad")).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(metrics.invalid_requests(), 0u);  // not yet: at scope exit
  }
  EXPECT_EQ(metrics.invalid_requests(), 1u);
  {
    RpcScope rpc(metrics, "Lookup");
    EXPECT_TRUE(rpc.Return(grpc::Status::OK).ok());
  }
  { RpcScope forgotten(metrics, "Commit"); }
  EXPECT_EQ(metrics.invalid_requests(), 1u);
  const std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  EXPECT_NE(text.find("_count{code=\"INVALID_ARGUMENT\",method=\"Lookup\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("_count{code=\"OK\",method=\"Lookup\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("_count{code=\"UNKNOWN\",method=\"Commit\"} 1"), std::string::npos) << text;
}

}  // namespace
}  // namespace kvtier::server
