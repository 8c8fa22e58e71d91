// A real in-process server on 127.0.0.1:0 talked to through the real client library.
#include <cstring>
#include <numeric>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "kvtier/client/client.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/server/block_store.h"
#include "kvtier/server/server.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/wire/wire.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using client::Client;
using client::GetResult;
using client::PutResult;

Namespace TestNamespace(uint32_t block_tokens = 16) {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "llama-test";
  ns.layout = {.kind = LayoutKind::kStandard,
               .dtype = DType::kBf16,
               .num_layers = 2,
               .num_kv_heads = 2,
               .head_dim = 32,
               .block_tokens = block_tokens,
               .tp_size = 1};
  return ns;
}

std::vector<uint32_t> Tokens(size_t n, uint32_t seed = 1) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>((i * 2654435761u) ^ seed) % 32000;
  return t;
}

std::vector<std::byte> BlockBytes(const Fingerprint& fp, uint64_t size) {
  std::vector<std::byte> b(size);
  uint64_t x = fp.RingPosition() | 1;
  for (auto& c : b) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<std::byte>(x);
  }
  return b;
}

class CacheServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = server::Server::Start({.node_id = "node-a", .metrics_address = "", .host_cache_bytes = 64ULL << 20});
    ASSERT_OK(s);
    server_ = std::move(s).value();
    auto c = Client::Connect({.members = {Address()}, .rpc_timeout = absl::Milliseconds(1500)});
    ASSERT_OK(c);
    client_ = std::move(c).value();
  }

  std::string Address() const { return "127.0.0.1:" + std::to_string(server_->grpc_port()); }

  // Puts every block of `fps` with bytes derived from the fingerprint.
  void PutAll(const Namespace& ns, std::span<const Fingerprint> fps) {
    std::vector<std::vector<std::byte>> data;
    std::vector<std::span<const std::byte>> views;
    for (const auto& fp : fps) data.push_back(BlockBytes(fp, ns.layout.ShardBytes()));
    for (const auto& d : data) views.emplace_back(d);
    auto r = client_->Put(ns, fps, 0, views);
    ASSERT_OK(r);
    for (PutResult p : *r) EXPECT_TRUE(p == PutResult::kStored || p == PutResult::kAlreadyPresent);
  }

  std::unique_ptr<server::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(CacheServerTest, PutThenGetRoundTripsEveryByte) {
  const Namespace ns = TestNamespace();
  auto fps = ChainFingerprints(ns, Tokens(16 * 5));
  ASSERT_OK(fps);
  ASSERT_EQ(fps->size(), 5u);
  PutAll(ns, *fps);
  const uint64_t bytes = ns.layout.ShardBytes();
  std::vector<std::vector<std::byte>> out(5, std::vector<std::byte>(bytes));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto r = client_->Get(ns, *fps, 0, views);
  ASSERT_OK(r);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ((*r)[i], GetResult::kHit);
    EXPECT_EQ(out[i], BlockBytes((*fps)[i], bytes));
  }
  EXPECT_EQ(client_->stats().retrieve_hit_blocks.load(), 5u);
  EXPECT_EQ(client_->stats().retrieve_hit_tokens.load(), 5u * 16);
  EXPECT_EQ(client_->stats().misses_from_errors.load(), 0u);
}

TEST_F(CacheServerTest, LookupAtBlockBoundaries) {
  const Namespace ns = TestNamespace();
  constexpr size_t B = 16;
  const auto tokens = Tokens(3 * B);
  auto all = ChainFingerprints(ns, tokens);
  ASSERT_OK(all);
  PutAll(ns, std::span(*all).first(2));  // blocks 0 and 1 cached
  const std::pair<size_t, uint32_t> cases[] = {{0, 0},         {B - 1, 0}, {B, 1},         {B + 1, 1},
                                               {2 * B - 1, 1}, {2 * B, 2}, {2 * B + 1, 2}, {3 * B, 2}};
  for (auto [len, want] : cases) {
    auto fps = ChainFingerprints(ns, std::span(tokens).first(len));
    ASSERT_OK(fps);
    EXPECT_EQ(fps->size(), len / B);
    auto r = client_->LookupPrefix(ns, *fps);
    ASSERT_OK(r);
    EXPECT_EQ(r->prefix_blocks, want) << "prompt of " << len << " tokens";
    EXPECT_EQ(r->blocks_from_errors, 0u);
  }
}

