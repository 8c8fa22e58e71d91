// NcclService: the cache-server side of the NCCL transport. It implements kvtier.v1.NcclService
// (proto/kvtier/v1/nccl.proto): it bootstraps one two-rank communicator per worker (the server is
// rank 0 on the device tier's GPU), reuses it for every transfer of that worker, and sends leased
// device-tier blocks with grouped ncclSend. Each worker's communicator has a sender thread that runs
// its transfers in the order they were announced; a transfer not complete within transfer_timeout
// (dead or stuck worker) aborts the communicator and releases the lease, and the worker's next
// Bootstrap starts a new generation. docs/gpu.md describes the protocol.
#ifndef KVTIER_NCCL_NCCL_SERVICE_H_
#define KVTIER_NCCL_NCCL_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/nccl/device_block_source.h"
#include "kvtier/nccl/nccl_api.h"
#include "kvtier/nccl/nccl_channel.h"

namespace grpc {
class Service;
class ServerContext;
}  // namespace grpc

namespace kvtier::nccl {

struct NcclServiceOptions {
  // A bootstrapped worker that has not joined its communicator by then is dropped (communicator
  // aborted). Default 30 s.
  absl::Duration init_timeout = absl::Seconds(30);
  // Bound on one grouped send, from its start on the device to its completion; past it the
  // communicator is aborted. Default 10 s.
  absl::Duration transfer_timeout = absl::Seconds(10);
  // Lease asked of the device tier per Fetch; must exceed transfer_timeout (a lease waits in the
  // sender's queue before its transfer starts). Default 30 s.
  absl::Duration lease_ttl = absl::Seconds(30);
  uint32_t max_workers = 256;  // live communicators; more Bootstraps get RESOURCE_EXHAUSTED
  uint32_t max_blocks_per_fetch = 4096;
  NcclChannelOptions channel;  // polling interval, clock and sleep of every communicator
  // Who made a call, from its metadata (the kvtier-server checks its bearer token as on the cache
  // service): the caller's tenant, or nullopt for a caller allowed every tenant (an admin, or a server
  // without tokens); an error (UNAUTHENTICATED, ...) refuses the call with that status. Called on
  // gRPC's threads, concurrently. Empty (default): every caller is allowed every tenant.
  // With a tenant: Bootstrap of a worker id whose communicator another tenant bootstrapped, and Fetch
  // of that communicator or of a namespace of another tenant, are PERMISSION_DENIED.
  std::function<absl::StatusOr<std::optional<std::string>>(const grpc::ServerContext& ctx)> authenticate;

  // Errors: InvalidArgument naming the field.
  absl::Status Validate() const;
};

// Monotonic counters.
struct NcclServiceStats {
  std::atomic<uint64_t> communicators{0};  // communicators created (first bootstraps and resets)
  std::atomic<uint64_t> reuses{0};         // Bootstraps answered with the live communicator
  std::atomic<uint64_t> aborts{0};         // communicators aborted (init or transfer failure/timeout)
  std::atomic<uint64_t> fetches{0};        // Fetch calls that queued a transfer (>= 1 block sent)
  std::atomic<uint64_t> sent_blocks{0};    // blocks whose grouped send completed
  std::atomic<uint64_t> sent_bytes{0};
  std::atomic<uint64_t> failed_blocks{0};  // blocks announced but not sent (timeout, abort, reset)
};

// What the service knows of one worker's communicator.
struct NcclSessionInfo {
  uint64_t generation = 0;
  bool failed = false;  // init or a transfer failed or timed out; the communicator is aborted
  uint64_t queued_transfers = 0;
};

// Thread-safety: all methods may be called concurrently. `api` and `source` are borrowed and must
// outlive the service.
class NcclService {
 public:
  // Errors: InvalidArgument (options).
  static absl::StatusOr<std::unique_ptr<NcclService>> Create(NcclApi& api, DeviceBlockSource& source,
                                                             const NcclServiceOptions& options);
  // Cancels every communicator's wait or transfer in flight, closes the healthy ones and joins the
  // sender threads. Shut down the grpc::Server that serves grpc_service() first.
  ~NcclService();

  // The gRPC service to register with a grpc::ServerBuilder (owned by this object).
  grpc::Service* grpc_service();

  const NcclServiceStats& stats() const;
  // The live communicator of `worker_id`, or nullopt when it has none.
  std::optional<NcclSessionInfo> session(const std::string& worker_id) const;

  class Impl;

 private:
  explicit NcclService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::nccl

#endif  // KVTIER_NCCL_NCCL_SERVICE_H_
