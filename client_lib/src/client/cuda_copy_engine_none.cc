// DeviceTransfer in a build without CUDA: every DeviceTransfer::Create fails here.
#include "client/cuda_copy_engine.h"

namespace kvtier::client::internal {

absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCudaCopyEngine(int32_t /*device*/, uint32_t /*num_slots*/) {
  return absl::FailedPreconditionError("built without CUDA");
}

}  // namespace kvtier::client::internal
