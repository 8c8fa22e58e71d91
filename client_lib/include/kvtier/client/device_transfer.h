// DeviceTransfer: Get and Put of KV blocks straight from and into GPU memory, for inference workers whose
// KV lives in device memory. It wraps a Client: block bytes are staged through a pool of pinned host
// buffers (cudaHostAlloc, allocated once and reused), and copies run on the caller's CUDA stream, so that
// the network transfer of one batch overlaps the host<->device copy of the previous one (double
// buffering with the default two staging buffers). docs/gpu.md describes the pipeline.
//
// No CUDA type appears here: a stream is a `void*` holding a cudaStream_t (nullptr = the legacy default
// stream of the device). In a build without CUDA every call returns FailedPrecondition("built without
// CUDA"), and in a CUDA build on a machine without a usable device Create() returns FailedPrecondition.
#ifndef KVTIER_CLIENT_DEVICE_TRANSFER_H_
#define KVTIER_CLIENT_DEVICE_TRANSFER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/client/client.h"
#include "kvtier/client/device_buffer.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/namespace.h"

namespace kvtier::client {

struct DeviceTransferOptions {
  // CUDA device of every buffer passed to this DeviceTransfer (and of its copies). Default 0.
  int32_t device = 0;
  // Blocks per staged batch: one host Get or Put per batch, then one copy per block (DESIGN.md §8's
  // transfer batch size). A batch is also capped at staging_buffer_bytes / block bytes. Default 8.
  uint32_t batch_blocks = 8;
  // Pinned staging buffers. 2 = double buffering (one batch on the network while the previous one is
  // copied); 1 = no overlap. Default 2, at most 16.
  uint32_t staging_buffers = 2;
  // Bytes of each pinned staging buffer; a block larger than this is refused (InvalidArgument).
  // Default 64 MiB (two 32 MiB blocks of Llama-3.1-8B at 256 tokens, bf16).
  uint64_t staging_buffer_bytes = 64ULL << 20;

  // Errors: InvalidArgument naming the field.
  absl::Status Validate() const;
};

// Monotonic counters of one DeviceTransfer.
struct DeviceTransferStats {
  std::atomic<uint64_t> batches{0};               // staged batches (Get and Put)
  std::atomic<uint64_t> host_to_device_bytes{0};  // bytes copied into caller device buffers (hits only)
  std::atomic<uint64_t> device_to_host_bytes{0};  // bytes copied out of caller device buffers
};

// Thread-safety: calls on one DeviceTransfer are serialized (one staging pool); use one per thread or
// stream for parallel transfers. `client` must outlive the DeviceTransfer.
class DeviceTransfer {
 public:
  // Allocates options.staging_buffers pinned buffers of options.staging_buffer_bytes each on
  // options.device. Errors: InvalidArgument (bad options), FailedPrecondition ("built without CUDA", or
  // no usable CUDA device / device ordinal out of range), ResourceExhausted (pinned allocation failed).
  static absl::StatusOr<std::unique_ptr<DeviceTransfer>> Create(Client& client, const DeviceTransferOptions& options);
  // Waits for every copy still in flight from the staging buffers, then frees them.
  ~DeviceTransfer();

  // Client::Get into device memory: fetches shard `shard` of each block into `buffers[i]`. Blocks are
  // fetched in batches into pinned staging buffers and copied host-to-device on `stream` (a
  // cudaStream_t, borrowed); only kHit blocks are copied, other buffers are left untouched.
  // Stream-ordered: on return every copy is enqueued on `stream`, and work the caller enqueues on
  // `stream` afterwards sees the bytes (cudaStreamSynchronize(stream) waits for them on the host).
  // Results and counters are as Client::Get's (dead owners are kMissFromError, never an error).
  // Errors: InvalidArgument (counts or sizes disagree, shard >= tp_size, a buffer that is not device
  // memory of options.device, a block larger than staging_buffer_bytes), FailedPrecondition (built
  // without CUDA), Internal (a CUDA call failed; its message is included).
  absl::StatusOr<std::vector<GetResult>> GetToDevice(const Namespace& ns, std::span<const Fingerprint> fingerprints,
                                                     uint32_t shard, std::span<const DeviceBuffer> buffers,
                                                     void* stream = nullptr);

  // Client::Put from device memory: copies each batch of `blocks` device-to-host on `stream` (after the
  // work already enqueued there, e.g. the kernel that produced the KV) into a staging buffer, then
  // stores it with Client::Put, while the next batch is being copied. Synchronous: on return the device
  // buffers are no longer read. `first_block_index` as in Client::Put.
  // Errors: as GetToDevice.
  absl::StatusOr<std::vector<PutResult>> PutFromDevice(const Namespace& ns, std::span<const Fingerprint> fingerprints,
                                                       uint32_t shard, std::span<const DeviceBuffer> blocks,
                                                       void* stream = nullptr, uint32_t first_block_index = 0);

  const DeviceTransferStats& stats() const;

  class Impl;

 private:
  explicit DeviceTransfer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_DEVICE_TRANSFER_H_
