// The UCX side of a client's members (docs/architecture.md "A Get, step by step"): the one UcxClient
// of the client, created on first need, and each member's endpoint over it (Member::ucx, a UcxPeer):
// connect, session tickets and their renewal, and the backoff after a failure.
#ifndef KVTIER_CLIENT_SRC_CLIENT_UCX_ENDPOINTS_H_
#define KVTIER_CLIENT_SRC_CLIENT_UCX_ENDPOINTS_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/time/time.h"
#include "client/membership.h"
#include "client/transport_mode.h"
#include "kvtier/client/client.h"
#include "kvtier/ucx/ucx_client.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/wire/channel_security.h"

namespace kvtier::client {

// Thread-safety: all methods may be called concurrently.
// Ownership: `options` and `stats` are borrowed and must outlive this object; the members whose
// endpoints it opened must be destroyed (closing them) before it.
class UcxEndpoints {
 public:
  UcxEndpoints(const ClientOptions& options, TransportMode mode, wire::ChannelSecurity security, ClientStats& stats)
      : options_(options), mode_(mode), security_(std::move(security)), stats_(stats) {}

  // The client's UcxClient, created on the first call; null when UCX cannot start on this host.
  UcxClient* client();

  // The UCX endpoint to move member's bytes over, connecting (GetInfo, then a UCX hello, both by
  // `deadline` and at most rpc_timeout) when there is none and the backoff has passed; nullopt: use gRPC
  // bytes (or fail, with transport "ucx"). Always nullopt with transport "grpc".
  std::optional<UcxClient::EndpointId> Endpoint(Member& member, absl::Time deadline);

  // Drops member's `endpoint` after an error or a missed deadline; the next call after the backoff
  // reconnects. A no-op when `endpoint` is no longer the member's ready endpoint.
  void Failed(Member& member, UcxClient::EndpointId endpoint);

 private:
  bool NeedsSession() const;
  std::optional<v1::OpenUcxSessionResponse> OpenSession(Member& member, absl::Time deadline);
  void RenewSession(Member& member, std::unique_lock<std::mutex>& lock);  // REQUIRES: lock holds member.ucx->mu

  const ClientOptions& options_;
  const TransportMode mode_;
  const wire::ChannelSecurity security_;
  ClientStats& stats_;
  std::mutex ucx_mu_;
  std::unique_ptr<UcxClient> ucx_;            // guarded by ucx_mu_ until created; created once, on first need
  bool ucx_failed_ = false;                   // guarded by ucx_mu_: UCX could not start here
  std::atomic<UcxClient*> created_{nullptr};  // ucx_ once created: the data path reads it without ucx_mu_
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_UCX_ENDPOINTS_H_
