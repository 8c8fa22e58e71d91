// How Client picks a member's path for device buffers (client.cc GetIntoDevice over data_path.h), driven
// through fake BlockPaths (the test seam SetBlockPathFactoryForTest) and DeviceTransfer's staging
// pipeline over a copy engine that copies with memcpy, so that no GPU is needed: "device" memory is host
// memory. NCCL is taken for device buffers on a member that offers it; host buffers, a member without
// NCCL, a block missing from the member's device tier and transport "grpc" take the host paths.
// Members are configured with their node ids and health checks are an hour apart, so no RPC is made.
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "client/data_path.h"
#include "client/staging_pipeline.h"
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

constexpr int32_t kDevice = 3;

// A CopyEngine whose copies run at once with memcpy (staging is plain host memory).
class MemcpyEngine final : public internal::CopyEngine {
 public:
  explicit MemcpyEngine(int* copies) : copies_(copies) {}
  absl::Status Activate() override { return absl::OkStatus(); }
  absl::Status CheckDeviceBuffer(const DeviceBuffer&) override { return absl::OkStatus(); }
  absl::StatusOr<std::byte*> AllocateStaging(uint64_t bytes) override { return new std::byte[bytes]; }
  void FreeStaging(std::byte* staging) override { delete[] staging; }
  absl::Status CopyAsync(internal::CopyKind, void* dst, const void* src, uint64_t bytes, void*) override {
    std::memcpy(dst, src, bytes);
    ++*copies_;
    return absl::OkStatus();
  }
  absl::Status Record(uint32_t, void*) override { return absl::OkStatus(); }
  absl::Status Wait(uint32_t) override { return absl::OkStatus(); }

 private:
  int* copies_;
};

class ClientDevicePathsTest : public ::testing::Test {
 protected:
  ~ClientDevicePathsTest() override {
    pipeline_.reset();
    client_.reset();
    SetBlockPathFactoryForTest(nullptr);
  }

  // Connects to three members; those of `nccl_ring_indices` (positions on the ring) offer NCCL.
  void Connect(const std::string& transport, std::set<uint32_t> nccl_ring_indices) {
    ClientOptions o;
    o.transport = transport;
    o.members = {"node-1=127.0.0.1:1", "node-2=127.0.0.1:2", "node-3=127.0.0.1:3"};
    o.health_check_interval = absl::Hours(1);
    SetBlockPathFactoryForTest([this] { return std::make_unique<FakePaths>(cluster_); });
    auto c = Client::Connect(o);
    ASSERT_OK(c.status());
    client_ = *std::move(c);
    ASSERT_EQ(Ns().layout.ShardBytes(), kBlockBytes);
    {
      std::lock_guard<std::mutex> lock(cluster_.mu);
      for (uint32_t r : nccl_ring_indices) cluster_.servers[AddressOf(r)].offers_nccl = true;
    }
    auto p = internal::StagingPipeline::Create(std::make_unique<MemcpyEngine>(&copies_),
                                               {.device = kDevice, .batch_blocks = 4, .staging_buffer_bytes = 1024});
    ASSERT_OK(p.status());
    pipeline_ = *std::move(p);
    io_ = std::make_unique<internal::ClientBlockIo>(*client_);
    for (uint32_t n = 0; n < 24; ++n) fps_.push_back(Fp(n));
    std::vector<std::vector<std::byte>> bytes;
    std::vector<std::span<const std::byte>> blocks;
    for (size_t i = 0; i < fps_.size(); ++i) bytes.emplace_back(kBlockBytes, std::byte(i + 1));
    for (const auto& b : bytes) blocks.emplace_back(b);
    auto put = client_->Put(Ns(), fps_, 0, blocks, 0);
    ASSERT_OK(put.status());
    for (PutResult r : *put) ASSERT_EQ(r, PutResult::kStored);
  }

  std::string AddressOf(uint32_t ring_index) const {
    return "127.0.0.1:" + client_->ring().node_ids()[ring_index].substr(5);
  }

  // A GPU get as DeviceTransfer::GetToDevice makes it (the pipeline over the client); checks the bytes.
  std::vector<GetResult> DeviceGet() {
    std::vector<std::vector<std::byte>> memory(fps_.size(), std::vector<std::byte>(kBlockBytes));
    std::vector<DeviceBuffer> buffers;
    for (auto& m : memory) buffers.push_back({.device = kDevice, .ptr = m.data(), .size_bytes = kBlockBytes});
    auto got = pipeline_->Get(*io_, Ns(), fps_, 0, buffers, nullptr);
    EXPECT_OK(got.status());
    if (!got.ok()) return {};
    for (size_t i = 0; i < fps_.size(); ++i) {
      if ((*got)[i] == GetResult::kHit) {
        EXPECT_EQ(memory[i], std::vector<std::byte>(kBlockBytes, std::byte(i + 1))) << i;
      }
    }
    return *got;
  }

  // Blocks of fps_ whose primary owner offers NCCL.
  size_t BlocksOnNcclMembers() {
    std::lock_guard<std::mutex> lock(cluster_.mu);
    size_t n = 0;
    for (const Fingerprint& fp : fps_) n += cluster_.servers[AddressOf(client_->ring().Primary(fp))].offers_nccl;
    return n;
  }

