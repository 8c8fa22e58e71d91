#include "kvtier/ucx/ucx_server.h"

#include <arpa/inet.h>
#include <sys/random.h>
#include <sys/resource.h>

#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/log.h"
#include "kvtier/ucx/ucx_messages.h"
#include "kvtier/ucx/ucx_pending_connections.h"
#include "kvtier/v1/cache.pb.h"
#include "ucx_server_impl.h"

namespace kvtier::ucx {
namespace {

// Lets UCX watch as many connections as the process may open: its default of 1024 async handler
// slots is the first limit a flood of connections hits. Never lowers a value the operator set higher.
// Runs before the first ucp_init.
void RaiseUcxAsyncEvents() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < lim.rlim_max) {  // the soft limit up to the hard one
    lim.rlim_cur = lim.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &lim);
    (void)getrlimit(RLIMIT_NOFILE, &lim);
  }
  const uint64_t want = std::min<uint64_t>(kMaxAsyncEvents, lim.rlim_cur);
  char current[32] = {};
  uint64_t have = 0;
  if (ucs_global_opts_get_value("ASYNC_MAX_EVENTS", current, sizeof(current)) == UCS_OK &&
      absl::SimpleAtoi(current, &have) && have >= want) {
    return;
  }
  (void)ucs_global_opts_set_value("ASYNC_MAX_EVENTS", std::to_string(want).c_str());
}

}  // namespace

absl::Status UcxServer::Impl::Init() {
  RaiseUcxAsyncEvents();
  reaper.emplace(PendingConnectionReaper::Options{.timeout = options.pending_connection_timeout,
                                                  .max_per_host = options.max_pending_connections_per_host});
  auto addr = ResolveIpv4(options.listen_address, /*min_port=*/0);
  if (!addr.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("ucx.listen_address: ", addr.status().message()));
  }
  auto created = UcxContext::Create(options.transports, "ucx.transports", /*several_workers=*/false);
  if (!created.ok()) return created.status();
  context = *std::move(created);
  auto w = UcxWorker::Create(context);
  if (!w.ok()) return w.status();
  worker = *std::move(w);
  ucs_status_t st = UCS_OK;

  // Register the host tier once. Transports without registration needs (tcp, shared memory) accept it
  // at no cost; an RDMA NIC would pin it here instead of per transfer.
  const std::span<std::byte> host = source->HostRegion();
  region = host.data();
  region_bytes = host.size();
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = region;
  mp.length = region_bytes;
  if (region_bytes != 0 && (st = ucp_mem_map(context->get(), &mp, &memh)) != UCS_OK) {
    KVTIER_LOG(warn, "kvtier-server: ucp_mem_map of the host tier failed ({}); registering per transfer",
               ucs_status_string(st));
    memh = nullptr;
  }

  const std::pair<uint16_t, ucp_am_recv_callback_t> handlers[] = {
      {msg::kHello, &Impl::OnHello},         {msg::kGet, &Impl::OnGet},         {msg::kPut, &Impl::OnPut},
      {msg::kPutCommit, &Impl::OnPutCommit}, {msg::kRelease, &Impl::OnRelease}, {msg::kLease, &Impl::OnLease},
      {msg::kAllocate, &Impl::OnAllocate},   {msg::kCommit, &Impl::OnCommit}};
  for (const auto& [id, cb] : handlers) {
    if (absl::Status s = worker->SetAmHandler(id, cb, this); !s.ok()) return s;
  }

  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
  lp.sockaddr.addrlen = sizeof(sockaddr_in);
  lp.conn_handler.cb = &Impl::OnConnRequest;
  lp.conn_handler.arg = this;
  if ((st = ucp_listener_create(worker->get(), &lp, &listener)) != UCS_OK) {
    // UCX 1.13 binds its listener without SO_REUSEADDR (UCX_TCP_CM_REUSEADDR does not reach it): after
    // a kill -9 the port stays taken while connections of the old process sit in TIME_WAIT (60 s).
    return absl::UnavailableError(absl::StrCat(
        "cannot listen for UCX on ", options.listen_address, ": ", ucs_status_string(st),
        st == UCS_ERR_BUSY ? " (the port is in use, or held for up to 60 s by connections of a process that "
                             "was killed there; port 0 picks a free one, which clients find through GetInfo)"
                           : " (UCX_TLS must include tcp)"));
  }
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if ((st = ucp_listener_query(listener, &la)) != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucp_listener_query: ", ucs_status_string(st)));
  }
  port = ntohs(reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port);
  reaper->set_listen_port(port);
  return absl::OkStatus();
}

