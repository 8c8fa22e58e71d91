// The two-phase put (Allocate, the bytes, Commit; Abort on failure) that GrpcBlockPath and UcxBlockPath
// share: they differ in where the bytes (and, over UCX, the reservation and commit) go.
#ifndef KVTIER_CLIENT_SRC_CLIENT_TWO_PHASE_PUT_H_
#define KVTIER_CLIENT_SRC_CLIENT_TWO_PHASE_PUT_H_

#include <optional>

#include "absl/status/status.h"
#include "client/block_path.h"
#include "client/membership.h"
#include "client/ucx_endpoints.h"
#include "kvtier/client/client.h"
#include "kvtier/ucx/ucx_client.h"

namespace kvtier::client {

// Where one put goes. Everything is borrowed for the call.
struct PutPath {
  Member* member = nullptr;                       // never null
  const ClientOptions* options = nullptr;         // never null
  ClientStats* stats = nullptr;                   // never null
  UcxEndpoints* ucx = nullptr;                    // never null when `endpoint` is set
  std::optional<UcxClient::EndpointId> endpoint;  // nullopt: all over gRPC
};

// The two-phase put of `batch` (BlockPath::Put's contract) over `p`: with p.endpoint, the bytes over
// that UCX endpoint (and the reservation and commit too when its session takes them), else all over
// gRPC. Returns nullopt, with the results untouched, when a UCX reservation failed before the member
// answered (not past its deadline: a late answer holds the keys) and the batch may go over gRPC instead.
std::optional<absl::Status> TwoPhasePut(const PutPath& p, const PutBatchRequest& batch);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_TWO_PHASE_PUT_H_
