// The CUDA CopyEngine: pinned staging from cudaHostAlloc, copies with cudaMemcpyAsync on the caller's
// stream, one event per staging slot. Only cudart is used (never the driver API).
#include "client/cuda_copy_engine.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "absl/strings/str_cat.h"

namespace kvtier::client::internal {
namespace {

absl::Status CudaError(const char* what, cudaError_t err) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(int32_t device, std::vector<cudaEvent_t> events)
      : device_(device), events_(std::move(events)), recorded_(events_.size(), false) {}

  ~CudaCopyEngine() override {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    for (cudaEvent_t e : events_) {
      cudaEventSynchronize(e);
      cudaEventDestroy(e);
    }
  }

  absl::Status Activate() override {
    const cudaError_t err = cudaSetDevice(device_);
    return err == cudaSuccess ? absl::OkStatus() : CudaError("cudaSetDevice", err);
  }

  absl::Status CheckDeviceBuffer(const DeviceBuffer& buffer) override {
    cudaPointerAttributes attr{};
    const cudaError_t err = cudaPointerGetAttributes(&attr, buffer.ptr);
    if (err != cudaSuccess) {
      cudaGetLastError();  // not sticky; clear it
      return absl::InvalidArgumentError(absl::StrCat("cudaPointerGetAttributes: ", cudaGetErrorString(err)));
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
      return absl::InvalidArgumentError("not device or managed memory");
    }
    if (attr.type == cudaMemoryTypeDevice && attr.device != device_) {
      return absl::InvalidArgumentError(absl::StrCat("memory of device ", attr.device, ", want ", device_));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::byte*> AllocateStaging(uint64_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaHostAlloc of ", bytes, " pinned bytes: ", cudaGetErrorString(err)));
    }
    return static_cast<std::byte*>(p);
  }

  void FreeStaging(std::byte* staging) override { cudaFreeHost(staging); }

  absl::Status CopyAsync(CopyKind kind, void* dst, const void* src, uint64_t bytes, void* stream) override {
    const cudaMemcpyKind k = kind == CopyKind::kHostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream));
    return err == cudaSuccess ? absl::OkStatus() : CudaError("cudaMemcpyAsync", err);
  }

  absl::Status Record(uint32_t slot, void* stream) override {
    const cudaError_t err = cudaEventRecord(events_[slot], static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) return CudaError("cudaEventRecord", err);
    recorded_[slot] = true;
    return absl::OkStatus();
  }

  absl::Status Wait(uint32_t slot) override {
    if (!recorded_[slot]) return absl::OkStatus();
    const cudaError_t err = cudaEventSynchronize(events_[slot]);
    return err == cudaSuccess ? absl::OkStatus() : CudaError("cudaEventSynchronize", err);
  }

 private:
  const int32_t device_;
  std::vector<cudaEvent_t> events_;  // one per slot
  std::vector<bool> recorded_;       // whether events_[i] was ever recorded
};

}  // namespace

absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCudaCopyEngine(int32_t device, uint32_t num_slots) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("no usable CUDA device: ", cudaGetErrorString(err)));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(absl::StrCat("CUDA device ", device, " requested, ", count, " present"));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaError("cudaSetDevice", e);
  std::vector<cudaEvent_t> events(num_slots);
  for (uint32_t i = 0; i < num_slots; ++i) {
    if (cudaError_t e = cudaEventCreateWithFlags(&events[i], cudaEventDisableTiming); e != cudaSuccess) {
      for (uint32_t j = 0; j < i; ++j) cudaEventDestroy(events[j]);
      return CudaError("cudaEventCreateWithFlags", e);
    }
  }
  return std::unique_ptr<CopyEngine>(new CudaCopyEngine(device, std::move(events)));
}

}  // namespace kvtier::client::internal