  FakeCluster cluster_;
  int copies_ = 0;  // host-to-device copies out of staging
  std::unique_ptr<Client> client_;
  std::unique_ptr<internal::StagingPipeline> pipeline_;
  std::unique_ptr<internal::ClientBlockIo> io_;
  std::vector<Fingerprint> fps_;
};

TEST_F(ClientDevicePathsTest, DeviceBuffersGoOverNcclOnMembersThatOfferIt) {
  Connect("auto", {0, 1, 2});
  EXPECT_EQ(DeviceGet(), std::vector<GetResult>(fps_.size(), GetResult::kHit));
  EXPECT_EQ(copies_, 0);  // nothing staged
  std::lock_guard<std::mutex> lock(cluster_.mu);
  for (const auto& [address, s] : cluster_.servers) {
    EXPECT_GE(s.nccl_reads, 1) << address;
    EXPECT_EQ(s.reads, 0) << address;
    EXPECT_EQ(s.nccl_devices, std::set<int32_t>{kDevice}) << address;
  }
  EXPECT_EQ(client_->stats().get_blocks.load(), fps_.size());  // each block counted once
  EXPECT_EQ(client_->stats().retrieve_hit_blocks.load(), fps_.size());
}

TEST_F(ClientDevicePathsTest, HostBuffersTakeTheHostPathOnMembersThatOfferNccl) {
  Connect("auto", {0, 1, 2});
  std::vector<std::vector<std::byte>> bytes(fps_.size(), std::vector<std::byte>(kBlockBytes));
  std::vector<std::span<std::byte>> buffers;
  for (auto& b : bytes) buffers.emplace_back(b);
  auto got = client_->Get(Ns(), fps_, 0, buffers, 0);
  ASSERT_OK(got.status());
  EXPECT_EQ(*got, std::vector<GetResult>(fps_.size(), GetResult::kHit));
  for (size_t i = 0; i < fps_.size(); ++i) EXPECT_EQ(bytes[i][0], std::byte(i + 1)) << i;
  std::lock_guard<std::mutex> lock(cluster_.mu);
  for (const auto& [address, s] : cluster_.servers) {
    EXPECT_EQ(s.nccl_reads, 0) << address;
    EXPECT_GE(s.reads, 1) << address;
  }
}

TEST_F(ClientDevicePathsTest, AMemberWithoutNcclIsStagedThroughItsHostPath) {
  Connect("auto", {0});
  const size_t on_nccl = BlocksOnNcclMembers();
  ASSERT_GT(on_nccl, 0u);
  ASSERT_LT(on_nccl, fps_.size());
  EXPECT_EQ(DeviceGet(), std::vector<GetResult>(fps_.size(), GetResult::kHit));
  EXPECT_EQ(copies_, static_cast<int>(fps_.size() - on_nccl));  // only the others were staged
  std::lock_guard<std::mutex> lock(cluster_.mu);
  for (const auto& [address, s] : cluster_.servers) {
    if (s.offers_nccl) {
      EXPECT_GE(s.nccl_reads, 1) << address;
      EXPECT_EQ(s.reads, 0) << address;
    } else {
      EXPECT_EQ(s.nccl_reads, 0) << address;
      EXPECT_GE(s.reads, 1) << address;
    }
  }
  EXPECT_EQ(client_->stats().get_blocks.load(), fps_.size());
}

TEST_F(ClientDevicePathsTest, ABlockNotInTheMembersDeviceTierIsStagedFromItsHostPath) {
  Connect("auto", {0, 1, 2});
  {
    std::lock_guard<std::mutex> lock(cluster_.mu);
    for (auto& [address, s] : cluster_.servers) s.hbm_empty = true;
  }
  EXPECT_EQ(DeviceGet(), std::vector<GetResult>(fps_.size(), GetResult::kHit));
  EXPECT_EQ(copies_, static_cast<int>(fps_.size()));
  std::lock_guard<std::mutex> lock(cluster_.mu);
  for (const auto& [address, s] : cluster_.servers) {
    EXPECT_GE(s.nccl_reads, 1) << address;  // asked first, then over the host path
    EXPECT_GE(s.reads, 1) << address;
  }
}

TEST_F(ClientDevicePathsTest, TransportGrpcStagesDeviceBuffersEvenWhereNcclIsOffered) {
  Connect("grpc", {0, 1, 2});
  EXPECT_EQ(DeviceGet(), std::vector<GetResult>(fps_.size(), GetResult::kHit));
  EXPECT_EQ(copies_, static_cast<int>(fps_.size()));
  std::lock_guard<std::mutex> lock(cluster_.mu);
  for (const auto& [address, s] : cluster_.servers) EXPECT_EQ(s.nccl_reads, 0) << address;
}

TEST_F(ClientDevicePathsTest, GetIntoDeviceRefusesBuffersOnTwoDevices) {
  Connect("auto", {0, 1, 2});
  std::vector<std::byte> a(kBlockBytes), b(kBlockBytes);
  const std::vector<DeviceBuffer> buffers = {{.device = 0, .ptr = a.data(), .size_bytes = kBlockBytes},
                                             {.device = 1, .ptr = b.data(), .size_bytes = kBlockBytes}};
  auto got = client_->GetIntoDevice(Ns(), std::span(fps_).first(2), 0, buffers);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  std::lock_guard<std::mutex> lock(cluster_.mu);
  for (const auto& [address, s] : cluster_.servers) EXPECT_EQ(s.nccl_reads, 0) << address;
}

}  // namespace
}  // namespace kvtier::client
