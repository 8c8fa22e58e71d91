// The vLLM event encoding (docs/events.md, "vLLM format"): byte-exact batches written by hand from vLLM's
// msgspec definitions (KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared; array_like, tag=True,
// omit_defaults), and a field-by-field decode with an independent msgpack reader.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_replace.h"
#include "events/vllm_encoder.h"
#include "testing/msgpack_reader.h"
#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

using testing::MsgpackReader;
using testing::MsgpackValue;
using Type = MsgpackValue::Type;

// Bytes from space-separated hex.
std::string Hex(const std::string& spaced) { return absl::HexStringToBytes(absl::StrReplaceAll(spaced, {{" ", ""}})); }
// msgpack fixstr of `s` (< 32 bytes).
std::string FixStr(const std::string& s) { return std::string(1, static_cast<char>(0xa0 | s.size())) + s; }

// Bytes 0, 1, ..., 31: the int form is int.from_bytes(fp, "big") & (2**64 - 1) = 0x18191a1b1c1d1e1f.
Fingerprint Counting() {
  Fingerprint fp;
  for (size_t i = 0; i < fp.bytes.size(); ++i) fp.bytes[i] = static_cast<uint8_t>(i);
  return fp;
}

const std::string kTs = Hex("cb 3f f8 00 00 00 00 00 00");  // 1.5 as float64
const std::string kHashInt = Hex("cf 18 19 1a 1b 1c 1d 1e 1f");

TEST(VllmEncoderTest, BlockStoredBatchIsByteExact) {
  const std::string got = EncodeVllmBatch(
      1.5, {{.kind = VllmEvent::Kind::kStored, .block_hashes = {Counting()}, .medium = "CPU", .block_size = 16}}, 0,
      VllmBlockHashForm::kInt);
  // KVEventBatch [ts, events, data_parallel_rank]; BlockStored [tag, block_hashes, parent_block_hash,
  // token_ids, block_size, lora_id, medium, lora_name].
  const std::string want = Hex("93") + kTs + Hex("91") + Hex("98") + FixStr("BlockStored") + Hex("91") + kHashInt +
                           Hex("c0") + Hex("90") + Hex("10") + Hex("c0") + FixStr("CPU") + Hex("c0") + Hex("00");
  EXPECT_EQ(absl::BytesToHexString(got), absl::BytesToHexString(want));
}

TEST(VllmEncoderTest, BlockRemovedBatchIsByteExact) {
  const std::string got =
      EncodeVllmBatch(1.5, {{.kind = VllmEvent::Kind::kRemoved, .block_hashes = {Counting()}, .medium = "DISK"}}, 0,
                      VllmBlockHashForm::kInt);
  // BlockRemoved [tag, block_hashes, medium].
  const std::string want = Hex("93") + kTs + Hex("91") + Hex("93") + FixStr("BlockRemoved") + Hex("91") + kHashInt +
                           FixStr("DISK") + Hex("00");
  EXPECT_EQ(absl::BytesToHexString(got), absl::BytesToHexString(want));
}

TEST(VllmEncoderTest, AllBlocksClearedBatchIsByteExact) {
  // data_parallel_rank None is its default, so omit_defaults drops it: a two-element batch.
  const std::string got =
      EncodeVllmBatch(1.5, {{.kind = VllmEvent::Kind::kCleared}}, std::nullopt, VllmBlockHashForm::kInt);
  const std::string want = Hex("92") + kTs + Hex("91") + Hex("91") + FixStr("AllBlocksCleared");
  EXPECT_EQ(absl::BytesToHexString(got), absl::BytesToHexString(want));

  const std::string empty = EncodeVllmBatch(1.5, {}, 7, VllmBlockHashForm::kInt);
  EXPECT_EQ(absl::BytesToHexString(empty), absl::BytesToHexString(Hex("93") + kTs + Hex("90 07")));
}

