// The UCX plane's control messages (kvtier/ucx/ucx_messages.h): every message decodes to what was
// encoded, and a truncated, padded or malformed one decodes to nothing.
#include "kvtier/ucx/ucx_messages.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace kvtier::ucx::msg {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(UcxMessagesTest, HelloReplyCarriesItsFlagsAndStillReadsAReplyWithout) {
  const std::string with = Encode(HelloReply{.nonce = 7, .node_id = "node-a", .flags = kTakesLeases});
  auto m = DecodeHelloReply(Bytes(with));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->version, kProtocolVersion);
  EXPECT_EQ(m->nonce, 7u);
  EXPECT_EQ(m->node_id, "node-a");
  EXPECT_EQ(m->flags, kTakesLeases);
  // A server that sends no flags: the reply ends after the node id.
  const std::string without = with.substr(0, with.size() - sizeof(uint32_t));
  auto old = DecodeHelloReply(Bytes(without));
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->node_id, "node-a");
  EXPECT_EQ(old->flags, 0u);
  EXPECT_FALSE(DecodeHelloReply(Bytes(with + "x")).has_value());          // trailing garbage
  EXPECT_FALSE(DecodeHelloReply(Bytes(with.substr(0, 15))).has_value());  // node id cut short
  EXPECT_FALSE(DecodeHelloReply(Bytes(without.substr(0, without.size() - 1))).has_value());
}

TEST(UcxMessagesTest, HelloCarriesItsTicketAndStillReadsAHelloWithout) {
  const std::string ticket(32, '\x5a');
  auto m = DecodeHello(Bytes(Encode(Hello{.nonce = 9, .ticket = ticket})));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->version, kProtocolVersion);
  EXPECT_EQ(m->nonce, 9u);
  EXPECT_EQ(m->ticket, ticket);
  const std::string bare = Encode(Hello{.nonce = 9});
  EXPECT_EQ(bare.size(), sizeof(uint32_t) + sizeof(uint64_t)) << "no ticket: the version 1 layout";
  auto old = DecodeHello(Bytes(bare));
  ASSERT_TRUE(old.has_value());
  EXPECT_TRUE(old->ticket.empty());
  const std::string with = Encode(Hello{.nonce = 9, .ticket = ticket});
  EXPECT_FALSE(DecodeHello(Bytes(with + "x")).has_value());                       // trailing garbage
  EXPECT_FALSE(DecodeHello(Bytes(with.substr(0, with.size() - 1))).has_value());  // ticket cut short
  EXPECT_FALSE(DecodeHello(Bytes(Encode(Hello{.ticket = std::string(kMaxTicketBytes + 1, 't')}))).has_value());
}

TEST(UcxMessagesTest, ARefusedHelloReplyCarriesItsErrorAndAnAcceptedOneItsPutTagKey) {
  auto refused = DecodeHelloReply(
      Bytes(Encode(HelloReply{.nonce = 3, .node_id = "n", .flags = kRefused, .error = "expired ticket"})));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->flags, kRefused);
  EXPECT_EQ(refused->error, "expired ticket");
  EXPECT_EQ(refused->put_tag_key, 0u);
  const std::string accepted =
      Encode(HelloReply{.nonce = 3, .node_id = "n", .flags = kTakesLeases, .put_tag_key = 0x1234567890abcdefULL});
  auto a = DecodeHelloReply(Bytes(accepted));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->put_tag_key, 0x1234567890abcdefULL);
  EXPECT_TRUE(a->error.empty());
  EXPECT_FALSE(DecodeHelloReply(Bytes(accepted.substr(0, accepted.size() - 1))).has_value());
  // Keyed put tags keep bit 63 (the server's put tags) and differ per key; key 0 is the plain tag.
  const CapabilityId id = CapabilityId::Random();
  EXPECT_EQ(SessionPutTag(id, 1, 0), PutTag(id, 1));
  EXPECT_NE(SessionPutTag(id, 1, a->put_tag_key) & kPutTagBit, 0u);
  EXPECT_NE(SessionPutTag(id, 1, a->put_tag_key), PutTag(id, 1));
  EXPECT_NE(SessionPutTag(id, 1, 1), SessionPutTag(id, 1, 2));
}

TEST(UcxMessagesTest, LeaseRequestAndReplyRoundTrip) {
  const std::string request = Encode(LeaseMessage{.request_id = 42, .payload = std::string("\0req\xff", 5)},
                                     /*reply=*/false);
  auto r = DecodeLeaseMessage(Bytes(request), /*reply=*/false);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->request_id, 42u);
  EXPECT_EQ(r->payload, std::string("\0req\xff", 5));

  for (bool ok : {true, false}) {
    const std::string reply = Encode(LeaseMessage{.request_id = 9, .ok = ok, .payload = "answer"}, /*reply=*/true);
    auto m = DecodeLeaseMessage(Bytes(reply), /*reply=*/true);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->request_id, 9u);
    EXPECT_EQ(m->ok, ok);
    EXPECT_EQ(m->payload, "answer");
  }
  // An empty payload is a valid (empty) message; a cut id or a bad status byte is not.
  EXPECT_TRUE(DecodeLeaseMessage(Bytes(Encode(LeaseMessage{.request_id = 1}, false)), false).has_value());
  EXPECT_FALSE(DecodeLeaseMessage(Bytes(std::string(7, '\0')), false).has_value());
  std::string bad_ok = Encode(LeaseMessage{.request_id = 1}, /*reply=*/true);
  bad_ok[8] = '\x03';
  EXPECT_FALSE(DecodeLeaseMessage(Bytes(bad_ok), /*reply=*/true).has_value());
}

