#include "kvtier/kernels/device.h"

#include <string>

#include <gtest/gtest.h>

namespace kvtier::kernels {
namespace {

TEST(DeviceTest, FlavorMatchesTheBuild) {
#if KVTIER_HAVE_CUDA
  EXPECT_EQ(std::string(BuildFlavor()), "cuda");
#else
  EXPECT_EQ(std::string(BuildFlavor()), "cpu");
  EXPECT_FALSE(CudaAvailable());
#endif
}

TEST(DeviceTest, NoDeviceExplainsWhy) {
  KernelStatus why;
  const int n = DeviceCount(&why);
  if (n > 0) {
    EXPECT_TRUE(CudaAvailable());
  } else {
    EXPECT_FALSE(CudaAvailable());
    EXPECT_FALSE(why.ok());
    EXPECT_FALSE(why.message.empty());
  }
}

TEST(DeviceTest, DeviceIsUsableWhenPresent) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  EXPECT_GT(DeviceCount(), 0);
}

}  // namespace
}  // namespace kvtier::kernels
