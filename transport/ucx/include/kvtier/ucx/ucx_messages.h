// The UCX bulk plane's small control messages and tag layout, shared by the block server (UcxServer)
// and the block client (UcxClient). Header-only, no UCX types.
//
// Protocol (DESIGN.md §4, docs/architecture.md "UCX data plane"): gRPC is the control plane every
// client can use; UCX carries payload bytes as tagged messages, plus these active messages (AM; leases,
// reservations and commits among them, so that a get or put over UCX needs no gRPC round trip), each
// a little-endian byte string in the AM's data. `id16` is a lease or reservation id: its 16
// bytes (kvtier/common/capability_id.h), random and bound to the tenant that took it; an id the server
// does not hold live is answered exactly as one of another tenant's would be (empty messages, ok = 0).
// Version 2: ids are id16 (version 1 carried them as u64 and took sequential ids), and the hello
// carries a session ticket.
//   kHello      client -> server  {version u32, nonce u64, [ticket_len u32, ticket bytes]}
//                 The first AM of every endpoint. ticket: from the OpenUcxSession RPC, over the client's
//                 authenticated gRPC channel; absent or empty when the client has none.
//   kHelloReply server -> client  {version u32, nonce u64, node_id_len u32, node_id bytes, flags u32,
//                                  [put_tag_key u64, error_len u32, error bytes]}
//                 flags & kTakesLeases: the server answers kLease on this endpoint.
//                 flags & kTakesPuts: the server answers kAllocate and kCommit on this endpoint.
//                 flags & kCommitsPuts: the server takes kPutCommit on this endpoint.
//                 flags & kRefused: the server requires a ticket (tokens or TLS on) and the hello had
//                 none, or an unknown or expired one; error says which. The server closes the endpoint
//                 shortly after, and until then drops every other AM of it.
//                 put_tag_key: the endpoint's put tags are PutTag(...) ^ put_tag_key (SessionPutTag);
//                 random per authenticated endpoint, 0 (or absent) on a server without tickets.
//               A server that requires tickets serves the AMs below only on an endpoint whose hello
//               carried a valid ticket; any of them on another endpoint is dropped and the endpoint
//               closed. An endpoint stays authenticated, as the ticket's tenant and role, until it
//               closes; the ticket's expiry bounds only when it may open one. An endpoint without a
//               valid hello 10 s after it connected is closed.
//   kGet        client -> server  {request_id u64, lease_id id16, tag_base u64, flags u32, n u32, index u32 x n}
//                 The server sends, for each j < n, block indices[j] of the lease as one tagged message
//                 with tag tag_base + j, straight from the leased slot; a block it cannot send (lease
//                 expired, index not held; an unknown lease id, or one of another tenant than the
//                 endpoint's: every message) is sent as an empty message on its tag, so that every
//                 posted receive completes. flags & kGetRelease: release the lease once every send
//                 completed.
//   kPut        client -> server  {request_id u64, reservation_id id16, n u32, index u32 x n}
//                 The server checks the full id (live, and of the endpoint's tenant), then posts, for
//                 each index, a tagged receive straight into the reserved slot with tag
//                 SessionPutTag(reservation_id, index, put_tag_key); the client sends the block's bytes
//                 with that tag. A tag is not a capability (it holds 39 bits of the id): only a kPut
//                 naming the whole live id makes the server post receives into its slots; any other
//                 gets no receive and a kPutDone with every ok = 0.
//   kPutDone    server -> client  {request_id u64, n u32, ok u8 x n}: every receive of the request finished
//                 (ok = all bytes arrived); the client commits over gRPC only after it.
//   kRelease    client -> server  {lease_id id16}: release the lease (a client that split one lease's
//                 blocks over several kGet requests, on several endpoints, sends it after the last).
//                 Ignored for a lease of another tenant than the endpoint's.
//   kLease      client -> server  {request_id u64, request bytes}: a serialized kvtier.v1.ReadRequest;
//                 the server does what the Lease RPC does, as the endpoint's tenant and role (a
//                 namespace of another tenant: PERMISSION_DENIED), and answers kLeaseReply. It saves a
//                 get its gRPC round trip.
//   kLeaseReply server -> client  {request_id u64, status u8, [code u32], payload bytes}: status 1: a
//                 serialized kvtier.v1.ReadResponse (status, checksums, lease id); status 2: the server
//                 refused, code (an absl::StatusCode, e.g. INVALID_ARGUMENT for a block above its
//                 limits.max_block_bytes) and its message follow; status 0: an error message without a
//                 code (servers before codes were sent; read as UNAVAILABLE).
//   kAllocate   client -> server  {request_id u64, request bytes}: a serialized kvtier.v1.AllocateRequest;
//                 the server does what the Allocate RPC does, as the endpoint's tenant and role, and
//                 answers kAllocateReply (framed as kLeaseReply; payload a kvtier.v1.AllocateResponse).
//   kCommit     client -> server  {request_id u64, request bytes}: a serialized kvtier.v1.CommitRequest,
//                 sent after the batch's kPutDone; answered kCommitReply (framed as kLeaseReply;
//                 payload a kvtier.v1.CommitResponse). With kAllocate it takes a put's two gRPC round
//                 trips off its path. A reservation taken over either plane commits over either.
//   kPutCommit  client -> server  {request_id u64, request bytes}: request_id is that of a kPut this
//                 endpoint sent before it (AMs of one endpoint arrive in order), the bytes a serialized
//                 kvtier.v1.CommitRequest. The server runs that Commit, as the endpoint's tenant and role,
//                 once every receive of that kPut finished (at once when they already have, or when no
//                 such kPut is in flight), and answers kPutCommitReply (framed as kLeaseReply, request_id
//                 the kPut's, payload a kvtier.v1.CommitResponse) instead of that kPut's kPutDone (a
//                 kPutDone already sent stays sent; the client ignores it). The commit is the same call
//                 as kCommit's: a block whose bytes did not all arrive, or whose hash is not the
//                 request's checksum, is not committed. So a put batch costs the kAllocate round trip,
//                 then the sends and one reply, and the client computes its checksums while its bytes
//                 move and sends them right after its last send.
//
// Versions: 2 added the hello's ticket and the reply's kRefused, put_tag_key and error; a client and a
// server of different versions do not complete a hello (the client then moves its bytes over gRPC).
// kAllocate and kCommit came within version 2, behind the kTakesPuts flag: a server without them does
// not set it, and its clients reserve and commit over gRPC. kPutCommit came within version 2 as well,
// behind kCommitsPuts: a client sends it only to a server that set the flag, else it waits for kPutDone
// and commits with kCommit (or over gRPC); a server that sets the flag answers old clients as before.
#ifndef KVTIER_UCX_UCX_MESSAGES_H_
#define KVTIER_UCX_UCX_MESSAGES_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kvtier/common/capability_id.h"

