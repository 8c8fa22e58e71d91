// CPU reference of gather/scatter: against the naive index-by-index definition, round trips, and
// argument errors, for all three engine layouts.
#include "kvtier/kernels/gather_scatter.h"

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"

namespace kvtier::kernels {
namespace {

using testing::Bytes;

struct Case {
  EngineLayout layout;
  int32_t element_bytes;
  int32_t page_size;
  int32_t block_tokens;
  int32_t dim;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << testing::LayoutName(c.layout) << " e" << c.element_bytes << " p" << c.page_size << " t" << c.block_tokens
      << " d" << c.dim;
}

class GatherScatterTest : public ::testing::TestWithParam<Case> {
 protected:
  PagedCacheSpec Spec() const {
    const Case& c = GetParam();
    return testing::SmallSpec(c.layout, c.element_bytes, c.page_size, c.block_tokens, c.dim);
  }
};

TEST_P(GatherScatterTest, GatherMatchesTheNaiveDefinitionWithRepeatedPages) {
  const PagedCacheSpec spec = Spec();
  std::mt19937_64 rng(1);
  std::vector<Bytes> caches;
  for (int l = 0; l < spec.block.num_layers; ++l) caches.push_back(testing::RandomBytes(spec.LayerBytes(), rng));
  const int32_t num_blocks = 4;
  const std::vector<int32_t> table = testing::RandomTable(spec, num_blocks, rng);
  std::vector<Bytes> blocks(num_blocks, Bytes(spec.BlockBytes(), 0xAB));
  const KernelStatus s = GatherCpu(spec, testing::ConstPointers(caches).data(), table.data(), num_blocks,
                                   testing::Pointers<void>(blocks).data());
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(blocks, testing::NaiveGather(spec, caches, table, num_blocks));
}

TEST_P(GatherScatterTest, ScatterThenGatherRoundTripsAndTouchesOnlyNamedPages) {
  const PagedCacheSpec spec = Spec();
  std::mt19937_64 rng(2);
  const int32_t num_blocks = 3;
  const std::vector<int32_t> table = testing::UniqueTable(spec, num_blocks, rng);
  std::vector<Bytes> blocks;
  for (int b = 0; b < num_blocks; ++b) blocks.push_back(testing::RandomBytes(spec.BlockBytes(), rng));
  std::vector<Bytes> caches(spec.block.num_layers, Bytes(spec.LayerBytes(), 0));
  KernelStatus s = ScatterCpu(spec, testing::ConstPointers(blocks).data(), table.data(), num_blocks,
                              testing::Pointers<void>(caches).data());
  ASSERT_TRUE(s.ok()) << s.message;

  // Pages the table does not name stay zero.
  std::vector<bool> named(spec.num_pages, false);
  for (int32_t p : table) named[p] = true;
  for (int l = 0; l < spec.block.num_layers; ++l) {
    for (int32_t page = 0; page < spec.num_pages; ++page) {
      if (named[page]) continue;
      for (int kv = 0; kv < spec.block.NumKv(); ++kv) {
        const int64_t off = (spec.layout == EngineLayout::kKvFirst ? int64_t{kv} * spec.num_pages + page
                                                                   : int64_t{page} * spec.block.NumKv() + kv) *
                            spec.PageBytes();
        for (int64_t i = 0; i < spec.PageBytes(); ++i) {
          ASSERT_EQ(caches[l][off + i], 0) << "layer " << l << " page " << page;
        }
      }
    }
  }
  // The naive definition of gather reads back exactly what was scattered.
  EXPECT_EQ(testing::NaiveGather(spec, caches, table, num_blocks), blocks);
  std::vector<Bytes> back(num_blocks, Bytes(spec.BlockBytes()));
  s = GatherCpu(spec, testing::ConstPointers(caches).data(), table.data(), num_blocks,
                testing::Pointers<void>(back).data());
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(back, blocks);
}

TEST_P(GatherScatterTest, GatherThenScatterRestoresTheNamedPages) {
  const PagedCacheSpec spec = Spec();
  std::mt19937_64 rng(3);
  std::vector<Bytes> caches;
  for (int l = 0; l < spec.block.num_layers; ++l) caches.push_back(testing::RandomBytes(spec.LayerBytes(), rng));
  const int32_t num_blocks = 2;
  const std::vector<int32_t> table = testing::UniqueTable(spec, num_blocks, rng);
  std::vector<Bytes> blocks(num_blocks, Bytes(spec.BlockBytes()));
  ASSERT_TRUE(GatherCpu(spec, testing::ConstPointers(caches).data(), table.data(), num_blocks,
                        testing::Pointers<void>(blocks).data())
                  .ok());
  // Scatter into a copy whose named pages were wiped: the copy must equal the original again.
  std::vector<Bytes> wiped = caches;
  std::vector<Bytes> garbage(num_blocks, Bytes(spec.BlockBytes(), 0x5A));
  ASSERT_TRUE(ScatterCpu(spec, testing::ConstPointers(garbage).data(), table.data(), num_blocks,
                         testing::Pointers<void>(wiped).data())
                  .ok());
  ASSERT_NE(wiped, caches);
  ASSERT_TRUE(ScatterCpu(spec, testing::ConstPointers(blocks).data(), table.data(), num_blocks,
                         testing::Pointers<void>(wiped).data())
                  .ok());
  EXPECT_EQ(wiped, caches);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GatherScatterTest,
    ::testing::Values(Case{EngineLayout::kKvFirst, 2, 4, 12, 8}, Case{EngineLayout::kPageFirst, 2, 4, 12, 8},
                      Case{EngineLayout::kMla, 2, 4, 12, 24}, Case{EngineLayout::kKvFirst, 1, 1, 3, 5},
                      Case{EngineLayout::kPageFirst, 1, 2, 8, 3}, Case{EngineLayout::kMla, 1, 3, 6, 7},
                      Case{EngineLayout::kKvFirst, 4, 8, 8, 4}, Case{EngineLayout::kPageFirst, 2, 16, 16, 16}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return testing::LayoutName(c.layout) + "_e" + std::to_string(c.element_bytes) + "_p" +
             std::to_string(c.page_size) + "_t" + std::to_string(c.block_tokens) + "_d" + std::to_string(c.dim);
    });

class GatherScatterErrorsTest : public ::testing::Test {
 protected:
  GatherScatterErrorsTest() : spec_(testing::SmallSpec(EngineLayout::kKvFirst, 2)) {
    caches_.assign(spec_.block.num_layers, Bytes(spec_.LayerBytes()));
    blocks_.assign(2, Bytes(spec_.BlockBytes()));
    table_.assign(2 * spec_.PagesPerBlock(), 0);
    for (size_t i = 0; i < table_.size(); ++i) table_[i] = static_cast<int32_t>(i);
  }
  KernelStatus Gather(const PagedCacheSpec& spec) {
    return GatherCpu(spec, testing::ConstPointers(caches_).data(), table_.data(), 2,
                     testing::Pointers<void>(blocks_).data());
  }
  KernelStatus Scatter(const PagedCacheSpec& spec) {
    return ScatterCpu(spec, testing::ConstPointers(blocks_).data(), table_.data(), 2,
                      testing::Pointers<void>(caches_).data());
  }