void UcxServer::Impl::Destroy() {
  if (listener != nullptr) ucp_listener_destroy(listener);
  listener = nullptr;
  worker.reset();
  // With the worker gone nothing can touch the slots any more: settle what never completed.
  RunDeferred();
  for (Op* op : std::vector<Op*>(inflight.begin(), inflight.end())) Complete(op, UCS_ERR_CANCELED, 0);
  RunDeferred();  // completions may have posted further sends; with no endpoint left they fail at once
  for (Op* op : abandoned) delete op;
  abandoned.clear();
  if (memh != nullptr) ucp_mem_unmap(context->get(), memh);
  memh = nullptr;
  context.reset();
}

void UcxServer::Impl::Run() {
  next_sweep = absl::Now() + kSweepInterval;
  worker->Run([this] { return !stop.load(std::memory_order_acquire); },
              [this](bool progressed) {
                if (calls->replies_ready()) SendCallReplies();
                if (!deferred.empty()) {
                  RunDeferred();
                  return true;
                }
                if (progressed) return true;
                MaintenanceIfDue();
                return false;
              },
              [] { return kSweepInterval; });
  // Stopping: cancel receives, force-close every endpoint, drain what completes.
  for (Op* op : std::vector<Op*>(inflight.begin(), inflight.end())) {
    if (inflight.contains(op) && op->request != nullptr && !op->cancel_requested) {
      op->cancel_requested = true;
      ucp_request_cancel(worker->get(), op->request);
    }
  }
  std::vector<EpId> all;
  for (const auto& [id, ep] : eps) all.push_back(id);
  for (EpId id : all) CloseEp(id);
  const absl::Time until = absl::Now() + kShutdownDrain;
  while ((!inflight.empty() || worker->closing() || !deferred.empty()) && absl::Now() < until) {
    ucp_worker_progress(worker->get());
    RunDeferred();
    worker->ReapCloses();
  }
  worker->DrainCloses(absl::Now());  // frees what is left
  if (!inflight.empty()) {
    KVTIER_LOG(warn, "kvtier-server: {} UCX transfers did not finish at shutdown", inflight.size());
  }
}

void UcxServer::Impl::CloseEp(EpId id) {
  auto it = eps.find(id);
  if (it == eps.end()) return;
  ucp_ep_h ep = it->second;
  eps.erase(it);
  ep_ids.erase(ep);
  sessions_of.erase(id);
  if (auto peer = peer_of.find(id); peer != peer_of.end()) {
    reaper->Release(peer->second);
    peer_of.erase(peer);
  }
  const absl::Time now = absl::Now();
  std::vector<Op*> receives;
  for (Op* op : inflight) {
    if (op->ep != id) continue;
    if (op->closed == absl::InfiniteFuture()) op->closed = now;
    if (op->batch->is_put && !op->cancel_requested && op->request != nullptr) receives.push_back(op);
  }
  worker->CloseEndpoint(ep);
  for (Op* op : receives) {
    if (!inflight.contains(op) || op->cancel_requested) continue;  // completed meanwhile
    op->cancel_requested = true;
    ucp_request_cancel(worker->get(), op->request);  // may complete (and free) op right here
  }
}

