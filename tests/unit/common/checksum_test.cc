#include "kvtier/common/checksum.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(BlockChecksumTest, EmptyInputIsTheXxh3EmptyHash) {
  EXPECT_EQ(BlockChecksum(nullptr, 0), 0x2d06800538d394c2ULL);
  EXPECT_EQ(BlockChecksum("", 0), 0x2d06800538d394c2ULL);
}

TEST(BlockChecksumTest, MatchesReferenceXxh3ValuesInEveryLengthClass) {
  // The vectors of LLVM's xxhash test (llvm/unittests/Support/xxhashTest.cpp), taken from the reference
  // XXH3_64bits with seed 0, over prefixes of an xorshift buffer. They cover every XXH3 code path (0, 1-3,
  // 4-8, 9-16, 17-128, 129-240 bytes and the long-input loop), so a different seed, algorithm or
  // library would show here, and stored checksums would stop matching.
  constexpr size_t kSize = 2243;
  std::vector<uint8_t> a(kSize);
  uint64_t x = 1;
  for (size_t i = 0; i < kSize; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    a[i] = static_cast<uint8_t>(x);
  }
  const std::vector<std::pair<size_t, uint64_t>> vectors = {
      {0, 0x2d06800538d394c2},    {1, 0xd0d496e05c553485},    {2, 0x84d625edb7055eac},    {3, 0x6ea2d59aca5c3778},
      {4, 0xbf65290914e80242},    {5, 0xc01fd099ad4fc8e4},    {6, 0x9e3ea8187399caa5},    {7, 0x9da8b60540644f5a},
      {8, 0xabc1413da6cd0209},    {9, 0x8bc89400bfed51f6},    {16, 0x7e46916754d7c9b8},   {17, 0xed4be912ba5f836d},
      {32, 0xf59b59b58c304fd1},   {33, 0x9013fb74ca603e0c},   {64, 0xfa5271fcce0db1c3},   {65, 0x79c42431727f1012},
      {96, 0x591ee0ddf9c9ccd1},   {97, 0x8ffc6a3111fe19da},   {128, 0x06a146ee9a2da378},  {129, 0xbc7138129bf065da},
      {403, 0xcefeb3ffa532ad8c},  {512, 0xcdfa6b6268e3650f},  {513, 0x4bb5d42742f9765f},  {2048, 0x330ce110cbb79eae},
      {2049, 0x3ba6afa0249fef9a}, {2240, 0xd61d4d2a94e926a8}, {2243, 0x0979f786a24edde7},
  };
  for (const auto& [len, want] : vectors) {
    EXPECT_EQ(BlockChecksum(a.data(), len), want) << "length " << len;
  }
}

TEST(BlockChecksumTest, SameBytesSameChecksum) {
  std::vector<uint8_t> a(4096);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 31 + 7);
  std::vector<uint8_t> b = a;
  EXPECT_EQ(BlockChecksum(a.data(), a.size()), BlockChecksum(b.data(), b.size()));
}

TEST(BlockChecksumTest, EveryFlippedBitChangesTheChecksum) {
  std::vector<uint8_t> block(1024);
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint8_t>(i);
  const uint64_t original = BlockChecksum(block.data(), block.size());
  for (size_t byte = 0; byte < block.size(); byte += 37) {
    for (int bit = 0; bit < 8; ++bit) {
      block[byte] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_NE(BlockChecksum(block.data(), block.size()), original) << "byte " << byte << " bit " << bit;
      block[byte] ^= static_cast<uint8_t>(1 << bit);
    }
  }
  EXPECT_EQ(BlockChecksum(block.data(), block.size()), original);
}

TEST(BlockChecksumTest, LengthMatters) {
  const std::string zeros(64, '\0');
  EXPECT_NE(BlockChecksum(zeros.data(), 63), BlockChecksum(zeros.data(), 64));
  EXPECT_NE(BlockChecksum(zeros.data(), 0), BlockChecksum(zeros.data(), 1));
}

TEST(BlockChecksumTest, DoesNotDependOnAlignment) {
  std::vector<uint8_t> buffer(300);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> shifted(buffer.size() + 3);
  std::copy(buffer.begin(), buffer.end(), shifted.begin() + 3);
  EXPECT_EQ(BlockChecksum(buffer.data(), buffer.size()), BlockChecksum(shifted.data() + 3, buffer.size()));
}

}  // namespace
}  // namespace kvtier
