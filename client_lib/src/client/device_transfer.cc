#include "kvtier/client/device_transfer.h"

#include <utility>

#include "client/cuda_copy_engine.h"
#include "client/staging_pipeline.h"
#include "kvtier/common/status_macros.h"

namespace kvtier::client {

class DeviceTransfer::Impl {
 public:
  Impl(Client& client, std::unique_ptr<internal::StagingPipeline> pipeline)
      : io_(client), pipeline_(std::move(pipeline)) {}
  internal::ClientBlockIo io_;
  std::unique_ptr<internal::StagingPipeline> pipeline_;
};

absl::StatusOr<std::unique_ptr<DeviceTransfer>> DeviceTransfer::Create(Client& client,
                                                                       const DeviceTransferOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  KVTIER_ASSIGN_OR_RETURN(auto engine, internal::CreateCudaCopyEngine(options.device, options.staging_buffers));
  KVTIER_ASSIGN_OR_RETURN(auto pipeline, internal::StagingPipeline::Create(std::move(engine), options));
  return std::unique_ptr<DeviceTransfer>(new DeviceTransfer(std::make_unique<Impl>(client, std::move(pipeline))));
}

DeviceTransfer::DeviceTransfer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceTransfer::~DeviceTransfer() = default;

absl::StatusOr<std::vector<GetResult>> DeviceTransfer::GetToDevice(const Namespace& ns,
                                                                   std::span<const Fingerprint> fingerprints,
                                                                   uint32_t shard,
                                                                   std::span<const DeviceBuffer> buffers,
                                                                   void* stream) {
  return impl_->pipeline_->Get(impl_->io_, ns, fingerprints, shard, buffers, stream);
}

absl::StatusOr<std::vector<PutResult>> DeviceTransfer::PutFromDevice(const Namespace& ns,
                                                                     std::span<const Fingerprint> fingerprints,
                                                                     uint32_t shard,
                                                                     std::span<const DeviceBuffer> blocks, void* stream,
                                                                     uint32_t first_block_index) {
  return impl_->pipeline_->Put(impl_->io_, ns, fingerprints, shard, blocks, stream, first_block_index);
}

const DeviceTransferStats& DeviceTransfer::stats() const { return impl_->pipeline_->stats(); }

}  // namespace kvtier::client
