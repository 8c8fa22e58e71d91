// Host-side helpers of the CUDA wrappers: turning a cudaError_t into a KernelStatus, and a scratch device
// buffer that carries a call's host tables (pointer arrays, block table) to the kernel. Private to
// kvtier_kernels; built only with CUDA.
#ifndef KVTIER_KERNELS_SRC_CUDA_TABLES_H_
#define KVTIER_KERNELS_SRC_CUDA_TABLES_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "kvtier/kernels/kernel_status.h"

namespace kvtier::kernels::internal {

// {err, cudaGetErrorString(err)} prefixed with `what`; ok for cudaSuccess.
KernelStatus FromCuda(cudaError_t err, const char* what);

// {kKernelNoCuda, "no CUDA device: <why>"}: what the wrappers return, after checking their arguments,
// when CudaAvailable() is false.
KernelStatus NoCudaDevice();

// Collects host tables, then copies them in one cudaMemcpyAsync to a device buffer allocated on
// `stream` (cudaMallocAsync; cudaMalloc where memory pools are unsupported). The destructor frees the
// buffer in stream order (cudaFreeAsync), or after a cudaStreamSynchronize for the cudaMalloc
// fallback, so it must run after the kernel that reads the tables has been queued. Not thread-safe.
class DeviceTables {
 public:
  explicit DeviceTables(cudaStream_t stream) : stream_(stream) {}
  ~DeviceTables();
  DeviceTables(const DeviceTables&) = delete;
  DeviceTables& operator=(const DeviceTables&) = delete;

  // Appends `bytes` from `data` (16-byte aligned in the buffer) and returns its offset.
  size_t Add(const void* data, size_t bytes);
  // Allocates the device buffer and queues the copy.
  cudaError_t Upload();
  // The device address of what Add() returned `offset` for; valid after a successful Upload().
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(device_) + offset);
  }

 private:
  cudaStream_t stream_;
  std::vector<unsigned char> host_;
  void* device_ = nullptr;
  bool async_ = true;  // allocated with cudaMallocAsync
};

}  // namespace kvtier::kernels::internal

#endif  // KVTIER_KERNELS_SRC_CUDA_TABLES_H_