TEST(VllmEncoderTest, BytesHashFormIsMsgpackBin) {
  const std::string got =
      EncodeVllmBatch(1.5, {{.kind = VllmEvent::Kind::kRemoved, .block_hashes = {Counting()}, .medium = "GPU"}}, 0,
                      VllmBlockHashForm::kBytes);
  std::string bin = Hex("c4 20");
  for (uint8_t b : Counting().bytes) bin.push_back(static_cast<char>(b));
  const std::string want =
      Hex("93") + kTs + Hex("91") + Hex("93") + FixStr("BlockRemoved") + Hex("91") + bin + FixStr("GPU") + Hex("00");
  EXPECT_EQ(absl::BytesToHexString(got), absl::BytesToHexString(want));
}

TEST(VllmEncoderTest, MediumAndIntHash) {
  EXPECT_STREQ(VllmMedium(Tier::kHbm), "GPU");
  EXPECT_STREQ(VllmMedium(Tier::kHost), "CPU");
  EXPECT_STREQ(VllmMedium(Tier::kDisk), "DISK");
  EXPECT_EQ(VllmIntBlockHash(Counting()), 0x18191a1b1c1d1e1fULL);
  Fingerprint small;  // all zero but the last byte: a positive fixint on the wire, as msgspec writes 5
  small.bytes[31] = 5;
  EXPECT_EQ(VllmIntBlockHash(small), 5u);
  const std::string got = EncodeVllmBatch(
      0.0, {{.kind = VllmEvent::Kind::kRemoved, .block_hashes = {small}, .medium = "CPU"}}, 0, VllmBlockHashForm::kInt);
  EXPECT_NE(got.find(Hex("91 05") + FixStr("CPU")), std::string::npos);
}

// The map form (structs declared without array_like): field names as keys, the tag under "type" first.
TEST(VllmEncoderTest, MapFormIsByteExact) {
  const std::string stored = EncodeVllmBatch(
      1.5, {{.kind = VllmEvent::Kind::kStored, .block_hashes = {Counting()}, .medium = "CPU", .block_size = 16}}, 0,
      VllmBlockHashForm::kInt, VllmEncoding::kMap);
  const std::string want = Hex("83") + FixStr("ts") + kTs + FixStr("events") + Hex("91") + Hex("88") + FixStr("type") +
                           FixStr("BlockStored") + FixStr("block_hashes") + Hex("91") + kHashInt +
                           FixStr("parent_block_hash") + Hex("c0") + FixStr("token_ids") + Hex("90") +
                           FixStr("block_size") + Hex("10") + FixStr("lora_id") + Hex("c0") + FixStr("medium") +
                           FixStr("CPU") + FixStr("lora_name") + Hex("c0") + FixStr("data_parallel_rank") + Hex("00");
  EXPECT_EQ(absl::BytesToHexString(stored), absl::BytesToHexString(want));

  const std::string removed_cleared =
      EncodeVllmBatch(1.5,
                      {{.kind = VllmEvent::Kind::kRemoved, .block_hashes = {Counting()}, .medium = "DISK"},
                       {.kind = VllmEvent::Kind::kCleared}},
                      std::nullopt, VllmBlockHashForm::kInt, VllmEncoding::kMap);
  const std::string want2 = Hex("82") + FixStr("ts") + kTs + FixStr("events") + Hex("92") + Hex("83") + FixStr("type") +
                            FixStr("BlockRemoved") + FixStr("block_hashes") + Hex("91") + kHashInt + FixStr("medium") +
                            FixStr("DISK") + Hex("81") + FixStr("type") + FixStr("AllBlocksCleared");
  EXPECT_EQ(absl::BytesToHexString(removed_cleared), absl::BytesToHexString(want2));
}

// Every integer, string and array length takes msgpack's shortest form, as msgspec writes them.
TEST(VllmEncoderTest, ShortestForms) {
  auto enc = [](auto&& write) {
    std::string out;
    MsgpackWriter w(&out);
    write(w);
    return absl::BytesToHexString(out);
  };
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Uint(127); }), "7f");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Uint(128); }), "cc80");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Uint(256); }), "cd0100");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Uint(65536); }), "ce00010000");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Uint(uint64_t{1} << 32); }), "cf0000000100000000");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Int(-1); }), "ff");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Int(-33); }), "d0df");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Int(-129); }), "d1ff7f");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Int(-32769); }), "d2ffff7fff");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Int(INT64_MIN); }), "d38000000000000000");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Str(std::string(31, 'a')); }).substr(0, 2), "bf");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Str(std::string(32, 'a')); }).substr(0, 4), "d920");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Str(std::string(256, 'a')); }).substr(0, 6), "da0100");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.ArrayHeader(15); }), "9f");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.ArrayHeader(16); }), "dc0010");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.ArrayHeader(65536); }), "dd00010000");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.MapHeader(15); }), "8f");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.MapHeader(16); }), "de0010");
  EXPECT_EQ(enc([](MsgpackWriter& w) { w.Float64(-0.25); }), "cbbfd0000000000000");
}

