// Membership of a client (docs/architecture.md "Membership"): one Member per cache server (static or
// found in DNS) with its gRPC stubs, health and UCX endpoint state, the immutable ring views calls
// hold, and Membership, the registry the refresher thread keeps current (DNS, health checks, ring swaps).
#ifndef KVTIER_CLIENT_SRC_CLIENT_MEMBERSHIP_H_
#define KVTIER_CLIENT_SRC_CLIENT_MEMBERSHIP_H_

#include <condition_variable>
#include <cstdint>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvtier/client/client.h"
#include "kvtier/common/hash_ring.h"
#include "kvtier/ucx/ucx_client.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/wire/channel_security.h"

namespace kvtier::client {

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
  bool commits_puts = false;                      // guarded by mu; `endpoint` answers PutAndCommit
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

// The members of one client and the ring over them. Connect fills it (SetMembers, RebuildRing); then
// the refresher thread (Start) re-resolves members_dns, checks every member's health and swaps in a new
// ring when the members in it change.
// Thread-safety: all methods may be called concurrently, except Start and Stop (Connect and the
// client's destructor).
// Ownership: `options` and `stats` are borrowed and must outlive this object.
class Membership {
 public:
  Membership(const ClientOptions& options, ClientStats& stats, grpc::ChannelArguments channel_args,
             wire::ChannelSecurity security, std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(options),
        stats_(stats),
        channel_args_(std::move(channel_args)),
        security_(std::move(security)),
        credentials_(std::move(credentials)) {}
  ~Membership() { Stop(); }

  // A new member at `address` (host:port) over a channel with this client's arguments and security.
  std::shared_ptr<Member> NewMember(const std::string& address, const std::string& configured_id, bool from_dns) const;
  // Asks each of `ms` its node id (GetInfo), all at once, within `timeout`; records the ids that come back.
  void AskNodeIds(const std::vector<Member*>& ms, absl::Duration timeout, bool wait_for_ready);
  // Replaces the registry (Connect, before the first ring).
  void SetMembers(std::vector<std::shared_ptr<Member>> members);

  // The ring now; never null after a first RebuildRing that returned true. Calls hold it to the end.
  std::shared_ptr<const RingView> View() const;
  // Every member: static ones first, then DNS ones.
  std::vector<std::shared_ptr<Member>> Members() const;
  // Ring changes since the first ring.
  uint64_t ring_version() const;

  // Resolves members_dns and applies the answer: new addresses become members (asked their node id),
  // addresses gone from the answer leave. A failed resolution changes nothing.
  void RefreshDns();
  // One round of grpc.health.v1 checks of every member, at once; updates each member's health and asks
  // the node id of members that pass and need it (unknown, or returning from ejection).
  void CheckHealth();
  // Builds the ring the members call for (known node id, not ejected; the first member reporting an id
  // has it) and swaps it in when it differs from the current one (always, with `force`). Returns false,
  // changing nothing, when no member qualifies.
  bool RebuildRing(bool force);

  // Starts the refresher thread: DNS every dns_refresh_interval (with members_dns), health checks every
  // health_check_interval, then a ring rebuild.
  void Start();
  // Stops and joins the refresher thread; idempotent.
  void Stop();
  // Drops the ring and every member (the client's destructor, after Stop: members close their UCX
  // endpoints as they go, so they go before the UCX client).
  void Clear();

 private:
  void RefreshLoop();

  const ClientOptions& options_;
  ClientStats& stats_;
  const grpc::ChannelArguments channel_args_;
  const wire::ChannelSecurity security_;                         // TLS and token of every member's channel
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;  // made from `security_` at Connect

  // Written only by Connect and the refresher thread.
  mutable std::mutex members_mu_;
  std::vector<std::shared_ptr<Member>> members_;  // guarded by members_mu_

  mutable std::mutex view_mu_;
  std::shared_ptr<const RingView> view_;  // guarded by view_mu_
  uint64_t ring_version_ = 0;             // guarded by view_mu_

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;  // guarded by stop_mu_
  std::thread refresher_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_MEMBERSHIP_H_
