// The UCX plane's control messages (kvtier/wire/ucx_messages.h): every message decodes to what was
// encoded, and a truncated, padded or malformed one decodes to nothing.
#include "kvtier/wire/ucx_messages.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <string>

namespace kvtier::wire::ucx {
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
  EXPECT_EQ(SessionPutTag(5, 1, 0), PutTag(5, 1));
  EXPECT_NE(SessionPutTag(5, 1, a->put_tag_key) & kPutTagBit, 0u);
  EXPECT_NE(SessionPutTag(5, 1, a->put_tag_key), PutTag(5, 1));
  EXPECT_NE(SessionPutTag(5, 1, 1), SessionPutTag(5, 1, 2));
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

TEST(UcxMessagesTest, ReleaseIsExactlyALeaseId) {
  const std::string m = Encode(Release{.lease_id = 0x0102030405060708ULL});
  ASSERT_EQ(m.size(), 8u);
  auto r = DecodeRelease(Bytes(m));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->lease_id, 0x0102030405060708ULL);
  EXPECT_FALSE(DecodeRelease(Bytes(m.substr(0, 7))).has_value());
  EXPECT_FALSE(DecodeRelease(Bytes(m + "x")).has_value());
}

}  // namespace
}  // namespace kvtier::wire::ucx