// A mixed batch read back field by field, as a vLLM subscriber's decoder sees it.
TEST(VllmEncoderTest, MixedBatchDecodesFieldByField) {
  Fingerprint a = Counting();
  Fingerprint b;
  b.bytes.fill(0xff);
  std::vector<VllmEvent> events = {
      {.kind = VllmEvent::Kind::kCleared},
      {.kind = VllmEvent::Kind::kStored, .block_hashes = {a, b}, .medium = "GPU", .block_size = 64},
      {.kind = VllmEvent::Kind::kRemoved, .block_hashes = {b}, .medium = "DISK"},
  };
  // 20 more stores: the events array needs array16.
  for (int i = 0; i < 20; ++i) events.push_back(events[1]);
  const double ts = 1764637200.123456;
  auto v = MsgpackReader::Decode(EncodeVllmBatch(ts, events, 2, VllmBlockHashForm::kInt));
  ASSERT_OK(v);
  ASSERT_EQ(v->type, Type::kArray);
  ASSERT_EQ(v->items.size(), 3u);
  EXPECT_EQ(v->items[0].type, Type::kFloat);
  EXPECT_TRUE(v->items[0].f64);
  EXPECT_EQ(v->items[0].f, ts);
  EXPECT_EQ(v->items[2].type, Type::kUint);
  EXPECT_EQ(v->items[2].u, 2u);
  const auto& evs = v->items[1].items;
  ASSERT_EQ(evs.size(), events.size());

  ASSERT_EQ(evs[0].items.size(), 1u);
  EXPECT_EQ(evs[0].items[0].s, "AllBlocksCleared");

  const auto& st = evs[1].items;
  ASSERT_EQ(st.size(), 8u);
  EXPECT_EQ(st[0].s, "BlockStored");
  ASSERT_EQ(st[1].items.size(), 2u);
  EXPECT_EQ(st[1].items[0].u, 0x18191a1b1c1d1e1fULL);
  EXPECT_EQ(st[1].items[1].u, UINT64_MAX);
  EXPECT_TRUE(st[2].is_nil());  // parent_block_hash
  EXPECT_EQ(st[3].type, Type::kArray);
  EXPECT_TRUE(st[3].items.empty());  // token_ids
  EXPECT_EQ(st[4].u, 64u);           // block_size
  EXPECT_TRUE(st[5].is_nil());       // lora_id
  EXPECT_EQ(st[6].type, Type::kStr);
  EXPECT_EQ(st[6].s, "GPU");    // medium
  EXPECT_TRUE(st[7].is_nil());  // lora_name

  const auto& rm = evs[2].items;
  ASSERT_EQ(rm.size(), 3u);
  EXPECT_EQ(rm[0].s, "BlockRemoved");
  ASSERT_EQ(rm[1].items.size(), 1u);
  EXPECT_EQ(rm[1].items[0].u, UINT64_MAX);
  EXPECT_EQ(rm[2].s, "DISK");
  for (size_t i = 3; i < evs.size(); ++i) EXPECT_EQ(evs[i].items[0].s, "BlockStored");
}

}  // namespace
}  // namespace kvtier::server

