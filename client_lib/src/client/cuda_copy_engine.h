// The CUDA CopyEngine of DeviceTransfer (cuda_copy_engine.cc, built only with CUDA), or, in a build
// without CUDA, a factory that always fails (cuda_copy_engine_none.cc).
#ifndef KVTIER_CLIENT_SRC_CLIENT_CUDA_COPY_ENGINE_H_
#define KVTIER_CLIENT_SRC_CLIENT_CUDA_COPY_ENGINE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "client/staging_pipeline.h"

namespace kvtier::client::internal {

// A CopyEngine on CUDA device `device` with one event per slot (`num_slots`): cudaHostAlloc'd staging,
// cudaMemcpyAsync on the caller's stream, cudaEventRecord / cudaEventSynchronize.
// Errors: FailedPrecondition ("built without CUDA", no usable device, `device` out of range),
// Internal (event creation failed).
absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCudaCopyEngine(int32_t device, uint32_t num_slots);

}  // namespace kvtier::client::internal

#endif  // KVTIER_CLIENT_SRC_CLIENT_CUDA_COPY_ENGINE_H_