TEST_F(CacheServerTest, LookupStopsAtTheFirstHole) {
  const Namespace ns = TestNamespace();
  auto fps = ChainFingerprints(ns, Tokens(16 * 6));
  ASSERT_OK(fps);
  const std::vector<Fingerprint> stored = {(*fps)[0], (*fps)[1], (*fps)[3], (*fps)[4]};  // hole at 2
  PutAll(ns, stored);
  auto r = client_->LookupPrefix(ns, *fps);
  ASSERT_OK(r);
  EXPECT_EQ(r->prefix_blocks, 2u);
  EXPECT_EQ(r->present, (std::vector<bool>{true, true, false, true, true, false}));
  EXPECT_LE(client_->stats().prefix_hit_blocks.load(), client_->stats().lookup_blocks.load());
}

TEST_F(CacheServerTest, OtherTenantWithTheSameTokensSharesNothing) {
  Namespace a = TestNamespace();
  Namespace b = a;
  b.tenant = "globex";
  auto fa = ChainFingerprints(a, Tokens(64));
  ASSERT_OK(fa);
  PutAll(a, *fa);
  auto fb = ChainFingerprints(b, Tokens(64));
  ASSERT_OK(fb);
  EXPECT_NE((*fa)[0], (*fb)[0]);
  // Even knowing tenant a's fingerprints, tenant b's namespace sees nothing.
  auto r = client_->LookupPrefix(b, *fa);
  ASSERT_OK(r);
  EXPECT_EQ(r->prefix_blocks, 0u);
}

TEST_F(CacheServerTest, CorruptBlockIsReportedNeverReturnedAsHit) {
  const Namespace ns = TestNamespace();
  auto fps = ChainFingerprints(ns, Tokens(32));
  ASSERT_OK(fps);
  PutAll(ns, *fps);
  ASSERT_OK(server_->store_for_test().CorruptBlockForTest({(*fps)[1], 0}, 17));
  const uint64_t bytes = ns.layout.ShardBytes();
  std::vector<std::vector<std::byte>> out(2, std::vector<std::byte>(bytes));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto r = client_->Get(ns, *fps, 0, views);
  ASSERT_OK(r);
  EXPECT_EQ((*r)[0], GetResult::kHit);
  EXPECT_EQ((*r)[1], GetResult::kChecksumMismatch);
  EXPECT_EQ(client_->stats().checksum_failures.load(), 1u);
  EXPECT_EQ(client_->stats().retrieve_hit_blocks.load(), 1u);
}

TEST_F(CacheServerTest, BlocksLargerThanFourMiBRoundTrip) {
  Namespace ns = TestNamespace();
  ns.layout.num_layers = 8;
  ns.layout.num_kv_heads = 8;
  ns.layout.head_dim = 128;
  ns.layout.block_tokens = 256;  // 8 * 2 * 256 * 8 * 128 * 2 = 8 MiB per block
  ASSERT_EQ(ns.layout.ShardBytes(), 8ULL << 20);
  auto fps = ChainFingerprints(ns, Tokens(512));
  ASSERT_OK(fps);
  PutAll(ns, *fps);
  std::vector<std::vector<std::byte>> out(2, std::vector<std::byte>(8ULL << 20));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto r = client_->Get(ns, *fps, 0, views);
  ASSERT_OK(r);
  EXPECT_EQ((*r)[0], GetResult::kHit);
  EXPECT_EQ((*r)[1], GetResult::kHit);
  EXPECT_EQ(out[1], BlockBytes((*fps)[1], 8ULL << 20));
}

TEST_F(CacheServerTest, ClientRefusesMismatchedBuffers) {
  const Namespace ns = TestNamespace();
  auto fps = ChainFingerprints(ns, Tokens(32));
  ASSERT_OK(fps);
  std::vector<std::byte> small(10);
  std::vector<std::span<std::byte>> views = {small, small};
  EXPECT_EQ(client_->Get(ns, *fps, 0, views).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Get(ns, *fps, 1, views).status().code(), absl::StatusCode::kInvalidArgument);
}

