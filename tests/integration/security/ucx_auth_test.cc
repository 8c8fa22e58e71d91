// The UCX bulk plane of a server with tokens, against a real kvtier-server process: raw UCX peers that
// speak the wire protocol (kvtier/ucx/ucx_messages.h) without a ticket, with another tenant's ticket
// or with an expired one, and an honest client over transport ucx.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <ucp/api/ucp.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvtier/client/client.h"
#include "kvtier/common/capability_id.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/ucx/ucx_messages.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/wire/channel_security.h"
#include "kvtier/wire/wire.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

namespace msg = ucx::msg;
using testing::ServerProcess;

constexpr char kTokenA[] = "ucx-token-of-tenant-a";
constexpr char kTokenB[] = "ucx-token-of-tenant-b";
constexpr int kSessionTtlSeconds = 3;  // ucx.session_ttl of the server

Namespace TenantNamespace(const std::string& tenant) {
  return Namespace{.tenant = tenant,
                   .model = "test/model",
                   .layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64, .block_tokens = 16},
                   .tenant_salt = absl::StrCat("salt-of-", tenant)};
}

std::vector<Fingerprint> Chain(const Namespace& ns, size_t blocks, uint32_t seed) {
  std::vector<uint32_t> tokens(blocks * ns.layout.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7919 + seed * 104729) % 50000);
  auto fps = ChainFingerprints(ns, tokens);
  EXPECT_OK(fps);
  return fps.ok() ? *fps : std::vector<Fingerprint>{};
}

std::string Pattern(uint64_t size, uint32_t seed) {
  std::string b(size, '\0');
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>((seed * 131 + i * 7) & 0xff);
  return b;
}

v1::BlockKeys Keys(std::span<const Fingerprint> fps) {
  std::vector<BlockKey> keys;
  for (const Fingerprint& f : fps) keys.push_back({.fingerprint = f, .shard = 0});
  v1::BlockKeys out;
  wire::EncodeKeys(keys, &out);
  return out;
}

// A UCX peer that speaks the bulk plane's messages by hand: one context, one worker, one endpoint to
// the server's listener (error mode NONE, as kvtier's own client). Single-threaded: every call
// progresses the worker itself.
class RawUcxPeer {
 public:
  struct Received {
    uint16_t id;
    std::string data;
  };

