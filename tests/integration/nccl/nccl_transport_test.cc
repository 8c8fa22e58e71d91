// The NCCL transport end to end over a real gRPC server on loopback: the bootstrap service hands out
// one unique id per worker and reuses it, a reset or a failure starts a new generation, blocks move
// worker <- server through grouped transfers, and a dead worker or a server whose sends never arrive is
// detected by timeouts and aborts instead of hanging. NCCL itself is FakeNcclApi (host memory), so
// these run without a GPU; the last test uses real NCCL on two GPUs and skips without them.
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/container/flat_hash_map.h"
#include "kvtier/kernels/device.h"
#include "kvtier/nccl/device_block_source.h"
#include "kvtier/nccl/nccl_service.h"
#include "kvtier/nccl/nccl_worker.h"
#include "kvtier/v1/nccl.grpc.pb.h"
#include "kvtier/wire/wire.h"
#include "testing/fake_nccl_api.h"
#include "testing/status_matchers.h"

#if KVTIER_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace kvtier::nccl {
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
  k.fingerprint.bytes[7] = 0x33;
  return k;
}

// A device tier over host memory: blocks by key, and a count of leases not yet released.
class HostBlockSource final : public DeviceBlockSource {
 public:
  int32_t device() const override { return 0; }
  absl::StatusOr<DeviceBlockLease> Resolve(const Namespace&, std::span<const BlockKey> keys, absl::Duration) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::optional<DeviceSpan>> out;
    for (const BlockKey& k : keys) {
      auto it = blocks_.find(k);
      if (it == blocks_.end()) {
        out.push_back(std::nullopt);
      } else {
        out.push_back(DeviceSpan{it->second.data(), it->second.size()});
      }
    }
    ++leases_;
    ++active_;
    return DeviceBlockLease(std::move(out), [this] {
      std::lock_guard<std::mutex> lock(mu_);
      --active_;
    });
  }
  void Add(const BlockKey& k, std::vector<std::byte> bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[k] = std::move(bytes);
  }
  int active_leases() const {
    std::lock_guard<std::mutex> lock(mu_);
    return active_;
  }
  int leases() const {
    std::lock_guard<std::mutex> lock(mu_);
    return leases_;
  }

 private:
  mutable std::mutex mu_;
  absl::flat_hash_map<BlockKey, std::vector<std::byte>> blocks_;
  int leases_ = 0;
  int active_ = 0;
};

// Waits (polling, up to 10 s) for `pred`.
template <typename Pred>
bool Eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

class NcclTransportTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  void StartServer(absl::Duration transfer_timeout = absl::Milliseconds(300)) {
    NcclServiceOptions o;
    o.init_timeout = absl::Seconds(5);
    o.transfer_timeout = transfer_timeout;
    o.lease_ttl = transfer_timeout * 4;
    o.max_workers = 4;
    o.channel.poll_interval = absl::Microseconds(50);
    o.authenticate = authenticate_;
    auto svc = NcclService::Create(api_, source_, o);
    ASSERT_OK(svc);
    service_ = std::move(svc).value();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_->grpc_service());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    stub_ = v1::NcclService::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    service_.reset();
  }

  std::unique_ptr<NcclWorker> MakeWorker(const std::string& id, absl::Duration transfer_timeout = absl::Seconds(5),
                                         const std::string& token = "") {
    NcclWorkerOptions o;
    o.auth_token = token;
    o.server_address = address_;
    o.worker_id = id;
    o.rpc_timeout = absl::Seconds(2);
    o.init_timeout = absl::Seconds(5);
    o.transfer_timeout = transfer_timeout;
    o.channel.poll_interval = absl::Microseconds(50);
    auto w = NcclWorker::Create(api_, o);
    EXPECT_OK(w);
    return w.ok() ? std::move(w).value() : nullptr;
  }

  v1::NcclBootstrapResponse Bootstrap(const std::string& worker, uint64_t reset, grpc::Status* status = nullptr,
                                      const std::string& token = "") {
    v1::NcclBootstrapRequest req;
    req.set_worker_id(worker);
    req.set_reset_generation(reset);
    v1::NcclBootstrapResponse resp;
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    grpc::Status st = stub_->Bootstrap(&ctx, req, &resp);
    if (status != nullptr)
      *status = st;
    else
      EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }

  std::vector<std::byte> Pattern(int seed) {
    std::vector<std::byte> b(ns_.layout.ShardBytes());
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(seed * 37 + i);
    return b;
  }

  // Restarts the service with bearer tokens, as kvtier-server checks them: "tok-acme" is a worker of
  // tenant "acme" (ns_'s), "tok-other" one of tenant "other", "tok-admin" an admin; anything else is
  // UNAUTHENTICATED.
  void RestartWithTokens() {
    server_->Shutdown();
    service_.reset();
    authenticate_ = [](const grpc::ServerContext& ctx) -> absl::StatusOr<std::optional<std::string>> {
      auto it = ctx.client_metadata().find("authorization");
      const std::string value =
          it == ctx.client_metadata().end() ? "" : std::string(it->second.data(), it->second.size());
      if (value == "Bearer tok-acme") return std::optional<std::string>("acme");
      if (value == "Bearer tok-other") return std::optional<std::string>("other");
      if (value == "Bearer tok-admin") return std::optional<std::string>();
      return absl::UnauthenticatedError(value.empty() ? "no token" : "unknown token");
    };
    StartServer();
  }

  grpc::StatusCode FetchCode(const std::string& worker, uint64_t generation, const Namespace& ns,
                             const std::string& token) {
    v1::NcclFetchRequest req;
    req.set_worker_id(worker);
    req.set_generation(generation);
    wire::ToProto(ns, req.mutable_namespace_());
    std::vector<BlockKey> keys = {Key(0)};
    wire::EncodeKeys(keys, req.mutable_keys());
    req.set_block_bytes(ns.layout.ShardBytes());
    v1::NcclFetchResponse resp;
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    return stub_->Fetch(&ctx, req, &resp).error_code();
  }

  std::function<absl::StatusOr<std::optional<std::string>>(const grpc::ServerContext&)> authenticate_;
  Namespace ns_ = TestNamespace();
  testing::FakeNcclApi api_;
  HostBlockSource source_;
  std::unique_ptr<NcclService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<v1::NcclService::Stub> stub_;
};

