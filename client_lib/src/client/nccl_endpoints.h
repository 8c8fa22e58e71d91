// NcclEndpoints: the NCCL workers of one client (docs/gpu.md "NCCL through the Client"). A member offers
// NCCL when its GetInfo says `nccl` (it serves kvtier.v1.NcclService from its HBM tier on its gRPC
// port); this client then keeps one NcclWorker (transport/nccl) per member address and CUDA device, made
// at the first device read and reused, whose communicator is bootstrapped by its first Fetch.
#ifndef KVTIER_CLIENT_SRC_CLIENT_NCCL_ENDPOINTS_H_
#define KVTIER_CLIENT_SRC_CLIENT_NCCL_ENDPOINTS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "client/membership.h"
#include "client/transport_mode.h"
#include "kvtier/client/client.h"
#include "kvtier/nccl/nccl_api.h"
#include "kvtier/nccl/nccl_worker.h"

namespace kvtier::client {

// A member that does not offer NCCL, or did not answer, is asked again this often (it may restart with
// an HBM tier).
constexpr absl::Duration kNcclUnsupportedRecheck = absl::Seconds(10);

// Thread-safety: all methods may be called concurrently.
// Ownership: `options` is borrowed and must outlive this object.
class NcclEndpoints {
 public:
  // NCCL is used with transport "auto" only, and not with TLS (the NCCL bootstrap channel of NcclWorker
  // is plaintext). The NCCL API is the one set by SetNcclApiForTest at construction, else the real one
  // (CreateNcclApi), made at the first device read; a build without NCCL has none, and no member is
  // then read over NCCL.
  NcclEndpoints(const ClientOptions& options, TransportMode mode);

  // The worker that receives member's blocks into device memory of CUDA device `device`, or null when
  // there is none: NCCL is off for this client, or the member does not offer it (asked with GetInfo
  // by `deadline`, at most rpc_timeout; a member that says no or does not answer is asked again
  // after kNcclUnsupportedRecheck). The worker lives as long as this object. Its Fetch bounds are
  // the client's: rpc_timeout per RPC and per grouped receive, connect_timeout for the first
  // communicator to come up.
  nccl::NcclWorker* Worker(Member& member, int32_t device, absl::Time deadline);

 private:
  struct Peer {
    std::mutex mu;                                // held across the GetInfo: one caller asks
    bool offered = false;                         // guarded by mu
    absl::Time ask_after = absl::InfinitePast();  // guarded by mu; no GetInfo before it
    absl::flat_hash_map<int32_t, std::unique_ptr<nccl::NcclWorker>> workers;  // guarded by mu; by device
  };
  nccl::NcclApi* Api();

  const ClientOptions& options_;
  const bool enabled_;
  const std::string worker_prefix_;  // host/pid/this client: worker ids are unique per process and GPU
  std::mutex mu_;
  nccl::NcclApi* api_ = nullptr;              // guarded by mu_
  bool api_tried_ = false;                    // guarded by mu_
  std::unique_ptr<nccl::NcclApi> owned_api_;  // guarded by mu_; the real API when api_ points to it
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_;  // guarded by mu_; by member address
};

// Test seam (tests/unit/client, tests/integration/nccl): while set (non-null), clients connected
// afterwards use `api` (borrowed; it must outlive them) for NCCL, e.g. a FakeNcclApi whose "device"
// memory is host memory. Set it before Connect and clear it after the client is destroyed.
void SetNcclApiForTest(nccl::NcclApi* api);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_NCCL_ENDPOINTS_H_
