#include "client/ucx_endpoints.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvtier/common/host_port.h"
#include "kvtier/common/log.h"
#include "kvtier/v1/admin.grpc.pb.h"

namespace kvtier::client {

namespace {

// A member's UCX listener: at the host it is bound to (info.ucx_address), since a listener bound to one
// address accepts only there; at the host we reach the member's gRPC at when it is bound to a wildcard
// (which accepts on every address), as the events subscriber does with a PUB endpoint.
std::string UcxTarget(const std::string& grpc_address, const v1::GetInfoResponse& info) {
  auto bound = ParseHostPort(info.ucx_address(), /*min_port=*/0);
  const std::string host =
      bound.ok() && !IsWildcardHost(bound->host) ? bound->host : grpc_address.substr(0, grpc_address.rfind(':'));
  return absl::StrCat(host, ":", info.ucx_port());
}

}  // namespace

UcxClient* UcxEndpoints::client() {
  if (UcxClient* created = created_.load(std::memory_order_acquire); created != nullptr) return created;
  std::lock_guard<std::mutex> lock(ucx_mu_);
  if (ucx_ == nullptr && !ucx_failed_) {
    auto created = UcxClient::Create(options_.ucx_transports, options_.ucx_get_lanes);
    if (created.ok()) {
      ucx_ = std::move(created).value();
      created_.store(ucx_.get(), std::memory_order_release);
    } else {
      ucx_failed_ = true;
    }
  }
  return ucx_.get();
}

// The UCX endpoint to move member's bytes over, connecting (GetInfo, then a UCX hello, both by
// `deadline` and at most rpc_timeout) when there is none and the backoff has passed; nullopt: use gRPC
// bytes (or fail, with transport "ucx"). One caller connects at a time, without holding the lock, and
// the others do not queue behind it: with transport "auto" they move their bytes over gRPC meanwhile,
// with "ucx" they wait for its outcome until their own deadline.
std::optional<UcxClient::EndpointId> UcxEndpoints::Endpoint(Member& member, absl::Time deadline) {
  if (mode_ == TransportMode::kGrpc) return std::nullopt;
  UcxPeer& peer = *member.ucx;
  std::unique_lock<std::mutex> lock(peer.mu);
  while (peer.state == UcxPeer::State::kConnecting) {
    if (mode_ != TransportMode::kUcx ||
        peer.connected.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout) {
      if (peer.state == UcxPeer::State::kConnecting) return std::nullopt;
    }
  }
  if (peer.state == UcxPeer::State::kReady) {
    if (!peer.ticket.empty() && !peer.renewing && absl::Now() >= peer.renew_at) {
      RenewSession(member, lock);
      if (peer.state != UcxPeer::State::kReady) return std::nullopt;  // failed meanwhile
    }
    return peer.endpoint;
  }
  if (absl::Now() < peer.retry_after) return std::nullopt;
  peer.state = UcxPeer::State::kConnecting;
  lock.unlock();
  const absl::Time until = std::min(deadline, absl::Now() + options_.rpc_timeout);
  UcxPeer::State outcome = UcxPeer::State::kDown;
  std::optional<UcxClient::Connection> connection;
  UcxClient* ucx_client = nullptr;
  v1::GetInfoResponse info;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(until));
  if (member.admin->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok()) {
    ucx_client = info.ucx_port() != 0 ? client() : nullptr;
    outcome = ucx_client == nullptr ? UcxPeer::State::kUnsupported : UcxPeer::State::kDown;
  }
  std::optional<v1::OpenUcxSessionResponse> session;
  if (ucx_client != nullptr && NeedsSession()) {
    session = OpenSession(member, until);
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
                       "kvtier-client: member {} refused the UCX session ({}); its bytes go over gRPC", member.address,
                       std::string(conn.status().message()));
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
  peer.retry_after =
      absl::Now() + (outcome == UcxPeer::State::kUnsupported ? kUcxUnsupportedRecheck : options_.ucx_reconnect_backoff);
  if (outcome == UcxPeer::State::kReady) {
    peer.endpoint = connection->endpoint;
    peer.client = ucx_client;
    peer.takes_leases = connection->takes_leases;
    peer.takes_puts = connection->takes_puts;
    peer.commits_puts = connection->commits_puts;
    peer.ticket = session.has_value() ? session->ticket() : "";
    peer.renew_at =
        session.has_value() ? absl::Now() + absl::Milliseconds(session->ttl_ms()) / 2 : absl::InfiniteFuture();
    stats_.ucx_connects.fetch_add(1, std::memory_order_relaxed);
  }
  peer.connected.notify_all();
  if (outcome != UcxPeer::State::kReady) return std::nullopt;
  return peer.endpoint;
}

// A member's UCX endpoints must present a session ticket when this client authenticates on gRPC (a
// token or TLS): the server then requires one.
bool UcxEndpoints::NeedsSession() const { return !security_.auth_token.empty() || !security_.ca_file.empty(); }

// A new UCX session of `member` over its gRPC channel (the token and TLS of every call), or nullopt
// (logged, rate limited): the member's bytes then go over gRPC.
std::optional<v1::OpenUcxSessionResponse> UcxEndpoints::OpenSession(Member& member, absl::Time deadline) {
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
void UcxEndpoints::RenewSession(Member& member, std::unique_lock<std::mutex>& lock) {
  UcxPeer& peer = *member.ucx;
  peer.renewing = true;
  lock.unlock();
  auto session = OpenSession(member, absl::Now() + options_.rpc_timeout);
  lock.lock();
  peer.renewing = false;
  if (!session.has_value()) {
    peer.renew_at = absl::Now() + std::max(options_.ucx_reconnect_backoff, absl::Seconds(1));
    return;
  }
  peer.renew_at = absl::Now() + absl::Milliseconds(session->ttl_ms()) / 2;
  if (peer.state != UcxPeer::State::kReady) return;
  peer.ticket = session->ticket();
  peer.client->SetTicket(peer.endpoint, peer.ticket);
}

// Drops member's endpoint after an error or a missed deadline; the next call after the backoff
// reconnects.
void UcxEndpoints::Failed(Member& member, UcxClient::EndpointId endpoint) {
  UcxPeer& peer = *member.ucx;
  std::lock_guard<std::mutex> lock(peer.mu);
  if (peer.state != UcxPeer::State::kReady || peer.endpoint != endpoint) return;
  peer.state = UcxPeer::State::kDown;
  peer.retry_after = absl::Now() + options_.ucx_reconnect_backoff;
  ucx_->Close(endpoint);
  stats_.ucx_endpoint_failures.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace kvtier::client