TEST_F(NcclTransportTest, BootstrapHandsOutOneIdPerWorkerAndReusesIt) {
  auto a = Bootstrap("worker-a", 0);
  EXPECT_EQ(a.unique_id().size(), 128u);
  EXPECT_EQ(a.generation(), 1u);
  EXPECT_EQ(a.nranks(), 2u);
  EXPECT_EQ(a.worker_rank(), 1u);
  auto again = Bootstrap("worker-a", 0);
  EXPECT_EQ(again.unique_id(), a.unique_id()) << "a live pair's communicator is reused";
  EXPECT_EQ(again.generation(), 1u);
  auto b = Bootstrap("worker-b", 0);
  EXPECT_NE(b.unique_id(), a.unique_id());
  EXPECT_EQ(b.generation(), 1u);
  EXPECT_EQ(service_->stats().communicators.load(), 2u);
  EXPECT_EQ(service_->stats().reuses.load(), 1u);
  EXPECT_EQ(api_.unique_ids.load(), 2);
  grpc::Status st;
  Bootstrap("", 0, &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  for (int i = 0; i < 2; ++i) Bootstrap("worker-" + std::to_string(10 + i), 0);
  Bootstrap("one-too-many", 0, &st);  // max_workers = 4
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(NcclTransportTest, AResetOfTheLiveGenerationStartsANewCommunicator) {
  auto g1 = Bootstrap("w", 0);
  auto g2 = Bootstrap("w", /*reset_generation=*/1);
  EXPECT_EQ(g2.generation(), 2u);
  EXPECT_NE(g2.unique_id(), g1.unique_id());
  // A stale reset (of generation 1, already replaced) reuses the live generation 2.
  auto stale = Bootstrap("w", 1);
  EXPECT_EQ(stale.generation(), 2u);
  EXPECT_EQ(stale.unique_id(), g2.unique_id());
  // The replaced communicator (never joined by a worker) is aborted promptly, not at init_timeout.
  EXPECT_TRUE(Eventually([&] { return api_.aborts.load() == 1; })) << api_.aborts.load();
  EXPECT_EQ(service_->session("w")->generation, 2u);
  // A fetch on the old generation is refused with ABORTED (bootstrap again).
  v1::NcclFetchRequest req;
  req.set_worker_id("w");
  req.set_generation(1);
  wire::ToProto(ns_, req.mutable_namespace_());
  req.set_block_bytes(ns_.layout.ShardBytes());
  v1::NcclFetchResponse resp;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub_->Fetch(&ctx, req, &resp).error_code(), grpc::StatusCode::ABORTED);
}

TEST_F(NcclTransportTest, FetchDeliversBlocksOverOneReusedCommunicator) {
  for (int i : {0, 2, 3}) source_.Add(Key(i), Pattern(i));
  auto worker = MakeWorker("w");
  ASSERT_NE(worker, nullptr);
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> bufs(5, std::vector<std::byte>(ns_.layout.ShardBytes(), std::byte{0xee}));
  std::vector<DeviceSpan> spans;
  for (int i = 0; i < 5; ++i) {
    keys.push_back(Key(i));
    spans.push_back({bufs[i].data(), bufs[i].size()});
  }
  auto got = worker->Fetch(ns_, keys, spans, nullptr);
  ASSERT_OK(got);
  using R = NcclFetchResult;
  EXPECT_EQ(*got, (std::vector<R>{R::kHit, R::kMiss, R::kHit, R::kHit, R::kMiss}));
  EXPECT_EQ(bufs[0], Pattern(0));
  EXPECT_EQ(bufs[2], Pattern(2));
  EXPECT_EQ(bufs[3], Pattern(3));
  EXPECT_EQ(bufs[1], std::vector<std::byte>(ns_.layout.ShardBytes(), std::byte{0xee})) << "a miss is untouched";
  // Second fetch, same communicator: one bootstrap in all.
  std::fill(bufs[0].begin(), bufs[0].end(), std::byte{0});
  got = worker->Fetch(ns_, std::span(keys).first(1), std::span(spans).first(1), nullptr);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0], R::kHit);
  EXPECT_EQ(bufs[0], Pattern(0));
  EXPECT_EQ(worker->stats().bootstraps.load(), 1u);
  EXPECT_EQ(worker->generation(), 1u);
  EXPECT_EQ(service_->stats().communicators.load(), 1u);
  EXPECT_EQ(worker->stats().hit_blocks.load(), 4u);
  EXPECT_TRUE(Eventually([&] { return source_.active_leases() == 0; })) << "every lease ends after its send";
  EXPECT_TRUE(Eventually([&] { return service_->stats().sent_blocks.load() == 4; }));
  EXPECT_EQ(service_->stats().sent_bytes.load(), 4 * ns_.layout.ShardBytes());
  // All misses: nothing is sent and the lease ends at once.
  std::vector<BlockKey> absent = {Key(1), Key(4)};
  got = worker->Fetch(ns_, absent, std::span(spans).subspan(1, 2), nullptr);
  ASSERT_OK(got);
  EXPECT_EQ(*got, (std::vector<R>{R::kMiss, R::kMiss}));
  EXPECT_EQ(source_.active_leases(), 0);
}

