// A DeviceTierMemory kept in host memory, so that the HBM tier's logic (promotion, demotion, budgets,
// checksums on every move) is tested on machines without a GPU. The CUDA implementation
// (NewCudaDeviceTierMemory) has its own tests, which run where a device is usable.
#ifndef KVTIER_TESTS_TESTING_EMULATED_HBM_H_
#define KVTIER_TESTS_TESTING_EMULATED_HBM_H_

#include <atomic>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtier/server/device_tier_memory.h"

namespace kvtier::testing {

class EmulatedHbm final : public server::DeviceTierMemory {
 public:
  explicit EmulatedHbm(uint64_t bytes) : bytes_(bytes) {}
  uint64_t size_bytes() const override { return bytes_.size(); }
  absl::Status CopyIn(uint64_t offset, std::span<const std::byte> src) override {
    if (fail_copies.load()) return absl::InternalError("injected device copy failure");
    if (offset > bytes_.size() || src.size() > bytes_.size() - offset) return absl::InvalidArgumentError("past end");
    if (!src.empty()) std::memcpy(bytes_.data() + offset, src.data(), src.size());
    copies_in.fetch_add(1);
    return absl::OkStatus();
  }
  absl::Status CopyOut(uint64_t offset, std::span<std::byte> dst) const override {
    if (fail_copies.load()) return absl::InternalError("injected device copy failure");
    if (offset > bytes_.size() || dst.size() > bytes_.size() - offset) return absl::InvalidArgumentError("past end");
    if (!dst.empty()) std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
    return absl::OkStatus();
  }
  // The host address of byte `offset`: transports under test (a fake NCCL) read it as device memory.
  void* DeviceAddress(uint64_t offset) const override {
    return offset < bytes_.size() ? const_cast<std::byte*>(bytes_.data()) + offset : nullptr;
  }
  std::string Describe() const override { return absl::StrCat("emulated ", bytes_.size(), " bytes"); }

  std::atomic<bool> fail_copies{false};
  std::atomic<uint64_t> copies_in{0};

 private:
  std::vector<std::byte> bytes_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_EMULATED_HBM_H_
