// A GPU get through Client reaching a member over NCCL: a real gRPC server on loopback serves the
// member's GetInfo (which says whether it offers NCCL) and the real NcclService over a device tier in
// host memory; the client's own NCCL path (nccl_endpoints.h, nccl_block_path.h) bootstraps an
// NcclWorker with it and receives the blocks. NCCL is FakeNcclApi (SetNcclApiForTest), whose "device"
// memory is host memory, so this runs without a GPU. The last test uses real NCCL on two GPUs (the
// member's device tier on GPU 0, the client's buffers on GPU 1) and skips without them.
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/container/flat_hash_map.h"
#include "client/nccl_endpoints.h"
#include "kvtier/client/client.h"
#include "kvtier/kernels/device.h"
#include "kvtier/nccl/device_block_source.h"
#include "kvtier/nccl/nccl_service.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "testing/fake_nccl_api.h"
#include "testing/status_matchers.h"

#if KVTIER_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace kvtier::client {
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

Fingerprint Fp(int i) {
  Fingerprint fp;
  fp.bytes[0] = static_cast<uint8_t>(i);
  fp.bytes[7] = 0x5a;
  return fp;
}

// A device tier over host memory, by key.
class HostBlockSource final : public nccl::DeviceBlockSource {
 public:
  int32_t device() const override { return 0; }
  absl::StatusOr<nccl::DeviceBlockLease> Resolve(const Namespace&, std::span<const BlockKey> keys,
                                                 absl::Duration) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::optional<nccl::DeviceSpan>> out;
    for (const BlockKey& k : keys) {
      auto it = blocks_.find(k);
      if (it == blocks_.end()) {
        out.push_back(std::nullopt);
      } else {
        out.push_back(nccl::DeviceSpan{it->second.data(), it->second.size()});
      }
    }
    return nccl::DeviceBlockLease(std::move(out), [] {});
  }
  void Add(const BlockKey& k, std::vector<std::byte> bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[k] = std::move(bytes);
  }

 private:
  std::mutex mu_;
  absl::flat_hash_map<BlockKey, std::vector<std::byte>> blocks_;  // guarded by mu_
};

// GetInfo as a kvtier-server answers it: its node id, and whether it serves NCCL.
class InfoService final : public v1::AdminService::Service {
 public:
  explicit InfoService(bool nccl) : nccl_(nccl) {}
  grpc::Status GetInfo(grpc::ServerContext*, const v1::GetInfoRequest*, v1::GetInfoResponse* resp) override {
    resp->set_node_id("node-1");
    resp->set_transport("grpc");
    resp->set_nccl(nccl_);
    return grpc::Status::OK;
  }

 private:
  const bool nccl_;
};

class ClientNcclTest : public ::testing::Test {
 protected:
  ~ClientNcclTest() override {
    client_.reset();
    SetNcclApiForTest(nullptr);
    if (server_ != nullptr) server_->Shutdown();
    service_.reset();
  }

  void Start(bool offers_nccl) {
    nccl::NcclServiceOptions o;
    o.init_timeout = absl::Seconds(5);
    o.transfer_timeout = absl::Seconds(2);
    o.lease_ttl = absl::Seconds(8);
    o.channel.poll_interval = absl::Microseconds(50);
    auto svc = nccl::NcclService::Create(api_, source_, o);
    ASSERT_OK(svc);
    service_ = std::move(svc).value();
    info_ = std::make_unique<InfoService>(offers_nccl);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(info_.get());
    builder.RegisterService(service_->grpc_service());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    SetNcclApiForTest(&api_);
    ClientOptions co;
    co.members = {"node-1=127.0.0.1:" + std::to_string(port)};
    co.health_check_interval = absl::Hours(1);
    auto c = Client::Connect(co);
    ASSERT_OK(c.status());
    client_ = *std::move(c);
  }

  std::vector<std::byte> Pattern(int seed) const {
    std::vector<std::byte> b(ns_.layout.ShardBytes());
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(seed * 37 + i);
    return b;
  }