TEST_F(NcclTransportTest, WithTokensAMissingOrUnknownTokenIsUnauthenticated) {
  RestartWithTokens();
  grpc::Status st;
  Bootstrap("w", 0, &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  Bootstrap("w", 0, &st, "tok-forged");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(service_->session("w").has_value()) << "a refused bootstrap makes no communicator";
  EXPECT_EQ(FetchCode("w", 1, ns_, ""), grpc::StatusCode::UNAUTHENTICATED);
  // A worker without a token gets errors, never blocks.
  source_.Add(Key(0), Pattern(0));
  auto worker = MakeWorker("w");
  ASSERT_NE(worker, nullptr);
  std::vector<std::byte> buf(ns_.layout.ShardBytes(), std::byte{0xee});
  std::vector<DeviceSpan> spans = {{buf.data(), buf.size()}};
  std::vector<BlockKey> keys = {Key(0)};
  auto got = worker->Fetch(ns_, keys, spans, nullptr);
  EXPECT_TRUE(!got.ok() || (*got)[0] == NcclFetchResult::kError);
  EXPECT_EQ(buf, std::vector<std::byte>(ns_.layout.ShardBytes(), std::byte{0xee}));
}

TEST_F(NcclTransportTest, WithTokensAnotherTenantsTokenIsPermissionDenied) {
  RestartWithTokens();
  source_.Add(Key(0), Pattern(0));
  // Tenant acme's worker, with its token, gets its blocks.
  auto worker = MakeWorker("w", absl::Seconds(5), "tok-acme");
  ASSERT_NE(worker, nullptr);
  std::vector<std::byte> buf(ns_.layout.ShardBytes(), std::byte{0xee});
  std::vector<DeviceSpan> spans = {{buf.data(), buf.size()}};
  std::vector<BlockKey> keys = {Key(0)};
  auto got = worker->Fetch(ns_, keys, spans, nullptr);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0], NcclFetchResult::kHit);
  EXPECT_EQ(buf, Pattern(0));
  const uint64_t generation = worker->generation();
  ASSERT_EQ(generation, 1u);
  const uint64_t fetches = service_->stats().fetches.load();
  // Tenant other may neither reset acme's communicator nor fetch on it, even acme's namespace.
  grpc::Status st;
  Bootstrap("w", generation, &st, "tok-other");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(service_->session("w")->generation, generation) << "the refused reset changed nothing";
  EXPECT_EQ(FetchCode("w", generation, ns_, "tok-other"), grpc::StatusCode::PERMISSION_DENIED);
  // On its own communicator, other may not fetch acme's namespace.
  Bootstrap("w-other", 0, &st, "tok-other");
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(FetchCode("w-other", 1, ns_, "tok-other"), grpc::StatusCode::PERMISSION_DENIED);
  // Nor may acme fetch a namespace of another tenant on its own.
  Namespace other = ns_;
  other.tenant = "other";
  EXPECT_EQ(FetchCode("w", generation, other, "tok-acme"), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(service_->stats().fetches.load(), fetches) << "no refused fetch queued a send";
  // An admin may.
  EXPECT_EQ(FetchCode("w-other", 1, other, "tok-admin"), grpc::StatusCode::OK);
  // acme's worker still works.
  std::fill(buf.begin(), buf.end(), std::byte{0});
  got = worker->Fetch(ns_, keys, spans, nullptr);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0], NcclFetchResult::kHit);
  EXPECT_EQ(buf, Pattern(0));
}

