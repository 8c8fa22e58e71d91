// NcclApi: the few NCCL and CUDA runtime calls the NCCL transport makes, behind an interface, so that
// the communicator state machine, the bootstrap service and the worker are tested without a GPU (with
// a fake) and so that no NCCL or CUDA type reaches a header. CreateNcclApi() returns the real one when
// the build has NCCL (KVTIER_WITH_NCCL), else FailedPrecondition.
#ifndef KVTIER_NCCL_NCCL_API_H_
#define KVTIER_NCCL_NCCL_API_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier::nccl {

// An ncclUniqueId: NCCL_UNIQUE_ID_BYTES (128) opaque bytes, made by rank 0 and shared over gRPC.
struct NcclUniqueId {
  static constexpr size_t kBytes = 128;
  std::array<std::byte, kBytes> bytes{};
  friend bool operator==(const NcclUniqueId&, const NcclUniqueId&) = default;
};

// A contiguous device buffer (non-owning): one block of a grouped send or receive.
struct DeviceSpan {
  void* ptr = nullptr;
  uint64_t size_bytes = 0;
};

enum class TransferKind : uint8_t { kSend, kRecv };

// Opaque handles of the implementation (an ncclComm_t with its device; a cudaEvent_t).
using CommHandle = void*;
using EventHandle = void*;

// Thread-safety: an implementation may be called from many threads, each call on a different
// communicator (NCCL's rule); calls on one communicator are serialized by its NcclChannel.
class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // ncclGetUniqueId. Errors: Unavailable (NCCL could not create one, e.g. no network interface).
  virtual absl::StatusOr<NcclUniqueId> GetUniqueId() = 0;
  // Starts ncclCommInitRankConfig with blocking = 0 on `device` and returns at once; Poll() reports
  // when the communicator is ready. Errors: Unavailable (NCCL refused at once).
  virtual absl::StatusOr<CommHandle> CommInitRank(const NcclUniqueId& id, int nranks, int rank, int device) = 0;
  // ncclCommGetAsyncError: true = ready (no operation in progress), false = still in progress.
  // Errors: Unavailable with NCCL's message (the communicator failed; abort it).
  virtual absl::StatusOr<bool> Poll(CommHandle comm) = 0;
  // One ncclGroupStart / ncclSend or ncclRecv of each buffer (as bytes, to or from `peer`, in order) /
  // ncclGroupEnd, on `stream` (a cudaStream_t; nullptr = the device's default stream). With a
  // non-blocking communicator the group may still be being enqueued on return: Poll() until ready.
  // Errors: Unavailable (NCCL failed).
  virtual absl::Status GroupTransfer(CommHandle comm, TransferKind kind, std::span<const DeviceSpan> buffers, int peer,
                                     void* stream) = 0;
  // A non-blocking CUDA stream on `device` (cudaStreamNonBlocking), as void*. Errors: Internal.
  virtual absl::StatusOr<void*> CreateStream(int device) = 0;
  virtual void DestroyStream(void* stream) = 0;
  // A CUDA event on `device` (timing disabled). Errors: Internal.
  virtual absl::StatusOr<EventHandle> CreateEvent(int device) = 0;
  virtual void DestroyEvent(EventHandle event) = 0;
  // cudaEventRecord on `stream`. Errors: Internal.
  virtual absl::Status RecordEvent(EventHandle event, void* stream) = 0;
  // cudaEventQuery: true = done, false = not yet. Errors: Internal.
  virtual absl::StatusOr<bool> EventDone(EventHandle event) = 0;
  // ncclCommFinalize: starts flushing; Poll() until ready, then Destroy(). Errors: Unavailable.
  virtual absl::Status Finalize(CommHandle comm) = 0;
  // ncclCommDestroy: frees a finalized communicator; the handle is invalid afterwards.
  virtual void Destroy(CommHandle comm) = 0;
  // ncclCommAbort: cancels every operation in flight (so no stream waits forever on a dead peer) and
  // frees the communicator; the handle is invalid afterwards.
  virtual void Abort(CommHandle comm) = 0;
};

// The NCCL implementation (one per process is enough; it holds no state).
// Errors: FailedPrecondition ("built without NCCL").
absl::StatusOr<std::unique_ptr<NcclApi>> CreateNcclApi();

// True when this build links NCCL.
bool NcclBuilt();

}  // namespace kvtier::nccl

#endif  // KVTIER_NCCL_NCCL_API_H_