  // Waits (polling, up to 10 s) until the service has counted `n` sent blocks.
  bool SentEventually(uint64_t n) const {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (service_->stats().sent_blocks.load() != n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    return service_->stats().sent_blocks.load() == n;
  }

  const Namespace ns_ = TestNamespace();
  testing::FakeNcclApi api_;
  HostBlockSource source_;
  std::unique_ptr<nccl::NcclService> service_;
  std::unique_ptr<InfoService> info_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientNcclTest, AGpuGetReachesAMemberThatOffersNcclOverNccl) {
  ASSERT_NO_FATAL_FAILURE(Start(/*offers_nccl=*/true));
  source_.Add({Fp(0), 0}, Pattern(0));
  source_.Add({Fp(2), 0}, Pattern(2));
  const std::vector<Fingerprint> fps = {Fp(0), Fp(1), Fp(2)};
  const uint64_t bytes = ns_.layout.ShardBytes();
  std::vector<std::vector<std::byte>> memory(fps.size(), std::vector<std::byte>(bytes));
  std::vector<DeviceBuffer> buffers;
  for (auto& m : memory) buffers.push_back({.device = 0, .ptr = m.data(), .size_bytes = bytes});
  auto got = client_->GetIntoDevice(ns_, fps, 0, buffers);
  ASSERT_OK(got.status());
  EXPECT_EQ(*got, (std::vector<bool>{true, false, true}));  // Fp(1) is not in the device tier
  EXPECT_EQ(memory[0], Pattern(0));
  EXPECT_EQ(memory[2], Pattern(2));
  EXPECT_TRUE(SentEventually(2));  // the server's sender counts once it sees its send complete
  EXPECT_EQ(service_->stats().communicators.load(), 1u);
  EXPECT_EQ(client_->stats().retrieve_hit_blocks.load(), 2u);
  EXPECT_EQ(client_->stats().nccl_get_blocks.load(), 2u);

  // The communicator is kept for the next get.
  auto again = client_->GetIntoDevice(ns_, std::span(fps).first(1), 0, std::span(buffers).first(1));
  ASSERT_OK(again.status());
  EXPECT_EQ(*again, std::vector<bool>{true});
  EXPECT_TRUE(SentEventually(3));
  EXPECT_EQ(service_->stats().communicators.load(), 1u);
}

TEST_F(ClientNcclTest, AMemberThatDoesNotOfferNcclIsNotAskedOverIt) {
  ASSERT_NO_FATAL_FAILURE(Start(/*offers_nccl=*/false));
  source_.Add({Fp(0), 0}, Pattern(0));
  const uint64_t bytes = ns_.layout.ShardBytes();
  std::vector<std::byte> memory(bytes);
  const std::vector<DeviceBuffer> buffers = {{.device = 0, .ptr = memory.data(), .size_bytes = bytes}};
  const std::vector<Fingerprint> fps = {Fp(0)};
  auto got = client_->GetIntoDevice(ns_, fps, 0, buffers);
  ASSERT_OK(got.status());
  EXPECT_EQ(*got, std::vector<bool>{false});  // left to the host path
  EXPECT_EQ(client_->stats().nccl_get_blocks.load(), 0u);
  EXPECT_EQ(service_->stats().communicators.load(), 0u);
  EXPECT_EQ(api_.inits.load(), 0);
}

#if KVTIER_HAVE_NCCL
// cudaMalloc'd bytes on one device.
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

// A device tier on GPU 0.
class GpuBlockSource final : public nccl::DeviceBlockSource {
 public:
  int32_t device() const override { return 0; }
  absl::StatusOr<nccl::DeviceBlockLease> Resolve(const Namespace&, std::span<const BlockKey> keys,
                                                 absl::Duration) override {
    std::vector<std::optional<nccl::DeviceSpan>> out;
    for (const BlockKey& k : keys) {
      auto it = blocks.find(k);
      if (it == blocks.end()) {
        out.push_back(std::nullopt);
      } else {
        out.push_back(nccl::DeviceSpan{it->second->ptr, it->second->size});
      }
    }
    return nccl::DeviceBlockLease(std::move(out), [] {});
  }
  absl::flat_hash_map<BlockKey, std::unique_ptr<DeviceBytes>> blocks;
};
#endif

TEST(ClientNcclTwoGpuTest, AGpuGetThroughClientMovesBlocksFromTheMemberGpuToTheWorkerGpu) {
  if (!nccl::NcclBuilt() || kernels::DeviceCount() < 2) GTEST_SKIP() << "needs two GPUs (and a build with NCCL)";
#if KVTIER_HAVE_NCCL
  auto api = nccl::CreateNcclApi();
  ASSERT_OK(api);
  const Namespace ns = TestNamespace();
  const size_t bytes = ns.layout.ShardBytes();
  std::vector<std::byte> expected(bytes);
  for (size_t i = 0; i < bytes; ++i) expected[i] = static_cast<std::byte>(i * 7 + 1);
  GpuBlockSource source;
  auto block = std::make_unique<DeviceBytes>(0, bytes);
  ASSERT_EQ(cudaMemcpy(block->ptr, expected.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  source.blocks[{Fp(0), 0}] = std::move(block);
  auto svc = nccl::NcclService::Create(**api, source, {});
  ASSERT_OK(svc);
  InfoService info(/*nccl=*/true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&info);
  builder.RegisterService((*svc)->grpc_service());
  auto server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ClientOptions co;  // the client makes its own NCCL API: no test seam
  co.members = {"node-1=127.0.0.1:" + std::to_string(port)};
  co.health_check_interval = absl::Hours(1);
  auto client = Client::Connect(co);
  ASSERT_OK(client.status());
  DeviceBytes dst(1, bytes), other(1, bytes);
  const std::vector<DeviceBuffer> buffers = {{.device = 1, .ptr = dst.ptr, .size_bytes = bytes},
                                             {.device = 1, .ptr = other.ptr, .size_bytes = bytes}};
  const std::vector<Fingerprint> fps = {Fp(0), Fp(5)};
  auto got = (*client)->GetIntoDevice(ns, fps, 0, buffers);
  ASSERT_OK(got.status());
  EXPECT_EQ(*got, (std::vector<bool>{true, false}));
  std::vector<std::byte> back(bytes);
  cudaSetDevice(1);
  ASSERT_EQ(cudaMemcpy(back.data(), dst.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, expected);
  client->reset();
  server->Shutdown();
#endif
}

}  // namespace
}  // namespace kvtier::client