void UcxServer::Impl::OnConnRequest(ucp_conn_request_h conn_request, void* arg) {
  auto* self = static_cast<Impl*>(arg);
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  const std::string peer =
      ucp_conn_request_query(conn_request, &attr) == UCS_OK
          ? PendingConnectionReaper::PeerKey(reinterpret_cast<const sockaddr*>(&attr.client_address))
          : std::string();
  absl::StatusOr<ucp_ep_h> accepted = self->worker->Accept(conn_request, &Impl::OnEpError, self);
  if (accepted.ok()) {
    ucp_ep_h handle = *accepted;
    const EpId id = self->next_ep++;
    self->eps[id] = handle;
    self->ep_ids[handle] = id;
    if (!peer.empty()) {
      self->reaper->Admit(peer);
      self->peer_of[id] = peer;
    }
    if (self->TicketsRequired()) self->unproven.push_back({id, absl::Now() + kHelloTimeout});
  } else {
    ucp_listener_reject(self->listener, conn_request);
  }
}

void UcxServer::Impl::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t) {
  auto* self = static_cast<Impl*>(arg);
  if (auto it = self->ep_ids.find(ep); it != self->ep_ids.end()) {
    self->to_close.push_back(it->second);  // closed outside UCX's callback
  }
}

UcxServer::Impl::EpId UcxServer::Impl::Sender(Impl* self, void* data, const ucp_am_recv_param_t* param) {
  if (self->worker->DropRendezvous(data, param)) return 0;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr) return 0;
  auto it = self->ep_ids.find(param->reply_ep);
  return it == self->ep_ids.end() ? 0 : it->second;
}

// The session of endpoint `ep`, or null when it has not proven a ticket (tickets required): then the
// AM is dropped and the endpoint closed (outside UCX's callback).
const UcxServer::Impl::EpSession* UcxServer::Impl::Admit(EpId ep, const char* what) {
  static const EpSession kOpen{};  // no tickets required: an admin, as gRPC without tokens
  if (!TicketsRequired()) return &kOpen;
  if (auto it = sessions_of.find(ep); it != sessions_of.end()) return &it->second;
  source->CountAuthRejection();
  KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                   "kvtier-server: UCX {} on an endpoint without a valid session ticket; dropped, endpoint closed",
                   what);
  to_close.push_back(ep);
  return nullptr;
}

ucs_status_t UcxServer::Impl::OnHello(void* arg, const void*, size_t, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  const EpId ep = Sender(self, data, param);
  if (ep == 0) return UCS_OK;
  auto hello = msg::DecodeHello({static_cast<const std::byte*>(data), length});
  if (!hello.has_value()) {
    if (self->TicketsRequired() && !self->sessions_of.contains(ep)) self->to_close.push_back(ep);
    return UCS_OK;
  }
  msg::HelloReply reply{.version = msg::kProtocolVersion,
                        .nonce = hello->nonce,
                        .node_id = self->options.node_id,
                        .flags = (self->options.offer_leases ? msg::kTakesLeases : 0u) |
                                 (self->options.offer_puts ? msg::kTakesPuts : 0u) |
                                 (self->options.offer_puts && self->options.offer_put_commit ? msg::kCommitsPuts : 0u)};
  if (self->TicketsRequired()) {
    std::optional<Principal> who;
    if (hello->version != msg::kProtocolVersion) {
      reply.error =
          absl::StrCat("UCX protocol version ", hello->version, " is not this server's (", msg::kProtocolVersion, ")");
    } else if (hello->ticket.empty()) {
      reply.error = "this server requires a UCX session ticket (OpenUcxSession over gRPC) in the hello";
    } else if (who = self->options.find_ticket(hello->ticket); !who.has_value()) {
      reply.error = "unknown or expired UCX session ticket: open a new session (OpenUcxSession)";
    }
    if (!who.has_value()) {
      self->source->CountAuthRejection();
      KVTIER_LOG_EVERY(std::chrono::seconds(10), warn, "kvtier-server: refused a UCX endpoint: {}", reply.error);
      self->sessions_of.erase(ep);
      reply.flags = msg::kRefused;
      self->SendAm(ep, msg::kHelloReply, msg::Encode(reply));
      self->refused.push_back({ep, absl::Now() + kRefusedLinger});
      return UCS_OK;
    }
    EpSession session{.who = *who};
    // A key of 0 would leave the plain tags. getrandom of 8 bytes does not fail short; should it fail
    // (EINTR), it is tried again, never replaced by a guessable key.
    for (int tries = 0; session.put_tag_key == 0 && tries < 16; ++tries) {
      if (getrandom(&session.put_tag_key, sizeof(session.put_tag_key), 0) != sizeof(session.put_tag_key)) {
        session.put_tag_key = 0;
      }
    }
    if (session.put_tag_key == 0) {
      reply.flags = msg::kRefused;
      reply.error = "the server could not draw a put tag key; connect again";
      self->SendAm(ep, msg::kHelloReply, msg::Encode(reply));
      self->refused.push_back({ep, absl::Now() + kRefusedLinger});
      return UCS_OK;
    }
    reply.put_tag_key = session.put_tag_key;
    // A second hello on an authenticated endpoint keeps its key: puts in flight use it.
    auto [it, inserted] = self->sessions_of.try_emplace(ep, session);
    if (!inserted) {
      it->second.who = *who;
      reply.put_tag_key = it->second.put_tag_key;
    }
  }
  self->SendAm(ep, msg::kHelloReply, msg::Encode(reply));
  return UCS_OK;
}