TEST(UcxMessagesTest, ARefusedLeaseCarriesTheServersCodeAndMessage) {
  const std::string reply =
      Encode(LeaseMessage{.request_id = 5, .ok = false, .code = 3, .payload = "a block is 2097152 bytes"}, true);
  ASSERT_EQ(reply.size(), 8u + 1 + 4 + 24);
  EXPECT_EQ(reply[8], '\x02');
  auto m = DecodeLeaseMessage(Bytes(reply), /*reply=*/true);
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->ok);
  EXPECT_EQ(m->code, 3u);  // INVALID_ARGUMENT
  EXPECT_EQ(m->payload, "a block is 2097152 bytes");
  // A reply of a server that sent no code (status 0) still decodes, with code 0.
  const std::string old = Encode(LeaseMessage{.request_id = 5, .ok = false, .payload = "refused"}, true);
  EXPECT_EQ(old[8], '\x00');
  auto o = DecodeLeaseMessage(Bytes(old), /*reply=*/true);
  ASSERT_TRUE(o.has_value());
  EXPECT_FALSE(o->ok);
  EXPECT_EQ(o->code, 0u);
  EXPECT_EQ(o->payload, "refused");
  // Status 2 with its code cut short, or a code of 0 (OK is no refusal), is malformed.
  EXPECT_FALSE(DecodeLeaseMessage(Bytes(reply.substr(0, 11)), true).has_value());
  std::string zero = reply;
  std::memset(zero.data() + 9, 0, 4);
  EXPECT_FALSE(DecodeLeaseMessage(Bytes(zero), true).has_value());
}

constexpr CapabilityId kId = CapabilityId::FromArray(
    {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x81, 0xa0, 0xb1, 0xc2, 0xd3, 0xe4, 0xf5, 0x16, 0x27});

TEST(UcxMessagesTest, ReleaseIsExactlyALeaseIdsSixteenBytes) {
  const std::string m = Encode(Release{.lease_id = kId});
  ASSERT_EQ(m.size(), 16u);
  EXPECT_EQ(std::memcmp(m.data(), kId.bytes().data(), 16), 0);  // the id's bytes, in order
  auto r = DecodeRelease(Bytes(m));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->lease_id, kId);
  EXPECT_FALSE(DecodeRelease(Bytes(m.substr(0, 15))).has_value());
  EXPECT_FALSE(DecodeRelease(Bytes(m.substr(0, 8))).has_value());  // a version-1 u64 id
  EXPECT_FALSE(DecodeRelease(Bytes(m + "x")).has_value());
}

TEST(UcxMessagesTest, GetAndPutCarrySixteenByteIds) {
  const std::string get =
      Encode(GetRequest{.request_id = 3, .lease_id = kId, .tag_base = 77, .flags = kGetRelease, .indices = {4, 9}});
  ASSERT_EQ(get.size(), 8u + 16 + 8 + 4 + 4 + 2 * 4);
  EXPECT_EQ(std::memcmp(get.data() + 8, kId.bytes().data(), 16), 0);
  auto g = DecodeGetRequest(Bytes(get));
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->request_id, 3u);
  EXPECT_EQ(g->lease_id, kId);
  EXPECT_EQ(g->tag_base, 77u);
  EXPECT_EQ(g->flags, kGetRelease);
  EXPECT_EQ(g->indices, (std::vector<uint32_t>{4, 9}));
  EXPECT_FALSE(DecodeGetRequest(Bytes(get.substr(0, get.size() - 1))).has_value());

  const std::string put = Encode(PutRequest{.request_id = 5, .reservation_id = kId, .indices = {0, 1, 2}});
  ASSERT_EQ(put.size(), 8u + 16 + 4 + 3 * 4);
  auto p = DecodePutRequest(Bytes(put));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->reservation_id, kId);
  EXPECT_EQ(p->indices, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_FALSE(DecodePutRequest(Bytes(put + "x")).has_value());
}

TEST(UcxMessagesTest, PutTagTakesTheLow39BitsOfTheIdAndTheIndex) {
  // low64 of kId = 0x8102030405060708: its low 39 bits are 0x0405060708.
  EXPECT_EQ(kId.low64(), 0x8102030405060708ULL);
  EXPECT_EQ(PutTagPrefix(kId), 0x0405060708ULL);
  EXPECT_EQ(PutTag(kId, 5), kPutTagBit | (uint64_t{0x0405060708} << kTagIndexBits) | 5);
  EXPECT_EQ(PutTag(kId, kMaxTagIndex) & kMaxTagIndex, kMaxTagIndex);
  // Only the prefix and index bits enter the tag: ids that differ elsewhere share their tags (which is
  // why the server checks a kPut's whole id, and keeps prefixes of live reservations distinct).
  auto other = kId.bytes();
  other[15] ^= 0xff;
  other[7] ^= 0x80;  // bit 63 of low64: outside the prefix
  EXPECT_EQ(PutTag(CapabilityId::FromArray(other), 5), PutTag(kId, 5));
  other[0] ^= 1;
  EXPECT_NE(PutTag(CapabilityId::FromArray(other), 5), PutTag(kId, 5));
}

}  // namespace
}  // namespace kvtier::ucx::msg
