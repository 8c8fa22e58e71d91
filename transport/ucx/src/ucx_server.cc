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
#include "ucx_control_calls.h"
#include "ucx_worker.h"

namespace kvtier::ucx {
namespace {

using Direction = TransferDirection;
// Bytes of one get request's sends in flight at once (at least one block); see StartGet.
constexpr uint64_t kSendWindowBytes = 8ULL << 20;
constexpr absl::Duration kSweepInterval = absl::Milliseconds(100);
// How long a request of a force-closed endpoint may stay uncompleted by UCX before it is abandoned
// (see MaintenanceIfDue); at most transfer_timeout.
constexpr absl::Duration kAbandonGrace = absl::Milliseconds(250);
constexpr absl::Duration kShutdownDrain = absl::Seconds(2);
// How long a refused endpoint stays open for its kHelloReply (with kRefused) to get out.
constexpr absl::Duration kRefusedLinger = absl::Milliseconds(500);
// With tickets required: an endpoint that has not proven one this long after it connected is closed,
// so that peers that connect and stay silent cannot hold endpoints open.
constexpr absl::Duration kHelloTimeout = absl::Seconds(10);
// How often the listener's pending connections are swept (PendingConnectionReaper).
constexpr absl::Duration kPendingSweepInterval = absl::Seconds(1);
// UCX's async handler slots (UCX_ASYNC_MAX_EVENTS, 1024 by default): one per connection of its
// connection manager. Raised to the descriptor limit, up to this.
constexpr uint64_t kMaxAsyncEvents = 65536;

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

struct UcxServer::Impl {
  using EpId = uint64_t;  // endpoints are named by id: a closed ucp_ep_h's address may be reused

  // One kGet or kPut request of a client.
  struct Batch {
    bool is_put = false;
    // The endpoint's principal (an admin on a server without tickets): the source answers an id of
    // another tenant exactly as an unknown one, so nothing of it is pinned, sent or received.
    Principal who;
    uint64_t request_id = 0;
    CapabilityId id;  // lease id (get) or reservation id (put)
    uint32_t flags = 0;
    EpId ep = 0;              // the client's endpoint
    std::vector<uint8_t> ok;  // per entry
    size_t remaining = 0;     // entries not completed
    // Get only: the blocks to send, the client's first tag, and the send window's state.
    std::vector<uint32_t> indices;
    uint64_t tag_base = 0;
    size_t next = 0;               // next entry to post
    uint64_t in_flight_bytes = 0;  // posted, not completed
  };
  // One tagged send or receive of one block.
  struct Op {
    Impl* impl = nullptr;
    Batch* batch = nullptr;
    uint32_t slot = 0;    // entry of the batch
    uint32_t index = 0;   // block index in the lease or reservation
    bool pinned = false;  // false: an empty send / a draining receive (nothing to unpin)
    uint64_t size = 0;
    const std::byte* data = nullptr;  // the pinned slot (receives)
    void* request = nullptr;
    EpId ep = 0;  // the endpoint it runs on (receives: the batch's client)
    absl::Time start;
    // Past this it is cancelled or its endpoint force-closed: start + transfer_timeout, or sooner the
    // expiry of the lease or reservation it pins (a pin must not outlive it: see PinnedBlock).
    absl::Time deadline = absl::InfiniteFuture();
    absl::Time closed = absl::InfiniteFuture();  // when its endpoint was force-closed
    bool cancel_requested = false;
    bool abandoned = false;  // accounted for and unpinned; UCX still owns the request
  };

  UcxServerOptions options;
  HostBlockSource* source = nullptr;

  std::shared_ptr<UcxContext> context;  // outlives `worker` (memh is unmapped after it is destroyed)
  std::unique_ptr<UcxWorker> worker;
  ucp_listener_h listener = nullptr;
  ucp_mem_h memh = nullptr;
  std::byte* region = nullptr;
  uint64_t region_bytes = 0;
  int port = 0;

