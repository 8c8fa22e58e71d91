// The disk tier's metadata record: version 1 (no engine metadata, and every record written before there
// was any) still reads, version 2 carries the engine's BlockMeta, version 3 adds the parent fingerprint,
// and malformed records are refused.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "storage/disk_tier.h"

namespace kvtier::server {
namespace {

DiskBlockMeta Fixed() {
  return {.namespace_id = 0x0102030405060708ULL,
          .tenant_id = 9,
          .size_bytes = 4096,
          .checksum = 0xdeadbeefULL,
          .depth = 3,
          .access_count = 2};
}

// A version 1 record as every earlier server wrote it, byte by byte.
std::string Version1Bytes() {
  std::string s(1, '\x01');
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(0x0102030405060708ULL, 8);
  put(9, 8);
  put(4096, 8);
  put(0xdeadbeefULL, 8);
  put(3, 4);
  put(2, 4);
  return s;
}

TEST(DiskMetaTest, BlockWithoutMetadataIsWrittenAsVersion1) {
  EXPECT_EQ(EncodeDiskBlockMeta(Fixed()), Version1Bytes());
  DiskBlockMeta m = Fixed();
  m.block_meta = std::make_shared<BlockMeta>();  // empty metadata: the same record
  EXPECT_EQ(EncodeDiskBlockMeta(m), Version1Bytes());
}

TEST(DiskMetaTest, Version1RecordStillReads) {
  DiskBlockMeta m;
  ASSERT_TRUE(DecodeDiskBlockMeta(Version1Bytes(), &m));
  EXPECT_EQ(m.namespace_id, 0x0102030405060708ULL);
  EXPECT_EQ(m.tenant_id, 9u);
  EXPECT_EQ(m.size_bytes, 4096u);
  EXPECT_EQ(m.checksum, 0xdeadbeefULL);
  EXPECT_EQ(m.depth, 3u);
  EXPECT_EQ(m.access_count, 2u);
  EXPECT_EQ(m.block_meta, nullptr);
}

TEST(DiskMetaTest, EngineMetadataRoundTrips) {
  for (const EngineBlockHash& hash : {EngineBlockHash::Int(-42), EngineBlockHash::Uint(UINT64_MAX),
                                      EngineBlockHash::Bytes(std::string(32, '\x7f')), EngineBlockHash()}) {
    auto b = std::make_shared<BlockMeta>();
    b->hash = hash;
    b->parent_hash = EngineBlockHash::Bytes("p");
    b->token_ids = {0, 1, 151643, UINT32_MAX};
    b->lora_id = -1;
    DiskBlockMeta m = Fixed();
    m.block_meta = b;
    const std::string bytes = EncodeDiskBlockMeta(m);
    EXPECT_EQ(bytes[0], '\x02');
    DiskBlockMeta got;
    ASSERT_TRUE(DecodeDiskBlockMeta(bytes, &got));
    EXPECT_EQ(got.size_bytes, 4096u);
    EXPECT_EQ(got.depth, 3u);
    ASSERT_NE(got.block_meta, nullptr);
    EXPECT_EQ(*got.block_meta, *b);
    EXPECT_EQ(EncodeDiskBlockMeta(got), bytes);
  }
}

TEST(DiskMetaTest, TokensOnlyAndLoraOnlyRoundTrip) {
  auto tokens = std::make_shared<BlockMeta>();
  tokens->token_ids.assign(kMaxBlockTokenIds, 5);
  auto lora = std::make_shared<BlockMeta>();
  lora->lora_id = 0;
  for (const auto& b : {tokens, lora}) {
    DiskBlockMeta m = Fixed();
    m.block_meta = b;
    DiskBlockMeta got;
    ASSERT_TRUE(DecodeDiskBlockMeta(EncodeDiskBlockMeta(m), &got));
    ASSERT_NE(got.block_meta, nullptr);
    EXPECT_EQ(*got.block_meta, *b);
  }
}

Fingerprint SomeFingerprint(uint8_t seed) {
  Fingerprint fp;
  for (size_t i = 0; i < fp.bytes.size(); ++i) fp.bytes[i] = static_cast<uint8_t>(seed + i * 7);
  return fp;
}

TEST(DiskMetaTest, ParentFingerprintIsVersion3) {
  // Only the parent fingerprint (a block put without engine metadata): 41 + 3 form/flag bytes + the
  // token count + 32 bytes.
  auto parent_only = std::make_shared<BlockMeta>();
  parent_only->parent_fingerprint = SomeFingerprint(1);
  auto full = std::make_shared<BlockMeta>();
  full->hash = EngineBlockHash::Int(-5);
  full->parent_hash = EngineBlockHash::Uint(9);
  full->token_ids = {3, 4, 5};
  full->lora_id = 2;
  full->parent_fingerprint = SomeFingerprint(200);
  for (const auto& b : {parent_only, full}) {
    DiskBlockMeta m = Fixed();
    m.block_meta = b;
    const std::string bytes = EncodeDiskBlockMeta(m);
    EXPECT_EQ(bytes[0], '\x03');
    EXPECT_EQ(bytes.substr(bytes.size() - 32),
              std::string(reinterpret_cast<const char*>(b->parent_fingerprint->bytes.data()), 32));
    DiskBlockMeta got;
    ASSERT_TRUE(DecodeDiskBlockMeta(bytes, &got));
    ASSERT_NE(got.block_meta, nullptr);
    EXPECT_EQ(*got.block_meta, *b);
    EXPECT_EQ(EncodeDiskBlockMeta(got), bytes);
    for (size_t n = 0; n < bytes.size(); ++n) EXPECT_FALSE(DecodeDiskBlockMeta(bytes.substr(0, n), &got)) << n;
    EXPECT_FALSE(DecodeDiskBlockMeta(bytes + "x", &got));
  }
  DiskBlockMeta m = Fixed();
  m.block_meta = parent_only;
  EXPECT_EQ(EncodeDiskBlockMeta(m).size(), 41u + 3 + 4 + 32);
}

TEST(DiskMetaTest, MalformedRecordsAreRefused) {
  auto b = std::make_shared<BlockMeta>();
  b->hash = EngineBlockHash::Uint(7);
  b->token_ids = {1, 2};
  DiskBlockMeta m = Fixed();
  m.block_meta = b;
  const std::string good = EncodeDiskBlockMeta(m);
  DiskBlockMeta got;
  // Every truncation, and a trailing byte.
  for (size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(DecodeDiskBlockMeta(good.substr(0, n), &got)) << n;
  EXPECT_FALSE(DecodeDiskBlockMeta(good + "x", &got));
  // Version 1 with extra bytes; an unknown version.
  EXPECT_FALSE(DecodeDiskBlockMeta(Version1Bytes() + "x", &got));
  std::string v4 = good;
  v4[0] = '\x04';
  EXPECT_FALSE(DecodeDiskBlockMeta(v4, &got));
  // Version 2's bytes labelled version 3 lack the parent fingerprint.
  std::string v3 = good;
  v3[0] = '\x03';
  EXPECT_FALSE(DecodeDiskBlockMeta(v3, &got));
  // Version 2 carrying no metadata at all is not what the encoder writes.
  std::string empty = Version1Bytes();
  empty[0] = '\x02';
  empty += std::string("\x00\x00\x00", 3) + std::string(4, '\0');
  EXPECT_FALSE(DecodeDiskBlockMeta(empty, &got));
  // A hash form past kBytes; a non-negative value in the negative-int form.
  std::string bad_form = good;
  bad_form[41] = '\x04';
  EXPECT_FALSE(DecodeDiskBlockMeta(bad_form, &got));
  std::string nonneg_int = good;
  nonneg_int[41] = '\x01';  // 7 read as a "negative" int
  EXPECT_FALSE(DecodeDiskBlockMeta(nonneg_int, &got));
  // More token ids than the limit.
  auto many = std::make_shared<BlockMeta>();
  many->token_ids.assign(kMaxBlockTokenIds + 1, 1);
  m.block_meta = many;
  EXPECT_FALSE(DecodeDiskBlockMeta(EncodeDiskBlockMeta(m), &got));
}

}  // namespace
}  // namespace kvtier::server
