#include "client/data_path.h"

#include <mutex>
#include <optional>
#include <utility>

#include "client/grpc_block_path.h"
#include "client/nccl_block_path.h"
#include "client/nccl_endpoints.h"
#include "client/ucx_block_path.h"

namespace kvtier::client {

namespace {

class RealBlockPaths final : public BlockPathFactory {
 public:
  RealBlockPaths(const ClientOptions& options, ClientStats& stats, UcxEndpoints& ucx, NcclEndpoints& nccl)
      : options_(options), stats_(stats), ucx_(ucx), nccl_(nccl) {}

  std::unique_ptr<BlockPath> Ucx(Member& member, absl::Time deadline) override {
    const std::optional<UcxClient::EndpointId> endpoint = ucx_.Endpoint(member, deadline);
    if (!endpoint.has_value()) return nullptr;
    return std::make_unique<UcxBlockPath>(member, *endpoint, options_, stats_, ucx_);
  }
  std::unique_ptr<BlockPath> Grpc(Member& member) override {
    return std::make_unique<GrpcBlockPath>(member, options_, stats_);
  }
  std::unique_ptr<BlockPath> Nccl(Member& member, int32_t device, absl::Time deadline) override {
    nccl::NcclWorker* worker = nccl_.Worker(member, device, deadline);
    if (worker == nullptr) return nullptr;
    return std::make_unique<NcclBlockPath>(*worker, stats_);
  }

 private:
  const ClientOptions& options_;
  ClientStats& stats_;
  UcxEndpoints& ucx_;
  NcclEndpoints& nccl_;
};

std::mutex test_factory_mu;
BlockPathFactoryMaker& TestFactory() {  // guarded by test_factory_mu
  static auto* maker = new BlockPathFactoryMaker();
  return *maker;
}

}  // namespace

void SetBlockPathFactoryForTest(BlockPathFactoryMaker make) {
  std::lock_guard<std::mutex> lock(test_factory_mu);
  TestFactory() = std::move(make);
}

BlockPathFactoryMaker BlockPathFactoryForTest() {
  std::lock_guard<std::mutex> lock(test_factory_mu);
  return TestFactory();
}

std::unique_ptr<BlockPathFactory> MakeBlockPathFactory(const ClientOptions& options, ClientStats& stats,
                                                       UcxEndpoints& ucx, NcclEndpoints& nccl) {
  return std::make_unique<RealBlockPaths>(options, stats, ucx, nccl);
}

void DataPath::ReadBatch(Member& member, const v1::Namespace& pns, std::span<const BlockKey> keys,
                         std::span<const uint32_t> idx, uint64_t block_bytes,
                         std::span<const std::span<std::byte>> buffers, std::span<GetResult> results,
                         absl::Time deadline, CallRefusal& refusal) {
  const ReadBatchRequest batch{.pns = &pns,
                               .keys = keys,
                               .idx = idx,
                               .block_bytes = block_bytes,
                               .buffers = buffers,
                               .results = results,
                               .deadline = deadline};
  if (mode_ != TransportMode::kGrpc) {
    if (std::unique_ptr<BlockPath> ucx = paths_->Ucx(member, deadline); ucx != nullptr && ucx->Read(batch, refusal)) {
      return;
    }
    if (mode_ == TransportMode::kUcx) {  // no fallback: these blocks are misses from error
      stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  (void)paths_->Grpc(member)->Read(batch, refusal);
}

void DataPath::ReadDeviceBatch(Member& member, const Namespace& ns, const v1::Namespace& pns,
                               std::span<const BlockKey> keys, std::span<const uint32_t> idx, uint64_t block_bytes,
                               std::span<const DeviceBuffer> device_buffers, void* stream, std::span<GetResult> results,
                               absl::Time deadline, CallRefusal& refusal) {
  if (mode_ != TransportMode::kAuto || idx.empty()) return;
  const std::unique_ptr<BlockPath> path = paths_->Nccl(member, device_buffers[idx[0]].device, deadline);
  if (path == nullptr || !path->capabilities().device_buffers) return;
  const ReadBatchRequest batch{.pns = &pns,
                               .keys = keys,
                               .idx = idx,
                               .block_bytes = block_bytes,
                               .results = results,
                               .deadline = deadline,
                               .device_buffers = device_buffers,
                               .ns = &ns,
                               .stream = stream};
  (void)path->Read(batch, refusal);
}

absl::Status DataPath::PutBatch(Member& member, const v1::Namespace& pns, std::span<const BlockKey> keys,
                                std::span<const uint32_t> depths, std::span<const std::span<const std::byte>> blocks,
                                uint64_t block_bytes, std::span<PutResult> results,
                                std::span<const BlockMeta* const> block_meta) {
  const PutBatchRequest batch{.pns = &pns,
                              .keys = keys,
                              .depths = depths,
                              .blocks = blocks,
                              .block_bytes = block_bytes,
                              .results = results,
                              .block_meta = block_meta};
  if (mode_ != TransportMode::kGrpc) {
    if (std::unique_ptr<BlockPath> ucx = paths_->Ucx(member, absl::Now() + options_.rpc_timeout); ucx != nullptr) {
      if (std::optional<absl::Status> put = ucx->Put(batch); put.has_value()) return *put;
    }
    if (mode_ == TransportMode::kUcx) {  // no fallback: all kError
      stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      return absl::OkStatus();
    }
  }
  return paths_->Grpc(member)->Put(batch).value_or(absl::OkStatus());
}

}  // namespace kvtier::client