ucs_status_t UcxServer::Impl::OnGet(void* arg, const void*, size_t, void* data, size_t length,
                                    const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  const EpId ep = Sender(self, data, param);
  if (ep == 0) return UCS_OK;
  const EpSession* session = self->Admit(ep, "kGet");
  if (session == nullptr) return UCS_OK;
  auto req = msg::DecodeGetRequest({static_cast<const std::byte*>(data), length});
  if (req.has_value() && !req->indices.empty()) {
    self->StartGet(ep, *req, session->who);
  }
  return UCS_OK;
}

ucs_status_t UcxServer::Impl::OnLease(void* arg, const void*, size_t, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  return self->Call(data, length, param, "kLease", msg::kLease, self->options.offer_leases, msg::kLeaseReply);
}

ucs_status_t UcxServer::Impl::OnAllocate(void* arg, const void*, size_t, void* data, size_t length,
                                         const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  return self->Call(data, length, param, "kAllocate", msg::kAllocate, self->options.offer_puts, msg::kAllocateReply);
}

ucs_status_t UcxServer::Impl::OnCommit(void* arg, const void*, size_t, void* data, size_t length,
                                       const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  return self->Call(data, length, param, "kCommit", msg::kCommit, self->options.offer_puts, msg::kCommitReply);
}

ucs_status_t UcxServer::Impl::OnPutCommit(void* arg, const void*, size_t, void* data, size_t length,
                                          const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  const EpId ep = Sender(self, data, param);
  if (ep == 0) return UCS_OK;
  const EpSession* session = self->Admit(ep, "kPutCommit");
  if (session == nullptr) return UCS_OK;
  auto req = msg::DecodeLeaseMessage({static_cast<const std::byte*>(data), length}, /*reply=*/false);
  if (!req.has_value()) return UCS_OK;
  if (!self->options.offer_puts || !self->options.offer_put_commit) {
    self->SendAm(ep, msg::kPutCommitReply,
                 UcxControlCalls::EncodeReply(
                     req->request_id, absl::FailedPreconditionError("this server answers no kPutCommit over UCX")));
    return UCS_OK;
  }
  UcxControlCalls::Call call{.endpoint = ep,
                             .call = msg::kCommit,
                             .reply_id = msg::kPutCommitReply,
                             .request_id = req->request_id,
                             .who = session->who,
                             .payload = std::move(req->payload)};
  // The kPut came first (one endpoint's AMs arrive in order): still receiving, the commit waits for
  // its last receive; otherwise its receives have all finished (or it never started) and it commits now.
  if (auto it = self->put_batches.find({ep, req->request_id}); it != self->put_batches.end()) {
    it->second->commit = std::move(call);
    return UCS_OK;
  }
  self->PushCall(std::move(call), "kPutCommit");
  return UCS_OK;
}

void UcxServer::Impl::PushCall(UcxControlCalls::Call call, const char* what) {
  const EpId ep = call.endpoint;
  const uint16_t reply_id = call.reply_id;
  const uint64_t request_id = call.request_id;
  if (calls->Push(std::move(call))) return;
  SendAm(ep, reply_id,
         UcxControlCalls::EncodeReply(
             request_id, absl::ResourceExhaustedError(absl::StrCat("too many ", what, " calls queued; retry"))));
}

