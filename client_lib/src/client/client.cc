#include "kvtier/client/client.h"
#include "kvtier/common/log.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <latch>
#include <mutex>
#include <optional>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "client/replication.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvtier/client/dns_resolver.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/host_port.h"
#include "kvtier/common/similarity.h"
#include "kvtier/common/status_macros.h"
#include "kvtier/ucx/ucx_client.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/wire/channel_security.h"
#include "kvtier/wire/wire.h"

namespace kvtier::client {

namespace {

constexpr uint32_t kMaxReplicationFactor = 16;

// A member's UCX listener: at the host it is bound to (info.ucx_address), since a listener bound to one
// address accepts only there; at the host we reach the member's gRPC at when it is bound to a wildcard
// (which accepts on every address), as the events subscriber does with a PUB endpoint.
std::string UcxTarget(const std::string& grpc_address, const v1::GetInfoResponse& info) {
  auto bound = ParseHostPort(info.ucx_address(), /*min_port=*/0);
  const std::string host =
      bound.ok() && !IsWildcardHost(bound->host) ? bound->host : grpc_address.substr(0, grpc_address.rfind(':'));
  return absl::StrCat(host, ":", info.ucx_port());
}

// The replication fields of ClientOptions (docs/config.md "Replication").
absl::Status ValidateReplication(const ClientOptions& o) {
  if (o.replication_factor == 0 || o.replication_factor > kMaxReplicationFactor) {
    return absl::InvalidArgumentError(
        absl::StrCat("replication_factor: ", o.replication_factor, " is not in 1..", kMaxReplicationFactor));
  }
  for (size_t i = 0; i < o.replication_overrides.size(); ++i) {
    const ClientOptions::ReplicationOverride& r = o.replication_overrides[i];
    if (r.tenant.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("replication_overrides[", i, "].tenant: must not be empty"));
    }
    if (r.replication_factor == 0 || r.replication_factor > kMaxReplicationFactor) {
      return absl::InvalidArgumentError(absl::StrCat("replication_overrides[", i, "].replication_factor: ",
                                                     r.replication_factor, " is not in 1..", kMaxReplicationFactor));
    }
  }
  if (o.hot_read_replicas > kMaxReplicationFactor) {
    return absl::InvalidArgumentError(
        absl::StrCat("hot_read_replicas: ", o.hot_read_replicas, " is above ", kMaxReplicationFactor));
  }
  if (o.replica_queue_bytes == 0) return absl::InvalidArgumentError("replica_queue_bytes: must be > 0");
  if (o.hint_retry_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("hint_retry_interval: must be > 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ClientOptions::Validate() const {
  if (members.empty() && members_dns.empty()) {
    return absl::InvalidArgumentError("members: at least one member (or members_dns) is required");
  }
  for (const std::string& m : members) {
    const std::string addr = m.substr(m.find('=') == std::string::npos ? 0 : m.find('=') + 1);
    if (auto hp = ParseHostPort(addr); !hp.ok()) {
      // gRPC would take port 100403 as 34867: refuse it here, naming the member.
      return absl::InvalidArgumentError(
          absl::StrCat("members: \"", m, "\" is not host:port or node_id=host:port: ", hp.status().message()));
    }
  }
  if (!members_dns.empty()) {
    if (absl::Status s = ValidateDnsName(members_dns); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("members_dns: ", s.message()));
    }
  }
  if (absl::Status s = ValidateDnsServer(dns_server); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("dns_server: ", s.message()));
  }
  if (dns_refresh_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("dns_refresh_interval: must be > 0");
  }
  if (dns_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("dns_timeout: must be > 0");
  if (health_check_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("health_check_interval: must be > 0");
  }
  if (health_check_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("health_check_timeout: must be > 0");
  }
  if (unhealthy_threshold == 0) return absl::InvalidArgumentError("unhealthy_threshold: must be > 0");
  if (healthy_threshold == 0) return absl::InvalidArgumentError("healthy_threshold: must be > 0");
  if (virtual_nodes == 0) return absl::InvalidArgumentError("virtual_nodes: must be > 0");
  if (rpc_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("rpc_timeout: must be > 0");
  if (connect_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("connect_timeout: must be > 0");
  if (max_message_bytes < (4ULL << 20)) return absl::InvalidArgumentError("max_message_bytes: must be >= 4 MiB");
  if (stream_chunk_bytes == 0 || stream_chunk_bytes + (64 << 10) > max_message_bytes) {
    return absl::InvalidArgumentError("stream_chunk_bytes: must be > 0 and below max_message_bytes - 64 KiB");
  }
  if (max_blocks_per_request == 0) return absl::InvalidArgumentError("max_blocks_per_request: must be > 0");
  if (put_batch_blocks == 0) return absl::InvalidArgumentError("put_batch_blocks: must be > 0");
  if (max_block_bytes == 0) return absl::InvalidArgumentError("max_block_bytes: must be > 0");
  if (transport != "auto" && transport != "grpc" && transport != "ucx") {
    return absl::InvalidArgumentError(absl::StrCat("transport: \"", transport, "\" is not auto, grpc or ucx"));
  }
  if (ucx_reconnect_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ucx_reconnect_backoff: must be >= 0");
  }
  if (ucx_get_lanes < 1 || ucx_get_lanes > 64) {
    return absl::InvalidArgumentError(absl::StrCat("ucx_get_lanes: ", ucx_get_lanes, " is not in [1, 64]"));
  }
  return ValidateReplication(*this);
}

const char* GetResultName(GetResult r) {
  switch (r) {
    case GetResult::kHit:
      return "hit";
    case GetResult::kMiss:
      return "miss";
    case GetResult::kMissFromError:
      return "miss_from_error";
    case GetResult::kChecksumMismatch:
      return "checksum_mismatch";
  }
  return "unknown";
}

const char* PutResultName(PutResult r) {
  switch (r) {
    case PutResult::kStored:
      return "stored";
    case PutResult::kAlreadyPresent:
      return "already_present";
    case PutResult::kInProgress:
      return "in_progress";
    case PutResult::kNoSpace:
      return "no_space";
    case PutResult::kError:
      return "error";
  }
  return "unknown";
}

namespace {

// The UCX endpoint of one member, as far as this client knows.
struct UcxPeer {
  enum class State : uint8_t { kUnknown, kConnecting, kReady, kDown, kUnsupported };
  std::mutex mu;
  std::condition_variable connected;              // notified when a connect attempt ends
  State state = State::kUnknown;                  // guarded by mu
  UcxClient::EndpointId endpoint = 0;             // guarded by mu; valid while kReady
  UcxClient* client = nullptr;                    // guarded by mu; the client of `endpoint` while kReady
  bool takes_leases = false;                      // guarded by mu; `endpoint` answers UcxClient::Lease
  bool takes_puts = false;                        // guarded by mu; `endpoint` answers Allocate and Commit
  absl::Time retry_after = absl::InfinitePast();  // guarded by mu; no (re)connect before it
  // The UCX session (OpenUcxSession) of `endpoint`, when this client has a token or TLS: renewed at half
  // its lifetime, for the get lanes' endpoints opened later.
  std::string ticket;                            // guarded by mu; "" = none
  absl::Time renew_at = absl::InfiniteFuture();  // guarded by mu
  bool renewing = false;                         // guarded by mu: one caller renews
};

// A member without UCX is asked again this often (it may restart with UCX).
constexpr absl::Duration kUcxUnsupportedRecheck = absl::Seconds(10);
// Longest wait between a member's gRPC reconnect attempts (gRPC's default is 120 s), so that a member
// that comes back passes its health checks within about a second of it.
constexpr int kMaxReconnectBackoffMs = 1000;

// One member. Shared by the registry and the rings that include it: a member that leaves (its DNS record
// went) lives on until the last call using a ring with it returns.
struct Member {
  // Immutable after creation.
  std::string address;        // host:port
  std::string configured_id;  // from "node_id=host:port"; "" when the member is asked
  bool from_dns = false;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::CacheService::Stub> cache;
  std::unique_ptr<v1::AdminService::Stub> admin;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub;
  std::unique_ptr<UcxPeer> ucx = std::make_unique<UcxPeer>();

  mutable std::mutex mu;
  std::string node_id;                           // guarded by mu; "" until known
  MemberHealth health = MemberHealth::kUnknown;  // guarded by mu
  uint32_t failures = 0;                         // guarded by mu; failed checks in a row
  uint32_t passes = 0;                           // guarded by mu; passed checks in a row
  std::string last_error;                        // guarded by mu

  Member(std::string addr, std::string id, bool dns, const grpc::ChannelArguments& args,
         const std::shared_ptr<grpc::ChannelCredentials>& credentials, const wire::ChannelSecurity& security)
      : address(std::move(addr)), configured_id(id), from_dns(dns), node_id(std::move(id)) {
    channel = wire::CreateSecureChannel(address, credentials, args, security);
    cache = v1::CacheService::NewStub(channel);
    admin = v1::AdminService::NewStub(channel);
    health_stub = grpc::health::v1::Health::NewStub(channel);
  }
  ~Member() {
    std::lock_guard<std::mutex> lock(ucx->mu);
    if (ucx->state == UcxPeer::State::kReady && ucx->client != nullptr) ucx->client->Close(ucx->endpoint);
  }
  std::string NodeId() const {
    std::lock_guard<std::mutex> lock(mu);
    return node_id;
  }

  // `status` (a refusal: IsRefusal) as the caller sees it: the member's code, and its message after
  // the member and the RPC, e.g. "member node-1 (10.0.0.1:7400) refused Allocate: namespace.layout:
  // a block is 2097152 bytes, this server accepts at most 1048576".
  absl::Status Refused(const char* rpc, const absl::Status& status) const {
    const std::string id = NodeId();
    return absl::Status(
        status.code(), absl::StrCat("member ", id.empty() ? address : absl::StrCat(id, " (", address, ")"), " refused ",
                                    rpc, ": ", status.message()));
  }
};

// An immutable ring and the member behind each of its indices. Calls hold the view they started with.
struct RingView {
  HashRing ring;
  std::vector<std::shared_ptr<Member>> owners;  // ring index -> member
};

// Indices of `n` blocks grouped by the owner of each (a ring index), in block order within a group.
using OwnerGroups = std::vector<std::pair<uint32_t, std::vector<uint32_t>>>;

// Runs one unary callback-API RPC per item at once and waits for all; start(i, ctx, done) starts item
// i's RPC with `ctx` (deadline set) and must call done(status) exactly once.
template <typename StartFn>
std::vector<grpc::Status> RunAll(size_t n, absl::Duration timeout, bool wait_for_ready, StartFn start) {
  std::vector<grpc::Status> statuses(n);
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs(n);
  std::latch done(static_cast<std::ptrdiff_t>(n));
  for (size_t i = 0; i < n; ++i) {
    ctxs[i] = std::make_unique<grpc::ClientContext>();
    ctxs[i]->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    ctxs[i]->set_wait_for_ready(wait_for_ready);
    start(i, ctxs[i].get(), [&statuses, &done, i](grpc::Status s) {
      statuses[i] = std::move(s);
      done.count_down();
    });
  }
  done.wait();
  return statuses;
}

// Whether a member's answer refuses the request itself rather than failing to serve it: a bad
// request (InvalidArgument: a block above the member's limits.max_block_bytes, a layout or key set it
// will not take) or one it will not serve to this caller (PermissionDenied, Unauthenticated). No
// retry and no other member would answer it otherwise, so the call returns it (client.h, "Errors");
// every other failure (Unavailable, DeadlineExceeded, Cancelled, ...) is a dead or slow member and
// becomes per-block misses from error / kError.
bool IsRefusal(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kPermissionDenied ||
         code == absl::StatusCode::kUnauthenticated;
}

// The first refusal among a call's RPCs (IsRefusal), recorded by the call's threads.
class CallRefusal {
 public:
  void Record(absl::Status refusal) {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_.ok()) first_ = std::move(refusal);
  }
  bool refused() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !first_.ok();
  }
  absl::Status status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_;
  }

 private:
  mutable std::mutex mu_;
  absl::Status first_;  // guarded by mu_
};

}  // namespace

class Client::Impl {
 public:
  ClientOptions options;
  grpc::ChannelArguments channel_args;
  wire::ChannelSecurity security;                         // TLS and token of every member's channel
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // made from `security` at Connect
  ClientStats stats;
  std::mutex ucx_mu;
  std::unique_ptr<UcxClient> ucx;  // guarded by ucx_mu until created; created once, on first need
  bool ucx_failed = false;         // guarded by ucx_mu: UCX could not start here

