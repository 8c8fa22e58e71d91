// The staging pipeline behind DeviceTransfer, written against two seams so that its batching, slot
// reuse and overlap are tested without a GPU or a network: a CopyEngine (CUDA streams and events in
// production, a deferred-copy fake in tests) and a HostBlockIo (the Client's host Get/Put).
#ifndef KVTIER_CLIENT_SRC_CLIENT_STAGING_PIPELINE_H_
#define KVTIER_CLIENT_SRC_CLIENT_STAGING_PIPELINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/client/client.h"
#include "kvtier/client/device_transfer.h"

namespace kvtier::client::internal {

enum class CopyKind : uint8_t { kHostToDevice, kDeviceToHost };

// Asynchronous copies between pinned host memory and device memory, ordered on a stream, with one
// completion marker (a CUDA event) per staging slot. Used by one thread at a time.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Makes the engine's device current on the calling thread; the first step of every call.
  virtual absl::Status Activate() = 0;
  // OK when `buffer` is device memory of the engine's device. Errors: InvalidArgument.
  virtual absl::Status CheckDeviceBuffer(const DeviceBuffer& buffer) = 0;
  // Pinned host memory of `bytes`, owned by the caller until FreeStaging. Errors: ResourceExhausted.
  virtual absl::StatusOr<std::byte*> AllocateStaging(uint64_t bytes) = 0;
  virtual void FreeStaging(std::byte* staging) = 0;
  // Enqueues a copy of `bytes` from `src` to `dst` on `stream`. Errors: Internal.
  virtual absl::Status CopyAsync(CopyKind kind, void* dst, const void* src, uint64_t bytes, void* stream) = 0;
  // Marks `slot` busy until the work enqueued on `stream` so far has run. Errors: Internal.
  virtual absl::Status Record(uint32_t slot, void* stream) = 0;
  // Blocks until the last Record of `slot` has completed (at once if it was never recorded).
  // Errors: Internal.
  virtual absl::Status Wait(uint32_t slot) = 0;
};

// The block transfer the pipeline stages through: Client::Get/Put in production, and Client::GetIntoDevice
// for the blocks whose owner writes device memory itself (NCCL), which skip staging.
class HostBlockIo {
 public:
  virtual ~HostBlockIo() = default;
  // Fetches into `buffers` the blocks a device path can receive straight there; true per block that
  // arrived. Default: none arrive (every block is staged).
  virtual absl::StatusOr<std::vector<bool>> GetIntoDevice(const Namespace& ns, std::span<const Fingerprint> fps,
                                                          uint32_t shard, std::span<const DeviceBuffer> buffers,
                                                          void* stream) {
    (void)ns, (void)shard, (void)buffers, (void)stream;
    return std::vector<bool>(fps.size(), false);
  }
  virtual absl::StatusOr<std::vector<GetResult>> Get(const Namespace& ns, std::span<const Fingerprint> fps,
                                                     uint32_t shard, std::span<const std::span<std::byte>> buffers) = 0;
  virtual absl::StatusOr<std::vector<PutResult>> Put(const Namespace& ns, std::span<const Fingerprint> fps,
                                                     uint32_t shard, std::span<const std::span<const std::byte>> blocks,
                                                     uint32_t first_block_index) = 0;
};

// HostBlockIo over a Client (borrowed; must outlive this).
class ClientBlockIo final : public HostBlockIo {
 public:
  explicit ClientBlockIo(Client& client) : client_(client) {}
  absl::StatusOr<std::vector<GetResult>> Get(const Namespace& ns, std::span<const Fingerprint> fps, uint32_t shard,
                                             std::span<const std::span<std::byte>> buffers) override {
    return client_.Get(ns, fps, shard, buffers);
  }
  absl::StatusOr<std::vector<bool>> GetIntoDevice(const Namespace& ns, std::span<const Fingerprint> fps, uint32_t shard,
                                                  std::span<const DeviceBuffer> buffers, void* stream) override {
    return client_.GetIntoDevice(ns, fps, shard, buffers, stream);
  }
  absl::StatusOr<std::vector<PutResult>> Put(const Namespace& ns, std::span<const Fingerprint> fps, uint32_t shard,
                                             std::span<const std::span<const std::byte>> blocks,
                                             uint32_t first_block_index) override {
    return client_.Put(ns, fps, shard, blocks, first_block_index);
  }

 private:
  Client& client_;
};

// Moves batches of blocks between device buffers and a HostBlockIo through `staging_buffers` pinned
// slots, round-robin across calls. A slot is refilled only after Wait() on its last Record, so a copy
// still in flight never sees its source overwritten.
//   Get: first io.GetIntoDevice (blocks it delivers are hits, never staged); then, for each batch of
//        the others, Wait(slot); host Get into the slot; enqueue H2D of each hit; Record(slot).
//        The host Get of batch i+1 runs while batch i's copies are in flight.
//   Put: D2H copies are enqueued up to staging_buffers - 1 batches ahead of the host Put, so that the
//        copy of batch i+1 runs during the Put of batch i.
// Thread-safety: calls are serialized by an internal mutex.
class StagingPipeline {
 public:
  // Allocates the staging slots through `engine` (owned). Errors: InvalidArgument (options),
  // what AllocateStaging returns.
  static absl::StatusOr<std::unique_ptr<StagingPipeline>> Create(std::unique_ptr<CopyEngine> engine,
                                                                 const DeviceTransferOptions& options);
  // Waits on every slot, then frees the staging memory.
  ~StagingPipeline();

  // See DeviceTransfer::GetToDevice.
  absl::StatusOr<std::vector<GetResult>> Get(HostBlockIo& io, const Namespace& ns, std::span<const Fingerprint> fps,
                                             uint32_t shard, std::span<const DeviceBuffer> buffers, void* stream);
  // See DeviceTransfer::PutFromDevice.
  absl::StatusOr<std::vector<PutResult>> Put(HostBlockIo& io, const Namespace& ns, std::span<const Fingerprint> fps,
                                             uint32_t shard, std::span<const DeviceBuffer> blocks, void* stream,
                                             uint32_t first_block_index);

  // Blocks per batch for blocks of `block_bytes` (>= 1 when block_bytes <= staging_buffer_bytes).
  uint32_t BlocksPerBatch(uint64_t block_bytes) const;
  const DeviceTransferStats& stats() const { return stats_; }

 private:
  StagingPipeline(std::unique_ptr<CopyEngine> engine, const DeviceTransferOptions& options);
  absl::StatusOr<uint64_t> CheckCall(const Namespace& ns, size_t num_fps, uint32_t shard,
                                     std::span<const DeviceBuffer> buffers);

  std::mutex mu_;  // one call at a time: the slots and next_slot_ are shared state
  std::unique_ptr<CopyEngine> engine_;
  const DeviceTransferOptions options_;
  std::vector<std::byte*> slots_;  // staging_buffers pinned buffers of staging_buffer_bytes
  uint32_t next_slot_ = 0;         // guarded by mu_; round-robin across calls
  DeviceTransferStats stats_;
};

}  // namespace kvtier::client::internal

#endif  // KVTIER_CLIENT_SRC_CLIENT_STAGING_PIPELINE_H_
