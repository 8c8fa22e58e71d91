// DeviceTransfer against a real 3-process cluster: blocks put from GPU memory come back into other GPU
// memory byte for byte, through the pinned staging pipeline. Without a usable CUDA device the round
// trip skips, and Create() must fail with FailedPrecondition (that part runs everywhere).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/client/client.h"
#include "kvtier/client/device_transfer.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/kernels/device.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::client {
namespace {

Namespace TestNamespace() {
  Namespace ns;
  ns.tenant = "gpu-test";
  ns.model = "tiny";
  ns.layout.num_layers = 4;
  ns.layout.num_kv_heads = 2;
  ns.layout.head_dim = 64;
  ns.layout.block_tokens = 16;  // 16 KiB blocks (bf16)
  return ns;
}

TEST(DeviceTransferCreateTest, FailsWithFailedPreconditionWithoutAUsableDevice) {
  if (kernels::CudaAvailable()) GTEST_SKIP() << "a CUDA device is usable here; covered by the round trip";
  // A member given by id need not be up: Connect makes no RPC to it.
  auto client = Client::Connect({.members = {"node-1=127.0.0.1:1"}});
  ASSERT_OK(client);
  auto dt = DeviceTransfer::Create(**client, {});
  EXPECT_EQ(dt.status().code(), absl::StatusCode::kFailedPrecondition) << dt.status();
  auto bad = DeviceTransfer::Create(**client, {.staging_buffers = 0});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

class DeviceTransferClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
    for (int i = 1; i <= 3; ++i) {
      auto p = testing::ServerProcess::Start("node-" + std::to_string(i));
      ASSERT_OK(p);
      members_.push_back((*p)->address());
      procs_.push_back(std::move(p).value());
    }
    auto c = Client::Connect({.members = members_, .rpc_timeout = absl::Milliseconds(2000)});
    ASSERT_OK(c);
    client_ = std::move(c).value();
  }

  std::vector<std::string> members_;
  std::vector<std::unique_ptr<testing::ServerProcess>> procs_;
  std::unique_ptr<Client> client_;
};

TEST_F(DeviceTransferClusterTest, PutFromDeviceThenGetToDeviceRoundTripsEveryByte) {
#if KVTIER_HAVE_CUDA
  const Namespace ns = TestNamespace();
  const uint64_t bytes = ns.layout.ShardBytes();
  constexpr int kBlocks = 40;  // 5 batches of 8, over 2 staging buffers: slots are reused
  std::vector<uint32_t> tokens(kBlocks * ns.layout.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 + 3);
  auto fps = ChainFingerprints(ns, tokens);
  ASSERT_OK(fps);
  ASSERT_EQ(fps->size(), static_cast<size_t>(kBlocks));

  std::vector<std::byte> host(bytes * kBlocks);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  void* src = nullptr;
  void* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, host.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, host.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dst, 0, host.size()), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::vector<DeviceBuffer> in, out;
  for (int i = 0; i < kBlocks; ++i) {
    in.push_back({.device = 0, .ptr = static_cast<std::byte*>(src) + i * bytes, .size_bytes = bytes});
    out.push_back({.device = 0, .ptr = static_cast<std::byte*>(dst) + i * bytes, .size_bytes = bytes});
  }

  auto dt = DeviceTransfer::Create(*client_, {.batch_blocks = 8, .staging_buffers = 2});
  ASSERT_OK(dt);
  auto put = (*dt)->PutFromDevice(ns, *fps, 0, in, stream);
  ASSERT_OK(put);
  for (auto r : *put) EXPECT_EQ(r, PutResult::kStored);
  auto got = (*dt)->GetToDevice(ns, *fps, 0, out, stream);
  ASSERT_OK(got);
  for (auto r : *got) EXPECT_EQ(r, GetResult::kHit);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<std::byte> back(host.size());
  ASSERT_EQ(cudaMemcpy(back.data(), dst, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), host.data(), host.size()), 0);
  EXPECT_EQ((*dt)->stats().host_to_device_bytes.load(), bytes * kBlocks);
  EXPECT_EQ((*dt)->stats().device_to_host_bytes.load(), bytes * kBlocks);
  EXPECT_EQ(client_->stats().retrieve_hit_blocks.load(), static_cast<uint64_t>(kBlocks));

  // A host pointer is refused as a device buffer.
  std::vector<DeviceBuffer> host_buf = {{.device = 0, .ptr = host.data(), .size_bytes = bytes}};
  auto bad = (*dt)->GetToDevice(ns, std::span(*fps).first(1), 0, host_buf, stream);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();

  dt->reset();
  cudaStreamDestroy(stream);
  cudaFree(src);
  cudaFree(dst);
#endif
}

}  // namespace
}  // namespace kvtier::client
