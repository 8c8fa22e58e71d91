// The hot-block set (client/hot_blocks.h): marking, lookups and the bound on what it remembers.
#include "client/hot_blocks.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace kvtier::client {
namespace {

Fingerprint Fp(uint32_t n) {
  Fingerprint fp;
  fp.bytes[0] = static_cast<uint8_t>(n);
  fp.bytes[1] = static_cast<uint8_t>(n >> 8);
  return fp;
}

TEST(HotBlocksTest, MarkIsTrueOnlyTheFirstTime) {
  HotBlocks hot;
  EXPECT_TRUE(hot.Mark(Fp(1)));
  EXPECT_FALSE(hot.Mark(Fp(1)));
  EXPECT_TRUE(hot.Mark(Fp(2)));
  EXPECT_EQ(hot.size(), 2u);
}

TEST(HotBlocksTest, ContainsLooksAtTheFirstNOnly) {
  HotBlocks hot;
  hot.Mark(Fp(1));
  hot.Mark(Fp(3));
  const std::vector<Fingerprint> fps = {Fp(1), Fp(2), Fp(3)};
  EXPECT_EQ(hot.Contains(fps, 3), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(hot.Contains(fps, 2), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(hot.Contains(fps, 0), (std::vector<bool>{false, false, false}));
}

TEST(HotBlocksTest, KeepsTheMostRecentlyMarkedCapacity) {
  HotBlocks hot(/*capacity=*/3);
  for (uint32_t n = 0; n < 5; ++n) EXPECT_TRUE(hot.Mark(Fp(n)));
  EXPECT_EQ(hot.size(), 3u);
  const std::vector<Fingerprint> fps = {Fp(0), Fp(1), Fp(2), Fp(3), Fp(4)};
  EXPECT_EQ(hot.Contains(fps, fps.size()), (std::vector<bool>{false, false, true, true, true}));
  // A forgotten block can be marked again, and pushes out the oldest.
  EXPECT_TRUE(hot.Mark(Fp(0)));
  EXPECT_EQ(hot.Contains(fps, fps.size()), (std::vector<bool>{true, false, false, true, true}));
}

TEST(HotBlocksTest, TheDefaultCapacityIs65536) {
  HotBlocks hot;
  for (uint32_t n = 0; n <= HotBlocks::kDefaultCapacity; ++n) {
    Fingerprint fp;
    fp.bytes[0] = static_cast<uint8_t>(n);
    fp.bytes[1] = static_cast<uint8_t>(n >> 8);
    fp.bytes[2] = static_cast<uint8_t>(n >> 16);
    hot.Mark(fp);
  }
  EXPECT_EQ(hot.size(), HotBlocks::kDefaultCapacity);
}

}  // namespace
}  // namespace kvtier::client