  std::thread thread;
  std::atomic<bool> stop{false};
  bool shut_down = false;  // touched by the owner's thread only

  // Progress thread only.
  absl::flat_hash_map<EpId, ucp_ep_h> eps;
  absl::flat_hash_map<ucp_ep_h, EpId> ep_ids;
  EpId next_ep = 1;
  absl::flat_hash_set<Op*> inflight;
  absl::flat_hash_set<Op*> abandoned;                  // freed when UCX completes them, or at Destroy
  std::vector<EpId> to_close;                          // endpoints reported failed by UCX
  std::vector<std::pair<Op*, ucs_status_t>> deferred;  // completed when posted; see Track
  absl::Time next_sweep;
  // What an endpoint proved in its hello. With tickets required, only endpoints in `sessions_of` are
  // served; without, every endpoint is served as an admin with put_tag_key 0.
  struct EpSession {
    Principal who;
    uint64_t put_tag_key = 0;
  };
  absl::flat_hash_map<EpId, EpSession> sessions_of;
  std::vector<std::pair<EpId, absl::Time>> refused;   // closed at that time (kRefusedLinger)
  std::vector<std::pair<EpId, absl::Time>> unproven;  // closed at that time unless in sessions_of
  // Connections of the listener UCX never delivered as a connection request; peer_of: ip:port of each
  // endpoint's connection, admitted to the reaper until the endpoint closes.
  std::optional<PendingConnectionReaper> reaper;

  std::optional<UcxControlCalls> calls;  // started after Init
  absl::flat_hash_map<EpId, std::string> peer_of;
  absl::Time next_pending_sweep;

  // ---- setup ----

  absl::Status Init() {
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
        {msg::kHello, &Impl::OnHello},     {msg::kGet, &Impl::OnGet},     {msg::kPut, &Impl::OnPut},
        {msg::kRelease, &Impl::OnRelease}, {msg::kLease, &Impl::OnLease}, {msg::kAllocate, &Impl::OnAllocate},
        {msg::kCommit, &Impl::OnCommit}};
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