TEST_F(NcclTransportTest, ADeadWorkerTimesOutTheServersSendAndReleasesTheLease) {
  source_.Add(Key(1), Pattern(1));
  // A worker that bootstraps and joins, announces a fetch, then dies before posting its receive.
  auto boot = Bootstrap("dead", 0);
  NcclUniqueId id;
  std::memcpy(id.bytes.data(), boot.unique_id().data(), 128);
  auto comm = api_.CommInitRank(id, 2, 1, 0);
  ASSERT_OK(comm);
  v1::NcclFetchRequest req;
  req.set_worker_id("dead");
  req.set_generation(boot.generation());
  wire::ToProto(ns_, req.mutable_namespace_());
  std::vector<BlockKey> keys = {Key(1)};
  wire::EncodeKeys(keys, req.mutable_keys());
  req.set_block_bytes(ns_.layout.ShardBytes());
  v1::NcclFetchResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->Fetch(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.sent_size(), 1);
  EXPECT_TRUE(resp.sent(0));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(Eventually([&] { return service_->session("dead")->failed; }));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_LT(waited, std::chrono::seconds(3)) << "the 300 ms transfer timeout bounds the send";
  EXPECT_TRUE(Eventually([&] { return source_.active_leases() == 0; }));
  EXPECT_EQ(service_->stats().aborts.load(), 1u);
  EXPECT_EQ(service_->stats().failed_blocks.load(), 1u);
  EXPECT_EQ(service_->stats().sent_blocks.load(), 0u);
  // Fetches on the failed communicator are refused; the next bootstrap starts generation 2.
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub_->Fetch(&ctx2, req, &resp).error_code(), grpc::StatusCode::ABORTED);
  auto next = Bootstrap("dead", 0);
  EXPECT_EQ(next.generation(), 2u);
  EXPECT_NE(next.unique_id(), boot.unique_id());
  api_.Abort(*comm);
}

TEST_F(NcclTransportTest, LostSendsBecomeErrorsAndTheWorkerReBootstraps) {
  source_.Add(Key(0), Pattern(0));
  auto worker = MakeWorker("w", /*transfer_timeout=*/absl::Milliseconds(200));
  ASSERT_NE(worker, nullptr);
  std::vector<std::byte> buf(ns_.layout.ShardBytes());
  std::vector<DeviceSpan> spans = {{buf.data(), buf.size()}, {buf.data(), buf.size()}};
  std::vector<BlockKey> keys = {Key(0), Key(9)};
  api_.drop_sends_from_rank = 0;  // the server's sends never arrive
  const auto start = std::chrono::steady_clock::now();
  auto got = worker->Fetch(ns_, keys, spans, nullptr);
  ASSERT_OK(got);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(*got, (std::vector<NcclFetchResult>{NcclFetchResult::kError, NcclFetchResult::kMiss}));
  EXPECT_EQ(worker->channel_state(), ChannelState::kAborted);
  EXPECT_EQ(worker->stats().aborts.load(), 1u);
  EXPECT_EQ(worker->stats().error_blocks.load(), 1u);
  // The next fetch asks the server to replace generation 1, and works.
  api_.drop_sends_from_rank = -1;
  got = worker->Fetch(ns_, std::span(keys).first(1), std::span(spans).first(1), nullptr);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0], NcclFetchResult::kHit);
  EXPECT_EQ(buf, Pattern(0));
  EXPECT_EQ(worker->generation(), 2u);
  EXPECT_EQ(worker->stats().bootstraps.load(), 2u);
  EXPECT_EQ(service_->session("w")->generation, 2u);
}

TEST_F(NcclTransportTest, AnUnreachableServerGivesErrorsWithinTheRpcDeadline) {
  server_->Shutdown();
  server_.reset();
  auto worker = MakeWorker("w");
  ASSERT_NE(worker, nullptr);
  std::vector<std::byte> buf(ns_.layout.ShardBytes());
  std::vector<DeviceSpan> spans = {{buf.data(), buf.size()}};
  std::vector<BlockKey> keys = {Key(0)};
  const auto start = std::chrono::steady_clock::now();
  auto got = worker->Fetch(ns_, keys, spans, nullptr);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0], NcclFetchResult::kError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  EXPECT_EQ(api_.inits.load(), 0);
}

