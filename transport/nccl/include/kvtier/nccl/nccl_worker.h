// NcclWorker: the inference-worker side of the NCCL transport, for one cache server. It bootstraps a
// two-rank communicator with the server over gRPC (kvtier.v1.NcclService; the worker is rank 1 on its
// own GPU), keeps it for every later Fetch, and receives blocks straight into the caller's device
// buffers with one grouped ncclRecv per Fetch. A server that is dead, slow or has dropped the
// communicator turns into kError blocks within the configured timeouts, never a hang: the
// communicator is aborted and the next Fetch bootstraps a new generation. docs/gpu.md has the protocol.
#ifndef KVTIER_NCCL_NCCL_WORKER_H_
#define KVTIER_NCCL_NCCL_WORKER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/namespace.h"
#include "kvtier/nccl/nccl_api.h"
#include "kvtier/nccl/nccl_channel.h"

namespace kvtier::nccl {

struct NcclWorkerOptions {
  std::string server_address;                           // host:port of the server's gRPC endpoint; required
  std::string worker_id;                                // unique per worker process and GPU, 1..255 bytes; required
  int32_t device = 0;                                   // CUDA device of this worker's buffers. Default 0
  absl::Duration rpc_timeout = absl::Seconds(2);        // deadline of each Bootstrap / Fetch RPC
  absl::Duration init_timeout = absl::Seconds(30);      // the communicator must be ready by then
  absl::Duration transfer_timeout = absl::Seconds(10);  // one grouped receive must complete by then
  uint64_t max_message_bytes = 80ULL << 20;             // gRPC message limit
  NcclChannelOptions channel;                           // polling interval, clock, sleep
  // Sent as `authorization: Bearer <auth_token>` on every RPC (a server with tokens requires it: the
  // worker's tenant). "" (default): none. The channel is plaintext: keep it on a trusted network.
  std::string auth_token;

  // Errors: InvalidArgument naming the field.
  absl::Status Validate() const;
};

// Outcome of one block of a Fetch.
enum class NcclFetchResult : uint8_t {
  kHit,    // the block arrived in its buffer
  kMiss,   // the server's device tier does not hold it (or holds it at another size)
  kError,  // the server or the communicator failed or timed out; the buffer's bytes are undefined
};
const char* NcclFetchResultName(NcclFetchResult r);

struct NcclWorkerStats {
  std::atomic<uint64_t> bootstraps{0};  // Bootstrap RPCs answered (first ones and re-bootstraps)
  std::atomic<uint64_t> aborts{0};      // communicators this worker aborted (error or timeout)
  std::atomic<uint64_t> hit_blocks{0};
  std::atomic<uint64_t> hit_bytes{0};
  std::atomic<uint64_t> error_blocks{0};
};

// Thread-safety: all methods may be called concurrently; Fetch calls are serialized (both ends must post
// a communicator's transfers in the same order). `api` is borrowed and must outlive the worker.
class NcclWorker {
 public:
  // No RPC is made here; the first Fetch bootstraps. Errors: InvalidArgument (options).
  static absl::StatusOr<std::unique_ptr<NcclWorker>> Create(NcclApi& api, const NcclWorkerOptions& options);
  ~NcclWorker();

  // Receives the blocks `keys` of `ns` held in the server's device tier into `buffers[i]` (device memory
  // of options.device, each ns.layout.ShardBytes() long, borrowed until this returns) on `stream` (a
  // cudaStream_t; nullptr = the default stream). Returns when the received bytes are in place (the
  // receives have completed on `stream`). Bootstraps first when there is no live communicator. Blocks
  // are not checksummed on arrival (the server verified them on entry to its device tier).
  // Errors: InvalidArgument (counts or sizes disagree, invalid namespace). Server failures are kError.
  absl::StatusOr<std::vector<NcclFetchResult>> Fetch(const Namespace& ns, std::span<const BlockKey> keys,
                                                     std::span<const DeviceSpan> buffers, void* stream);

  // Generation of the live communicator (0 before the first bootstrap).
  uint64_t generation() const;
  // State of the current communicator (kIdle before the first bootstrap).
  ChannelState channel_state() const;
  const NcclWorkerStats& stats() const;

  class Impl;

 private:
  explicit NcclWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::nccl

#endif  // KVTIER_NCCL_NCCL_WORKER_H_