  // Frees UCX; the progress thread has stopped.
  void Destroy() {
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

  // ---- progress thread ----

  void Run() {
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

  void MaintenanceIfDue() {
    worker->ReapCloses();
    if (!to_close.empty()) {
      // UCX reports some peer failures even without error handling (a tcp connection that broke):
      // close at once, which also cancels that client's unmatched receives.
      KVTIER_LOG_EVERY(std::chrono::seconds(10), info, "kvtier-server: {} UCX endpoints failed (peer gone); closed",
                       to_close.size());
      for (EpId id : std::vector<EpId>(std::move(to_close))) CloseEp(id);
      to_close.clear();
    }
    const absl::Time now = absl::Now();
    if (now >= next_pending_sweep) {
      next_pending_sweep = now + kPendingSweepInterval;
      const PendingConnectionReaper::SweepResult swept = reaper->Sweep(now);
      source->SetPendingConnections(swept.pending - swept.timed_out - swept.over_limit);
      if (swept.timed_out + swept.over_limit > 0) {
        source->CountPendingConnectionResets(swept.timed_out, swept.over_limit);
        KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                         "kvtier-server: reset {} connections to the UCX port that sent no valid connection request "
                         "within {} and {} beyond {} pending from one host",
                         swept.timed_out, absl::FormatDuration(options.pending_connection_timeout), swept.over_limit,
                         options.max_pending_connections_per_host);
      }
    }
    for (size_t i = 0; i < unproven.size();) {
      if (unproven[i].second <= now) {
        if (!sessions_of.contains(unproven[i].first)) CloseEp(unproven[i].first);
        unproven[i] = unproven.back();
        unproven.pop_back();
      } else {
        ++i;
      }
    }
    for (size_t i = 0; i < refused.size();) {
      if (refused[i].second <= now) {
        CloseEp(refused[i].first);
        refused[i] = refused.back();
        refused.pop_back();
      } else {
        ++i;
      }
    }
    if (now < next_sweep) return;
    next_sweep = now + kSweepInterval;
    // Transfers past their deadline (transfer_timeout, or the expiry of the lease or reservation they
    // pin, whichever comes first): cancel receives not matched yet; force-close the endpoint of
    // anything else (a send waiting for its client, a receive whose cancel did nothing because it was
    // matched: its data stopped coming). Endpoints run without peer failure handling (see the class
    // comment), so this is how a writer that died or stalled mid-put gives its keys back by its
    // reservation's expiry rather than transfer_timeout later. UCX 1.13 does not always complete such
    // requests when their endpoint closes (in error mode NONE, after the client died; a receive
    // matched over tcp never does); those are abandoned kAbandonGrace after the close, a send not
    // before its deadline: unpinned and counted, the request left to UCX. Nothing can still write a
    // receive's slot then (its endpoint, the only way in, is closed), and a late read of a send's slot
    // by a client still running would fail that client's checksum check.
    const absl::Duration grace = std::min(options.transfer_timeout, kAbandonGrace);
    std::vector<Op*> late;  // past the deadline, or on an endpoint closed (e.g. failed) a grace ago
    for (Op* op : inflight) {
      if (now >= op->deadline || now - op->closed > grace) late.push_back(op);
    }
    absl::flat_hash_set<EpId> close;
    uint64_t given_up = 0;
    for (Op* op : late) {
      if (!inflight.contains(op)) continue;  // completed by an earlier cancel's callback chain
      const bool is_recv = op->batch->is_put;
      if (is_recv && !op->cancel_requested) {
        op->cancel_requested = true;
        ucp_request_cancel(worker->get(), op->request);  // may complete (and free) op right here
        // Still in flight: it was matched, its data partly in. Close its endpoint now (below).
        if (!inflight.contains(op)) continue;
      }
      // A receive's slot is safe to give up once its endpoint has been closed a while; a send's only
      // at its deadline too (a client still running may read the slot until it gives up itself).
      if (now - op->closed > grace && (is_recv || now >= op->deadline)) {
        Abandon(op);
        ++given_up;
        continue;
      }
      if (now >= op->deadline && op->closed == absl::InfiniteFuture()) close.insert(op->ep);
    }
    for (EpId id : close) CloseEp(id);
    if (!close.empty()) {
      KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                       "kvtier-server: force-closed {} UCX endpoints with transfers past their deadline (a client "
                       "that died or stalled mid-transfer)",
                       close.size());
    }
    if (given_up > 0) {
      KVTIER_LOG(warn, "kvtier-server: gave up on {} UCX transfers of closed endpoints", given_up);
    }
  }

  // Force-closes endpoint `id` (if still open): UCX completes what it can with UCS_ERR_CANCELED. The
  // receives posted for that client's puts are cancelled too: they belong to the worker, not to the
  // endpoint, so closing it leaves them posted, and nothing else sends on their tags (a client sends a
  // put's blocks on the endpoint of its kPut). A receive already matched (its data partly in) does not
  // cancel; it is abandoned later (MaintenanceIfDue).
  void CloseEp(EpId id) {
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

  // ---- UCX callbacks ----

  static void OnConnRequest(ucp_conn_request_h conn_request, void* arg) {
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

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t) {
    auto* self = static_cast<Impl*>(arg);
    if (auto it = self->ep_ids.find(ep); it != self->ep_ids.end()) {
      self->to_close.push_back(it->second);  // closed outside UCX's callback
    }
  }

  // The endpoint an AM came from, or 0 for a rendezvous one (clients send eager only) or an unknown sender.
  static EpId Sender(Impl* self, void* data, const ucp_am_recv_param_t* param) {
    if (self->worker->DropRendezvous(data, param)) return 0;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr) return 0;
    auto it = self->ep_ids.find(param->reply_ep);
    return it == self->ep_ids.end() ? 0 : it->second;
  }