  // Every member: static ones first, then DNS ones. Written only by Connect and the refresher thread.
  mutable std::mutex members_mu;
  std::vector<std::shared_ptr<Member>> members;  // guarded by members_mu

  mutable std::mutex view_mu;
  std::shared_ptr<const RingView> view;  // guarded by view_mu; never null after Connect
  uint64_t ring_version = 0;             // guarded by view_mu

  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;  // guarded by stop_mu
  std::thread refresher;

  // Replication (docs/architecture.md "Replication"); created by Connect, uses the members and ring.
  std::unique_ptr<Replicator> replicator;
  std::atomic<uint64_t> read_calls{0};  // spreads hot-block reads over their owners (round robin)
  // Hot blocks: shallow blocks this client has read (Get hits) and given read replicas (PromoteHot).
  static constexpr size_t kMaxHotBlocks = 65536;
  std::mutex hot_mu;
  absl::flat_hash_set<Fingerprint> hot_blocks;  // guarded by hot_mu
  std::deque<Fingerprint> hot_order;            // guarded by hot_mu; oldest first

  ~Impl() {
    replicator.reset();  // its thread puts through the members and the ring: stop it first
    {
      std::lock_guard<std::mutex> lock(stop_mu);
      stopping = true;
    }
    stop_cv.notify_all();
    if (refresher.joinable()) refresher.join();
    // Members close their UCX endpoints as they go, so they go before the UCX client.
    {
      std::lock_guard<std::mutex> lock(view_mu);
      view.reset();
    }
    {
      std::lock_guard<std::mutex> lock(members_mu);
      members.clear();
    }
    ucx.reset();
  }

  std::shared_ptr<const RingView> View() const {
    std::lock_guard<std::mutex> lock(view_mu);
    return view;
  }

  std::vector<std::shared_ptr<Member>> Members() const {
    std::lock_guard<std::mutex> lock(members_mu);
    return members;
  }

  UcxClient* Ucx() {
    std::lock_guard<std::mutex> lock(ucx_mu);
    if (ucx == nullptr && !ucx_failed) {
      auto created = UcxClient::Create(options.ucx_transports, options.ucx_get_lanes);
      if (created.ok()) {
        ucx = std::move(created).value();
      } else {
        ucx_failed = true;
      }
    }
    return ucx.get();
  }

