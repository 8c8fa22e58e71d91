// DeviceTierMemory over kvtier_kernels' DeviceRegion (CUDA), and host-region pinning.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvtier/kernels/device.h"
#include "kvtier/kernels/device_memory.h"
#include "kvtier/server/device_tier_memory.h"

namespace kvtier::server {
namespace {

absl::Status FromKernel(const kernels::KernelStatus& s) {
  if (s.ok()) return absl::OkStatus();
  if (s.code == kernels::kKernelNoCuda) return absl::FailedPreconditionError(s.message);
  if (s.code == kernels::kKernelInvalidArgument) return absl::InvalidArgumentError(s.message);
  return absl::InternalError(s.message);
}

class CudaDeviceTierMemory final : public DeviceTierMemory {
 public:
  explicit CudaDeviceTierMemory(std::unique_ptr<kernels::DeviceRegion> region) : region_(std::move(region)) {}
  uint64_t size_bytes() const override { return region_->size_bytes(); }
  absl::Status CopyIn(uint64_t offset, std::span<const std::byte> src) override {
    return FromKernel(region_->CopyIn(offset, src.data(), src.size()));
  }
  absl::Status CopyOut(uint64_t offset, std::span<std::byte> dst) const override {
    return FromKernel(region_->CopyOut(offset, dst.data(), dst.size()));
  }
  void* DeviceAddress(uint64_t offset) const override {
    return offset < region_->size_bytes() ? static_cast<char*>(region_->device_data()) + offset : nullptr;
  }
  std::string Describe() const override {
    return absl::StrFormat("cuda:%d %.1f GiB", region_->device(),
                           static_cast<double>(region_->size_bytes()) / (1 << 30));
  }

 private:
  std::unique_ptr<kernels::DeviceRegion> region_;
};

class CudaPinnedHostRegion final : public PinnedHostRegion {
 public:
  explicit CudaPinnedHostRegion(void* p) : p_(p) {}
  ~CudaPinnedHostRegion() override { kernels::UnpinHostMemory(p_); }

 private:
  void* p_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceTierMemory>> NewCudaDeviceTierMemory(int device, double memory_ratio,
                                                                          uint64_t max_bytes) {
  if (!(memory_ratio > 0 && memory_ratio <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("memory_ratio must be in (0, 1], got ", memory_ratio));
  }
  uint64_t free_bytes = 0, total_bytes = 0;
  if (absl::Status s = FromKernel(kernels::DeviceMemoryInfo(device, &free_bytes, &total_bytes)); !s.ok()) return s;
  uint64_t bytes = static_cast<uint64_t>(memory_ratio * static_cast<double>(free_bytes));
  if (max_bytes > 0 && bytes > max_bytes) bytes = max_bytes;
  bytes &= ~((uint64_t{1} << 20) - 1);
  if (bytes == 0) {
    return absl::ResourceExhaustedError(absl::StrCat("device ", device, " has ", free_bytes,
                                                     " bytes free; memory_ratio ", memory_ratio, " leaves < 1 MiB"));
  }
  std::unique_ptr<kernels::DeviceRegion> region;
  if (const kernels::KernelStatus s = kernels::DeviceRegion::Create(device, bytes, &region); !s.ok()) {
    if (s.code > 0) return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc of ", bytes, " bytes: ", s.message));
    return FromKernel(s);
  }
  return std::make_unique<CudaDeviceTierMemory>(std::move(region));
}

absl::StatusOr<std::unique_ptr<PinnedHostRegion>> PinHostRegion(std::span<std::byte> region) {
  if (!kernels::CudaAvailable()) return absl::FailedPreconditionError("no usable CUDA device");
  if (absl::Status s = FromKernel(kernels::PinHostMemory(region.data(), region.size())); !s.ok()) return s;
  return std::make_unique<CudaPinnedHostRegion>(region.data());
}

}  // namespace kvtier::server