  bool TicketsRequired() const { return options.tickets_required; }

  // The session of endpoint `ep`, or null when it has not proven a ticket (tickets required): then the
  // AM is dropped and the endpoint closed (outside UCX's callback).
  const EpSession* Admit(EpId ep, const char* what) {
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

  static ucs_status_t OnHello(void* arg, const void*, size_t, void* data, size_t length,
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
                                   (self->options.offer_puts ? msg::kTakesPuts : 0u)};
    if (self->TicketsRequired()) {
      std::optional<Principal> who;
      if (hello->version != msg::kProtocolVersion) {
        reply.error = absl::StrCat("UCX protocol version ", hello->version, " is not this server's (",
                                   msg::kProtocolVersion, ")");
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

  static ucs_status_t OnGet(void* arg, const void*, size_t, void* data, size_t length,
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

  // A lease without gRPC, as the endpoint's principal.
  static ucs_status_t OnLease(void* arg, const void*, size_t, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    return self->Call(data, length, param, "kLease", msg::kLease, self->options.offer_leases, msg::kLeaseReply);
  }

  // The two phases of a put without gRPC, as the endpoint's principal.
  static ucs_status_t OnAllocate(void* arg, const void*, size_t, void* data, size_t length,
                                 const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    return self->Call(data, length, param, "kAllocate", msg::kAllocate, self->options.offer_puts, msg::kAllocateReply);
  }
  static ucs_status_t OnCommit(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    return self->Call(data, length, param, "kCommit", msg::kCommit, self->options.offer_puts, msg::kCommitReply);
  }

  // A control call of an authenticated endpoint (kLease, kAllocate, kCommit; `offered`: the hello
  // offers it): a call thread answers it as the endpoint's principal (Answer); the reply (`reply_id`)
  // carries its answer or its refusal's code and message.
  ucs_status_t Call(void* data, size_t length, const ucp_am_recv_param_t* param, const char* what, msg::AmId call,
                    bool offered, msg::AmId reply_id) {
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

  // Progress thread: sends the replies the call threads queued (to endpoints still open).
  void SendCallReplies() {
    for (UcxControlCalls::Reply& r : calls->TakeReplies()) SendAm(r.endpoint, r.reply_id, std::move(r.bytes));
  }

  // A client that split a lease's blocks over several kGet requests (get lanes) is done with it.
  static ucs_status_t OnRelease(void* arg, const void*, size_t, void* data, size_t length,
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

  static ucs_status_t OnPut(void* arg, const void*, size_t, void* data, size_t length,
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

  static void OnSendDone(void* request, ucs_status_t status, void* user_data) {
    Op* op = static_cast<Op*>(user_data);
    ucp_request_free(request);
    op->request = nullptr;
    op->impl->Completed(op, status, op->size);
  }

  static void OnRecvDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
    Op* op = static_cast<Op*>(user_data);
    const uint64_t length = status == UCS_OK && info != nullptr ? info->length : 0;
    ucp_request_free(request);
    op->request = nullptr;
    op->impl->Completed(op, status, length);
  }

  // ---- requests ----

  void SendAm(EpId id, uint16_t am_id, std::string payload) {
    auto it = eps.find(id);
    if (it == eps.end()) return;
    (void)UcxWorker::SendEagerAm(it->second, am_id, std::move(payload), /*reply=*/false);
  }

  // `who`: the endpoint's principal; a lease that is unknown to it (or another tenant's) sends every
  // block as an empty message, none is pinned.
  void StartGet(EpId ep, const msg::GetRequest& req, const Principal& who) {
    auto* batch = new Batch{.is_put = false,
                            .who = who,
                            .request_id = req.request_id,
                            .id = req.lease_id,
                            .flags = req.flags,
                            .ep = ep,
                            .ok = std::vector<uint8_t>(req.indices.size(), 0),
                            .remaining = req.indices.size(),
                            .indices = req.indices,
                            .tag_base = req.tag_base};
    // A window of sends: with every block's rendezvous in flight at once, UCX interleaves their
    // fragments and every block lands at the end; a window makes blocks land one after another, so the
    // client verifies each while the next moves (and while it is still in cache).
    while (batch->next < batch->indices.size() && batch->in_flight_bytes < kSendWindowBytes) PostNextSend(batch);
  }

  // Posts the batch's next send: its block from its pinned slot, or an empty message when it cannot be
  // pinned (the client then knows it is not coming).
  void PostNextSend(Batch* batch) {
    static const std::byte kEmpty{};
    const uint32_t j = static_cast<uint32_t>(batch->next++);
    const absl::Time now = absl::Now();
    auto* op = new Op{.impl = this,
                      .batch = batch,
                      .slot = j,
                      .index = batch->indices[j],
                      .ep = batch->ep,
                      .start = now,
                      .deadline = now + options.transfer_timeout};
    const std::byte* data = &kEmpty;
    auto pinned = source->PinForSend(batch->who, batch->id, op->index);  // unknown id: an empty message
    if (pinned.ok()) {
      op->pinned = true;
      op->size = pinned->size_bytes;
      op->deadline = std::min(op->deadline, now + pinned->expires_in);
      data = pinned->data;
    }
    batch->in_flight_bytes += std::max<uint64_t>(op->size, 1);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &Impl::OnSendDone;
    p.user_data = op;
    if (memh != nullptr && op->pinned && data >= region && data + op->size <= region + region_bytes) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = memh;
    }
    auto it = eps.find(batch->ep);
    ucs_status_ptr_t r = it != eps.end() ? ucp_tag_send_nbx(it->second, data, op->size, batch->tag_base + j, &p)
                                         : UCS_STATUS_PTR(UCS_ERR_CANCELED);  // closed meanwhile
    Track(op, r);
  }

  // `put_tag_key`: the endpoint's (SessionPutTag). `who`: the endpoint's principal; a reservation
  // unknown to it (or another tenant's) pins nothing, zero-byte receives on the endpoint's own tags
  // drain its sends, and every entry fails.
  void StartPut(EpId ep, const msg::PutRequest& req, uint64_t put_tag_key, const Principal& who) {
    auto* batch = new Batch{.is_put = true,
                            .who = who,
                            .request_id = req.request_id,
                            .id = req.reservation_id,
                            .ep = ep,
                            .ok = std::vector<uint8_t>(req.indices.size(), 0),
                            .remaining = req.indices.size()};
    if (req.indices.empty()) {
      FinishBatch(batch);
      return;
    }
    const absl::Time now = absl::Now();
    std::optional<bool> tag_free;  // PutTagFreeFor(id), asked once, when a block cannot be pinned
    for (uint32_t j = 0; j < req.indices.size(); ++j) {
      auto* op = new Op{.impl = this,
                        .batch = batch,
                        .slot = j,
                        .index = req.indices[j],
                        .ep = ep,
                        .start = now,
                        .deadline = now + options.transfer_timeout};
      if (op->index > msg::kMaxTagIndex) {
        deferred.push_back({op, UCS_ERR_INVALID_PARAM});  // the client cannot have a valid tag for it
        continue;
      }
      std::byte* data = nullptr;
      // The kPut's full id is checked here (a tag is no capability): only a live id of the endpoint's
      // tenant pins its slots.
      auto pinned = source->PinForReceive(batch->who, req.reservation_id, op->index);
      if (pinned.ok()) {
        op->pinned = true;
        op->size = pinned->size_bytes;
        op->deadline = std::min(op->deadline, now + pinned->expires_in);
        data = pinned->data;
        op->data = data;
      } else {
        // A zero-byte receive drains the client's message (truncated), so its send completes; but not
        // on a tag of another live reservation (a wrong id sharing its tag prefix): that message is not
        // this request's to take.
        if (!tag_free.has_value()) tag_free = source->PutTagFreeFor(req.reservation_id);
        if (!*tag_free) {
          deferred.push_back({op, UCS_ERR_INVALID_PARAM});
          continue;
        }
      }
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.cb.recv = &Impl::OnRecvDone;
      p.user_data = op;
      if (memh != nullptr && op->pinned) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p.memh = memh;
      }
      ucs_status_ptr_t r =
          ucp_tag_recv_nbx(worker->get(), data, op->size,
                           msg::SessionPutTag(req.reservation_id, op->index, put_tag_key), kFullTagMask, &p);
      Track(op, r);
    }
  }

  // Records a send/receive just posted: in flight, or completed at once. An immediate completion is
  // handled from the progress loop, never inside the caller's loop over a batch (which it could end).
  void Track(Op* op, ucs_status_ptr_t r) {
    if (UCS_PTR_IS_PTR(r)) {
      op->request = r;
      inflight.insert(op);
    } else {
      deferred.push_back({op, UCS_PTR_STATUS(r)});
    }
  }

  void RunDeferred() {
    while (!deferred.empty()) {
      std::vector<std::pair<Op*, ucs_status_t>> now;
      now.swap(deferred);
      for (auto [op, status] : now) Complete(op, status, status == UCS_OK ? op->size : 0);
    }
  }

  // UCX completed op's request (a callback).
  void Completed(Op* op, ucs_status_t status, uint64_t length) {
    if (op->abandoned) {  // settled already
      abandoned.erase(op);
      delete op;
      return;
    }
    Complete(op, status, length);
  }

  // Settles an op whose request UCX never completed (see MaintenanceIfDue).
  void Abandon(Op* op) {
    op->abandoned = true;
    abandoned.insert(op);
    Settle(op, UCS_ERR_CANCELED, 0);
  }

  // An op is done: unpin its slot, count it, and advance its batch; frees the op.
  void Complete(Op* op, ucs_status_t status, uint64_t length) {
    Settle(op, status, length);
    delete op;
  }

  void Settle(Op* op, ucs_status_t status, uint64_t length) {
    inflight.erase(op);
    Batch* batch = op->batch;
    op->batch = nullptr;
    bool ok = false;
    if (batch->is_put) {
      ok = op->pinned && status == UCS_OK && length == op->size;
      // Hash the block now, while it is in cache, so that Commit need not read it again. Abandoned ops
      // are not hashed: UCX may not be done with their slot.
      std::optional<uint64_t> sum;
      if (ok && !op->abandoned) sum = BlockChecksum(op->data, op->size);
      if (op->pinned) source->FinishReceive(batch->id, op->index, length, ok, sum);
      if (ok) {
        source->CountTransfer(Direction::kWrite, length);
      } else {
        source->CountTransferError(Direction::kWrite);
      }
    } else {
      ok = op->pinned && status == UCS_OK;
      if (op->pinned) source->UnpinSend(batch->id, op->index);
      batch->in_flight_bytes -= std::max<uint64_t>(op->size, 1);
      if (ok) {
        source->CountTransfer(Direction::kRead, op->size);
      } else {
        source->CountTransferError(Direction::kRead);
      }
    }
    batch->ok[op->slot] = ok ? 1 : 0;
    if (--batch->remaining == 0) {
      FinishBatch(batch);
      return;
    }
    if (!batch->is_put) {
      // Refill the send window. Immediate completions are deferred (Track), so this cannot recurse.
      while (batch->next < batch->indices.size() && batch->in_flight_bytes < kSendWindowBytes) PostNextSend(batch);
    }
  }

  void FinishBatch(Batch* batch) {
    if (batch->is_put) {
      SendAm(batch->ep, msg::kPutDone, msg::Encode(msg::PutDone{.request_id = batch->request_id, .ok = batch->ok}));
    } else if ((batch->flags & msg::kGetRelease) != 0) {  // never another tenant's lease (who)
      source->Release(batch->who, batch->id);
    }
    delete batch;
  }
};

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