ucs_status_t UcxServer::Impl::Call(void* data, size_t length, const ucp_am_recv_param_t* param, const char* what,
                                   msg::AmId call, bool offered, msg::AmId reply_id) {
  const EpId ep = Sender(this, data, param);
  if (ep == 0) return UCS_OK;
  const EpSession* session = Admit(ep, what);
  if (session == nullptr) return UCS_OK;
  auto req = msg::DecodeLeaseMessage({static_cast<const std::byte*>(data), length}, /*reply=*/false);
  if (!req.has_value()) return UCS_OK;
  const uint64_t request_id = req->request_id;
  if (offered && calls->Push({.endpoint = ep,
                              .call = call,
                              .reply_id = reply_id,
                              .request_id = request_id,
                              .who = session->who,
                              .payload = std::move(req->payload)})) {
    return UCS_OK;
  }
  const absl::Status refused =
      offered ? absl::ResourceExhaustedError(absl::StrCat("too many ", what, " calls queued; retry"))
              : absl::FailedPreconditionError(absl::StrCat("this server answers no ", what, " over UCX"));
  SendAm(ep, reply_id, UcxControlCalls::EncodeReply(request_id, refused));
  return UCS_OK;
}

void UcxServer::Impl::SendCallReplies() {
  for (UcxControlCalls::Reply& r : calls->TakeReplies()) SendAm(r.endpoint, r.reply_id, std::move(r.bytes));
}

ucs_status_t UcxServer::Impl::OnRelease(void* arg, const void*, size_t, void* data, size_t length,
                                        const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  const EpId ep = Sender(self, data, param);
  if (ep == 0) return UCS_OK;
  const EpSession* session = self->Admit(ep, "kRelease");
  if (session == nullptr) return UCS_OK;
  auto req = msg::DecodeRelease({static_cast<const std::byte*>(data), length});
  // Another tenant's lease is not released: the store treats its id as unknown.
  if (req.has_value()) self->source->Release(session->who, req->lease_id);
  return UCS_OK;
}

ucs_status_t UcxServer::Impl::OnPut(void* arg, const void*, size_t, void* data, size_t length,
                                    const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  const EpId ep = Sender(self, data, param);
  if (ep == 0) return UCS_OK;
  const EpSession* session = self->Admit(ep, "kPut");
  if (session == nullptr) return UCS_OK;
  auto req = msg::DecodePutRequest({static_cast<const std::byte*>(data), length});
  if (req.has_value()) {
    self->StartPut(ep, *req, session->put_tag_key, session->who);
  }
  return UCS_OK;
}

void UcxServer::Impl::SendAm(EpId id, uint16_t am_id, std::string payload) {
  auto it = eps.find(id);
  if (it == eps.end()) return;
  (void)UcxWorker::SendEagerAm(it->second, am_id, std::move(payload), /*reply=*/false);
}

UcxServer::UcxServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxServer::~UcxServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<UcxServer>> UcxServer::Start(const UcxServerOptions& options, HostBlockSource& source) {
  if (options.tickets_required && !options.find_ticket) {
    return absl::InvalidArgumentError("UcxServerOptions: tickets_required without find_ticket");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->source = &source;
  if (absl::Status s = impl->Init(); !s.ok()) {
    impl->Destroy();
    return s;
  }
  Impl* p = impl.get();
  p->calls.emplace(source, options.call_threads, [p] { p->worker->Wake(); });
  p->thread = std::thread([p] { p->Run(); });

  return std::unique_ptr<UcxServer>(new UcxServer(std::move(impl)));
}

void UcxServer::Shutdown() {
  if (impl_ == nullptr || impl_->shut_down) return;
  impl_->shut_down = true;
  if (impl_->calls.has_value()) impl_->calls->Stop();  // a call still in the store finishes first; its reply is dropped
  impl_->stop.store(true, std::memory_order_release);
  if (impl_->worker != nullptr) impl_->worker->Wake();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->Destroy();
}

int UcxServer::port() const { return impl_->port; }

}  // namespace kvtier::ucx