// Requests a buggy or hostile client could send, straight through the generated stub.
class RawRequestTest : public CacheServerTest {
 protected:
  void SetUp() override {
    CacheServerTest::SetUp();
    stub_ = v1::CacheService::NewStub(
        grpc::CreateCustomChannel(Address(), grpc::InsecureChannelCredentials(), wire::ChannelArgs(80 << 20)));
    wire::ToProto(TestNamespace(), &ns_);
  }

  grpc::StatusCode LookupCode(const v1::LookupRequest& req) {
    grpc::ClientContext ctx;
    v1::LookupResponse resp;
    return stub_->Lookup(&ctx, req, &resp).error_code();
  }

  // The server still answers a well-formed request.
  void ExpectStillServing() {
    v1::LookupRequest req;
    *req.mutable_namespace_() = ns_;
    req.mutable_keys()->set_fingerprints(std::string(32, 'x'));
    EXPECT_EQ(LookupCode(req), grpc::StatusCode::OK);
  }

  std::unique_ptr<v1::CacheService::Stub> stub_;
  v1::Namespace ns_;
};

TEST_F(RawRequestTest, MalformedKeysAreInvalidArgument) {
  v1::LookupRequest req;
  *req.mutable_namespace_() = ns_;
  req.mutable_keys()->set_fingerprints(std::string(33, 'x'));
  EXPECT_EQ(LookupCode(req), grpc::StatusCode::INVALID_ARGUMENT);
  req.mutable_keys()->set_fingerprints("");
  EXPECT_EQ(LookupCode(req), grpc::StatusCode::INVALID_ARGUMENT);
  req.mutable_keys()->set_fingerprints(std::string(64, 'x'));
  req.mutable_keys()->add_shards(0);  // 1 shard for 2 keys
  EXPECT_EQ(LookupCode(req), grpc::StatusCode::INVALID_ARGUMENT);
  req.mutable_keys()->add_shards(3);  // shard >= tp_size
  EXPECT_EQ(LookupCode(req), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectStillServing();
}

TEST_F(RawRequestTest, OversizedRequestsAreInvalidArgument) {
  v1::LookupRequest req;
  *req.mutable_namespace_() = ns_;
  req.mutable_keys()->set_fingerprints(std::string(32 * 70000, 'x'));  // above 65536 keys
  EXPECT_EQ(LookupCode(req), grpc::StatusCode::INVALID_ARGUMENT);
  // A layout whose blocks exceed max_block_bytes (64 MiB): 64 layers x 64 heads x 128 x 512 tokens x bf16.
  req.mutable_keys()->set_fingerprints(std::string(32, 'x'));
  v1::KvLayout* l = req.mutable_namespace_()->mutable_layout();
  l->set_num_layers(64);
  l->set_num_kv_heads(64);
  l->set_head_dim(128);
  l->set_block_tokens(512);
  EXPECT_EQ(LookupCode(req), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectStillServing();
}

TEST_F(RawRequestTest, InvalidLayoutsAreInvalidArgument) {
  v1::LookupRequest req;
  req.mutable_keys()->set_fingerprints(std::string(32, 'x'));
  EXPECT_EQ(LookupCode(req), grpc::StatusCode::INVALID_ARGUMENT);  // no namespace at all
  *req.mutable_namespace_() = ns_;
  req.mutable_namespace_()->mutable_layout()->set_head_dim(0);
  EXPECT_EQ(LookupCode(req), grpc::StatusCode::INVALID_ARGUMENT);
  *req.mutable_namespace_() = ns_;
  req.mutable_namespace_()->mutable_layout()->set_dtype(static_cast<v1::DType>(99));
  EXPECT_EQ(LookupCode(req), grpc::StatusCode::INVALID_ARGUMENT);
  *req.mutable_namespace_() = ns_;
  req.mutable_namespace_()->set_tenant("");
  EXPECT_EQ(LookupCode(req), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectStillServing();
}

TEST_F(RawRequestTest, MismatchedWritesAreRefusedAndNothingBecomesVisible) {
  v1::AllocateRequest areq;
  *areq.mutable_namespace_() = ns_;
  areq.mutable_keys()->set_fingerprints(std::string(32, 'k'));
  v1::AllocateResponse aresp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Allocate(&ctx, areq, &aresp).ok());
  }
  ASSERT_EQ(aresp.results(0), v1::ALLOCATE_RESULT_ALLOCATED);
  // More bytes than the layout's block.
  {
    grpc::ClientContext ctx;
    v1::WriteBlocksResponse wresp;
    auto w = stub_->WriteBlocks(&ctx, &wresp);
    v1::WriteBlocksRequest chunk;
    chunk.set_reservation_id(aresp.reservation_id());
    chunk.set_data(std::string(aresp.block_bytes() + 1, 'z'));
    w->Write(chunk);
    w->WritesDone();
    EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Commit without the bytes: incomplete, not visible.
  v1::CommitRequest creq;
  creq.set_reservation_id(aresp.reservation_id());
  creq.add_checksums(0);
  v1::CommitResponse cresp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Commit(&ctx, creq, &cresp).ok());
  }
  EXPECT_EQ(cresp.results(0), v1::COMMIT_RESULT_INCOMPLETE);
  // Wrong number of checksums for an unknown reservation.
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub_->Commit(&ctx, creq, &cresp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  ExpectStillServing();
  EXPECT_EQ(server_->store_for_test().stats().stored_blocks.load(), 0u);
}

TEST_F(CacheServerTest, StoppedServerTurnsIntoCountedMissesWithinTheDeadline) {
  const Namespace ns = TestNamespace();
  auto fps = ChainFingerprints(ns, Tokens(16 * 4));
  ASSERT_OK(fps);
  PutAll(ns, *fps);
  server_->Shutdown();
  const absl::Time start = absl::Now();
  auto r = client_->LookupPrefix(ns, *fps);
  ASSERT_OK(r);  // a dead owner is a miss, never an error of the call
  EXPECT_EQ(r->prefix_blocks, 0u);
  EXPECT_EQ(r->blocks_from_errors, 4u);
  const uint64_t bytes = ns.layout.ShardBytes();
  std::vector<std::vector<std::byte>> out(4, std::vector<std::byte>(bytes));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto g = client_->Get(ns, *fps, 0, views);
  ASSERT_OK(g);
  for (GetResult x : *g) EXPECT_EQ(x, GetResult::kMissFromError);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(2 * 1500 + 500));
  EXPECT_EQ(client_->stats().misses_from_errors.load(), 8u);
  EXPECT_GE(client_->stats().rpc_errors.load(), 2u);
}