  static std::unique_ptr<RawUcxPeer> Connect(int port) {
    auto p = std::unique_ptr<RawUcxPeer>(new RawUcxPeer());
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM;
    if (ucp_init(&params, nullptr, &p->context_) != UCS_OK) return nullptr;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(p->context_, &wp, &p->worker_) != UCS_OK) return nullptr;
    const std::pair<uint16_t, ucp_am_recv_callback_t> handlers[] = {{msg::kHelloReply, &OnAm<msg::kHelloReply>},
                                                                    {msg::kPutDone, &OnAm<msg::kPutDone>},
                                                                    {msg::kLeaseReply, &OnAm<msg::kLeaseReply>},
                                                                    {msg::kAllocateReply, &OnAm<msg::kAllocateReply>},
                                                                    {msg::kCommitReply, &OnAm<msg::kCommitReply>}};
    for (const auto& [id, cb] : handlers) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                      UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
      hp.id = id;
      hp.cb = cb;
      hp.arg = p.get();
      hp.flags = UCP_AM_FLAG_WHOLE_MSG;
      if (ucp_worker_set_am_recv_handler(p->worker_, &hp) != UCS_OK) return nullptr;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    ep.sockaddr.addrlen = sizeof(addr);
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    if (ucp_ep_create(p->worker_, &ep, &p->ep_) != UCS_OK) return nullptr;
    return p;
  }

  ~RawUcxPeer() {
    if (ep_ != nullptr) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(ep_, &p);
      if (UCS_PTR_IS_PTR(r)) {
        const absl::Time until = absl::Now() + absl::Seconds(1);
        while (ucp_request_check_status(r) == UCS_INPROGRESS && absl::Now() < until) ucp_worker_progress(worker_);
        ucp_request_free(r);
      }
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  // Sends an eager AM and progresses until it left.
  bool Am(uint16_t id, const std::string& payload) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep_, id, nullptr, 0, payload.data(), payload.size(), &p);
    return Wait(r);
  }
  // Sends `data` as a tagged message and progresses until it left (or a second passed).
  bool TagSend(uint64_t tag, const std::string& data) {
    ucp_request_param_t p{};
    ucs_status_ptr_t r = ucp_tag_send_nbx(ep_, data.data(), data.size(), tag, &p);
    return Wait(r);
  }

  // A posted tagged receive into `buf`.
  struct Recv {
    void* request = nullptr;
    std::string buf;
    bool done = false;
    uint64_t length = 0;
  };
  std::unique_ptr<Recv> PostRecv(uint64_t tag, uint64_t size) {
    auto r = std::make_unique<Recv>();
    r->buf.assign(size, '\0');
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = [](void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
      auto* rr = static_cast<Recv*>(user);
      ucp_request_free(request);
      rr->request = nullptr;
      rr->done = true;
      rr->length = status == UCS_OK && info != nullptr ? info->length : 0;
    };
    p.user_data = r.get();
    r->request = ucp_tag_recv_nbx(worker_, r->buf.data(), size, tag, ~uint64_t{0}, &p);
    return r;
  }
  void Cancel(Recv& r) {
    if (!r.done && UCS_PTR_IS_PTR(r.request)) {
      ucp_request_cancel(worker_, r.request);
      Progress(absl::Milliseconds(50));
    }
    if (!r.done && UCS_PTR_IS_PTR(r.request)) ucp_request_free(r.request);
    r.request = nullptr;
  }

  // Progresses until `pred` or the deadline; returns pred().
  template <typename Pred>
  bool ProgressUntil(absl::Duration d, Pred pred) {
    const absl::Time until = absl::Now() + d;
    while (!pred() && absl::Now() < until) {
      if (ucp_worker_progress(worker_) == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return pred();
  }
  void Progress(absl::Duration d) {
    ProgressUntil(d, [] { return false; });
  }

  // The next received AM of `id` within `d`, if any.
  std::optional<std::string> Next(uint16_t id, absl::Duration d) {
    auto find = [&] {
      for (const Received& r : received_) {
        if (r.id == id) return true;
      }
      return false;
    };
    if (!ProgressUntil(d, find)) return std::nullopt;
    for (auto it = received_.begin(); it != received_.end(); ++it) {
      if (it->id == id) {
        std::string out = std::move(it->data);
        received_.erase(it);
        return out;
      }
    }
    return std::nullopt;
  }

  // Sends a hello with `ticket` and waits for the reply (nullopt: none within `d`).
  std::optional<msg::HelloReply> Hello(const std::string& ticket, absl::Duration d = absl::Seconds(10)) {
    const uint64_t nonce = ++nonce_;
    if (!Am(msg::kHello, msg::Encode(msg::Hello{.nonce = nonce, .ticket = ticket}))) return std::nullopt;
    for (;;) {
      auto raw = Next(msg::kHelloReply, d);
      if (!raw.has_value()) return std::nullopt;
      auto reply = msg::DecodeHelloReply(std::as_bytes(std::span<const char>(raw->data(), raw->size())));
      if (reply.has_value() && reply->nonce == nonce) return reply;
    }
  }

 private:
  RawUcxPeer() = default;

  template <uint16_t Id>
  static ucs_status_t OnAm(void* arg, const void*, size_t, void* data, size_t length, const ucp_am_recv_param_t*) {
    static_cast<RawUcxPeer*>(arg)->received_.push_back({Id, std::string(static_cast<const char*>(data), length)});
    return UCS_OK;
  }

  bool Wait(ucs_status_ptr_t r) {
    if (!UCS_PTR_IS_PTR(r)) return UCS_PTR_STATUS(r) == UCS_OK;
    const absl::Time until = absl::Now() + absl::Seconds(2);
    while (ucp_request_check_status(r) == UCS_INPROGRESS && absl::Now() < until) ucp_worker_progress(worker_);
    const ucs_status_t st = ucp_request_check_status(r);
    if (st == UCS_INPROGRESS) ucp_request_cancel(worker_, r);
    ucp_request_free(r);
    return st == UCS_OK;
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  std::deque<Received> received_;
  uint64_t nonce_ = 0;
};

class UcxAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir_template[] = "/tmp/kvtier-ucx-auth-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = new std::string(dir_template);
    std::ofstream(*dir_ + "/kvtier.yaml")
        << "auth:\n  tokens:\n"
        << "    - {token: " << kTokenA << ", tenant: tenant-a, role: worker}\n"
        << "    - {token: " << kTokenB << ", tenant: tenant-b, role: worker}\n"
        << "ucx:\n  listen_address: 127.0.0.1:0\n  session_ttl: " << kSessionTtlSeconds << "s\n";
    auto p = ServerProcess::Start("ucx-auth-node", {"--config=" + *dir_ + "/kvtier.yaml"});
    ASSERT_OK(p);
    server_ = p->release();
    ASSERT_NE(server_->ucx_port(), 0);
  }

  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    if (dir_ != nullptr) {
      std::filesystem::remove_all(*dir_);
      delete dir_;
      dir_ = nullptr;
    }
  }

  static std::unique_ptr<v1::CacheService::Stub> Stub(const std::string& token) {
    wire::ChannelSecurity sec{.auth_token = token};
    auto creds = wire::MakeChannelCredentials(sec);
    EXPECT_OK(creds);
    return v1::CacheService::NewStub(
        wire::CreateSecureChannel(server_->address(), *creds, wire::ChannelArgs(80 << 20), sec));
  }

  static std::string Ticket(v1::CacheService::Stub& stub) {
    grpc::ClientContext ctx;
    v1::OpenUcxSessionResponse resp;
    const grpc::Status st = stub.OpenUcxSession(&ctx, v1::OpenUcxSessionRequest(), &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_TRUE(resp.required());
    EXPECT_EQ(resp.ttl_ms(), kSessionTtlSeconds * 1000u);
    return resp.ticket();
  }

  // Tenant A allocates one block over gRPC; returns the reservation id.
  CapabilityId AllocateA(const std::vector<Fingerprint>& fps) {
    grpc::ClientContext ctx;
    v1::AllocateRequest req;
    wire::ToProto(a_, req.mutable_namespace_());
    *req.mutable_keys() = Keys(fps);
    v1::AllocateResponse resp;
    EXPECT_TRUE(cache_a_->Allocate(&ctx, req, &resp).ok());
    return CapabilityId::FromWire(resp.reservation_id());
  }

  v1::CommitResponse CommitA(const CapabilityId& reservation_id, const std::string& bytes) {
    grpc::ClientContext ctx;
    v1::CommitRequest req;
    req.set_reservation_id(reservation_id.ToWire());
    req.add_checksums(BlockChecksum(bytes.data(), bytes.size()));
    v1::CommitResponse resp;
    EXPECT_TRUE(cache_a_->Commit(&ctx, req, &resp).ok());
    return resp;
  }

  // Tenant A's honest put of one block over its own authenticated raw endpoint; returns kPutDone's ok.
  bool PutOverUcxA(RawUcxPeer& peer, uint64_t put_tag_key, const CapabilityId& reservation_id,
                   const std::string& bytes) {
    const uint64_t request_id = 77;
    EXPECT_TRUE(peer.Am(msg::kPut, msg::Encode(msg::PutRequest{
                                       .request_id = request_id, .reservation_id = reservation_id, .indices = {0}})));
    EXPECT_TRUE(peer.TagSend(msg::SessionPutTag(reservation_id, 0, put_tag_key), bytes));
    auto done = peer.Next(msg::kPutDone, absl::Seconds(10));
    if (!done.has_value()) return false;
    auto d = msg::DecodePutDone(std::as_bytes(std::span<const char>(done->data(), done->size())));
    return d.has_value() && d->ok.size() == 1 && d->ok[0] == 1;
  }

  // A lease of `fps` for tenant A over gRPC.
  CapabilityId LeaseA(const std::vector<Fingerprint>& fps) {
    grpc::ClientContext ctx;
    v1::ReadRequest req;
    wire::ToProto(a_, req.mutable_namespace_());
    *req.mutable_keys() = Keys(fps);
    req.set_lease_ms(20000);
    v1::ReadResponse resp;
    EXPECT_TRUE(cache_a_->Lease(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.blocks_size(), 1);
    EXPECT_TRUE(resp.blocks_size() == 1 && resp.blocks(0).present());
    return CapabilityId::FromWire(resp.lease_id());
  }

  // Stores one block of tenant A through an authenticated raw endpoint; returns its fingerprints.
  std::vector<Fingerprint> StoreA(uint32_t seed, const std::string& bytes) {
    auto peer = RawUcxPeer::Connect(server_->ucx_port());
    EXPECT_NE(peer, nullptr);
    auto hello = peer->Hello(Ticket(*cache_a_));
    EXPECT_TRUE(hello.has_value() && (hello->flags & msg::kRefused) == 0);
    auto fps = Chain(a_, 1, seed);
    const CapabilityId id = AllocateA(fps);
    EXPECT_FALSE(id.null());
    EXPECT_TRUE(PutOverUcxA(*peer, hello->put_tag_key, id, bytes));
    EXPECT_EQ(CommitA(id, bytes).results(0), v1::COMMIT_RESULT_COMMITTED);
    return fps;
  }

  Namespace a_ = TenantNamespace("tenant-a");
  Namespace b_ = TenantNamespace("tenant-b");
  uint64_t block_bytes_ = a_.layout.ShardBytes();
  std::unique_ptr<v1::CacheService::Stub> cache_a_ = Stub(kTokenA);
  std::unique_ptr<v1::CacheService::Stub> cache_b_ = Stub(kTokenB);

  static std::string* dir_;
  static ServerProcess* server_;
};

std::string* UcxAuthTest::dir_ = nullptr;
ServerProcess* UcxAuthTest::server_ = nullptr;

TEST_F(UcxAuthTest, APeerWithoutATicketIsRefusedGetsNoBytesAndWritesNothing) {
  const std::string stored = Pattern(block_bytes_, 1);
  const std::vector<Fingerprint> fps = StoreA(1, stored);
  const CapabilityId lease = LeaseA(fps);
  ASSERT_FALSE(lease.null());
  // Tenant A's open reservation, and A's own authenticated endpoint to fill it later.
  auto honest = RawUcxPeer::Connect(server_->ucx_port());
  ASSERT_NE(honest, nullptr);
  auto honest_hello = honest->Hello(Ticket(*cache_a_));
  ASSERT_TRUE(honest_hello.has_value());
  ASSERT_EQ(honest_hello->flags & msg::kRefused, 0u);
  EXPECT_NE(honest_hello->put_tag_key, 0u);
  EXPECT_NE(honest_hello->flags & msg::kTakesLeases, 0u);  // with tokens on, sessions may lease
  const auto fresh = Chain(a_, 1, 2);
  const CapabilityId reservation = AllocateA(fresh);
  ASSERT_FALSE(reservation.null());

  auto attacker = RawUcxPeer::Connect(server_->ucx_port());
  ASSERT_NE(attacker, nullptr);
  auto refused = attacker->Hello("");
  ASSERT_TRUE(refused.has_value());
  EXPECT_NE(refused->flags & msg::kRefused, 0u);
  EXPECT_NE(refused->error.find("requires a UCX session ticket"), std::string::npos) << refused->error;
  EXPECT_EQ(refused->flags & msg::kTakesLeases, 0u);
  EXPECT_EQ(refused->put_tag_key, 0u);

  // kGet of A's live lease: no message comes on its tag, not even an empty one.
  auto recv = attacker->PostRecv(5000, block_bytes_);
  ASSERT_TRUE(attacker->Am(
      msg::kGet, msg::Encode(msg::GetRequest{.request_id = 1, .lease_id = lease, .tag_base = 5000, .indices = {0}})));
  // kPut into A's reservation, its bytes on the unkeyed tag and on the keyless session tag.
  const std::string garbage(block_bytes_, 'X');
  attacker->Am(msg::kPut, msg::Encode(msg::PutRequest{.request_id = 2, .reservation_id = reservation, .indices = {0}}));
  attacker->TagSend(msg::PutTag(reservation, 0), garbage);
  // kLease of A's namespace.
  v1::ReadRequest lease_req;
  wire::ToProto(a_, lease_req.mutable_namespace_());
  *lease_req.mutable_keys() = Keys(fps);
  attacker->Am(msg::kLease,
               msg::Encode(msg::LeaseMessage{.request_id = 3, .payload = lease_req.SerializeAsString()}, false));
  attacker->Progress(absl::Seconds(2));
  EXPECT_FALSE(recv->done) << "the server sent " << recv->length << " bytes to a peer without a ticket";
  EXPECT_FALSE(attacker->Next(msg::kPutDone, absl::ZeroDuration()).has_value());
  EXPECT_FALSE(attacker->Next(msg::kLeaseReply, absl::ZeroDuration()).has_value());
  attacker->Cancel(*recv);
  // The endpoint is closed: even a valid ticket on it is no longer answered.
  EXPECT_FALSE(attacker->Hello(Ticket(*cache_a_), absl::Seconds(2)).has_value());

  // A fills and commits its reservation as if nothing happened; the bytes are A's.
  const std::string bytes = Pattern(block_bytes_, 2);
  EXPECT_TRUE(PutOverUcxA(*honest, honest_hello->put_tag_key, reservation, bytes));
  EXPECT_EQ(CommitA(reservation, bytes).results(0), v1::COMMIT_RESULT_COMMITTED);
  const CapabilityId lease2 = LeaseA(fresh);
  auto got = honest->PostRecv(6000, block_bytes_);
  ASSERT_TRUE(honest->Am(
      msg::kGet,
      msg::Encode(msg::GetRequest{
          .request_id = 4, .lease_id = lease2, .tag_base = 6000, .flags = msg::kGetRelease, .indices = {0}})));
  ASSERT_TRUE(honest->ProgressUntil(absl::Seconds(10), [&] { return got->done; }));
  EXPECT_EQ(got->length, block_bytes_);
  EXPECT_EQ(got->buf, bytes);
}

TEST_F(UcxAuthTest, TenantBsTicketCannotGetPutOrLeaseTenantAsBlocks) {
  const std::string stored = Pattern(block_bytes_, 10);
  const std::vector<Fingerprint> fps = StoreA(10, stored);
  const CapabilityId lease = LeaseA(fps);
  ASSERT_FALSE(lease.null());
  const auto fresh = Chain(a_, 1, 11);
  const CapabilityId reservation = AllocateA(fresh);
  ASSERT_FALSE(reservation.null());

  auto peer_b = RawUcxPeer::Connect(server_->ucx_port());
  ASSERT_NE(peer_b, nullptr);
  auto hello_b = peer_b->Hello(Ticket(*cache_b_));
  ASSERT_TRUE(hello_b.has_value());
  ASSERT_EQ(hello_b->flags & msg::kRefused, 0u) << hello_b->error;

  // kGet of A's lease, asking the server to release it after: every block comes as an empty message,
  // and the lease is not released (A reads through it below).
  auto recv = peer_b->PostRecv(7000, block_bytes_);
  ASSERT_TRUE(peer_b->Am(
      msg::kGet,
      msg::Encode(msg::GetRequest{
          .request_id = 1, .lease_id = lease, .tag_base = 7000, .flags = msg::kGetRelease, .indices = {0}})));
  ASSERT_TRUE(peer_b->ProgressUntil(absl::Seconds(10), [&] { return recv->done; }));
  EXPECT_EQ(recv->length, 0u);
  EXPECT_EQ(recv->buf, std::string(block_bytes_, '\0'));
  // kRelease of A's lease is ignored: A still reads through it below.
  ASSERT_TRUE(peer_b->Am(msg::kRelease, msg::Encode(msg::Release{.lease_id = lease})));
  // kPut into A's reservation: refused, nothing received into it.
  const std::string garbage(block_bytes_, 'Y');
  ASSERT_TRUE(peer_b->Am(msg::kPut,
                         msg::Encode(msg::PutRequest{.request_id = 2, .reservation_id = reservation, .indices = {0}})));
  ASSERT_TRUE(peer_b->TagSend(msg::SessionPutTag(reservation, 0, hello_b->put_tag_key), garbage));
  peer_b->TagSend(msg::PutTag(reservation, 0), garbage);
  auto done = peer_b->Next(msg::kPutDone, absl::Seconds(10));
  ASSERT_TRUE(done.has_value());
  auto d = msg::DecodePutDone(std::as_bytes(std::span<const char>(done->data(), done->size())));
  ASSERT_TRUE(d.has_value());
  ASSERT_EQ(d->ok.size(), 1u);
  EXPECT_EQ(d->ok[0], 0);
  // kLease of A's namespace: PERMISSION_DENIED.
  v1::ReadRequest lease_req;
  wire::ToProto(a_, lease_req.mutable_namespace_());
  *lease_req.mutable_keys() = Keys(fps);
  ASSERT_TRUE(peer_b->Am(
      msg::kLease, msg::Encode(msg::LeaseMessage{.request_id = 3, .payload = lease_req.SerializeAsString()}, false)));
  auto reply = peer_b->Next(msg::kLeaseReply, absl::Seconds(10));
  ASSERT_TRUE(reply.has_value());
  auto r = msg::DecodeLeaseMessage(std::as_bytes(std::span<const char>(reply->data(), reply->size())), true);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->code, static_cast<uint32_t>(absl::StatusCode::kPermissionDenied)) << r->payload;
  // B's own namespace leases fine over the same endpoint.
  v1::ReadRequest own;
  wire::ToProto(b_, own.mutable_namespace_());
  *own.mutable_keys() = Keys(Chain(b_, 1, 12));
  ASSERT_TRUE(peer_b->Am(msg::kLease,
                         msg::Encode(msg::LeaseMessage{.request_id = 4, .payload = own.SerializeAsString()}, false)));
  auto own_reply = peer_b->Next(msg::kLeaseReply, absl::Seconds(10));
  ASSERT_TRUE(own_reply.has_value());
  auto o = msg::DecodeLeaseMessage(std::as_bytes(std::span<const char>(own_reply->data(), own_reply->size())), true);
  ASSERT_TRUE(o.has_value());
  EXPECT_TRUE(o->ok) << o->payload;
  // kAllocate in A's namespace: PERMISSION_DENIED.
  v1::AllocateRequest alloc_req;
  wire::ToProto(a_, alloc_req.mutable_namespace_());
  *alloc_req.mutable_keys() = Keys(Chain(a_, 1, 13));
  ASSERT_TRUE(
      peer_b->Am(msg::kAllocate,
                 msg::Encode(msg::LeaseMessage{.request_id = 5, .payload = alloc_req.SerializeAsString()}, false)));
  auto alloc_reply = peer_b->Next(msg::kAllocateReply, absl::Seconds(10));
  ASSERT_TRUE(alloc_reply.has_value());
  auto ar =
      msg::DecodeLeaseMessage(std::as_bytes(std::span<const char>(alloc_reply->data(), alloc_reply->size())), true);
  ASSERT_TRUE(ar.has_value());
  EXPECT_FALSE(ar->ok);
  EXPECT_EQ(ar->code, static_cast<uint32_t>(absl::StatusCode::kPermissionDenied)) << ar->payload;
  // kCommit of A's reservation: answered exactly as one of an id that never existed, and A's
  // reservation stays open (A commits it below).
  auto commit_over_b = [&](const CapabilityId& id, uint64_t request_id) {
    v1::CommitRequest creq;
    creq.set_reservation_id(id.ToWire());
    creq.add_checksums(BlockChecksum(garbage.data(), garbage.size()));
    EXPECT_TRUE(peer_b->Am(
        msg::kCommit,
        msg::Encode(msg::LeaseMessage{.request_id = request_id, .payload = creq.SerializeAsString()}, false)));
    auto raw = peer_b->Next(msg::kCommitReply, absl::Seconds(10));
    EXPECT_TRUE(raw.has_value());
    auto m = raw.has_value()
                 ? msg::DecodeLeaseMessage(std::as_bytes(std::span<const char>(raw->data(), raw->size())), true)
                 : std::nullopt;
    EXPECT_TRUE(m.has_value());
    return m.value_or(msg::LeaseMessage{});
  };
  const msg::LeaseMessage foreign = commit_over_b(reservation, 6);
  const msg::LeaseMessage unknown = commit_over_b(CapabilityId::Random(), 7);
  EXPECT_FALSE(foreign.ok);
  EXPECT_EQ(foreign.code, static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition)) << foreign.payload;
  EXPECT_EQ(foreign.code, unknown.code);
  EXPECT_EQ(foreign.payload, unknown.payload);

  // A's lease still serves A, and A's reservation still takes A's bytes.
  auto honest = RawUcxPeer::Connect(server_->ucx_port());
  ASSERT_NE(honest, nullptr);
  auto hello_a = honest->Hello(Ticket(*cache_a_));
  ASSERT_TRUE(hello_a.has_value());
  ASSERT_EQ(hello_a->flags & msg::kRefused, 0u);
  EXPECT_NE(hello_a->put_tag_key, hello_b->put_tag_key);
  auto got = honest->PostRecv(8000, block_bytes_);
  ASSERT_TRUE(honest->Am(
      msg::kGet,
      msg::Encode(msg::GetRequest{
          .request_id = 5, .lease_id = lease, .tag_base = 8000, .flags = msg::kGetRelease, .indices = {0}})));
  ASSERT_TRUE(honest->ProgressUntil(absl::Seconds(10), [&] { return got->done; }));
  EXPECT_EQ(got->length, block_bytes_);
  EXPECT_EQ(got->buf, stored);
  const std::string bytes = Pattern(block_bytes_, 11);
  EXPECT_TRUE(PutOverUcxA(*honest, hello_a->put_tag_key, reservation, bytes));
  EXPECT_EQ(CommitA(reservation, bytes).results(0), v1::COMMIT_RESULT_COMMITTED);
}