  // The UCX endpoint to move member's bytes over, connecting (GetInfo, then a UCX hello, both by
  // `deadline` and at most rpc_timeout) when there is none and the backoff has passed; nullopt: use gRPC
  // bytes (or fail, with transport "ucx"). One caller connects at a time, without holding the lock, and
  // the others do not queue behind it: with transport "auto" they move their bytes over gRPC meanwhile,
  // with "ucx" they wait for its outcome until their own deadline.
  std::optional<UcxClient::EndpointId> UcxEndpoint(Member& member, absl::Time deadline) {
    if (options.transport == "grpc") return std::nullopt;
    UcxPeer& peer = *member.ucx;
    std::unique_lock<std::mutex> lock(peer.mu);
    while (peer.state == UcxPeer::State::kConnecting) {
      if (options.transport != "ucx" ||
          peer.connected.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout) {
        if (peer.state == UcxPeer::State::kConnecting) return std::nullopt;
      }
    }
    if (peer.state == UcxPeer::State::kReady) {
      if (!peer.ticket.empty() && !peer.renewing && absl::Now() >= peer.renew_at) {
        RenewUcxSession(member, lock);
        if (peer.state != UcxPeer::State::kReady) return std::nullopt;  // failed meanwhile
      }
      return peer.endpoint;
    }
    if (absl::Now() < peer.retry_after) return std::nullopt;
    peer.state = UcxPeer::State::kConnecting;
    lock.unlock();
    const absl::Time until = std::min(deadline, absl::Now() + options.rpc_timeout);
    UcxPeer::State outcome = UcxPeer::State::kDown;
    std::optional<UcxClient::Connection> connection;
    UcxClient* ucx_client = nullptr;
    v1::GetInfoResponse info;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(until));
    if (member.admin->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok()) {
      ucx_client = info.ucx_port() != 0 ? Ucx() : nullptr;
      outcome = ucx_client == nullptr ? UcxPeer::State::kUnsupported : UcxPeer::State::kDown;
    }
    std::optional<v1::OpenUcxSessionResponse> session;
    if (ucx_client != nullptr && UcxNeedsSession()) {
      session = OpenUcxSession(member, until);
      if (!session.has_value()) {
        ucx_client = nullptr;
        outcome = UcxPeer::State::kUnsupported;  // asked again after kUcxUnsupportedRecheck
      }
    }
    if (ucx_client != nullptr) {
      const std::string target = UcxTarget(member.address, info);
      const std::string node_id = member.NodeId();
      auto conn = ucx_client->Connect(target, until, session.has_value() ? session->ticket() : "");
      if (conn.status().code() == absl::StatusCode::kPermissionDenied) {
        KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                         "kvtier-client: member {} refused the UCX session ({}); its bytes go over gRPC",
                         member.address, std::string(conn.status().message()));
        outcome = UcxPeer::State::kUnsupported;
      }
      if (conn.ok() && (node_id.empty() || conn->node_id == node_id)) {
        connection = *conn;
        outcome = UcxPeer::State::kReady;
      } else if (conn.ok()) {
        ucx_client->Close(conn->endpoint);  // another server answers at that port
      }
    }
    lock.lock();
    peer.state = outcome;
    // The backoff counts from the end of this attempt: a slow attempt must not let the next caller in
    // at once.
    peer.retry_after = absl::Now() + (outcome == UcxPeer::State::kUnsupported ? kUcxUnsupportedRecheck
                                                                              : options.ucx_reconnect_backoff);
    if (outcome == UcxPeer::State::kReady) {
      peer.endpoint = connection->endpoint;
      peer.client = ucx_client;
      peer.takes_leases = connection->takes_leases;
      peer.takes_puts = connection->takes_puts;
      peer.ticket = session.has_value() ? session->ticket() : "";
      peer.renew_at =
          session.has_value() ? absl::Now() + absl::Milliseconds(session->ttl_ms()) / 2 : absl::InfiniteFuture();
      stats.ucx_connects.fetch_add(1, std::memory_order_relaxed);
    }
    peer.connected.notify_all();
    if (outcome != UcxPeer::State::kReady) return std::nullopt;
    return peer.endpoint;
  }

  // A member's UCX endpoints must present a session ticket when this client authenticates on gRPC (a
  // token or TLS): the server then requires one.
  bool UcxNeedsSession() const { return !security.auth_token.empty() || !security.ca_file.empty(); }

  // A new UCX session of `member` over its gRPC channel (the token and TLS of every call), or nullopt
  // (logged, rate limited): the member's bytes then go over gRPC.
  std::optional<v1::OpenUcxSessionResponse> OpenUcxSession(Member& member, absl::Time deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::OpenUcxSessionResponse resp;
    const grpc::Status st = member.cache->OpenUcxSession(&ctx, v1::OpenUcxSessionRequest(), &resp);
    if (!st.ok() || resp.ticket().empty()) {
      KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                       "kvtier-client: no UCX session from member {} ({}); its bytes go over gRPC", member.address,
                       st.ok() ? std::string("empty ticket") : st.error_message());
      return std::nullopt;
    }
    return resp;
  }

  // Renews the ready endpoint's session of `member` (peer.mu held by `lock`; released during the RPC).
  // A failed renewal keeps the old ticket and tries again after a backoff: the open endpoint stays
  // authenticated; only new lane endpoints need a live ticket.
  void RenewUcxSession(Member& member, std::unique_lock<std::mutex>& lock) {
    UcxPeer& peer = *member.ucx;
    peer.renewing = true;
    lock.unlock();
    auto session = OpenUcxSession(member, absl::Now() + options.rpc_timeout);
    lock.lock();
    peer.renewing = false;
    if (!session.has_value()) {
      peer.renew_at = absl::Now() + std::max(options.ucx_reconnect_backoff, absl::Seconds(1));
      return;
    }
    peer.renew_at = absl::Now() + absl::Milliseconds(session->ttl_ms()) / 2;
    if (peer.state != UcxPeer::State::kReady) return;
    peer.ticket = session->ticket();
    peer.client->SetTicket(peer.endpoint, peer.ticket);
  }

  // Drops member's endpoint after an error or a missed deadline; the next call after the backoff
  // reconnects.
  void UcxEndpointFailed(Member& member, UcxClient::EndpointId endpoint) {
    UcxPeer& peer = *member.ucx;
    std::lock_guard<std::mutex> lock(peer.mu);
    if (peer.state != UcxPeer::State::kReady || peer.endpoint != endpoint) return;
    peer.state = UcxPeer::State::kDown;
    peer.retry_after = absl::Now() + options.ucx_reconnect_backoff;
    ucx->Close(endpoint);
    stats.ucx_endpoint_failures.fetch_add(1, std::memory_order_relaxed);
  }

  // Returns a lease now rather than at its expiry; best effort within the call's `deadline`: a lease not
  // released expires by itself (its TTL), so a member that stopped answering must not hold the caller
  // past its deadline here.
  // `lease_id`: as the server sent it (empty: no lease).
  void ReleaseLease(Member& member, const std::string& lease_id, absl::Time deadline) {
    if (lease_id.empty() || absl::Now() >= deadline) return;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::ReleaseRequest req;
    req.add_lease_ids(lease_id);
    v1::ReleaseResponse resp;
    (void)member.cache->Release(&ctx, req, &resp);
  }

  // Get of one owner's batch over UCX: a kLease message (an endpoint whose hello offered leases) or the unary Lease
  // RPC takes the lease, then the server sends the present blocks straight into `buffers` and releases
  // the lease.
  // Returns false, with nothing done to `results`, when the member answered the lease only over gRPC (a
  // kLease unanswered in time, its endpoint dropped): the caller may move these bytes over gRPC instead.
  // A lease the member refused (IsRefusal) is recorded in `refusal`.
  bool GetOverUcx(Member& member, UcxClient::EndpointId endpoint, const v1::Namespace& pns,
                  std::span<const BlockKey> keys, std::span<const uint32_t> idx, uint64_t block_bytes,
                  std::span<const std::span<std::byte>> buffers, std::span<GetResult> results, absl::Time deadline,
                  CallRefusal& refusal) {
    v1::ReadRequest req;
    *req.mutable_namespace_() = pns;
    wire::EncodeKeys(keys, req.mutable_keys());
    v1::ReadResponse head;
    bool got = false;
    bool over_ucx = false;
    {
      std::lock_guard<std::mutex> lock(member.ucx->mu);
      over_ucx = member.ucx->takes_leases && member.ucx->endpoint == endpoint;
    }
    // A server that went away shows first on its gRPC connection (closed by its kernel), while a UCX
    // message to it is only answered by the deadline: lease over gRPC then, which fails at once.
    over_ucx = over_ucx && member.channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
    if (over_ucx) {  // the endpoint's session may lease: no gRPC round trip
      // A lease is answered in well under a millisecond; one not answered within a quarter of the call's
      // time (at least 100 ms) is taken as a dead server and asked of gRPC, which fails at once then. A
      // server that answers there was only slow (a loaded machine): its bytes come over gRPC this time.
      const absl::Time ucx_deadline =
          std::min(deadline, absl::Now() + std::max(absl::Milliseconds(100), options.rpc_timeout / 4));
      auto answer = ucx->Lease(endpoint, req.SerializeAsString(), ucx_deadline);
      got = answer.ok() && head.ParseFromString(*answer) && static_cast<size_t>(head.blocks_size()) == idx.size();
      stats.ucx_leases.fetch_add(got ? 1 : 0, std::memory_order_relaxed);
      if (!answer.ok() && IsRefusal(answer.status().code())) {
        stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        refusal.Record(member.Refused("Lease", answer.status()));
        return true;  // the endpoint is fine: the member answered
      }
      if (!got && !answer.ok() && answer.status().code() == absl::StatusCode::kDeadlineExceeded) {
        head.Clear();
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(deadline));
        const grpc::Status st = member.cache->Lease(&ctx, req, &head);
        got = st.ok() && static_cast<size_t>(head.blocks_size()) == idx.size();
        if (got) {  // a slow server, not a dead one: its UCX endpoint was dropped, so gRPC bytes this time
          ReleaseLease(member, head.lease_id(), deadline);
          UcxEndpointFailed(member, endpoint);
          return false;
        }
        if (IsRefusal(wire::FromGrpc(st).code())) refusal.Record(member.Refused("Lease", wire::FromGrpc(st)));
      }
    } else {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      const grpc::Status st = member.cache->Lease(&ctx, req, &head);
      got = st.ok() && static_cast<size_t>(head.blocks_size()) == idx.size();
      if (IsRefusal(wire::FromGrpc(st).code())) {
        stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        refusal.Record(member.Refused("Lease", wire::FromGrpc(st)));
        return true;  // the endpoint is fine: the member answered
      }
    }
    if (!got) {
      stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      ReleaseLease(member, head.lease_id(), deadline);
      // The control plane is how a dead server shows (UCX endpoints run without peer failure handling):
      // reconnect after the backoff, so that a restarted server gets a fresh endpoint.
      UcxEndpointFailed(member, endpoint);
      return true;  // all kMissFromError
    }
    std::vector<uint32_t> indices;  // lease indices to fetch
    std::vector<std::span<std::byte>> bufs;
    std::vector<size_t> positions;  // k of each fetched block
    bool protocol_ok = true;
    for (size_t k = 0; k < idx.size(); ++k) {
      const v1::BlockStatus& st = head.blocks(static_cast<int>(k));
      if (!st.present()) {
        results[idx[k]] = GetResult::kMiss;
      } else if (st.size_bytes() != block_bytes) {
        protocol_ok = false;  // stays kMissFromError
      } else {
        indices.push_back(static_cast<uint32_t>(k));
        bufs.push_back(buffers[idx[k]]);
        positions.push_back(k);
      }
    }
    if (!protocol_ok) stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
    if (indices.empty()) {
      ReleaseLease(member, head.lease_id(), deadline);
      return true;
    }
    // Each block's checksum is verified as soon as it lands, while the next ones are still moving (from a
    // member on this node, on the get lane that received it: several j at once).
    std::vector<uint8_t> verified(indices.size(), 0);
    auto verify = [&](size_t j) {
      const size_t k = positions[j];
      const uint32_t i = idx[k];
      results[i] = BlockChecksum(buffers[i].data(), block_bytes) == head.blocks(static_cast<int>(k)).checksum()
                       ? GetResult::kHit
                       : GetResult::kChecksumMismatch;
      verified[j] = 1;
    };
    const UcxClient::TransferResult r =
        ucx->Get(endpoint, CapabilityId::FromWire(head.lease_id()), /*release=*/true, indices, bufs, deadline, verify);
    uint64_t arrived = 0;
    for (size_t j = 0; j < indices.size(); ++j) {
      if (r.items[j] != UcxClient::ItemStatus::kOk) {
        results[idx[positions[j]]] = GetResult::kMissFromError;  // whatever a verify saw, it did not finish in time
        continue;
      }
      ++arrived;
      if (verified[j] == 0) verify(j);
    }
    stats.ucx_get_blocks.fetch_add(arrived, std::memory_order_relaxed);
    if (r.on_lanes) stats.ucx_lane_get_blocks.fetch_add(arrived, std::memory_order_relaxed);
    if (r.endpoint_failed) {
      stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      UcxEndpointFailed(member, endpoint);
      ReleaseLease(member, head.lease_id(), deadline);  // the server may never have seen the request
    }
    return true;
  }

  // Reads `keys` (block idx[k] of the call) from `member` into buffers[idx[k]] and sets results[idx[k]]
  // (left kMissFromError when the owner fails or misses `deadline`). A refusal of the request
  // (IsRefusal) is recorded in `refusal`.
  void ReadBatch(Member& member, const v1::Namespace& pns, std::span<const BlockKey> keys,
                 std::span<const uint32_t> idx, uint64_t block_bytes, std::span<const std::span<std::byte>> buffers,
                 std::span<GetResult> results, absl::Time deadline, CallRefusal& refusal) {
    v1::ReadRequest req;
    *req.mutable_namespace_() = pns;
    if (options.transport != "grpc") {
      if (auto endpoint = UcxEndpoint(member, deadline);
          endpoint.has_value() &&
          GetOverUcx(member, *endpoint, pns, keys, idx, block_bytes, buffers, results, deadline, refusal)) {
        return;
      }
      if (options.transport == "ucx") {  // no fallback: these blocks are misses from error
        stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    wire::EncodeKeys(keys, req.mutable_keys());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    auto reader = member.cache->Read(&ctx, req);
    v1::ReadResponse msg;
    std::vector<uint64_t> received(idx.size(), 0);
    std::vector<v1::BlockStatus> status;
    bool protocol_ok = true;
    const bool have_head = reader->Read(&msg);  // false: the stream ended, with an error (Finish says which)
    if (have_head && static_cast<size_t>(msg.blocks_size()) == idx.size()) {
      status.assign(msg.blocks().begin(), msg.blocks().end());
      while (reader->Read(&msg)) {
        const uint32_t k = msg.index();
        if (k >= idx.size() || !status[k].present() || msg.offset() != received[k] ||
            msg.data().size() > block_bytes - received[k]) {
          protocol_ok = false;  // keep draining; these blocks stay errors
          continue;
        }
        std::memcpy(buffers[idx[k]].data() + received[k], msg.data().data(), msg.data().size());
        received[k] += msg.data().size();
      }
    } else {
      protocol_ok = false;
      if (have_head) ctx.TryCancel();  // don't wait for the rest of a stream we cannot use
    }
    const grpc::Status st = reader->Finish();
    if (!st.ok() || !protocol_ok) stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
    if (const absl::Status s = wire::FromGrpc(st); IsRefusal(s.code())) refusal.Record(member.Refused("Read", s));
    for (size_t k = 0; k < idx.size(); ++k) {
      const uint32_t i = idx[k];
      if (k < status.size() && !status[k].present()) {
        results[i] = GetResult::kMiss;
      } else if (k < status.size() && received[k] == block_bytes && status[k].size_bytes() == block_bytes) {
        if (BlockChecksum(buffers[i].data(), block_bytes) == status[k].checksum()) {
          results[i] = GetResult::kHit;
        } else {
          results[i] = GetResult::kChecksumMismatch;
        }
      } else {
        results[i] = GetResult::kMissFromError;
      }
    }
  }

  // Two-phase put of one batch to `member`: keys[k] from blocks[k] (each block_bytes long, borrowed for
  // the call) at prefix depth depths[k]. Sets results[k]; they stay kError when the owner fails.
  // Returns OK, or the member's refusal of the request (IsRefusal; results then say nothing).
  absl::Status PutBatch(Member& member, const v1::Namespace& pns, std::span<const BlockKey> keys,
                        std::span<const uint32_t> depths, std::span<const std::span<const std::byte>> blocks,
                        uint64_t block_bytes, std::span<PutResult> results,
                        std::span<const BlockMeta* const> block_meta = {}) {
    v1::CacheService::Stub& stub = *member.cache;
    std::optional<UcxClient::EndpointId> ucx_endpoint;
    if (options.transport != "grpc") {
      ucx_endpoint = UcxEndpoint(member, absl::Now() + options.rpc_timeout);
      if (!ucx_endpoint.has_value() && options.transport == "ucx") {
        stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        return absl::OkStatus();  // no fallback: all kError
      }
    }
    // Reserve and commit over the endpoint too when its session takes them (no gRPC round trip), as a
    // get takes its lease (GetOverUcx); gRPC is the fallback.
    bool control_over_ucx = false;
    if (ucx_endpoint.has_value()) {
      std::lock_guard<std::mutex> lock(member.ucx->mu);
      control_over_ucx = member.ucx->takes_puts && member.ucx->endpoint == *ucx_endpoint;
    }
    control_over_ucx = control_over_ucx && member.channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
    // Phase 1: reserve.
    v1::AllocateRequest areq;
    *areq.mutable_namespace_() = pns;
    wire::EncodeKeys(keys, areq.mutable_keys());
    areq.mutable_depths()->Add(depths.begin(), depths.end());
    for (const BlockMeta* m : block_meta) wire::ToProto(*m, areq.add_block_meta());
    v1::AllocateResponse aresp;
    bool reserved = false;
    if (control_over_ucx) {
      // The call's whole deadline, as the Allocate RPC gets: reserving may evict (and spill) first. A
      // reservation the server made for an answer that came too late holds the keys until its
      // reservation_ttl, so a late answer is not retried over gRPC (it would find them in progress):
      // this batch's blocks are errors. An endpoint that failed before answering is retried over gRPC.
      auto answer = ucx->Allocate(*ucx_endpoint, areq.SerializeAsString(), absl::Now() + options.rpc_timeout);
      if (!answer.ok() && IsRefusal(answer.status().code())) {
        stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        return member.Refused("Allocate", answer.status());  // it answered: the endpoint is fine
      }
      reserved =
          answer.ok() && aresp.ParseFromString(*answer) && static_cast<size_t>(aresp.results_size()) == keys.size();
      stats.ucx_allocates.fetch_add(reserved ? 1 : 0, std::memory_order_relaxed);
      if (!reserved) {
        aresp.Clear();
        UcxEndpointFailed(member, *ucx_endpoint);
        ucx_endpoint.reset();  // this batch's bytes go over gRPC
        control_over_ucx = false;
        if (options.transport == "ucx" || answer.status().code() == absl::StatusCode::kDeadlineExceeded) {
          stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
          return absl::OkStatus();  // all kError
        }
      }
    }
    if (!reserved) {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      const absl::Status st = wire::FromGrpc(stub.Allocate(&ctx, areq, &aresp));
      if (!st.ok() || static_cast<size_t>(aresp.results_size()) != keys.size()) {
        stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        if (IsRefusal(st.code())) return member.Refused("Allocate", st);         // it answered: the endpoint is fine
        if (ucx_endpoint.has_value()) UcxEndpointFailed(member, *ucx_endpoint);  // see GetOverUcx
        return absl::OkStatus();                                                 // all kError
      }
    }
    std::vector<uint32_t> allocated;  // positions k within keys
    for (size_t k = 0; k < keys.size(); ++k) {
      switch (aresp.results(static_cast<int>(k))) {
        case v1::ALLOCATE_RESULT_ALLOCATED:
          allocated.push_back(static_cast<uint32_t>(k));
          break;
        case v1::ALLOCATE_RESULT_ALREADY_PRESENT:
          results[k] = PutResult::kAlreadyPresent;
          break;
        case v1::ALLOCATE_RESULT_IN_PROGRESS:
          results[k] = PutResult::kInProgress;
          break;
        case v1::ALLOCATE_RESULT_NO_SPACE:
          results[k] = PutResult::kNoSpace;
          break;
        default:
          results[k] = PutResult::kError;
          break;
      }
    }
    if (allocated.empty()) return absl::OkStatus();
    // Phase 1b: the bytes into the reserved slots: over UCX straight into them, or streamed over gRPC.
    auto ComputeChecksums = [&] {
      std::vector<uint64_t> sums(keys.size(), 0);
      for (uint32_t k : allocated) sums[k] = BlockChecksum(blocks[k].data(), block_bytes);
      return sums;
    };
    std::vector<uint64_t> checksums;
    bool ok = true;
    absl::Status refused;  // a refusal of WriteBlocks or Commit (IsRefusal)
    if (ucx_endpoint.has_value()) {
      std::vector<uint32_t> indices(allocated.begin(), allocated.end());
      std::vector<std::span<const std::byte>> data;
      for (uint32_t k : allocated) data.push_back(blocks[k]);
      // The commit's checksums are computed while the bytes move.
      const UcxClient::TransferResult r =
          ucx->Put(*ucx_endpoint, CapabilityId::FromWire(aresp.reservation_id()), indices, data,
                   absl::Now() + options.rpc_timeout, [&] { checksums = ComputeChecksums(); });
      uint64_t taken = 0;
      for (auto item : r.items) taken += item == UcxClient::ItemStatus::kOk;
      stats.ucx_put_blocks.fetch_add(taken, std::memory_order_relaxed);
      if (r.endpoint_failed) {
        UcxEndpointFailed(member, *ucx_endpoint);
        ok = false;  // abort below; blocks the server did not take come back INCOMPLETE otherwise
      }
    } else {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      v1::WriteBlocksResponse wresp;
      auto writer = stub.WriteBlocks(&ctx, &wresp);
      v1::WriteBlocksRequest chunk;
      chunk.set_reservation_id(aresp.reservation_id());
      for (uint32_t k : allocated) {
        const std::span<const std::byte> b = blocks[k];
        for (uint64_t off = 0; ok && off < b.size(); off += options.stream_chunk_bytes) {
          const uint64_t n = std::min<uint64_t>(options.stream_chunk_bytes, b.size() - off);
          chunk.set_index(k);
          chunk.set_offset(off);
          chunk.set_data(reinterpret_cast<const char*>(b.data() + off), n);
          ok = writer->Write(chunk);
        }
        if (!ok) break;
      }
      writer->WritesDone();
      const absl::Status st = wire::FromGrpc(writer->Finish());
      if (IsRefusal(st.code())) refused = member.Refused("WriteBlocks", st);
      ok = st.ok() && ok;
    }
    // Phase 2: commit with checksums (entries for keys not allocated are ignored by the server).
    v1::CommitRequest creq;
    creq.set_reservation_id(aresp.reservation_id());
    if (checksums.empty()) checksums = ComputeChecksums();
    creq.mutable_checksums()->Add(checksums.begin(), checksums.end());
    v1::CommitResponse cresp;
    bool committed = false;
    if (ok && control_over_ucx && ucx_endpoint.has_value()) {
      auto answer = ucx->Commit(*ucx_endpoint, creq.SerializeAsString(), absl::Now() + options.rpc_timeout);
      if (!answer.ok() && IsRefusal(answer.status().code())) {
        refused = member.Refused("Commit", answer.status());
        ok = false;
      } else if (answer.ok()) {
        committed = cresp.ParseFromString(*answer) && static_cast<size_t>(cresp.results_size()) == keys.size();
        ok = committed;
      } else {
        // No answer: the endpoint is dropped and gRPC asked. A commit that did happen meanwhile makes
        // this one fail (an unknown reservation): its blocks then count as errors, though stored.
        UcxEndpointFailed(member, *ucx_endpoint);
        cresp.Clear();
      }
      stats.ucx_commits.fetch_add(committed ? 1 : 0, std::memory_order_relaxed);
    }
    if (ok && !committed) {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      const absl::Status st = wire::FromGrpc(stub.Commit(&ctx, creq, &cresp));
      if (IsRefusal(st.code())) refused = member.Refused("Commit", st);
      ok = st.ok() && static_cast<size_t>(cresp.results_size()) == keys.size();
    }
    if (!ok) {
      stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      // Best effort: return the slots now rather than at reservation expiry.
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      v1::AbortRequest abreq;
      abreq.set_reservation_id(aresp.reservation_id());
      v1::AbortResponse abresp;
      (void)stub.Abort(&ctx, abreq, &abresp);
      return refused;  // the allocated blocks stay kError
    }
    uint64_t mismatched = 0;
    for (uint32_t k : allocated) {
      const auto r = cresp.results(static_cast<int>(k));
      results[k] = r == v1::COMMIT_RESULT_COMMITTED ? PutResult::kStored : PutResult::kError;
      mismatched += r == v1::COMMIT_RESULT_CHECKSUM_MISMATCH;
    }
    // The server saw other bytes than we sent: count it like a corrupt read.
    stats.checksum_failures.fetch_add(mismatched, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  void SetDeadline(grpc::ClientContext& ctx) const {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
  }

  // Groups by primary owner on `view`, then splits each group into batches of at most `batch` blocks
  // (default: max_blocks_per_request); batches of one owner are adjacent.
  OwnerGroups GroupByOwner(const RingView& view, std::span<const Fingerprint> fps, std::span<const uint32_t> indices,
                           size_t batch = 0) const {
    if (batch == 0) batch = options.max_blocks_per_request;
    absl::flat_hash_map<uint32_t, size_t> slot;
    OwnerGroups groups;
    for (uint32_t i : indices) {
      const uint32_t m = view.ring.Primary(fps[i]);
      auto [it, inserted] = slot.try_emplace(m, groups.size());
      if (inserted) groups.push_back({m, {}});
      groups[it->second].second.push_back(i);
    }
    // Split batches above the per-request limit.
    OwnerGroups out;
    for (auto& [m, idx] : groups) {
      for (size_t off = 0; off < idx.size(); off += batch) {
        const size_t end = std::min(idx.size(), off + batch);
        out.push_back({m, std::vector<uint32_t>(idx.begin() + off, idx.begin() + end)});
      }
    }
    return out;
  }

  // Runs fn(g) for each group, in parallel threads beyond the first, and waits for all.
  template <typename Fn>
  static void ForEachParallel(size_t n, Fn fn) {
    std::vector<std::future<void>> rest;
    for (size_t g = 1; g < n; ++g) rest.push_back(std::async(std::launch::async, [&fn, g] { fn(g); }));
    if (n > 0) fn(0);
    for (auto& f : rest) f.get();
  }

  // ---- Replication (docs/architecture.md "Replication"): owners per block, read fail-over, replica puts.

  // R for `ns`: the first matching replication_overrides entry, else replication_factor.
  uint32_t ReplicationFactor(const Namespace& ns) const {
    for (const ClientOptions::ReplicationOverride& o : options.replication_overrides) {
      if (o.tenant == ns.tenant && (o.model.empty() || o.model == ns.model)) return o.replication_factor;
    }
    return options.replication_factor;
  }

  // Whether a block at `depth` may become hot (a read replica candidate).
  bool ShallowEnough(uint64_t depth) const { return options.hot_read_replicas > 0 && depth < options.hot_depth; }

  // Marks `fp` hot; false when it already was. The set keeps the kMaxHotBlocks most recently marked.
  bool MarkHot(const Fingerprint& fp) {
    std::lock_guard<std::mutex> lock(hot_mu);
    if (!hot_blocks.insert(fp).second) return false;
    hot_order.push_back(fp);
    if (hot_order.size() > kMaxHotBlocks) {
      hot_blocks.erase(hot_order.front());
      hot_order.pop_front();
    }
    return true;
  }

  // Which owners a read asks for each block, in order.
  struct ReadPlan {
    std::vector<std::vector<uint32_t>> owners;  // per block: ring indices; owners[i][0] is asked first
    // Per block: a miss at the first attempt goes on to the next owner (the primary) too: a hot block
    // read from one of its read replicas, which may not have it yet.
    std::vector<bool> retry_miss;

    // Most owners left to ask, this attempt's included, among blocks `idx` at `attempt`.
    size_t OwnersLeft(std::span<const uint32_t> idx, size_t attempt) const {
      size_t left = 1;
      for (uint32_t i : idx) left = std::max(left, owners[i].size() - attempt);
      return left;
    }
  };

  // The primary first, then the other replicas clockwise. A hot block (marked by MarkHot) is read first
  // from one of its R + hot_read_replicas owners, a different one on each call (round robin), so that
  // its reads spread over all of them; then from the primary and the rest in ring order.
  ReadPlan PlanReads(const RingView& view, const Namespace& ns, std::span<const Fingerprint> fps,
                     uint64_t first_depth) {
    const uint32_t r = ReplicationFactor(ns);
    ReadPlan plan;
    plan.owners.resize(fps.size());
    plan.retry_miss.resize(fps.size());
    std::vector<bool> hot(fps.size(), false);
    if (options.hot_read_replicas > 0) {
      std::lock_guard<std::mutex> lock(hot_mu);
      for (size_t i = 0; i < fps.size() && ShallowEnough(first_depth + i); ++i) hot[i] = hot_blocks.contains(fps[i]);
    }
    const uint64_t spread = options.hot_read_replicas > 0 ? read_calls.fetch_add(1, std::memory_order_relaxed) : 0;
    for (size_t i = 0; i < fps.size(); ++i) {
      std::vector<uint32_t>& o = plan.owners[i];
      o = view.ring.Owners(fps[i], r + (hot[i] ? options.hot_read_replicas : 0));
      const size_t pick = hot[i] ? spread % o.size() : 0;
      if (pick != 0) {
        std::rotate(o.begin(), o.begin() + static_cast<ptrdiff_t>(pick), o.begin() + static_cast<ptrdiff_t>(pick) + 1);
        plan.retry_miss[i] = true;
      }
    }
    return plan;
  }

  // After a Get: each block at depth < hot_depth that was a hit and is not hot yet becomes hot, and a copy
  // of it (from the caller's buffer) is queued for its hot_read_replicas extra owners. Hits mark blocks
  // hot because reuse is what makes a block hot: a shallow block of a prompt seen once is not.
  void PromoteHot(const RingView& view, const Namespace& ns, std::span<const Fingerprint> fps, uint32_t shard,
                  std::span<const std::span<std::byte>> buffers, uint64_t first_depth,
                  std::span<const GetResult> results) {
    if (replicator == nullptr || options.hot_read_replicas == 0) return;
    const uint32_t r = ReplicationFactor(ns);
    absl::flat_hash_map<uint32_t, ReplicaTask> tasks;  // by ring index
    for (size_t i = 0; i < fps.size() && ShallowEnough(first_depth + i); ++i) {
      if (results[i] != GetResult::kHit || !MarkHot(fps[i])) continue;
      const std::vector<uint32_t> owners = view.ring.Owners(fps[i], r + options.hot_read_replicas);
      if (owners.size() <= r) continue;
      auto bytes = std::make_shared<const std::vector<std::byte>>(buffers[i].begin(), buffers[i].end());
      for (size_t o = r; o < owners.size(); ++o) {
        auto [it, inserted] = tasks.try_emplace(owners[o]);
        if (inserted) {
          it->second.node_id = view.ring.node_ids()[owners[o]];
          it->second.ns = ns;
          it->second.shard = shard;
        }
        it->second.blocks.push_back(
            {.fingerprint = fps[i], .depth = static_cast<uint32_t>(first_depth + i), .bytes = bytes});
      }
    }
    for (auto& [m, task] : tasks) (void)replicator->Enqueue(std::move(task));
  }

  // Blocks `pending` grouped by the owner each asks at `attempt` (plan.owners[i][attempt]), in batches of
  // at most `batch`; batches of one owner are adjacent.
  static OwnerGroups GroupByAttempt(const ReadPlan& plan, std::span<const uint32_t> pending, size_t attempt,
                                    size_t batch) {
    absl::flat_hash_map<uint32_t, size_t> slot;
    OwnerGroups groups;
    for (uint32_t i : pending) {
      const uint32_t m = plan.owners[i][attempt];
      auto [it, inserted] = slot.try_emplace(m, groups.size());
      if (inserted) groups.push_back({m, {}});
      groups[it->second].second.push_back(i);
    }
    OwnerGroups out;
    for (auto& [m, idx] : groups) {
      for (size_t off = 0; off < idx.size(); off += batch) {
        const size_t end = std::min(idx.size(), off + batch);
        out.push_back({m, std::vector<uint32_t>(idx.begin() + off, idx.begin() + end)});
      }
    }
    return out;
  }

  // Deadline of an RPC whose blocks have at most `owners_left` owners left to ask (its own included):
  // an even share of what is left of the call's budget, so that a silent primary leaves time for the
  // replicas; the last owner gets all of it.
  // The deadline of a call that started at `start`: rpc_timeout later, less a reserve for assembling the
  // result after the last RPC returns (2% of rpc_timeout, between 2 and 20 ms), so that the call itself
  // returns within rpc_timeout even when an owner hangs until its deadline.
  static absl::Time CallDeadline(absl::Time start, absl::Duration rpc_timeout) {
    const absl::Duration reserve = std::clamp(rpc_timeout / 50, absl::Milliseconds(2), absl::Milliseconds(20));
    return start + std::max(rpc_timeout - reserve, rpc_timeout / 2);
  }

  static absl::Time AttemptDeadline(absl::Time call_deadline, size_t owners_left) {
    const absl::Time now = absl::Now();
    if (owners_left <= 1 || call_deadline <= now) return call_deadline;
    return now + (call_deadline - now) / static_cast<int64_t>(owners_left);
  }

  // The member in the ring now under `node_id`; null when there is none.
  static std::shared_ptr<Member> RingMember(const RingView& view, const std::string& node_id) {
    for (size_t r = 0; r < view.owners.size(); ++r) {
      if (view.ring.node_ids()[r] == node_id) return view.owners[r];
    }
    return nullptr;
  }

  // The Replicator's put: `task` to its owner on the ring now, in put_batch_blocks batches.
  // Errors: Unavailable (the owner is not in the ring), or the owner's refusal (IsRefusal).
  absl::StatusOr<std::vector<PutResult>> PutReplica(const ReplicaTask& task) {
    const std::shared_ptr<const RingView> view = View();
    const std::shared_ptr<Member> member = RingMember(*view, task.node_id);
    if (member == nullptr) return absl::UnavailableError(absl::StrCat("member ", task.node_id, " is not in the ring"));
    v1::Namespace pns;
    wire::ToProto(task.ns, &pns);
    const uint64_t block_bytes = task.ns.layout.ShardBytes();
    std::vector<PutResult> results(task.blocks.size(), PutResult::kError);
    const size_t batch = std::min(options.max_blocks_per_request, options.put_batch_blocks);
    for (size_t off = 0; off < task.blocks.size(); off += batch) {
      const size_t end = std::min(task.blocks.size(), off + batch);
      std::vector<BlockKey> keys;
      std::vector<uint32_t> depths;
      std::vector<std::span<const std::byte>> data;
      for (size_t k = off; k < end; ++k) {
        keys.push_back({task.blocks[k].fingerprint, task.shard});
        depths.push_back(task.blocks[k].depth);
        data.push_back(*task.blocks[k].bytes);
      }
      KVTIER_RETURN_IF_ERROR(
          PutBatch(*member, pns, keys, depths, data, block_bytes, std::span(results).subspan(off, end - off)));
      // An owner that failed a batch is down: leave the rest kError (hinted) rather than wait again.
      if (std::all_of(results.begin() + off, results.begin() + end, [](PutResult r) { return r == PutResult::kError; }))
        break;
    }
    return results;
  }

  bool InRing(const std::string& node_id) const { return RingMember(*View(), node_id) != nullptr; }

  // After Put's primary round: queues a copy of every block the primary stored, refused or could not
  // take (results[i] kStored, kNoSpace or kError) for each of its other owners on `view`, and hints the
  // blocks the primary could not take (kError) for the primary itself.
  void EnqueueReplicas(const RingView& view, const Namespace& ns, std::span<const Fingerprint> fps, uint32_t shard,
                       std::span<const std::span<const std::byte>> blocks, uint32_t first_block_index,
                       std::span<const PutResult> results) {
    if (replicator == nullptr || view.owners.size() < 2) return;
    const uint32_t r = ReplicationFactor(ns);
    if (r < 2) return;
    absl::flat_hash_map<uint32_t, ReplicaTask> tasks;          // by ring index
    std::vector<uint32_t> order;                               // ring indices in the order first seen
    absl::flat_hash_map<uint32_t, ReplicaTask> primary_hints;  // by ring index: primaries that failed
    for (size_t i = 0; i < fps.size(); ++i) {
      if (results[i] == PutResult::kAlreadyPresent || results[i] == PutResult::kInProgress) continue;
      const uint64_t depth = uint64_t{first_block_index} + i;
      const std::vector<uint32_t> owners = view.ring.Owners(fps[i], r);
      if (owners.size() < 2) continue;
      auto bytes = std::make_shared<const std::vector<std::byte>>(blocks[i].begin(), blocks[i].end());
      if (results[i] == PutResult::kError) {  // the primary is down: it gets the block when it returns
        auto [it, inserted] = primary_hints.try_emplace(owners[0]);
        if (inserted) {
          it->second.node_id = view.ring.node_ids()[owners[0]];
          it->second.ns = ns;
          it->second.shard = shard;
        }
        it->second.blocks.push_back({.fingerprint = fps[i], .depth = static_cast<uint32_t>(depth), .bytes = bytes});
      }
      for (size_t o = 1; o < owners.size(); ++o) {
        auto [it, inserted] = tasks.try_emplace(owners[o]);
        if (inserted) {
          it->second.node_id = view.ring.node_ids()[owners[o]];
          it->second.ns = ns;
          it->second.shard = shard;
          order.push_back(owners[o]);
        }
        it->second.blocks.push_back({.fingerprint = fps[i], .depth = static_cast<uint32_t>(depth), .bytes = bytes});
      }
    }
    for (uint32_t m : order) (void)replicator->Enqueue(std::move(tasks[m]));
    for (auto& [m, task] : primary_hints) replicator->HintNow(std::move(task));
  }

  // ---- Membership: the refresher thread's work (DNS, health checks, ring swaps).

  std::shared_ptr<Member> NewMember(const std::string& address, const std::string& configured_id, bool from_dns) const {
    return std::make_shared<Member>(address, configured_id, from_dns, channel_args, credentials, security);
  }

  // Asks each of `ms` its node id (GetInfo), all at once; records the ids that come back.
  void AskNodeIds(const std::vector<Member*>& ms, absl::Duration timeout, bool wait_for_ready) {
    std::vector<v1::GetInfoRequest> reqs(ms.size());
    std::vector<v1::GetInfoResponse> resps(ms.size());
    const std::vector<grpc::Status> statuses =
        RunAll(ms.size(), timeout, wait_for_ready, [&](size_t i, grpc::ClientContext* ctx, auto done) {
          ms[i]->admin->async()->GetInfo(ctx, &reqs[i], &resps[i], std::move(done));
        });
    for (size_t i = 0; i < ms.size(); ++i) {
      if (!statuses[i].ok() || resps[i].node_id().empty()) continue;
      std::lock_guard<std::mutex> lock(ms[i]->mu);
      ms[i]->node_id = resps[i].node_id();
    }
  }

  // Resolves members_dns and applies the answer: new addresses become members (asked their node id),
  // addresses gone from the answer leave. A failed resolution changes nothing.
  void RefreshDns() {
    auto resolved = ResolveMembers(options.members_dns, options.dns_server, options.dns_timeout);
    std::vector<std::string> addresses;
    if (resolved.ok()) {
      addresses = std::move(resolved).value();
    } else if (resolved.status().code() != absl::StatusCode::kNotFound) {
      stats.dns_failures.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    stats.dns_resolutions.fetch_add(1, std::memory_order_relaxed);
    const absl::flat_hash_set<std::string> wanted(addresses.begin(), addresses.end());
    absl::flat_hash_set<std::string> known;
    for (const auto& m : Members()) known.insert(m->address);
    std::vector<std::shared_ptr<Member>> added;
    for (const std::string& a : addresses) {
      if (known.insert(a).second) added.push_back(NewMember(a, "", /*from_dns=*/true));
    }
    std::vector<Member*> ask;
    for (const auto& m : added) ask.push_back(m.get());
    // No wait_for_ready: a member still starting is asked again by the health checks.
    AskNodeIds(ask, options.health_check_timeout, /*wait_for_ready=*/false);
    std::lock_guard<std::mutex> lock(members_mu);
    std::erase_if(members,
                  [&](const std::shared_ptr<Member>& m) { return m->from_dns && !wanted.contains(m->address); });
    members.insert(members.end(), added.begin(), added.end());
  }

  // One round of grpc.health.v1 checks of every member, at once; updates each member's health and asks
  // the node id of members that pass and need it (unknown, or returning from ejection).
  void CheckHealth() {
    const std::vector<std::shared_ptr<Member>> ms = Members();
    std::vector<grpc::health::v1::HealthCheckRequest> reqs(ms.size());
    std::vector<grpc::health::v1::HealthCheckResponse> resps(ms.size());
    const std::vector<grpc::Status> statuses =
        RunAll(ms.size(), options.health_check_timeout, /*wait_for_ready=*/false,
               [&](size_t i, grpc::ClientContext* ctx, auto done) {
                 ms[i]->health_stub->async()->Check(ctx, &reqs[i], &resps[i], std::move(done));
               });
    std::vector<Member*> ask;        // passed, and the node id is needed before it may be in the ring
    std::vector<Member*> returning;  // ejected members that passed healthy_threshold checks
    for (size_t i = 0; i < ms.size(); ++i) {
      Member& m = *ms[i];
      const bool pass = statuses[i].ok() && resps[i].status() == grpc::health::v1::HealthCheckResponse::SERVING;
      std::lock_guard<std::mutex> lock(m.mu);
      if (pass) {
        m.failures = 0;
        ++m.passes;
        m.last_error.clear();
        if (m.health == MemberHealth::kEjected) {
          if (m.passes >= options.healthy_threshold) {
            returning.push_back(&m);
            if (m.configured_id.empty()) ask.push_back(&m);  // a restarted server may report another id
          }
        } else {
          m.health = MemberHealth::kHealthy;
          if (m.node_id.empty()) ask.push_back(&m);
        }
        continue;
      }
      stats.health_check_failures.fetch_add(1, std::memory_order_relaxed);
      m.passes = 0;
      ++m.failures;
      m.last_error =
          statuses[i].ok()
              ? absl::StrCat("status ", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resps[i].status()))
              : wire::FromGrpc(statuses[i]).ToString();
      if (m.health != MemberHealth::kEjected && m.failures >= options.unhealthy_threshold) {
        m.health = MemberHealth::kEjected;
        stats.members_ejected.fetch_add(1, std::memory_order_relaxed);
      } else if (m.health == MemberHealth::kUnknown) {
        m.health = MemberHealth::kHealthy;  // in the ring until it reaches the threshold
      }
    }
    if (!ask.empty()) {
      // Forget the old id of a returning member first: if it does not answer now it stays out.
      for (Member* m : ask) {
        std::lock_guard<std::mutex> lock(m->mu);
        if (m->health == MemberHealth::kEjected) m->node_id.clear();
      }
      AskNodeIds(ask, options.health_check_timeout, /*wait_for_ready=*/false);
    }
    for (Member* m : returning) {
      std::lock_guard<std::mutex> lock(m->mu);
      if (!m->node_id.empty()) m->health = MemberHealth::kHealthy;
    }
  }

  // Builds the ring the members call for (known node id, not ejected; the first member reporting an id
  // has it) and swaps it in when it differs from the current one. Returns false, changing nothing, when
  // no member qualifies.
  bool RebuildRing(bool force) {
    std::vector<std::string> ids;
    std::vector<std::shared_ptr<Member>> owners;
    absl::flat_hash_set<std::string> seen;
    for (const auto& m : Members()) {
      std::string id;
      {
        std::lock_guard<std::mutex> lock(m->mu);
        if (m->node_id.empty() || m->health == MemberHealth::kEjected) continue;
        id = m->node_id;
      }
      if (!seen.insert(id).second) continue;
      ids.push_back(std::move(id));
      owners.push_back(m);
    }
    if (ids.empty()) return false;
    const std::shared_ptr<const RingView> current = View();
    if (!force && current != nullptr && current->owners.size() == owners.size()) {
      absl::flat_hash_map<std::string, const Member*> now;
      for (size_t r = 0; r < current->owners.size(); ++r) now[current->ring.node_ids()[r]] = current->owners[r].get();
      bool same = true;
      for (size_t r = 0; r < owners.size() && same; ++r) {
        auto it = now.find(ids[r]);
        same = it != now.end() && it->second == owners[r].get();
      }
      if (same) return true;
    }
    auto ring = HashRing::Create(ids, options.virtual_nodes);
    if (!ring.ok()) return false;  // not reached: ids are distinct and non-empty
    auto next = std::make_shared<const RingView>(RingView{std::move(ring).value(), std::move(owners)});
    std::lock_guard<std::mutex> lock(view_mu);
    if (view != nullptr) {
      ++ring_version;
      stats.ring_changes.fetch_add(1, std::memory_order_relaxed);
    }
    view = std::move(next);
    return true;
  }

  void RefreshLoop() {
    absl::Time next_dns =
        options.members_dns.empty() ? absl::InfiniteFuture() : absl::Now() + options.dns_refresh_interval;
    absl::Time next_health = absl::Now() + options.health_check_interval;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(stop_mu);
        if (stop_cv.wait_until(lock, absl::ToChronoTime(std::min(next_dns, next_health)),
                               [this] { return stopping; })) {
          return;
        }
      }
      const absl::Time now = absl::Now();
      if (now >= next_dns) {
        RefreshDns();
        next_dns = absl::Now() + options.dns_refresh_interval;
      }
      if (now >= next_health) {
        CheckHealth();
        next_health = absl::Now() + options.health_check_interval;
      }
      (void)RebuildRing(/*force=*/false);
    }
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->channel_args = wire::ChannelArgs(options.max_message_bytes);
  impl->channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  impl->security = wire::ChannelSecurity{.ca_file = options.tls_ca_file,
                                         .cert_file = options.tls_cert_file,
                                         .key_file = options.tls_key_file,
                                         .server_name = options.tls_server_name,
                                         .auth_token = options.auth_token};
  auto credentials = wire::MakeChannelCredentials(impl->security, "tls_");
  if (!credentials.ok()) return credentials.status();
  impl->credentials = *std::move(credentials);
  std::vector<std::shared_ptr<Member>> members;
  absl::flat_hash_set<std::string> addresses;
  for (const std::string& spec : options.members) {
    const size_t eq = spec.find('=');
    const std::string address = eq == std::string::npos ? spec : spec.substr(eq + 1);
    addresses.insert(address);
    members.push_back(impl->NewMember(address, eq == std::string::npos ? "" : spec.substr(0, eq), /*from_dns=*/false));
  }
  absl::Status dns_status;
  if (!options.members_dns.empty()) {
    auto resolved = ResolveMembers(options.members_dns, options.dns_server, options.dns_timeout);
    if (resolved.ok()) {
      impl->stats.dns_resolutions.fetch_add(1, std::memory_order_relaxed);
      for (const std::string& a : *resolved) {
        if (addresses.insert(a).second) members.push_back(impl->NewMember(a, "", /*from_dns=*/true));
      }
    } else if (resolved.status().code() == absl::StatusCode::kInvalidArgument) {
      return absl::InvalidArgumentError(absl::StrCat("members_dns: ", resolved.status().message()));
    } else {
      (resolved.status().code() == absl::StatusCode::kNotFound ? impl->stats.dns_resolutions : impl->stats.dns_failures)
          .fetch_add(1, std::memory_order_relaxed);
      dns_status = resolved.status();
    }
  }
  // Ask the members without a configured id for theirs, all at once, riding out members still starting.
  std::vector<Member*> ask;
  for (const auto& m : members) {
    if (m->node_id.empty()) ask.push_back(m.get());
  }
  impl->AskNodeIds(ask, options.connect_timeout, /*wait_for_ready=*/true);
  // Two static members may not report one id (a configuration error); a DNS member reporting an id
  // already taken (the same server under an IPv4 and an IPv6 record) stays out of the ring.
  absl::flat_hash_set<std::string> static_ids;
  for (const auto& m : members) {
    if (m->from_dns || m->node_id.empty()) continue;
    if (!static_ids.insert(m->node_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("members: node id \"", m->node_id, "\" is reported by two members"));
    }
  }
  {
    std::lock_guard<std::mutex> lock(impl->members_mu);
    impl->members = std::move(members);
  }
  if (!impl->RebuildRing(/*force=*/true)) {
    return absl::UnavailableError(
        dns_status.ok() ? std::string("no member answered with its node id")
                        : absl::StrCat("no member answered with its node id; members_dns: ", dns_status.message()));
  }
  // Set up UCX endpoints now, in parallel, so that the first transfers need not; a member that fails
  // here is retried by the first call that needs it.
  if (impl->options.transport != "grpc") {
    Impl& im = *impl;
    const std::shared_ptr<const RingView> view = im.View();
    Impl::ForEachParallel(view->owners.size(), [&](size_t r) {
      (void)im.UcxEndpoint(*view->owners[r], absl::Now() + im.options.rpc_timeout);
    });
  }
  const bool replicates =
      options.replication_factor > 1 || !options.replication_overrides.empty() || options.hot_read_replicas > 0;
  if (replicates)
    impl->replicator = std::make_unique<Replicator>(
        Replicator::Options{.queue_bytes = options.replica_queue_bytes,
                            .hint_bytes = options.hint_queue_bytes,
                            .hint_retry_interval = options.hint_retry_interval},
        Replicator::Hooks{.put = [p = impl.get()](const ReplicaTask& t) { return p->PutReplica(t); },
                          .in_ring = [p = impl.get()](const std::string& id) { return p->InRing(id); }},
        impl->stats);
  impl->refresher = std::thread([p = impl.get()] { p->RefreshLoop(); });
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const ClientStats& Client::stats() const { return impl_->stats; }

absl::Status Client::FlushReplicas(absl::Duration timeout) {
  return impl_->replicator == nullptr ? absl::OkStatus() : impl_->replicator->Flush(timeout);
}

HashRing Client::ring() const { return impl_->View()->ring; }

uint64_t Client::ring_version() const {
  std::lock_guard<std::mutex> lock(impl_->view_mu);
  return impl_->ring_version;
}

std::vector<MemberInfo> Client::members() const {
  const std::shared_ptr<const RingView> view = impl_->View();
  absl::flat_hash_set<const Member*> in_ring;
  for (const auto& m : view->owners) in_ring.insert(m.get());
  std::vector<MemberInfo> out;
  for (const auto& m : impl_->Members()) {
    MemberInfo info;
    info.address = m->address;
    info.from_dns = m->from_dns;
    info.in_ring = in_ring.contains(m.get());
    {
      std::lock_guard<std::mutex> lock(m->mu);
      info.node_id = m->node_id;
      info.health = m->health;
      info.consecutive_failures = m->failures;
      info.last_health_error = m->last_error;
    }
    {
      std::lock_guard<std::mutex> lock(m->ucx->mu);
      if (m->ucx->state == UcxPeer::State::kReady) {
        info.transport = "ucx";
      } else {
        info.transport = impl_->options.transport == "ucx" ? "none" : "grpc";
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<LookupResult> Client::LookupPrefix(const Namespace& ns, std::span<const Fingerprint> fps) {
  const absl::Time call_deadline = Impl::CallDeadline(absl::Now(), impl_->options.rpc_timeout);
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  // As Get and Put: a layout no server takes is the caller's error, not a server's failure.
  if (const uint64_t block_bytes = ns.layout.ShardBytes(); block_bytes > impl_->options.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of this layout is ", block_bytes,
                                                   " bytes, above max_block_bytes ", impl_->options.max_block_bytes));
  }
  Impl& im = *impl_;
  const uint32_t tp = ns.layout.tp_size;
  LookupResult result;
  result.present.assign(fps.size(), false);
  im.stats.lookups.fetch_add(1, std::memory_order_relaxed);
  im.stats.lookup_blocks.fetch_add(fps.size(), std::memory_order_relaxed);
  if (fps.empty()) return result;

  const std::shared_ptr<const RingView> view = im.View();  // this call's ring, whatever changes meanwhile
  v1::Namespace pns;
  wire::ToProto(ns, &pns);
  const uint64_t group_key = PromptGroupKey(fps);  // per-group statistics on the servers (similarity.h)
  // Each block's owners in the order to ask them; a block its owner cannot answer goes to the next one
  // (another attempt), all within one rpc_timeout.
  const Impl::ReadPlan plan = im.PlanReads(*view, ns, fps, /*first_depth=*/0);
  // With tp shards, each key is asked tp times; split so one request stays within the limit.
  const size_t per = std::max<size_t>(1, im.options.max_blocks_per_request / tp);
  std::vector<uint8_t> answered(fps.size(), 0);
  std::vector<uint32_t> pending(fps.size());
  for (uint32_t i = 0; i < pending.size(); ++i) pending[i] = i;
  absl::Status refused;  // the first owner's refusal of the request (IsRefusal): the call's error
  for (size_t attempt = 0; !pending.empty() && refused.ok(); ++attempt) {
    const OwnerGroups groups = Impl::GroupByAttempt(plan, pending, attempt, per);
    const size_t n = groups.size();
    std::vector<v1::LookupRequest> reqs(n);
    std::vector<v1::LookupResponse> resps(n);
    std::vector<grpc::Status> statuses(n);
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs(n);
    std::latch done(static_cast<std::ptrdiff_t>(n));
    for (size_t g = 0; g < n; ++g) {
      *reqs[g].mutable_namespace_() = pns;
      std::vector<BlockKey> keys;
      keys.reserve(groups[g].second.size() * tp);
      for (uint32_t i : groups[g].second) {
        for (uint32_t s = 0; s < tp; ++s) keys.push_back({fps[i], s});
      }
      wire::EncodeKeys(keys, reqs[g].mutable_keys());
      reqs[g].set_group_key(group_key);
      ctxs[g] = std::make_unique<grpc::ClientContext>();
      ctxs[g]->set_deadline(
          absl::ToChronoTime(Impl::AttemptDeadline(call_deadline, plan.OwnersLeft(groups[g].second, attempt))));
      view->owners[groups[g].first]->cache->async()->Lookup(ctxs[g].get(), &reqs[g], &resps[g], [&, g](grpc::Status s) {
        statuses[g] = std::move(s);
        done.count_down();
      });
    }
    done.wait();
    for (size_t g = 0; g < n; ++g) {
      const auto& idx = groups[g].second;
      if (!statuses[g].ok() || static_cast<size_t>(resps[g].present_size()) != idx.size() * tp) {
        im.stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        if (const absl::Status st = wire::FromGrpc(statuses[g]); IsRefusal(st.code()) && refused.ok()) {
          refused = view->owners[groups[g].first]->Refused("Lookup", st);
        }
        continue;  // these blocks stay unanswered: the next owner is asked, if any
      }
      for (size_t k = 0; k < idx.size(); ++k) {
        bool all_shards = true;
        for (uint32_t s = 0; s < tp; ++s) all_shards &= resps[g].present(static_cast<int>(k * tp + s));
        result.present[idx[k]] = all_shards;
        answered[idx[k]] = 1;
      }
    }
    uint64_t found_on_replica = 0;
    std::erase_if(pending, [&](uint32_t i) {
      found_on_replica += attempt > 0 && result.present[i];
      const bool retry = !answered[i] || (!result.present[i] && plan.retry_miss[i] && attempt == 0);
      return !retry || attempt + 1 >= plan.owners[i].size();
    });
    im.stats.replica_read_blocks.fetch_add(found_on_replica, std::memory_order_relaxed);
  }
  if (!refused.ok()) return refused;
  for (uint8_t a : answered) result.blocks_from_errors += a == 0;
  while (result.prefix_blocks < fps.size() && result.present[result.prefix_blocks]) ++result.prefix_blocks;
  im.stats.misses_from_errors.fetch_add(result.blocks_from_errors, std::memory_order_relaxed);
  im.stats.prefix_hit_blocks.fetch_add(result.prefix_blocks, std::memory_order_relaxed);
  im.stats.prefix_hit_tokens.fetch_add(uint64_t{result.prefix_blocks} * ns.layout.block_tokens,
                                       std::memory_order_relaxed);
  return result;
}

absl::StatusOr<std::vector<GetResult>> Client::Get(const Namespace& ns, std::span<const Fingerprint> fps,
                                                   uint32_t shard, std::span<const std::span<std::byte>> buffers,
                                                   uint32_t first_block_index) {
  const absl::Time call_deadline = Impl::CallDeadline(absl::Now(), impl_->options.rpc_timeout);
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  if (shard >= ns.layout.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard, " >= tp_size ", ns.layout.tp_size));
  }
  if (buffers.size() != fps.size()) {
    return absl::InvalidArgumentError(absl::StrCat(buffers.size(), " buffers for ", fps.size(), " blocks"));
  }
  const uint64_t block_bytes = ns.layout.ShardBytes();
  if (block_bytes > impl_->options.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of this layout is ", block_bytes,
                                                   " bytes, above max_block_bytes ", impl_->options.max_block_bytes));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].size() != block_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("buffers[", i, "] is ", buffers[i].size(), " bytes, a block is ", block_bytes));
    }
  }
  Impl& im = *impl_;
  std::vector<GetResult> results(fps.size(), GetResult::kMissFromError);
  im.stats.get_blocks.fetch_add(fps.size(), std::memory_order_relaxed);
  if (fps.empty()) return results;
  const std::shared_ptr<const RingView> view = im.View();  // this call's ring, whatever changes meanwhile
  v1::Namespace pns;
  wire::ToProto(ns, &pns);
  // Each block's owners in the order to ask them; a block its owner cannot serve goes to the next one
  // (another attempt), all within one rpc_timeout.
  const Impl::ReadPlan plan = im.PlanReads(*view, ns, fps, first_block_index);
  std::vector<uint32_t> pending(fps.size());
  for (uint32_t i = 0; i < pending.size(); ++i) pending[i] = i;
  uint64_t corrupt = 0;  // every copy that failed its checksum, whichever attempt
  CallRefusal refusal;   // the first owner's refusal of the request (IsRefusal): the call's error
  for (size_t attempt = 0; !pending.empty() && !refusal.refused(); ++attempt) {
    const OwnerGroups groups = im.GroupByAttempt(plan, pending, attempt, im.options.max_blocks_per_request);
    std::vector<GetResult> before(pending.size());
    for (size_t p = 0; p < pending.size(); ++p) {
      before[p] = results[pending[p]];
      results[pending[p]] = GetResult::kMissFromError;  // what an owner that fails leaves
    }
    Impl::ForEachParallel(groups.size(), [&](size_t g) {
      const auto& [owner, idx] = groups[g];
      std::vector<BlockKey> keys;
      keys.reserve(idx.size());
      for (uint32_t i : idx) keys.push_back({fps[i], shard});
      const absl::Time deadline = Impl::AttemptDeadline(call_deadline, plan.OwnersLeft(idx, attempt));
      im.ReadBatch(*view->owners[owner], pns, keys, idx, block_bytes, buffers, results, deadline, refusal);
    });
    for (size_t p = 0; p < pending.size(); ++p) {
      GetResult& r = results[pending[p]];
      corrupt += r == GetResult::kChecksumMismatch;
      if (r == GetResult::kMissFromError && before[p] == GetResult::kMiss)
        r = GetResult::kMiss;  // a hot block's miss stands
    }
    uint64_t served_by_replica = 0;
    std::erase_if(pending, [&](uint32_t i) {
      served_by_replica += attempt > 0 && results[i] == GetResult::kHit;
      const bool retry =
          results[i] != GetResult::kHit && (results[i] != GetResult::kMiss || (plan.retry_miss[i] && attempt == 0));
      return !retry || attempt + 1 >= plan.owners[i].size();
    });
    im.stats.replica_read_blocks.fetch_add(served_by_replica, std::memory_order_relaxed);
  }
  if (refusal.refused()) return refusal.status();
  im.PromoteHot(*view, ns, fps, shard, buffers, first_block_index, results);

  uint64_t hits = 0, from_errors = 0;
  for (GetResult r : results) {
    hits += r == GetResult::kHit;
    from_errors += r == GetResult::kMissFromError;
  }
  im.stats.retrieve_hit_blocks.fetch_add(hits, std::memory_order_relaxed);
  im.stats.retrieve_hit_tokens.fetch_add(hits * ns.layout.block_tokens, std::memory_order_relaxed);
  im.stats.retrieve_hit_bytes.fetch_add(hits * block_bytes, std::memory_order_relaxed);
  im.stats.misses_from_errors.fetch_add(from_errors, std::memory_order_relaxed);
  im.stats.checksum_failures.fetch_add(corrupt, std::memory_order_relaxed);
  return results;
}