// A host tier smaller than limits.max_block_bytes: the server advertises, and enforces up front, what fits.
TEST(SmallHostTierTest, MaxBlockBytesIsWhatTheHostTierCanHold) {
  auto server = server::Server::Start({.node_id = "small", .metrics_address = "", .host_cache_bytes = 1ULL << 20});
  ASSERT_OK(server);
  const std::string address = "127.0.0.1:" + std::to_string((*server)->grpc_port());
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto admin = v1::AdminService::NewStub(channel);
  grpc::ClientContext info_ctx;
  v1::GetInfoRequest info_req;
  v1::GetInfoResponse info;
  ASSERT_TRUE(admin->GetInfo(&info_ctx, info_req, &info).ok());
  EXPECT_EQ(info.max_block_bytes(), 1ULL << 20);
  // 2 MiB blocks (8 layers x 8 heads x 128 x 64 tokens x bf16 x K and V): refused, not "no space" later.
  auto cache = v1::CacheService::NewStub(channel);
  v1::AllocateRequest req;
  Namespace ns = TestNamespace();
  ns.layout = {.num_layers = 8, .num_kv_heads = 8, .head_dim = 128, .block_tokens = 64};
  ASSERT_EQ(ns.layout.ShardBytes(), 2ULL << 20);
  wire::ToProto(ns, req.mutable_namespace_());
  req.mutable_keys()->set_fingerprints(std::string(32, 'x'));
  req.add_depths(0);
  grpc::ClientContext ctx;
  v1::AllocateResponse resp;
  const grpc::Status st = cache->Allocate(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("at most 1048576"), std::string::npos) << st.error_message();
}

}  // namespace
}  // namespace kvtier