TEST_F(UcxAuthTest, AnExpiredTicketIsRefused) {
  const std::string ticket = Ticket(*cache_a_);
  ASSERT_EQ(ticket.size(), 32u);
  std::this_thread::sleep_for(std::chrono::milliseconds(kSessionTtlSeconds * 1000 + 500));
  auto peer = RawUcxPeer::Connect(server_->ucx_port());
  ASSERT_NE(peer, nullptr);
  auto reply = peer->Hello(ticket);
  ASSERT_TRUE(reply.has_value());
  EXPECT_NE(reply->flags & msg::kRefused, 0u);
  EXPECT_NE(reply->error.find("unknown or expired"), std::string::npos) << reply->error;
  // A made-up ticket is refused the same way.
  auto other = RawUcxPeer::Connect(server_->ucx_port());
  ASSERT_NE(other, nullptr);
  auto made_up = other->Hello(std::string(32, 'k'));
  ASSERT_TRUE(made_up.has_value());
  EXPECT_NE(made_up->flags & msg::kRefused, 0u);
}

TEST_F(UcxAuthTest, AnEndpointThatNeverSaysHelloIsClosed) {
  auto silent = RawUcxPeer::Connect(server_->ucx_port());
  ASSERT_NE(silent, nullptr);
  silent->Progress(absl::Seconds(12));  // the server closes unproven endpoints after 10 s
  EXPECT_FALSE(silent->Hello(Ticket(*cache_a_), absl::Seconds(3)).has_value());
  // A new endpoint with the same ticket is served.
  auto fresh = RawUcxPeer::Connect(server_->ucx_port());
  ASSERT_NE(fresh, nullptr);
  auto reply = fresh->Hello(Ticket(*cache_a_));
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->flags & msg::kRefused, 0u);
}