namespace kvtier::server {
namespace {

// A block with the engine's metadata is named by the engine's hash, and its parent, tokens, block size
// and LoRA id fill BlockStored; its removal names it by the same hash.
TEST(VllmEncoderTest, EngineMetadataFillsBlockStored) {
  auto meta = std::make_shared<BlockMeta>();
  meta->hash = EngineBlockHash::Int(-5);
  meta->parent_hash = EngineBlockHash::Uint(0x1234);
  meta->token_ids = {1, 2, 300};
  meta->lora_id = 7;
  const std::string got = EncodeVllmBatch(
      1.5,
      {{.kind = VllmEvent::Kind::kStored,
        .block_hashes = {Counting()},
        .medium = "CPU",
        .block_size = 16,
        .block_meta = {meta}},
       {.kind = VllmEvent::Kind::kRemoved, .block_hashes = {Counting()}, .medium = "CPU", .block_meta = {meta}}},
      0, VllmBlockHashForm::kInt);
  // -5 is a negative fixint (fb); 0x1234 uint16; tokens [1, 2, 300]; block_size 3 (the block's tokens);
  // lora_id 7.
  const std::string want = Hex("93") + kTs + Hex("92") + Hex("98") + FixStr("BlockStored") + Hex("91 fb") +
                           Hex("cd 12 34") + Hex("93 01 02 cd 01 2c") + Hex("03") + Hex("07") + FixStr("CPU") +
                           Hex("c0") + Hex("93") + FixStr("BlockRemoved") + Hex("91 fb") + FixStr("CPU") + Hex("00");
  EXPECT_EQ(absl::BytesToHexString(got), absl::BytesToHexString(want));
}

TEST(VllmEncoderTest, EngineBytesHashAndPartialMetadata) {
  auto meta = std::make_shared<BlockMeta>();
  meta->hash = EngineBlockHash::Bytes("abc");
  auto v = MsgpackReader::Decode(EncodeVllmBatch(1.5,
                                                 {{.kind = VllmEvent::Kind::kStored,
                                                   .block_hashes = {Counting()},
                                                   .medium = "DISK",
                                                   .block_size = 16,
                                                   .block_meta = {meta}}},
                                                 std::nullopt, VllmBlockHashForm::kInt, VllmEncoding::kMap));
  ASSERT_OK(v);
  ASSERT_EQ(v->type, Type::kMap);
  const auto& ev = v->items[3].items[0];  // "events" value, first event (a map)
  ASSERT_EQ(ev.type, Type::kMap);
  auto field = [&](const std::string& name) -> const MsgpackValue* {
    for (size_t i = 0; i + 1 < ev.items.size(); i += 2) {
      if (ev.items[i].s == name) return &ev.items[i + 1];
    }
    return nullptr;
  };
  ASSERT_NE(field("block_hashes"), nullptr);
  EXPECT_EQ(field("block_hashes")->items[0].type, Type::kBin);
  EXPECT_EQ(field("block_hashes")->items[0].s, "abc");
  EXPECT_TRUE(field("parent_block_hash")->is_nil());
  EXPECT_TRUE(field("token_ids")->items.empty());
  EXPECT_EQ(field("block_size")->u, 16u);  // no tokens: the configured size
  EXPECT_TRUE(field("lora_id")->is_nil());
}

// A block named by its fingerprint names its parent by the parent's fingerprint, in the configured
// hash form (byte-exact in the int form; bin in the bytes form). A block named by an engine hash never
// falls back to the parent's fingerprint: without the parent's engine hash its parent is nil.
TEST(VllmEncoderTest, ParentFingerprintFillsParentBlockHash) {
  Fingerprint parent;
  for (size_t i = 0; i < parent.bytes.size(); ++i) parent.bytes[i] = static_cast<uint8_t>(0xa0 + i % 16);
  auto meta = std::make_shared<BlockMeta>();
  meta->parent_fingerprint = parent;  // the last 8 bytes are a8 .. af
  const VllmEvent stored{.kind = VllmEvent::Kind::kStored,
                         .block_hashes = {Counting()},
                         .medium = "CPU",
                         .block_size = 16,
                         .block_meta = {meta}};
  const std::string got = EncodeVllmBatch(1.5, {stored}, 0, VllmBlockHashForm::kInt);
  const std::string want = Hex("93") + kTs + Hex("91") + Hex("98") + FixStr("BlockStored") + Hex("91") + kHashInt +
                           Hex("cf a8 a9 aa ab ac ad ae af") + Hex("90") + Hex("10") + Hex("c0") + FixStr("CPU") +
                           Hex("c0") + Hex("00");
  EXPECT_EQ(absl::BytesToHexString(got), absl::BytesToHexString(want));

  auto bytes = MsgpackReader::Decode(EncodeVllmBatch(1.5, {stored}, 0, VllmBlockHashForm::kBytes));
  ASSERT_OK(bytes);
  const MsgpackValue& ev = bytes->items[1].items[0];
  EXPECT_EQ(ev.items[1].items[0].type, Type::kBin);
  ASSERT_EQ(ev.items[2].type, Type::kBin);
  EXPECT_EQ(ev.items[2].s, std::string(reinterpret_cast<const char*>(parent.bytes.data()), 32));

  auto engine = std::make_shared<BlockMeta>(*meta);
  engine->hash = EngineBlockHash::Uint(3);
  auto named = MsgpackReader::Decode(EncodeVllmBatch(1.5,
                                                     {{.kind = VllmEvent::Kind::kStored,
                                                       .block_hashes = {Counting()},
                                                       .medium = "CPU",
                                                       .block_size = 16,
                                                       .block_meta = {engine}}},
                                                     0, VllmBlockHashForm::kInt));
  ASSERT_OK(named);
  EXPECT_EQ(named->items[1].items[0].items[1].items[0].u, 3u);
  EXPECT_TRUE(named->items[1].items[0].items[2].is_nil());
}

}  // namespace
}  // namespace kvtier::server

