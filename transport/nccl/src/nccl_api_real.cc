// NcclApi over libnccl and cudart (never the driver API). Communicators are non-blocking
// (ncclConfig_t.blocking = 0), so no call here waits on a peer: NcclChannel polls with a deadline and
// aborts.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvtier/nccl/nccl_api.h"

namespace kvtier::nccl {
namespace {

static_assert(NcclUniqueId::kBytes == NCCL_UNIQUE_ID_BYTES);

struct Comm {
  ncclComm_t comm = nullptr;
  int device = 0;
};

absl::Status NcclError(const char* what, ncclResult_t r, ncclComm_t comm = nullptr) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r),
                                             last != nullptr && *last != '\0' ? absl::StrCat(" (", last, ")") : ""));
}

absl::Status CudaError(const char* what, cudaError_t err) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

class RealNcclApi final : public NcclApi {
 public:
  absl::StatusOr<NcclUniqueId> GetUniqueId() override {
    ncclUniqueId id;
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return NcclError("ncclGetUniqueId", r);
    NcclUniqueId out;
    std::memcpy(out.bytes.data(), id.internal, NCCL_UNIQUE_ID_BYTES);
    return out;
  }

  absl::StatusOr<CommHandle> CommInitRank(const NcclUniqueId& id, int nranks, int rank, int device) override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaError("cudaSetDevice", e);
    ncclUniqueId nid;
    std::memcpy(nid.internal, id.bytes.data(), NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    auto c = std::make_unique<Comm>();
    c->device = device;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, nranks, nid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (c->comm != nullptr) ncclCommAbort(c->comm);
      return NcclError("ncclCommInitRankConfig", r);
    }
    return static_cast<CommHandle>(c.release());
  }

  absl::StatusOr<bool> Poll(CommHandle handle) override {
    auto* c = static_cast<Comm*>(handle);
    ncclResult_t async = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(c->comm, &async); r != ncclSuccess) {
      return NcclError("ncclCommGetAsyncError", r, c->comm);
    }
    if (async == ncclInProgress) return false;
    if (async != ncclSuccess) return NcclError("communicator failed", async, c->comm);
    return true;
  }

  absl::Status GroupTransfer(CommHandle handle, TransferKind kind, std::span<const DeviceSpan> buffers, int peer,
                             void* stream) override {
    auto* c = static_cast<Comm*>(handle);
    if (cudaError_t e = cudaSetDevice(c->device); e != cudaSuccess) return CudaError("cudaSetDevice", e);
    const auto s = static_cast<cudaStream_t>(stream);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return NcclError("ncclGroupStart", r, c->comm);
    for (const DeviceSpan& b : buffers) {
      r = kind == TransferKind::kSend ? ncclSend(b.ptr, b.size_bytes, ncclChar, peer, c->comm, s)
                                      : ncclRecv(b.ptr, b.size_bytes, ncclChar, peer, c->comm, s);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();
        return NcclError(kind == TransferKind::kSend ? "ncclSend" : "ncclRecv", r, c->comm);
      }
    }
    r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) return NcclError("ncclGroupEnd", r, c->comm);
    return absl::OkStatus();
  }

  absl::StatusOr<void*> CreateStream(int device) override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaError("cudaSetDevice", e);
    cudaStream_t s = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      return CudaError("cudaStreamCreateWithFlags", e);
    }
    return static_cast<void*>(s);
  }

  void DestroyStream(void* stream) override { cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }

  absl::StatusOr<EventHandle> CreateEvent(int device) override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaError("cudaSetDevice", e);
    cudaEvent_t ev = nullptr;
    if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess) {
      return CudaError("cudaEventCreateWithFlags", e);
    }
    return static_cast<EventHandle>(ev);
  }

  void DestroyEvent(EventHandle event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

  absl::Status RecordEvent(EventHandle event, void* stream) override {
    cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaEventRecord", e);
  }

  absl::StatusOr<bool> EventDone(EventHandle event) override {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return CudaError("cudaEventQuery", e);
  }

  absl::Status Finalize(CommHandle handle) override {
    auto* c = static_cast<Comm*>(handle);
    ncclResult_t r = ncclCommFinalize(c->comm);
    if (r != ncclSuccess && r != ncclInProgress) return NcclError("ncclCommFinalize", r, c->comm);
    return absl::OkStatus();
  }

  void Destroy(CommHandle handle) override {
    auto* c = static_cast<Comm*>(handle);
    ncclCommDestroy(c->comm);
    delete c;
  }

  void Abort(CommHandle handle) override {
    auto* c = static_cast<Comm*>(handle);
    ncclCommAbort(c->comm);
    delete c;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclApi>> CreateNcclApi() { return std::make_unique<RealNcclApi>(); }

bool NcclBuilt() { return true; }

}  // namespace kvtier::nccl
