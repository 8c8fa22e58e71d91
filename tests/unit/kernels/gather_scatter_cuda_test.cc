// CUDA gather/scatter against the CPU reference, byte for byte: all layouts, repeated pages, host and
// device tables, unaligned buffers, and output in mapped pinned host memory. Skips without a GPU.
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kvtier/kernels/device.h"
#include "kvtier/kernels/gather_scatter.h"

namespace kvtier::kernels {
namespace {

using testing::Bytes;

TEST(GatherScatterCudaTest, ArgumentsAreCheckedEvenWithoutADevice) {
  const PagedCacheSpec spec = testing::SmallSpec(EngineLayout::kKvFirst, 2);
  std::vector<Bytes> caches(spec.block.num_layers, Bytes(spec.LayerBytes()));
  std::vector<Bytes> blocks(1, Bytes(spec.BlockBytes()));
  std::vector<int32_t> table = {0, 1, 2};
  PagedCacheSpec bad = spec;
  bad.page_size = 5;
  EXPECT_EQ(
      GatherCuda(bad, testing::ConstPointers(caches).data(), table.data(), 1, testing::Pointers<void>(blocks).data())
          .code,
      kKernelInvalidArgument);
  table[2] = 99;
  EXPECT_EQ(
      ScatterCuda(spec, testing::ConstPointers(blocks).data(), table.data(), 1, testing::Pointers<void>(caches).data())
          .code,
      kKernelInvalidArgument);
  if (CudaAvailable()) return;
  table[2] = 2;
  const KernelStatus s =
      GatherCuda(spec, testing::ConstPointers(caches).data(), table.data(), 1, testing::Pointers<void>(blocks).data());
  EXPECT_EQ(s.code, kKernelNoCuda) << s.message;
  EXPECT_FALSE(s.message.empty());
}

#if KVTIER_HAVE_CUDA
using testing::DeviceBuffer;

struct Case {
  EngineLayout layout;
  int32_t element_bytes;
  int32_t page_size;
  int32_t block_tokens;
  int32_t dim;
  int32_t misalign;  // bytes added to every block pointer
  bool tables_on_device;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << testing::LayoutName(c.layout) << " e" << c.element_bytes << " p" << c.page_size << " t" << c.block_tokens
      << " d" << c.dim << " misalign " << c.misalign << (c.tables_on_device ? " device tables" : " host tables");
}

class GatherScatterCudaTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GatherScatterCudaTest, MatchesTheCpuReferenceExactly) {
  const Case& c = GetParam();
  PagedCacheSpec spec = testing::SmallSpec(c.layout, c.element_bytes, c.page_size, c.block_tokens, c.dim);
  spec.num_pages = 64;
  std::mt19937_64 rng(11);
  const int32_t num_blocks = 5;

  // Engine caches on the device, random contents.
  std::vector<Bytes> caches;
  std::vector<DeviceBuffer> d_caches;
  std::vector<void*> cache_ptrs;
  for (int l = 0; l < spec.block.num_layers; ++l) {
    caches.push_back(testing::RandomBytes(spec.LayerBytes(), rng));
    d_caches.emplace_back(caches.back());
    ASSERT_TRUE(d_caches.back().ok());
    cache_ptrs.push_back(d_caches.back().get());
  }
  std::vector<DeviceBuffer> d_blocks;
  std::vector<void*> block_ptrs;
  for (int b = 0; b < num_blocks; ++b) {
    d_blocks.emplace_back(spec.BlockBytes() + c.misalign);
    ASSERT_TRUE(d_blocks.back().ok());
    block_ptrs.push_back(d_blocks.back().get() + c.misalign);
  }

  // Gather with repeated pages.
  const std::vector<int32_t> table = testing::RandomTable(spec, num_blocks, rng);
  std::vector<Bytes> want(num_blocks, Bytes(spec.BlockBytes()));
  ASSERT_TRUE(GatherCpu(spec, testing::ConstPointers(caches).data(), table.data(), num_blocks,
                        testing::Pointers<void>(want).data())
                  .ok());
  CudaLaunchOptions options;
  options.tables_on_device = c.tables_on_device;
  DeviceBuffer d_table(Bytes(reinterpret_cast<const unsigned char*>(table.data()),
                             reinterpret_cast<const unsigned char*>(table.data() + table.size())));
  const size_t ptr_bytes = sizeof(void*);
  DeviceBuffer d_cache_ptrs(
      Bytes(reinterpret_cast<const unsigned char*>(cache_ptrs.data()),
            reinterpret_cast<const unsigned char*>(cache_ptrs.data()) + ptr_bytes * cache_ptrs.size()));
  DeviceBuffer d_block_ptrs(
      Bytes(reinterpret_cast<const unsigned char*>(block_ptrs.data()),
            reinterpret_cast<const unsigned char*>(block_ptrs.data()) + ptr_bytes * block_ptrs.size()));
  auto tbl = [&](const std::vector<int32_t>& host, DeviceBuffer& dev) {
    return c.tables_on_device ? reinterpret_cast<const int32_t*>(dev.get()) : host.data();
  };
  void* const* caches_arg = c.tables_on_device ? reinterpret_cast<void* const*>(d_cache_ptrs.get()) : cache_ptrs.data();
  void* const* blocks_arg = c.tables_on_device ? reinterpret_cast<void* const*>(d_block_ptrs.get()) : block_ptrs.data();