TEST_F(UcxAuthTest, AClientWithATokenPutsAndGetsOverUcxAndLeasesOverUcx) {
  client::ClientOptions o{.members = {server_->address()}, .rpc_timeout = absl::Seconds(5), .transport = "ucx"};
  o.auth_token = kTokenA;
  auto c = client::Client::Connect(o);
  ASSERT_OK(c);
  const auto fps = Chain(a_, 4, 20);
  std::vector<std::string> data;
  std::vector<std::span<const std::byte>> views;
  for (uint32_t i = 0; i < fps.size(); ++i) data.push_back(Pattern(block_bytes_, 20 + i));
  for (const auto& d : data) views.push_back(std::as_bytes(std::span<const char>(d.data(), d.size())));
  auto put = (*c)->Put(a_, fps, 0, views);
  ASSERT_OK(put);
  for (const auto& r : *put) EXPECT_EQ(r, client::PutResult::kStored);
  std::vector<std::string> out(fps.size(), std::string(block_bytes_, '\0'));
  std::vector<std::span<std::byte>> bufs;
  for (auto& d : out) bufs.push_back(std::as_writable_bytes(std::span<char>(d.data(), d.size())));
  auto got = (*c)->Get(a_, fps, 0, bufs);
  ASSERT_OK(got);
  for (size_t i = 0; i < fps.size(); ++i) {
    EXPECT_EQ((*got)[i], client::GetResult::kHit) << i;
    EXPECT_EQ(out[i], data[i]) << i;
  }
  const client::ClientStats& s = (*c)->stats();
  EXPECT_EQ(s.ucx_put_blocks.load(), fps.size());
  EXPECT_EQ(s.ucx_get_blocks.load(), fps.size());
  EXPECT_GE(s.ucx_leases.load(), 1u);
  EXPECT_GE(s.ucx_allocates.load(), 1u);  // the session may reserve and commit: no gRPC round trip
  EXPECT_GE(s.ucx_commits.load(), 1u);
  EXPECT_GE(s.ucx_connects.load(), 1u);
}

