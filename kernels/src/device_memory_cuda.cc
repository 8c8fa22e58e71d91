#include <cuda_runtime_api.h>

#include <string>

#include "kvtier/kernels/device.h"
#include "kvtier/kernels/device_memory.h"

namespace kvtier::kernels {
namespace {

KernelStatus FromCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  return {static_cast<int>(err), std::string(what) + ": " + cudaGetErrorString(err)};
}

KernelStatus CheckDevice(int device) {
  KernelStatus why;
  const int n = DeviceCount(&why);
  if (n == 0) return {kKernelNoCuda, "no usable CUDA device: " + why.message};
  if (device < 0 || device >= n) {
    return {kKernelInvalidArgument, "device " + std::to_string(device) + " is not in [0, " + std::to_string(n) + ")"};
  }
  return {};
}

KernelStatus CheckRange(uint64_t offset, uint64_t bytes, uint64_t size, const char* what) {
  if (offset > size || bytes > size - offset) {
    return {kKernelInvalidArgument, std::string(what) + ": range [" + std::to_string(offset) + ", " +
                                        std::to_string(offset + bytes) + ") is past the region's " +
                                        std::to_string(size) + " bytes"};
  }
  return {};
}

}  // namespace

KernelStatus DeviceMemoryInfo(int device, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return {kKernelInvalidArgument, "null output"};
  if (KernelStatus s = CheckDevice(device); !s.ok()) return s;
  if (KernelStatus s = FromCuda(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  size_t f = 0, t = 0;
  if (KernelStatus s = FromCuda(cudaMemGetInfo(&f, &t), "cudaMemGetInfo"); !s.ok()) return s;
  *free_bytes = f;
  *total_bytes = t;
  return {};
}

KernelStatus DeviceRegion::Create(int device, uint64_t bytes, std::unique_ptr<DeviceRegion>* out) {
  if (out == nullptr) return {kKernelInvalidArgument, "null output"};
  if (bytes == 0) return {kKernelInvalidArgument, "bytes: must be > 0"};
  if (KernelStatus s = CheckDevice(device); !s.ok()) return s;
  if (KernelStatus s = FromCuda(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  void* p = nullptr;
  if (KernelStatus s = FromCuda(cudaMalloc(&p, bytes), "cudaMalloc"); !s.ok()) return s;
  out->reset(new DeviceRegion(device, p, bytes));
  return {};
}

DeviceRegion::~DeviceRegion() {
  if (data_ != nullptr && cudaSetDevice(device_) == cudaSuccess) cudaFree(data_);
}

KernelStatus DeviceRegion::CopyIn(uint64_t offset, const void* src, uint64_t bytes) {
  if (KernelStatus s = CheckRange(offset, bytes, size_bytes_, "CopyIn"); !s.ok()) return s;
  if (bytes == 0) return {};
  if (src == nullptr) return {kKernelInvalidArgument, "CopyIn: null source"};
  if (KernelStatus s = FromCuda(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  return FromCuda(cudaMemcpy(static_cast<char*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

KernelStatus DeviceRegion::CopyOut(uint64_t offset, void* dst, uint64_t bytes) const {
  if (KernelStatus s = CheckRange(offset, bytes, size_bytes_, "CopyOut"); !s.ok()) return s;
  if (bytes == 0) return {};
  if (dst == nullptr) return {kKernelInvalidArgument, "CopyOut: null destination"};
  if (KernelStatus s = FromCuda(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  return FromCuda(cudaMemcpy(dst, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost),
                  "cudaMemcpy D2H");
}

KernelStatus DeviceRegion::CopyWithin(uint64_t dst_offset, uint64_t src_offset, uint64_t bytes) {
  if (KernelStatus s = CheckRange(dst_offset, bytes, size_bytes_, "CopyWithin destination"); !s.ok()) return s;
  if (KernelStatus s = CheckRange(src_offset, bytes, size_bytes_, "CopyWithin source"); !s.ok()) return s;
  if (bytes == 0) return {};
  if (dst_offset < src_offset + bytes && src_offset < dst_offset + bytes) {
    return {kKernelInvalidArgument, "CopyWithin: source and destination overlap"};
  }
  if (KernelStatus s = FromCuda(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  char* base = static_cast<char*>(data_);
  return FromCuda(cudaMemcpy(base + dst_offset, base + src_offset, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
}

KernelStatus PinHostMemory(void* p, uint64_t bytes) {
  if (p == nullptr || bytes == 0) return {kKernelInvalidArgument, "PinHostMemory: null or empty range"};
  if (!CudaAvailable()) return {kKernelNoCuda, "PinHostMemory: no usable CUDA device"};
  return FromCuda(cudaHostRegister(p, bytes, cudaHostRegisterPortable), "cudaHostRegister");
}

KernelStatus UnpinHostMemory(void* p) {
  if (!CudaAvailable()) return {kKernelNoCuda, "UnpinHostMemory: no usable CUDA device"};
  return FromCuda(cudaHostUnregister(p), "cudaHostUnregister");
}

}  // namespace kvtier::kernels
