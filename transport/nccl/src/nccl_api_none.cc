// The NCCL transport in a build without NCCL: no real NcclApi exists.
#include "kvtier/nccl/nccl_api.h"

namespace kvtier::nccl {

absl::StatusOr<std::unique_ptr<NcclApi>> CreateNcclApi() { return absl::FailedPreconditionError("built without NCCL"); }

bool NcclBuilt() { return false; }

}  // namespace kvtier::nccl