namespace kvtier::server {
namespace {

// Map-form events credited to engines carry "backend_id" and "instance_ids" after vLLM's fields; the
// array form and an envelope without instances are unchanged.
TEST(VllmEncoderTest, EnvelopeNamesTheBackendAndItsInstances) {
  const std::vector<VllmEvent> events = {
      {.kind = VllmEvent::Kind::kStored, .block_hashes = {Counting()}, .medium = "CPU", .block_size = 16},
      {.kind = VllmEvent::Kind::kRemoved, .block_hashes = {Counting()}, .medium = "CPU"},
      {.kind = VllmEvent::Kind::kCleared}};
  const VllmEnvelope envelope{.backend_id = "kvtier-0", .instance_ids = {"engine-a", "engine-b"}};
  EXPECT_EQ(EncodeVllmBatch(1.5, events, 0, VllmBlockHashForm::kInt, VllmEncoding::kArray, envelope),
            EncodeVllmBatch(1.5, events, 0, VllmBlockHashForm::kInt, VllmEncoding::kArray));
  EXPECT_EQ(EncodeVllmBatch(1.5, events, 0, VllmBlockHashForm::kInt, VllmEncoding::kMap, {.backend_id = "kvtier-0"}),
            EncodeVllmBatch(1.5, events, 0, VllmBlockHashForm::kInt, VllmEncoding::kMap));
  auto v =
      MsgpackReader::Decode(EncodeVllmBatch(1.5, events, 0, VllmBlockHashForm::kInt, VllmEncoding::kMap, envelope));
  ASSERT_OK(v);
  const auto& evs = v->items[3].items;
  ASSERT_EQ(evs.size(), 3u);
  const size_t fields[] = {8 + 2, 3 + 2, 1 + 2};  // "type" and the struct's fields, + the envelope's two
  for (size_t i = 0; i < evs.size(); ++i) {
    const auto& ev = evs[i];
    ASSERT_EQ(ev.type, Type::kMap);
    ASSERT_EQ(ev.items.size(), 2 * fields[i]);
    const size_t n = ev.items.size();
    EXPECT_EQ(ev.items[n - 4].s, "backend_id");
    EXPECT_EQ(ev.items[n - 3].s, "kvtier-0");
    EXPECT_EQ(ev.items[n - 2].s, "instance_ids");
    ASSERT_EQ(ev.items[n - 1].items.size(), 2u);
    EXPECT_EQ(ev.items[n - 1].items[0].s, "engine-a");
    EXPECT_EQ(ev.items[n - 1].items[1].s, "engine-b");
  }
}

}  // namespace
}  // namespace kvtier::server