TEST_F(NcclTransportTest, BadFetchArgumentsAreRefusedBeforeAnyRpc) {
  auto worker = MakeWorker("w");
  ASSERT_NE(worker, nullptr);
  std::vector<std::byte> buf(ns_.layout.ShardBytes() - 1);
  std::vector<DeviceSpan> spans = {{buf.data(), buf.size()}};
  std::vector<BlockKey> keys = {Key(0)};
  EXPECT_EQ(worker->Fetch(ns_, keys, spans, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  keys.push_back(Key(1));
  EXPECT_EQ(worker->Fetch(ns_, keys, spans, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(worker->stats().bootstraps.load(), 0u);
  NcclWorkerOptions bad;
  bad.server_address = "nohost";
  bad.worker_id = "w";
  EXPECT_EQ(NcclWorker::Create(api_, bad).status().code(), absl::StatusCode::kInvalidArgument);
  NcclServiceOptions so;
  so.lease_ttl = so.transfer_timeout;
  auto s = NcclService::Create(api_, source_, so).status();
  EXPECT_NE(s.message().find("lease_ttl"), std::string::npos) << s;
}

#if KVTIER_HAVE_NCCL
// Device memory on `device` holding `bytes`.
struct DeviceBytes {
  DeviceBytes(int device, size_t n) : device(device), size(n) {
    cudaSetDevice(device);
    cudaMalloc(&ptr, n);
  }
  ~DeviceBytes() {
    cudaSetDevice(device);
    cudaFree(ptr);
  }
  int device;
  size_t size;
  void* ptr = nullptr;
};

class DeviceSource final : public DeviceBlockSource {
 public:
  int32_t device() const override { return 0; }
  absl::StatusOr<DeviceBlockLease> Resolve(const Namespace&, std::span<const BlockKey> keys, absl::Duration) override {
    std::vector<std::optional<DeviceSpan>> out;
    for (const BlockKey& k : keys) {
      auto it = blocks.find(k);
      if (it == blocks.end())
        out.push_back(std::nullopt);
      else
        out.push_back(DeviceSpan{it->second->ptr, it->second->size});
    }
    return DeviceBlockLease(std::move(out), [] {});
  }
  absl::flat_hash_map<BlockKey, std::unique_ptr<DeviceBytes>> blocks;
};
#endif

TEST(NcclTwoGpuTest, BlocksMoveFromTheServerGpuToTheWorkerGpu) {
  if (!NcclBuilt() || kernels::DeviceCount() < 2) GTEST_SKIP() << "needs two GPUs (and a build with NCCL)";
#if KVTIER_HAVE_NCCL
  auto api = CreateNcclApi();
  ASSERT_OK(api);
  Namespace ns = TestNamespace();
  const size_t bytes = ns.layout.ShardBytes();
  DeviceSource source;
  std::vector<std::byte> expected(bytes);
  for (size_t i = 0; i < bytes; ++i) expected[i] = static_cast<std::byte>(i * 7 + 1);
  auto block = std::make_unique<DeviceBytes>(0, bytes);
  ASSERT_EQ(cudaMemcpy(block->ptr, expected.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  source.blocks[Key(0)] = std::move(block);
  auto svc = NcclService::Create(**api, source, {});
  ASSERT_OK(svc);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService((*svc)->grpc_service());
  auto server = builder.BuildAndStart();
  NcclWorkerOptions o;
  o.server_address = "127.0.0.1:" + std::to_string(port);
  o.worker_id = "gpu1";
  o.device = 1;
  auto worker = NcclWorker::Create(**api, o);
  ASSERT_OK(worker);
  DeviceBytes dst(1, bytes);
  std::vector<BlockKey> keys = {Key(0), Key(5)};
  DeviceBytes other(1, bytes);
  std::vector<DeviceSpan> spans = {{dst.ptr, bytes}, {other.ptr, bytes}};
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(cudaMemset(dst.ptr, 0, bytes), cudaSuccess);
    auto got = (*worker)->Fetch(ns, keys, spans, nullptr);
    ASSERT_OK(got);
    EXPECT_EQ(*got, (std::vector<NcclFetchResult>{NcclFetchResult::kHit, NcclFetchResult::kMiss}));
    std::vector<std::byte> back(bytes);
    cudaSetDevice(1);
    ASSERT_EQ(cudaMemcpy(back.data(), dst.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, expected) << "round " << round;
  }
  EXPECT_EQ((*worker)->stats().bootstraps.load(), 1u);
  worker->reset();
  server->Shutdown();
#endif
}

}  // namespace
}  // namespace kvtier::nccl
