// DeviceRegion and host pinning: the HBM tier's device memory. Without a usable device every call must
// fail cleanly with kKernelNoCuda; with one, bytes must round-trip exactly and ranges are checked.
#include "kvtier/kernels/device_memory.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kvtier/kernels/device.h"

namespace kvtier::kernels {
namespace {

std::vector<std::byte> Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

TEST(DeviceMemoryTest, WithoutDeviceEveryCallFailsCleanly) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is usable; this test covers machines without one";
  std::unique_ptr<DeviceRegion> region;
  const KernelStatus s = DeviceRegion::Create(0, 1 << 20, &region);
  EXPECT_EQ(s.code, kKernelNoCuda) << s.message;
  EXPECT_EQ(region, nullptr);
  uint64_t free_bytes = 0, total_bytes = 0;
  EXPECT_EQ(DeviceMemoryInfo(0, &free_bytes, &total_bytes).code, kKernelNoCuda);
  std::vector<std::byte> host(4096);
  EXPECT_EQ(PinHostMemory(host.data(), host.size()).code, kKernelNoCuda);
}

class DeviceMemoryGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KernelStatus why;
    if (DeviceCount(&why) == 0) GTEST_SKIP() << "needs a CUDA device: " << why.message;
  }
};

TEST_F(DeviceMemoryGpuTest, ReportsFreeAndTotalMemory) {
  uint64_t free_bytes = 0, total_bytes = 0;
  const KernelStatus s = DeviceMemoryInfo(0, &free_bytes, &total_bytes);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_GT(total_bytes, 0u);
  EXPECT_LE(free_bytes, total_bytes);
  EXPECT_EQ(DeviceMemoryInfo(DeviceCount(), &free_bytes, &total_bytes).code, kKernelInvalidArgument);
}

TEST_F(DeviceMemoryGpuTest, BytesRoundTripAtOffsets) {
  constexpr uint64_t kRegion = 8 << 20;
  std::unique_ptr<DeviceRegion> region;
  ASSERT_TRUE(DeviceRegion::Create(0, kRegion, &region).ok());
  ASSERT_NE(region->device_data(), nullptr);
  EXPECT_EQ(region->size_bytes(), kRegion);
  // Odd sizes and offsets, the last one ending exactly at the region's end.
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, 1}, {7, 4097}, {1 << 20, 1 << 20}, {kRegion - 513, 513}};
  for (size_t i = 0; i < ranges.size(); ++i) {
    const auto [offset, bytes] = ranges[i];
    const std::vector<std::byte> in = Pattern(bytes, static_cast<uint32_t>(i));
    ASSERT_TRUE(region->CopyIn(offset, in.data(), bytes).ok());
    std::vector<std::byte> out(bytes);
    ASSERT_TRUE(region->CopyOut(offset, out.data(), bytes).ok());
    EXPECT_EQ(out, in) << "range " << i;
  }
}

TEST_F(DeviceMemoryGpuTest, CopyWithinMovesBytesAndRefusesOverlap) {
  std::unique_ptr<DeviceRegion> region;
  ASSERT_TRUE(DeviceRegion::Create(0, 1 << 20, &region).ok());
  const std::vector<std::byte> in = Pattern(65536, 7);
  ASSERT_TRUE(region->CopyIn(0, in.data(), in.size()).ok());
  ASSERT_TRUE(region->CopyWithin(262144, 0, in.size()).ok());
  std::vector<std::byte> out(in.size());
  ASSERT_TRUE(region->CopyOut(262144, out.data(), out.size()).ok());
  EXPECT_EQ(out, in);
  EXPECT_EQ(region->CopyWithin(100, 0, 65536).code, kKernelInvalidArgument);
}

TEST_F(DeviceMemoryGpuTest, RangesPastTheRegionAreRefused) {
  std::unique_ptr<DeviceRegion> region;
  ASSERT_TRUE(DeviceRegion::Create(0, 4096, &region).ok());
  std::vector<std::byte> buf(4097);
  EXPECT_EQ(region->CopyIn(0, buf.data(), 4097).code, kKernelInvalidArgument);
  EXPECT_EQ(region->CopyOut(4096, buf.data(), 1).code, kKernelInvalidArgument);
  EXPECT_EQ(region->CopyIn(UINT64_MAX, buf.data(), 2).code, kKernelInvalidArgument);
  EXPECT_TRUE(region->CopyOut(4096, buf.data(), 0).ok());
  EXPECT_EQ(DeviceRegion::Create(0, 0, &region).code, kKernelInvalidArgument);
}

TEST_F(DeviceMemoryGpuTest, PinnedHostMemoryRoundTrips) {
  std::vector<std::byte> host = Pattern(1 << 20, 11);
  const KernelStatus pinned = PinHostMemory(host.data(), host.size());
  ASSERT_TRUE(pinned.ok()) << pinned.message;
  std::unique_ptr<DeviceRegion> region;
  ASSERT_TRUE(DeviceRegion::Create(0, host.size(), &region).ok());
  ASSERT_TRUE(region->CopyIn(0, host.data(), host.size()).ok());
  std::vector<std::byte> out(host.size());
  ASSERT_TRUE(region->CopyOut(0, out.data(), out.size()).ok());
  EXPECT_EQ(out, host);
  EXPECT_TRUE(UnpinHostMemory(host.data()).ok());
}

}  // namespace
}  // namespace kvtier::kernels