namespace kvtier::ucx::msg {

static_assert(std::endian::native == std::endian::little, "the UCX messages are little-endian in memory");
static_assert(sizeof(CapabilityId) == CapabilityId::kBytes && std::is_trivially_copyable_v<CapabilityId>,
              "an id16 is written and read as its 16 bytes");

// 2: lease and reservation ids are 16 random bytes (1: sequential u64 ids); the hello carries a ticket.
inline constexpr uint32_t kProtocolVersion = 2;

// Active message ids (ucp_worker_set_am_recv_handler).
enum AmId : uint16_t {
  kHello = 1,
  kHelloReply = 2,
  kGet = 3,
  kPut = 4,
  kPutDone = 5,
  kRelease = 6,
  kLease = 7,
  kLeaseReply = 8,
  kAllocate = 9,
  kAllocateReply = 10,
  kCommit = 11,
  kCommitReply = 12,
  kPutCommit = 13,
  kPutCommitReply = 14
};

inline constexpr uint32_t kTakesLeases = 1;  // kHelloReply flag
inline constexpr uint32_t kRefused = 2;      // kHelloReply flag: no valid ticket; the endpoint is closed
inline constexpr uint32_t kTakesPuts = 4;    // kHelloReply flag: the server answers kAllocate and kCommit
inline constexpr uint32_t kCommitsPuts = 8;  // kHelloReply flag: the server takes kPutCommit
inline constexpr uint32_t kMaxTicketBytes = 256;

inline constexpr uint32_t kGetRelease = 1;  // kGet flag: release the lease after the last send

// Tags of put payloads, as the server matches them: bit 63 set, then the reservation's tag prefix (the
// low 39 bits of CapabilityId::low64(), i.e. of the id's first 8 bytes read little-endian), then 24 bits
// of block index. The store never keeps two live reservations with the same prefix (it draws a new id
// instead, BlockStore::Allocate), so tags of two live puts never collide. The prefix is not secret from
// a peer that sees the tagged bytes, and a tag alone names no reservation: the server posts receives
// only for a kPut whose full 16-byte id is live.
inline constexpr uint64_t kPutTagBit = uint64_t{1} << 63;
inline constexpr uint32_t kTagIndexBits = 24;
inline constexpr uint32_t kTagPrefixBits = CapabilityId::kTagPrefixBits;
static_assert(1 + kTagPrefixBits + kTagIndexBits == 64, "a put tag is 64 bits");
inline constexpr uint32_t kMaxTagIndex = (uint32_t{1} << kTagIndexBits) - 1;
// The 39-bit tag prefix of reservation `reservation_id`.
inline uint64_t PutTagPrefix(const CapabilityId& reservation_id) { return reservation_id.tag_prefix(); }
// The tag of block `index` (<= kMaxTagIndex) of reservation `reservation_id`.
inline uint64_t PutTag(const CapabilityId& reservation_id, uint32_t index) {
  return kPutTagBit | (PutTagPrefix(reservation_id) << kTagIndexBits) | index;
}
// The put tag on an endpoint with `put_tag_key` (its kHelloReply): a peer without that endpoint's key
// cannot guess the tags of its puts, so cannot slip bytes into them. Bit 63 stays set.
inline uint64_t SessionPutTag(const CapabilityId& reservation_id, uint32_t index, uint64_t put_tag_key) {
  return PutTag(reservation_id, index) ^ (put_tag_key & ~kPutTagBit);
}

struct Hello {
  uint32_t version = kProtocolVersion;
  uint64_t nonce = 0;
  std::string ticket;  // empty: none
};
struct HelloReply {
  uint32_t version = kProtocolVersion;
  uint64_t nonce = 0;
  std::string node_id;
  uint32_t flags = 0;
  uint64_t put_tag_key = 0;
  std::string error;  // with kRefused: why
};
// kLease, kAllocate, kCommit and their replies: a request id and bytes (a serialized message, or an
// error's text).
struct LeaseMessage {
  uint64_t request_id = 0;
  bool ok = true;     // kLeaseReply only
  uint32_t code = 0;  // kLeaseReply with !ok: the absl::StatusCode of the refusal; 0 = none was sent
  std::string payload;
};
struct GetRequest {
  uint64_t request_id = 0;
  CapabilityId lease_id;
  uint64_t tag_base = 0;
  uint32_t flags = 0;
  std::vector<uint32_t> indices;
};
struct PutRequest {
  uint64_t request_id = 0;
  CapabilityId reservation_id;
  std::vector<uint32_t> indices;
};
struct Release {
  CapabilityId lease_id;
};
struct PutDone {
  uint64_t request_id = 0;
  std::vector<uint8_t> ok;
};

namespace internal {

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void Bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  bool Get(T& v) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Bytes(void* p, size_t n) {
    if (in_.size() - pos_ < n) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t left() const { return in_.size() - pos_; }
  bool done() const { return pos_ == in_.size(); }

 private:
  std::span<const std::byte> in_;
  size_t pos_ = 0;
};

}  // namespace internal

inline std::string Encode(const Hello& m) {
  internal::Writer w;
  w.Put(m.version);
  w.Put(m.nonce);
  if (!m.ticket.empty()) {
    w.Put(static_cast<uint32_t>(m.ticket.size()));
    w.Bytes(m.ticket.data(), m.ticket.size());
  }
  return w.Take();
}
inline std::string Encode(const HelloReply& m) {
  internal::Writer w;
  w.Put(m.version);
  w.Put(m.nonce);
  w.Put(static_cast<uint32_t>(m.node_id.size()));
  w.Bytes(m.node_id.data(), m.node_id.size());
  w.Put(m.flags);
  if (m.put_tag_key != 0 || !m.error.empty()) {
    w.Put(m.put_tag_key);
    w.Put(static_cast<uint32_t>(m.error.size()));
    w.Bytes(m.error.data(), m.error.size());
  }
  return w.Take();
}
inline std::string Encode(const LeaseMessage& m, bool reply) {
  internal::Writer w;
  w.Put(m.request_id);
  if (reply) {
    w.Put(static_cast<uint8_t>(m.ok ? 1 : (m.code != 0 ? 2 : 0)));
    if (!m.ok && m.code != 0) w.Put(m.code);
  }
  w.Bytes(m.payload.data(), m.payload.size());
  return w.Take();
}
inline std::string Encode(const GetRequest& m) {
  internal::Writer w;
  w.Put(m.request_id);
  w.Put(m.lease_id);
  w.Put(m.tag_base);
  w.Put(m.flags);
  w.Put(static_cast<uint32_t>(m.indices.size()));
  w.Bytes(m.indices.data(), m.indices.size() * sizeof(uint32_t));
  return w.Take();
}
inline std::string Encode(const PutRequest& m) {
  internal::Writer w;
  w.Put(m.request_id);
  w.Put(m.reservation_id);
  w.Put(static_cast<uint32_t>(m.indices.size()));
  w.Bytes(m.indices.data(), m.indices.size() * sizeof(uint32_t));
  return w.Take();
}
inline std::string Encode(const Release& m) {
  internal::Writer w;
  w.Put(m.lease_id);
  return w.Take();
}
inline std::string Encode(const PutDone& m) {
  internal::Writer w;
  w.Put(m.request_id);
  w.Put(static_cast<uint32_t>(m.ok.size()));
  w.Bytes(m.ok.data(), m.ok.size());
  return w.Take();
}

// Decoders return nullopt for a truncated, oversized or trailing-garbage message.
inline std::optional<Hello> DecodeHello(std::span<const std::byte> in) {
  internal::Reader r(in);
  Hello m;
  if (!r.Get(m.version) || !r.Get(m.nonce)) return std::nullopt;
  if (r.done()) return m;  // no ticket
  uint32_t n = 0;
  if (!r.Get(n) || n > kMaxTicketBytes || n != r.left()) return std::nullopt;
  m.ticket.resize(n);
  if (!r.Bytes(m.ticket.data(), n)) return std::nullopt;
  return m;
}
inline std::optional<HelloReply> DecodeHelloReply(std::span<const std::byte> in) {
  internal::Reader r(in);
  HelloReply m;
  uint32_t n = 0;
  if (!r.Get(m.version) || !r.Get(m.nonce) || !r.Get(n) || n > r.left()) return std::nullopt;
  m.node_id.resize(n);
  if (!r.Bytes(m.node_id.data(), n)) return std::nullopt;
  if (r.done()) return m;  // a server without flags sends none
  if (!r.Get(m.flags)) return std::nullopt;
  if (r.done()) return m;  // nor key nor error
  uint32_t e = 0;
  if (!r.Get(m.put_tag_key) || !r.Get(e) || e != r.left()) return std::nullopt;
  m.error.resize(e);
  if (!r.Bytes(m.error.data(), e)) return std::nullopt;
  return m;
}
inline std::optional<LeaseMessage> DecodeLeaseMessage(std::span<const std::byte> in, bool reply) {
  internal::Reader r(in);
  LeaseMessage m;
  uint8_t status = 1;
  if (!r.Get(m.request_id) || (reply && (!r.Get(status) || status > 2))) return std::nullopt;
  m.ok = status == 1;
  if (status == 2 && (!r.Get(m.code) || m.code == 0)) return std::nullopt;
  m.payload.resize(r.left());
  if (!r.Bytes(m.payload.data(), m.payload.size())) return std::nullopt;
  return m;
}
inline std::optional<GetRequest> DecodeGetRequest(std::span<const std::byte> in) {
  internal::Reader r(in);
  GetRequest m;
  uint32_t n = 0;
  if (!r.Get(m.request_id) || !r.Get(m.lease_id) || !r.Get(m.tag_base) || !r.Get(m.flags) || !r.Get(n) ||
      uint64_t{n} * sizeof(uint32_t) != r.left()) {
    return std::nullopt;
  }
  m.indices.resize(n);
  if (!r.Bytes(m.indices.data(), n * sizeof(uint32_t))) return std::nullopt;
  return m;
}
inline std::optional<PutRequest> DecodePutRequest(std::span<const std::byte> in) {
  internal::Reader r(in);
  PutRequest m;
  uint32_t n = 0;
  if (!r.Get(m.request_id) || !r.Get(m.reservation_id) || !r.Get(n) || uint64_t{n} * sizeof(uint32_t) != r.left()) {
    return std::nullopt;
  }
  m.indices.resize(n);
  if (!r.Bytes(m.indices.data(), n * sizeof(uint32_t))) return std::nullopt;
  return m;
}
inline std::optional<PutDone> DecodePutDone(std::span<const std::byte> in) {
  internal::Reader r(in);
  PutDone m;
  uint32_t n = 0;
  if (!r.Get(m.request_id) || !r.Get(n) || n != r.left()) return std::nullopt;
  m.ok.resize(n);
  if (!r.Bytes(m.ok.data(), n)) return std::nullopt;
  return m;
}

inline std::optional<Release> DecodeRelease(std::span<const std::byte> in) {
  internal::Reader r(in);
  Release m;
  if (!r.Get(m.lease_id) || !r.done()) return std::nullopt;
  return m;
}

}  // namespace kvtier::ucx::msg

#endif  // KVTIER_UCX_UCX_MESSAGES_H_