  PagedCacheSpec spec_;
  std::vector<Bytes> caches_;
  std::vector<Bytes> blocks_;
  std::vector<int32_t> table_;
};

TEST_F(GatherScatterErrorsTest, ValidArgumentsWork) {
  EXPECT_TRUE(Gather(spec_).ok());
  EXPECT_TRUE(Scatter(spec_).ok());
}

TEST_F(GatherScatterErrorsTest, BlockTokensNotAMultipleOfPageSizeIsRejected) {
  PagedCacheSpec spec = spec_;
  spec.page_size = 5;  // block_tokens is 12
  const KernelStatus s = Gather(spec);
  EXPECT_EQ(s.code, kKernelInvalidArgument);
  EXPECT_NE(s.message.find("page_size 5"), std::string::npos) << s.message;
  EXPECT_EQ(Scatter(spec).code, kKernelInvalidArgument);
}

TEST_F(GatherScatterErrorsTest, BadFieldsAreRejected) {
  auto expect_invalid = [&](PagedCacheSpec spec, const char* field) {
    const KernelStatus s = Gather(spec);
    EXPECT_EQ(s.code, kKernelInvalidArgument) << field;
    EXPECT_NE(s.message.find(field), std::string::npos) << s.message;
  };
  PagedCacheSpec spec = spec_;
  spec.element_bytes = 3;
  expect_invalid(spec, "element_bytes");
  spec = spec_;
  spec.page_size = 0;
  expect_invalid(spec, "page_size");
  spec = spec_;
  spec.block.head_dim = 0;
  expect_invalid(spec, "head_dim");
  spec = spec_;
  spec.layout = EngineLayout::kMla;  // block kind is still kStandard
  expect_invalid(spec, "kMla");
  spec = spec_;
  spec.block.kind = BlockKind::kMla;
  spec.block.latent_dim = 16;  // layout is kKvFirst
  expect_invalid(spec, "kStandard");
}

TEST_F(GatherScatterErrorsTest, PageIdsOutOfRangeAreRejectedBeforeAnyCopy) {
  blocks_[0].assign(blocks_[0].size(), 0x77);
  table_.back() = spec_.num_pages;
  KernelStatus s = Gather(spec_);
  EXPECT_EQ(s.code, kKernelInvalidArgument);
  EXPECT_NE(s.message.find("page 23"), std::string::npos) << s.message;
  EXPECT_EQ(blocks_[0], Bytes(blocks_[0].size(), 0x77));  // untouched
  table_.back() = -1;
  EXPECT_EQ(Gather(spec_).code, kKernelInvalidArgument);
  EXPECT_EQ(Scatter(spec_).code, kKernelInvalidArgument);
}

TEST_F(GatherScatterErrorsTest, ScatterRejectsAPageNamedTwice) {
  table_[4] = table_[1];
  const KernelStatus s = Scatter(spec_);
  EXPECT_EQ(s.code, kKernelInvalidArgument);
  EXPECT_NE(s.message.find("more than once"), std::string::npos) << s.message;
  EXPECT_TRUE(Gather(spec_).ok());  // gather may read a page twice
}

TEST_F(GatherScatterErrorsTest, NullPointersAreRejected) {
  std::vector<void*> blocks = testing::Pointers<void>(blocks_);
  blocks[1] = nullptr;
  EXPECT_EQ(GatherCpu(spec_, testing::ConstPointers(caches_).data(), table_.data(), 2, blocks.data()).code,
            kKernelInvalidArgument);
  EXPECT_EQ(GatherCpu(spec_, nullptr, table_.data(), 2, testing::Pointers<void>(blocks_).data()).code,
            kKernelInvalidArgument);
  EXPECT_EQ(
      GatherCpu(spec_, testing::ConstPointers(caches_).data(), nullptr, 2, testing::Pointers<void>(blocks_).data())
          .code,
      kKernelInvalidArgument);
  EXPECT_EQ(GatherCpu(spec_, testing::ConstPointers(caches_).data(), table_.data(), -1,
                      testing::Pointers<void>(blocks_).data())
                .code,
            kKernelInvalidArgument);
}

TEST_F(GatherScatterErrorsTest, ZeroBlocksIsANoOp) {
  EXPECT_TRUE(GatherCpu(spec_, nullptr, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(ScatterCpu(spec_, nullptr, nullptr, 0, nullptr).ok());
}

TEST(PagedCacheSpecTest, HugeShapesAreRejectedWithoutOverflow) {
  PagedCacheSpec spec = testing::SmallSpec(EngineLayout::kKvFirst, 2);
  spec.block.num_layers = 1 << 30;
  spec.block.num_kv_heads = 1 << 30;
  spec.block.head_dim = 1 << 30;
  KernelStatus s = spec.Validate();
  EXPECT_EQ(s.code, kKernelInvalidArgument);
  EXPECT_NE(s.message.find("2^40"), std::string::npos) << s.message;
  spec = testing::SmallSpec(EngineLayout::kKvFirst, 4);
  spec.num_pages = 2000000000;
  spec.block.head_dim = 1 << 20;
  s = spec.Validate();
  EXPECT_EQ(s.code, kKernelInvalidArgument);
  EXPECT_NE(s.message.find("2^46"), std::string::npos) << s.message;
}

TEST(PagedCacheSpecTest, SizesFollowTheLayouts) {
  PagedCacheSpec spec = testing::SmallSpec(EngineLayout::kPageFirst, 2, 4, 12, 8);
  EXPECT_EQ(spec.PagesPerBlock(), 3);
  EXPECT_EQ(spec.PageBytes(), 4 * 2 * 8 * 2);
  EXPECT_EQ(spec.LayerBytes(), 23 * 2 * spec.PageBytes());
  EXPECT_EQ(spec.BlockBytes(), 3 * 2 * 12 * 2 * 8 * 2);
  spec = testing::SmallSpec(EngineLayout::kMla, 2, 4, 12, 576);
  EXPECT_EQ(spec.PageBytes(), 4 * 576 * 2);
  EXPECT_EQ(spec.LayerBytes(), 23 * spec.PageBytes());
  EXPECT_EQ(spec.BlockBytes(), 3 * 12 * 576 * 2);
}

}  // namespace
}  // namespace kvtier::kernels
