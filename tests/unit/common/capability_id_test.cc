// CapabilityId (kvtier/common/capability_id.h): random, never null, 16 bytes on the wire and back,
// anything else decoded as no id.
#include "kvtier/common/capability_id.h"

#include <gtest/gtest.h>

#include <bit>
#include <string>

#include "absl/container/flat_hash_set.h"

namespace kvtier {
namespace {

TEST(CapabilityIdTest, WireEncodingIsTheSixteenBytesAndNothingElseDecodes) {
  const CapabilityId id = CapabilityId::FromArray({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0xff});
  const std::string wire = id.ToWire();
  ASSERT_EQ(wire.size(), 16u);
  EXPECT_EQ(wire, std::string("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\xff", 16));
  ASSERT_TRUE(CapabilityId::FromBytes(wire).has_value());
  EXPECT_EQ(*CapabilityId::FromBytes(wire), id);
  EXPECT_EQ(CapabilityId::FromWire(wire), id);
  EXPECT_EQ(id.ToHex(), "0102030405060708090a0b0c0d0e0fff");
  EXPECT_EQ(id.low64(), 0x0807060504030201ULL);
  // Too short, too long, empty, or the 8 bytes of a u64: no id (FromWire: the null id, which names nothing).
  for (const std::string& bad : {wire.substr(0, 15), wire + "x", std::string(), wire.substr(0, 8)}) {
    EXPECT_FALSE(CapabilityId::FromBytes(bad).has_value()) << bad.size();
    EXPECT_TRUE(CapabilityId::FromWire(bad).null()) << bad.size();
  }
  // The null id encodes as an absent field and reads back as null.
  EXPECT_TRUE(CapabilityId().null());
  EXPECT_EQ(CapabilityId().ToWire(), "");
  EXPECT_TRUE(CapabilityId::FromWire(CapabilityId().ToWire()).null());
  EXPECT_EQ(CapabilityId().ToHex(), std::string(32, '0'));
}

TEST(CapabilityIdTest, RandomIdsAreDistinctNonNullAndDifferInAboutHalfTheirBits) {
  absl::flat_hash_set<CapabilityId> seen;
  absl::flat_hash_set<uint64_t> firsts;
  CapabilityId prev;
  uint64_t ones = 0;
  constexpr int kIds = 10000;
  for (int i = 0; i < kIds; ++i) {
    const CapabilityId id = CapabilityId::Random();
    ASSERT_FALSE(id.null());
    ASSERT_TRUE(seen.insert(id).second) << id.ToHex();
    ASSERT_TRUE(firsts.insert(id.low64()).second) << "two ids share their first 8 bytes";
    for (uint8_t b : id.bytes()) ones += static_cast<uint64_t>(std::popcount(b));
    if (i > 0) {
      int differ = 0;
      for (size_t k = 0; k < CapabilityId::kBytes; ++k)
        differ += std::popcount(uint8_t(id.bytes()[k] ^ prev.bytes()[k]));
      EXPECT_GE(differ, 24) << "consecutive ids " << prev.ToHex() << " and " << id.ToHex();
    }
    prev = id;
  }
  // 1.28M random bits: the share of ones is 0.5 within far more than 6 standard deviations (0.0027).
  const double share = static_cast<double>(ones) / (kIds * 128.0);
  EXPECT_GT(share, 0.49);
  EXPECT_LT(share, 0.51);
}

}  // namespace
}  // namespace kvtier
