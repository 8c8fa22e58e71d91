#include "cuda_tables.h"

#include <cstring>
#include <string>

#include "kvtier/kernels/device.h"

namespace kvtier::kernels::internal {

KernelStatus FromCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  return KernelStatus{static_cast<int>(err), std::string(what) + ": " + cudaGetErrorString(err)};
}

KernelStatus NoCudaDevice() {
  KernelStatus why;
  DeviceCount(&why);
  return KernelStatus{kKernelNoCuda, "no CUDA device: " + why.message};
}

DeviceTables::~DeviceTables() {
  if (device_ == nullptr) return;
  if (async_) {
    cudaFreeAsync(device_, stream_);
  } else {
    cudaStreamSynchronize(stream_);
    cudaFree(device_);
  }
}

size_t DeviceTables::Add(const void* data, size_t bytes) {
  const size_t offset = (host_.size() + 15) & ~size_t{15};
  host_.resize(offset + bytes);
  if (bytes > 0) std::memcpy(host_.data() + offset, data, bytes);
  return offset;
}

cudaError_t DeviceTables::Upload() {
  const size_t bytes = host_.empty() ? 16 : host_.size();
  cudaError_t err = cudaMallocAsync(&device_, bytes, stream_);
  if (err == cudaErrorNotSupported) {
    cudaGetLastError();  // clear it; fall back to a plain allocation
    async_ = false;
    err = cudaMalloc(&device_, bytes);
  }
  if (err != cudaSuccess) {
    device_ = nullptr;
    return err;
  }
  if (host_.empty()) return cudaSuccess;
  // From pageable memory: the driver stages host_ before returning, so host_ may die afterwards.
  return cudaMemcpyAsync(device_, host_.data(), host_.size(), cudaMemcpyHostToDevice, stream_);
}

}  // namespace kvtier::kernels::internal