  KernelStatus s = GatherCuda(spec, caches_arg, tbl(table, d_table), num_blocks, blocks_arg, options);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(testing::CudaSync(), "");
  for (int b = 0; b < num_blocks; ++b) {
    EXPECT_EQ(d_blocks[b].Download(c.misalign, spec.BlockBytes()), want[b]) << "block " << b;
  }

  // Scatter fresh blocks into distinct pages; compare whole caches with the CPU scatter.
  const std::vector<int32_t> unique = testing::UniqueTable(spec, num_blocks, rng);
  std::vector<Bytes> fresh;
  for (int b = 0; b < num_blocks; ++b) {
    fresh.push_back(testing::RandomBytes(spec.BlockBytes(), rng));
    Bytes padded(c.misalign, 0);
    padded.insert(padded.end(), fresh.back().begin(), fresh.back().end());
    ASSERT_TRUE(d_blocks[b].Upload(padded));
  }
  ASSERT_TRUE(ScatterCpu(spec, testing::ConstPointers(fresh).data(), unique.data(), num_blocks,
                         testing::Pointers<void>(caches).data())
                  .ok());
  DeviceBuffer d_unique(Bytes(reinterpret_cast<const unsigned char*>(unique.data()),
                              reinterpret_cast<const unsigned char*>(unique.data() + unique.size())));
  s = ScatterCuda(spec, blocks_arg, tbl(unique, d_unique), num_blocks, caches_arg, options);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(testing::CudaSync(), "");
  for (int l = 0; l < spec.block.num_layers; ++l) {
    EXPECT_EQ(d_caches[l].Download(), caches[l]) << "layer " << l;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GatherScatterCudaTest,
    ::testing::Values(Case{EngineLayout::kKvFirst, 2, 16, 64, 128, 0, false},  // Llama-like, 16-byte path
                      Case{EngineLayout::kPageFirst, 2, 16, 64, 128, 0, true},
                      Case{EngineLayout::kMla, 2, 8, 32, 576, 0, false},
                      Case{EngineLayout::kMla, 1, 1, 4, 576, 0, true},       // SGLang-style page_size 1, fp8
                      Case{EngineLayout::kKvFirst, 1, 4, 12, 5, 0, false},   // odd run length: byte path
                      Case{EngineLayout::kPageFirst, 2, 4, 8, 8, 8, false},  // 8-byte aligned blocks
                      Case{EngineLayout::kKvFirst, 2, 4, 8, 8, 2, true},     // 2-byte aligned blocks
                      Case{EngineLayout::kMla, 2, 4, 8, 64, 3, false},       // unaligned blocks
                      Case{EngineLayout::kKvFirst, 4, 2, 4, 6, 4, false}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return testing::LayoutName(c.layout) + "_e" + std::to_string(c.element_bytes) + "_p" +
             std::to_string(c.page_size) + "_t" + std::to_string(c.block_tokens) + "_d" + std::to_string(c.dim) + "_m" +
             std::to_string(c.misalign) + (c.tables_on_device ? "_dev" : "_host");
    });

TEST(GatherScatterCudaPinnedTest, GathersStraightIntoMappedPinnedHostMemory) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  const PagedCacheSpec spec = testing::SmallSpec(EngineLayout::kKvFirst, 2, 16, 32, 64);
  std::mt19937_64 rng(12);
  std::vector<Bytes> caches;
  std::vector<DeviceBuffer> d_caches;
  std::vector<const void*> cache_ptrs;
  for (int l = 0; l < spec.block.num_layers; ++l) {
    caches.push_back(testing::RandomBytes(spec.LayerBytes(), rng));
    d_caches.emplace_back(caches.back());
    cache_ptrs.push_back(d_caches.back().get());
  }
  const std::vector<int32_t> table = testing::RandomTable(spec, 2, rng);
  void* pinned[2] = {nullptr, nullptr};
  for (auto& p : pinned) ASSERT_EQ(cudaHostAlloc(&p, spec.BlockBytes(), cudaHostAllocMapped), cudaSuccess);
  KernelStatus s = GatherCuda(spec, cache_ptrs.data(), table.data(), 2, pinned);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(testing::CudaSync(), "");
  const std::vector<Bytes> want = testing::NaiveGather(spec, caches, table, 2);
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(Bytes(static_cast<unsigned char*>(pinned[b]), static_cast<unsigned char*>(pinned[b]) + spec.BlockBytes()),
              want[b]);
    cudaFreeHost(pinned[b]);
  }
}

TEST(GatherScatterCudaStreamTest, RunsOnTheGivenStream) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  const PagedCacheSpec spec = testing::SmallSpec(EngineLayout::kPageFirst, 2, 16, 32, 64);
  std::mt19937_64 rng(13);
  std::vector<Bytes> caches;
  std::vector<DeviceBuffer> d_caches;
  std::vector<const void*> cache_ptrs;
  for (int l = 0; l < spec.block.num_layers; ++l) {
    caches.push_back(testing::RandomBytes(spec.LayerBytes(), rng));
    d_caches.emplace_back(caches.back());
    cache_ptrs.push_back(d_caches.back().get());
  }
  const std::vector<int32_t> table = testing::RandomTable(spec, 1, rng);
  DeviceBuffer block(spec.BlockBytes());
  void* block_ptr = block.get();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  CudaLaunchOptions options;
  options.stream = stream;
  KernelStatus s = GatherCuda(spec, cache_ptrs.data(), table.data(), 1, &block_ptr, options);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  EXPECT_EQ(block.Download(), testing::NaiveGather(spec, caches, table, 1)[0]);
}
#endif  // KVTIER_HAVE_CUDA

}  // namespace
}  // namespace kvtier::kernels