absl::StatusOr<std::vector<PutResult>> Client::Put(const Namespace& ns, std::span<const Fingerprint> fps,
                                                   uint32_t shard, std::span<const std::span<const std::byte>> blocks,
                                                   uint32_t first_block_index) {
  return Put(ns, fps, shard, blocks, PutOptions{.first_block_index = first_block_index});
}

absl::StatusOr<std::vector<PutResult>> Client::Put(const Namespace& ns, std::span<const Fingerprint> fps,
                                                   uint32_t shard, std::span<const std::span<const std::byte>> blocks,
                                                   const PutOptions& put_options) {
  const uint32_t first_block_index = put_options.first_block_index;
  if (!put_options.block_meta.empty() && put_options.block_meta.size() != fps.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_meta: ", put_options.block_meta.size(), " for ", fps.size(), " fingerprints"));
  }
  // Each block's parent is the previous block of the chain (the caller's parent_hash for the first),
  // unless the caller named it: filled before the blocks are split among their owners.
  std::vector<BlockMeta> meta(put_options.block_meta.begin(), put_options.block_meta.end());
  for (size_t i = 0; i < meta.size(); ++i) {
    if (meta[i].parent_hash.empty()) meta[i].parent_hash = i == 0 ? put_options.parent_hash : meta[i - 1].hash;
    if (absl::Status s = ValidateBlockMeta(meta[i], absl::StrCat("block_meta[", i, "]")); !s.ok()) return s;
  }
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  if (shard >= ns.layout.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard, " >= tp_size ", ns.layout.tp_size));
  }
  if (blocks.size() != fps.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(blocks.size(), " blocks of bytes for ", fps.size(), " fingerprints"));
  }
  const uint64_t block_bytes = ns.layout.ShardBytes();
  if (block_bytes > impl_->options.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of this layout is ", block_bytes,
                                                   " bytes, above max_block_bytes ", impl_->options.max_block_bytes));
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].size() != block_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("blocks[", i, "] is ", blocks[i].size(), " bytes, a block is ", block_bytes));
    }
  }
  Impl& im = *impl_;
  std::vector<PutResult> results(fps.size(), PutResult::kError);
  im.stats.put_blocks.fetch_add(fps.size(), std::memory_order_relaxed);
  if (fps.empty()) return results;
  std::vector<uint32_t> all(fps.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  const std::shared_ptr<const RingView> view = im.View();  // this call's ring, whatever changes meanwhile
  const OwnerGroups groups =
      im.GroupByOwner(*view, fps, all, std::min(im.options.max_blocks_per_request, im.options.put_batch_blocks));
  // Owners in parallel; one owner's batches in order, each committed before the next is reserved, so a
  // put larger than an owner's memory streams through it instead of reserving more than it has.
  std::vector<std::pair<size_t, size_t>> runs;  // [first, last) group of each owner
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g == 0 || groups[g].first != groups[g - 1].first) runs.push_back({g, g});
    runs.back().second = g + 1;
  }
  v1::Namespace pns;
  wire::ToProto(ns, &pns);
  CallRefusal refusal;  // the first owner's refusal of the request (IsRefusal): the call's error

  // Puts batch g; true when its owner should get no more batches in this call.
  auto put_batch = [&](size_t g) {
    const auto& [owner, idx] = groups[g];
    std::vector<BlockKey> keys;
    std::vector<uint32_t> depths;
    std::vector<std::span<const std::byte>> data;
    std::vector<const BlockMeta*> batch_meta;
    for (uint32_t i : idx) {
      keys.push_back({fps[i], shard});
      depths.push_back(first_block_index + i);
      data.push_back(blocks[i]);
      if (!meta.empty()) batch_meta.push_back(&meta[i]);
    }
    std::vector<PutResult> batch(idx.size(), PutResult::kError);
    if (absl::Status s = im.PutBatch(*view->owners[owner], pns, keys, depths, data, block_bytes, batch, batch_meta);
        !s.ok()) {
      refusal.Record(std::move(s));
      return true;  // the rest would be refused too
    }
    for (size_t k = 0; k < idx.size(); ++k) results[idx[k]] = batch[k];
    return std::all_of(batch.begin(), batch.end(), [](PutResult p) { return p == PutResult::kError; });
  };
  Impl::ForEachParallel(runs.size(), [&](size_t r) {
    for (size_t g = runs[r].first; g < runs[r].second; ++g) {
      // An owner that failed a whole batch (down, or past its deadline) is not waited for again: the
      // rest of its blocks stay kError, so a dead owner costs one batch's deadlines, not one per batch.
      if (put_batch(g)) break;
    }
  });
  if (!refusal.refused()) im.EnqueueReplicas(*view, ns, fps, shard, blocks, first_block_index, results);

  uint64_t stored = 0, rejected = 0;
  for (PutResult r : results) {
    stored += r == PutResult::kStored;
    rejected += r == PutResult::kNoSpace;
  }
  im.stats.put_stored_blocks.fetch_add(stored, std::memory_order_relaxed);
  im.stats.put_stored_bytes.fetch_add(stored * block_bytes, std::memory_order_relaxed);
  im.stats.put_rejected_blocks.fetch_add(rejected, std::memory_order_relaxed);
  if (refusal.refused()) return refusal.status();  // blocks other owners stored stay stored (and counted)
  return results;
}

}  // namespace kvtier::client