// TLS without tokens: the UCX plane still requires a ticket, which only a client that passed the TLS
// handshake of the gRPC port can open.
TEST(UcxTlsTest, WithTlsAndNoTokensTheUcxPlaneStillRequiresATicket) {
  char dir_template[] = "/tmp/kvtier-ucx-tls-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string d = dir_template;
  std::ofstream(d + "/server.ext") << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  auto run = [](const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; };
  ASSERT_TRUE(run(absl::StrCat("openssl req -x509 ", key, " -keyout ", d, "/ca.key -out ", d,
                               "/ca.pem -days 2 -subj /CN=kvtier-ucx-test-ca")));
  ASSERT_TRUE(
      run(absl::StrCat("openssl req ", key, " -keyout ", d, "/server.key -out ", d, "/server.csr -subj /CN=server")));
  ASSERT_TRUE(run(absl::StrCat("openssl x509 -req -in ", d, "/server.csr -CA ", d, "/ca.pem -CAkey ", d,
                               "/ca.key -CAcreateserial -days 2 -out ", d, "/server.pem -extfile ", d, "/server.ext")));
  std::ofstream(d + "/kvtier.yaml") << "tls:\n  cert_file: " << d << "/server.pem\n  key_file: " << d
                                    << "/server.key\nucx:\n  listen_address: 127.0.0.1:0\n";
  auto p = ServerProcess::Start("ucx-tls-node", {"--config=" + d + "/kvtier.yaml"});
  ASSERT_OK(p);
  ASSERT_NE((*p)->ucx_port(), 0);

  auto peer = RawUcxPeer::Connect((*p)->ucx_port());
  ASSERT_NE(peer, nullptr);
  auto refused = peer->Hello("");
  ASSERT_TRUE(refused.has_value());
  EXPECT_NE(refused->flags & msg::kRefused, 0u);

  client::ClientOptions o{.members = {(*p)->address()}, .rpc_timeout = absl::Seconds(5), .transport = "ucx"};
  o.tls_ca_file = d + "/ca.pem";
  auto c = client::Client::Connect(o);
  ASSERT_OK(c);
  const Namespace ns = TenantNamespace("tenant-a");
  const uint64_t size = ns.layout.ShardBytes();
  const auto fps = Chain(ns, 2, 30);
  std::vector<std::string> data = {Pattern(size, 30), Pattern(size, 31)};
  std::vector<std::span<const std::byte>> views;
  for (const auto& x : data) views.push_back(std::as_bytes(std::span<const char>(x.data(), x.size())));
  ASSERT_OK((*c)->Put(ns, fps, 0, views));
  std::vector<std::string> out(2, std::string(size, '\0'));
  std::vector<std::span<std::byte>> bufs;
  for (auto& x : out) bufs.push_back(std::as_writable_bytes(std::span<char>(x.data(), x.size())));
  auto got = (*c)->Get(ns, fps, 0, bufs);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0], client::GetResult::kHit);
  EXPECT_EQ((*got)[1], client::GetResult::kHit);
  EXPECT_EQ(out, data);
  EXPECT_EQ((*c)->stats().ucx_get_blocks.load(), 2u);
  EXPECT_EQ((*c)->stats().ucx_put_blocks.load(), 2u);
  p->reset();
  std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace kvtier
