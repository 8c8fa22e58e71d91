// The HBM tier on real device memory (NewCudaDeviceTierMemory): the same promotion, demotion and
// checksum behaviour as tests/unit/server/hbm_tier_test.cc, with CUDA copies. Without a usable device
// the factory must refuse cleanly (FailedPrecondition, so the server runs without the tier) and the
// device tests skip.
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/common/checksum.h"
#include "kvtier/kernels/device.h"
#include "kvtier/server/block_store.h"
#include "kvtier/server/device_tier_memory.h"
#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

constexpr uint64_t kBlock = 256 << 10;

BlockKey Key(uint32_t n) {
  BlockKey k;
  std::memcpy(k.fingerprint.bytes.data(), &n, sizeof(n));
  k.fingerprint.bytes[30] = 0x17;
  return k;
}

std::vector<std::byte> Payload(uint32_t seed) {
  std::vector<std::byte> b(kBlock);
  for (size_t i = 0; i < kBlock; ++i) b[i] = static_cast<std::byte>((i * 193 + seed * 6151) >> 3);
  return b;
}

TEST(HbmTierCudaTest, WithoutADeviceTheFactoryRefusesCleanly) {
  if (kernels::CudaAvailable()) GTEST_SKIP() << "a CUDA device is usable; this test covers machines without one";
  auto memory = NewCudaDeviceTierMemory(0, 0.5, 0);
  ASSERT_FALSE(memory.ok());
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kFailedPrecondition) << memory.status();
  EXPECT_EQ(NewCudaDeviceTierMemory(0, 1.5, 0).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::byte> host(4096);
  EXPECT_EQ(PinHostRegion(host).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(HbmTierCudaTest, BlocksMoveThroughDeviceMemoryByteForByte) {
  kernels::KernelStatus why;
  if (kernels::DeviceCount(&why) == 0) GTEST_SKIP() << "needs a CUDA device: " << why.message;
  auto memory = NewCudaDeviceTierMemory(0, 0.5, 4 * kBlock);
  ASSERT_OK(memory);
  ASSERT_EQ((*memory)->size_bytes(), 4 * kBlock);
  ASSERT_NE((*memory)->DeviceAddress(0), nullptr);
  BlockStoreOptions o{.capacity_bytes = 16 * kBlock, .slab_bytes = 4 * kBlock};
  o.hbm_memory = std::shared_ptr<DeviceTierMemory>(std::move(memory).value());
  auto created = BlockStore::Create(o);
  ASSERT_OK(created);
  std::unique_ptr<BlockStore> store = std::move(created).value();
  auto pinned = PinHostRegion(store->HostRegion());
  EXPECT_OK(pinned);
  const NamespaceRef ns{.id = 3, .tenant_id = TenantId("t"), .block_bytes = kBlock};
  for (uint32_t n = 0; n < 8; ++n) {
    const BlockKey k = Key(n);
    auto a = store->Allocate(ns, std::span<const BlockKey>(&k, 1));
    ASSERT_OK(a);
    const auto bytes = Payload(n);
    ASSERT_OK(store->Write(a->reservation_id, 0, 0, bytes));
    const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
    ASSERT_OK(store->Commit(a->reservation_id, std::span<const uint64_t>(&sum, 1)));
  }
  // Two rounds of reads: every block goes up to HBM and, as HBM holds 4, comes back down to host.
  for (int round = 0; round < 2; ++round) {
    for (uint32_t n = 0; n < 8; ++n) {
      const BlockKey k = Key(n);
      auto lease = store->AcquireRead(ns, std::span<const BlockKey>(&k, 1), absl::ZeroDuration());
      ASSERT_TRUE(lease.blocks[0].present) << n;
      std::vector<std::byte> out(kBlock);
      ASSERT_OK(store->CopyOut(lease.lease_id, 0, 0, out));
      EXPECT_EQ(out, Payload(n)) << n;
      store->Release(std::span<const CapabilityId>(&lease.lease_id, 1));
      EXPECT_EQ(store->TierOfForTest(k), Tier::kHbm);
    }
  }
  EXPECT_EQ(store->stats().hbm_blocks.load(), 4u);
  EXPECT_LE(store->stats().hbm_bytes.load(), 4 * kBlock);
  EXPECT_EQ(store->stats().hbm_promotions.load(), 16u);
  EXPECT_EQ(store->stats().hbm_demotions.load(), 12u);
  EXPECT_EQ(store->stats().hbm_errors.load(), 0u);
  // A byte flipped in device memory is caught and never served.
  ASSERT_OK(store->CorruptBlockForTest(Key(7), 1000));
  const BlockStore::VerifyResult v = store->Verify();
  EXPECT_EQ(v.corrupt, 1u);
  EXPECT_EQ(store->TierOfForTest(Key(7)), std::nullopt);
  pinned->reset();
}

}  // namespace
}  // namespace kvtier::server
