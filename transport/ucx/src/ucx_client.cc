#include "kvtier/ucx/ucx_client.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kvtier/ucx/ucx_messages.h"
#include "ucx_get_lane.h"
#include "ucx_worker.h"

namespace kvtier::ucx {
namespace {

using ItemStatus = UcxClient::ItemStatus;
// One caller's transfer (or hello). Fields under mu are shared with the progress thread; `requests` is
// touched by the progress thread only.
struct Transfer {
  std::mutex mu;
  std::condition_variable cv;
  size_t remaining = 0;            // guarded by mu: completions still expected
  uint64_t endpoint = 0;           // a hello's endpoint
  bool single_copy = false;        // guarded by mu: the hello's endpoint has a single-copy lane
  std::vector<ItemStatus> items;   // guarded by mu
  std::vector<uint8_t> put_ok;     // guarded by mu: the server's kPutDone
  bool put_done = false;           // guarded by mu
  std::string node_id;             // guarded by mu: the hello reply
  uint32_t hello_flags = 0;        // guarded by mu: the hello reply
  std::string hello_error;         // guarded by mu: a refused hello's reason (kRefused)
  std::string lease_reply;         // guarded by mu: a kLeaseReply's payload (failed: its error text)
  uint32_t lease_code = 0;         // guarded by mu: a refused kLeaseReply's absl::StatusCode (0: none sent)
  bool failed = false;             // guarded by mu: the endpoint is unknown, failed or a send failed
  std::vector<uint32_t> arrived;   // guarded by mu: items that completed kOk, in completion order
  std::vector<void*> requests;     // progress thread: per item, the request while in flight
  std::vector<uint64_t> expected;  // per item: bytes a receive must bring

  void Done(std::unique_lock<std::mutex>&) {
    --remaining;
    cv.notify_all();  // also wakes a caller that consumes arrivals one by one
  }
};

}  // namespace

struct UcxClient::Impl {
  struct Op {
    Impl* impl = nullptr;
    std::shared_ptr<Transfer> transfer;
    uint32_t slot = 0;
    void* request = nullptr;  // while in flight (live_ops)
  };
  struct Endpoint {
    ucp_ep_h ep = nullptr;
    bool failed = false;
    uint64_t put_tag_key = 0;  // from the hello reply (SessionPutTag)
  };

  std::unique_ptr<UcxWorker> worker;  // its context is the get lanes' too
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> next_tag{1};
  std::atomic<uint64_t> next_id{1};
  std::atomic<uint64_t> abandoned{0};

  std::mutex queue_mu;
  std::deque<std::function<void()>> queue;  // guarded by queue_mu
  std::atomic<bool> queued{false};

  // Get lanes.
  int get_lanes = 2;
  std::mutex lanes_mu;
  std::vector<std::unique_ptr<GetLane>> lanes;  // guarded by lanes_mu; started on first need
  bool lanes_failed = false;                    // guarded by lanes_mu
  // guarded by lanes_mu: the listener (host:port) of each endpoint with a single-copy lane, whose Gets
  // are split over the lanes
  absl::flat_hash_map<EndpointId, std::string> listener_of;
  absl::flat_hash_map<EndpointId, std::string> ticket_of;  // guarded by lanes_mu: for lane endpoints

  // Progress thread only.
  absl::flat_hash_map<EndpointId, Endpoint> endpoints;
  absl::flat_hash_map<ucp_ep_h, EndpointId> endpoint_ids;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> pending_hello;  // by nonce
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> pending_put;    // by request id
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> pending_lease;  // by request id
  // Every send and receive in flight, until its callback runs. One that a forced close never completed
  // (a transfer given up on) is released by Destroy, so that neither it nor its transfer outlives us.
  absl::flat_hash_set<Op*> live_ops;

  absl::Status Init(const std::string& transports) {
    auto context = UcxContext::Create(transports, "ucx_transports", /*several_workers=*/true);
    if (!context.ok()) return context.status();
    auto w = UcxWorker::Create(*std::move(context));
    if (!w.ok()) return w.status();
    worker = *std::move(w);
    const std::pair<uint16_t, ucp_am_recv_callback_t> handlers[] = {
        {msg::kHelloReply, &Impl::OnHelloReply},  {msg::kPutDone, &Impl::OnPutDone},
        {msg::kLeaseReply, &Impl::OnLeaseReply},  {msg::kAllocateReply, &Impl::OnLeaseReply},
        {msg::kCommitReply, &Impl::OnLeaseReply}, {msg::kPutCommitReply, &Impl::OnLeaseReply}};
    for (const auto& [id, cb] : handlers) {
      if (absl::Status s = worker->SetAmHandler(id, cb, this); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // The progress thread has stopped (or never started).
  void Destroy() {
    {
      std::lock_guard<std::mutex> lock(lanes_mu);
      lanes.clear();  // joins their threads and closes their endpoints
    }
    if (worker != nullptr) {
      for (auto& [id, e] : endpoints) worker->CloseEndpoint(e.ep);
      const absl::Time until = absl::Now() + kCloseGrace;
      worker->DrainCloses(until);
      while (!live_ops.empty() && absl::Now() < until) ucp_worker_progress(worker->get());
      for (Op* op : live_ops) {
        ucp_request_free(op->request);  // UCX finishes it alone; its callback no longer runs
        delete op;
      }
      live_ops.clear();
      endpoints.clear();
      worker.reset();
    }
  }

  // ---- progress thread ----

  void Run() {
    worker->Run([this] { return !stop.load(std::memory_order_acquire); },
                [this](bool progressed) {
                  if (queued.load(std::memory_order_acquire)) {
                    RunCommands();
                    return true;
                  }
                  if (progressed) return true;
                  worker->ReapCloses();
                  return false;
                },
                [] { return absl::Milliseconds(100); });
    RunCommands();  // a Close() queued last
  }

  void RunCommands() {
    std::deque<std::function<void()>> batch;
    {
      std::lock_guard<std::mutex> lock(queue_mu);
      batch.swap(queue);
      queued.store(false, std::memory_order_release);
    }
    for (auto& fn : batch) fn();
  }

  void Enqueue(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(queue_mu);
      queue.push_back(std::move(fn));
      queued.store(true, std::memory_order_release);
    }
    worker->Wake();
  }

  void CloseEndpoint(EndpointId id) {
    auto it = endpoints.find(id);
    if (it == endpoints.end()) return;
    ucp_ep_h ep = it->second.ep;
    endpoints.erase(it);
    endpoint_ids.erase(ep);
    worker->CloseEndpoint(ep);
  }

  // The endpoint to run on, or null (and every item failed) when it is unknown or failed.
  ucp_ep_h UsableEndpoint(EndpointId id, Transfer& t) {
    auto it = endpoints.find(id);
    if (it != endpoints.end() && !it->second.failed) return it->second.ep;
    std::unique_lock<std::mutex> lock(t.mu);
    t.failed = true;
    t.remaining = 0;
    t.cv.notify_all();
    return nullptr;
  }

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t) {
    auto* self = static_cast<Impl*>(arg);
    auto it = self->endpoint_ids.find(ep);
    if (it != self->endpoint_ids.end()) self->endpoints[it->second].failed = true;
  }

  static ucs_status_t OnHelloReply(void* arg, const void*, size_t, void* data, size_t length,
                                   const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    if (self->worker->DropRendezvous(data, param)) return UCS_OK;
    auto reply = msg::DecodeHelloReply({static_cast<const std::byte*>(data), length});
    if (!reply.has_value()) return UCS_OK;
    auto it = self->pending_hello.find(reply->nonce);
    if (it == self->pending_hello.end()) return UCS_OK;
    std::shared_ptr<Transfer> t = std::move(it->second);
    self->pending_hello.erase(it);
    std::unique_lock<std::mutex> lock(t->mu);
    t->node_id = reply->version == msg::kProtocolVersion ? reply->node_id : "";
    t->hello_flags = reply->flags;
    t->hello_error = reply->error;
    if (auto ep = self->endpoints.find(t->endpoint); ep != self->endpoints.end()) {
      t->single_copy = HasSingleCopyLane(ep->second.ep);  // wired up: the hello went out on it
      ep->second.put_tag_key = reply->put_tag_key;
    }
    t->failed = reply->version != msg::kProtocolVersion || (reply->flags & msg::kRefused) != 0;
    t->Done(lock);
    return UCS_OK;
  }

  // A control call (kLease, kAllocate, kCommit): sends `request` as `id` and waits for its reply (any of
  // kLeaseReply, kAllocateReply, kCommitReply, matched by request id) until `deadline`. `what` names it
  // in errors.
  absl::StatusOr<std::string> Call(EndpointId endpoint, msg::AmId id, const char* what, std::string request,
                                   absl::Time deadline) {
    const uint64_t request_id = next_id.fetch_add(1);
    auto t = std::make_shared<Transfer>();
    t->remaining = 1;
    Enqueue([this, t, endpoint, request_id, id,
             payload = msg::Encode(msg::LeaseMessage{.request_id = request_id, .payload = std::move(request)},
                                   /*reply=*/false)]() mutable {
      ucp_ep_h ep = UsableEndpoint(endpoint, *t);
      if (ep == nullptr) return;
      pending_lease[request_id] = t;
      if (UcxWorker::SendEagerAm(ep, id, std::move(payload), /*reply=*/true) != UCS_OK) {
        pending_lease.erase(request_id);
        std::unique_lock<std::mutex> lock(t->mu);
        t->failed = true;
        t->Done(lock);
      }
    });
    const bool in_time = Await(t, endpoint, deadline, [this, request_id] { Forget(pending_lease, request_id); });
    std::lock_guard<std::mutex> lock(t->mu);
    if (!in_time) return absl::DeadlineExceededError(absl::StrCat("UCX ", what, ": no answer in time"));
    if (t->failed && t->lease_code != 0)
      return absl::Status(static_cast<absl::StatusCode>(t->lease_code), t->lease_reply);
    if (t->failed) {
      return absl::UnavailableError(t->lease_reply.empty() ? absl::StrCat("UCX ", what, " failed")
                                                           : absl::StrCat("UCX ", what, " refused: ", t->lease_reply));
    }
    return std::move(t->lease_reply);
  }

  static ucs_status_t OnLeaseReply(void* arg, const void*, size_t, void* data, size_t length,
                                   const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    if (self->worker->DropRendezvous(data, param)) return UCS_OK;
    auto reply = msg::DecodeLeaseMessage({static_cast<const std::byte*>(data), length}, /*reply=*/true);
    if (!reply.has_value()) return UCS_OK;
    auto it = self->pending_lease.find(reply->request_id);
    if (it == self->pending_lease.end()) return UCS_OK;
    std::shared_ptr<Transfer> t = std::move(it->second);
    self->pending_lease.erase(it);
    std::unique_lock<std::mutex> lock(t->mu);
    t->failed = !reply->ok;
    t->lease_code = reply->code;
    t->lease_reply = std::move(reply->payload);
    t->Done(lock);
    return UCS_OK;
  }

  static ucs_status_t OnPutDone(void* arg, const void*, size_t, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    if (self->worker->DropRendezvous(data, param)) return UCS_OK;
    auto done = msg::DecodePutDone({static_cast<const std::byte*>(data), length});
    if (!done.has_value()) return UCS_OK;
    auto it = self->pending_put.find(done->request_id);
    if (it == self->pending_put.end()) return UCS_OK;
    std::shared_ptr<Transfer> t = std::move(it->second);
    self->pending_put.erase(it);
    std::unique_lock<std::mutex> lock(t->mu);
    if (done->ok.size() == t->items.size()) t->put_ok = std::move(done->ok);
    t->put_done = true;
    t->Done(lock);
    return UCS_OK;
  }

  static void OnRecvDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
    auto* op = static_cast<Op*>(user_data);
    op->impl->live_ops.erase(op);
    Transfer& t = *op->transfer;
    t.requests[op->slot] = nullptr;
    ucp_request_free(request);
    ItemStatus s = ItemStatus::kError;
    if (status == UCS_OK && info != nullptr) {
      if (info->length == t.expected[op->slot]) {
        s = ItemStatus::kOk;
      } else if (info->length == 0) {
        s = ItemStatus::kUnavailable;  // the server could not send this block
      }
    }
    {
      std::unique_lock<std::mutex> lock(t.mu);
      t.items[op->slot] = s;
      if (s == ItemStatus::kOk) t.arrived.push_back(op->slot);
      t.Done(lock);
    }
    delete op;
  }

  static void OnSendDone(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<Op*>(user_data);
    op->impl->live_ops.erase(op);
    Transfer& t = *op->transfer;
    t.requests[op->slot] = nullptr;
    ucp_request_free(request);
    {
      std::unique_lock<std::mutex> lock(t.mu);
      t.items[op->slot] = status == UCS_OK ? ItemStatus::kOk : ItemStatus::kError;
      t.Done(lock);
    }
    delete op;
  }

  // Progress thread: posts the tagged sends of a put's blocks (items j of `t`) on `ep`.
  void PostPutSends(const std::shared_ptr<Transfer>& t, ucp_ep_h ep, const CapabilityId& reservation_id,
                    std::span<const uint32_t> idx, std::span<const std::span<const std::byte>> data,
                    uint64_t put_tag_key) {
    for (uint32_t j = 0; j < data.size(); ++j) {
      auto* op = new Op{.impl = this, .transfer = t, .slot = j};
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = &Impl::OnSendDone;
      p.user_data = op;
      ucs_status_ptr_t r = ucp_tag_send_nbx(ep, data[j].data(), data[j].size(),
                                            msg::SessionPutTag(reservation_id, idx[j], put_tag_key), &p);
      if (UCS_PTR_IS_PTR(r)) {
        t->requests[j] = r;
        op->request = r;
        live_ops.insert(op);
        continue;
      }
      delete op;
      std::unique_lock<std::mutex> lock(t->mu);
      t->items[j] = UCS_PTR_STATUS(r) == UCS_OK ? ItemStatus::kOk : ItemStatus::kError;
      t->Done(lock);
    }
  }

  // Stops waiting for a server's reply: its completion is counted now.
  static void Forget(absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>>& pending, uint64_t key) {
    auto it = pending.find(key);
    if (it == pending.end()) return;
    std::shared_ptr<Transfer> t = std::move(it->second);
    pending.erase(it);
    std::unique_lock<std::mutex> lock(t->mu);
    t->failed = true;
    t->Done(lock);
  }

  // Waits for `t` until `deadline`; on a miss cancels what can be cancelled, force-closes the endpoint
  // and waits for the requests to complete. True when everything completed by the deadline.
  // `on_arrival(j)` (may be empty) runs on the caller's thread for each item as soon as it completed
  // kOk, while the rest are in flight.
  bool Await(const std::shared_ptr<Transfer>& t, EndpointId endpoint, absl::Time deadline, std::function<void()> forget,
             const std::function<void(size_t)>& on_arrival = {}) {
    {
      std::unique_lock<std::mutex> lock(t->mu);
      size_t seen = 0;
      const auto until = absl::ToChronoTime(deadline);
      while (t->cv.wait_until(lock, until,
                              [&] { return t->remaining == 0 || (on_arrival && t->arrived.size() > seen); })) {
        if (on_arrival && t->arrived.size() > seen) {
          const std::vector<uint32_t> fresh(t->arrived.begin() + static_cast<ptrdiff_t>(seen), t->arrived.end());
          seen = t->arrived.size();
          lock.unlock();
          for (uint32_t j : fresh) on_arrival(j);
          lock.lock();
          continue;
        }
        return true;  // remaining == 0
      }
    }
    Enqueue([this, t, forget] {
      forget();
      for (void* r : t->requests) {
        if (r != nullptr) ucp_request_cancel(worker->get(), r);  // unmatched receives complete as cancelled
      }
    });
    {
      std::unique_lock<std::mutex> lock(t->mu);
      t->cv.wait_for(lock, absl::ToChronoNanoseconds(kCancelGrace), [&] { return t->remaining == 0; });
    }
    Enqueue([this, endpoint] { CloseEndpoint(endpoint); });
    std::unique_lock<std::mutex> lock(t->mu);
    if (!t->cv.wait_for(lock, absl::ToChronoNanoseconds(kCloseGrace), [&] { return t->remaining == 0; })) {
      abandoned.fetch_add(t->remaining, std::memory_order_relaxed);
    }
    return false;
  }
};

UcxClient::UcxClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxClient::~UcxClient() {
  impl_->stop.store(true, std::memory_order_release);
  impl_->worker->Wake();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->Destroy();
}

absl::StatusOr<std::unique_ptr<UcxClient>> UcxClient::Create(const std::string& transports, int get_lanes) {
  auto impl = std::make_unique<Impl>();
  impl->get_lanes = std::max(1, get_lanes);
  if (absl::Status s = impl->Init(transports); !s.ok()) {
    impl->Destroy();
    return s;
  }
  Impl* p = impl.get();
  p->thread = std::thread([p] { p->Run(); });
  return std::unique_ptr<UcxClient>(new UcxClient(std::move(impl)));
}

void UcxClient::SetTicket(EndpointId endpoint, const std::string& ticket) {
  std::lock_guard<std::mutex> lock(impl_->lanes_mu);
  if (impl_->ticket_of.contains(endpoint)) impl_->ticket_of[endpoint] = ticket;
}

uint64_t UcxClient::abandoned_requests() const {
  uint64_t n = impl_->abandoned.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(impl_->lanes_mu);
  for (const auto& lane : impl_->lanes) n += lane->abandoned();
  return n;
}

absl::StatusOr<UcxClient::Connection> UcxClient::Connect(const std::string& host_port, absl::Time deadline,
                                                         const std::string& ticket) {
  auto addr = ResolveIpv4(host_port, /*min_port=*/1);
  if (!addr.ok()) return addr.status();
  Impl& im = *impl_;
  const EndpointId id = im.next_id.fetch_add(1);
  const uint64_t nonce = im.next_id.fetch_add(1);
  auto t = std::make_shared<Transfer>();
  t->remaining = 1;
  t->endpoint = id;
  im.Enqueue([&im, t, id, nonce, ticket, addr = *addr] {
    absl::StatusOr<ucp_ep_h> connected = im.worker->Connect(addr, &Impl::OnEpError, &im);
    if (!connected.ok()) {
      std::unique_lock<std::mutex> lock(t->mu);
      t->failed = true;
      t->Done(lock);
      return;
    }
    ucp_ep_h ep = *connected;
    im.endpoints[id] = {.ep = ep};
    im.endpoint_ids[ep] = id;
    im.pending_hello[nonce] = t;
    if (UcxWorker::SendEagerAm(ep, msg::kHello, msg::Encode(msg::Hello{.nonce = nonce, .ticket = ticket}), true) !=
        UCS_OK) {
      im.pending_hello.erase(nonce);
      std::unique_lock<std::mutex> lock(t->mu);
      t->failed = true;
      t->Done(lock);
    }
  });
  const bool in_time = im.Await(t, id, deadline, [&im, nonce] { im.Forget(im.pending_hello, nonce); });
  std::lock_guard<std::mutex> lock(t->mu);
  if (in_time && (t->hello_flags & msg::kRefused) != 0) {
    Close(id);
    return absl::PermissionDeniedError(absl::StrCat("UCX hello to ", host_port, " refused: ", t->hello_error));
  }
  if (!in_time || t->failed) {
    if (in_time) Close(id);
    return in_time ? absl::UnavailableError(absl::StrCat("UCX hello to ", host_port, " failed"))
                   : absl::DeadlineExceededError(absl::StrCat("UCX hello to ", host_port, " timed out"));
  }
  {
    std::lock_guard<std::mutex> lanes_lock(im.lanes_mu);
    if (t->single_copy) im.listener_of[id] = host_port;
    if (!ticket.empty()) im.ticket_of[id] = ticket;
  }
  return Connection{.endpoint = id,
                    .node_id = t->node_id,
                    .takes_leases = (t->hello_flags & msg::kTakesLeases) != 0,
                    .takes_puts = (t->hello_flags & msg::kTakesPuts) != 0,
                    .commits_puts = (t->hello_flags & msg::kCommitsPuts) != 0};
}

absl::StatusOr<std::string> UcxClient::Lease(EndpointId endpoint, std::string request, absl::Time deadline) {
  return impl_->Call(endpoint, msg::kLease, "lease", std::move(request), deadline);
}

absl::StatusOr<std::string> UcxClient::Allocate(EndpointId endpoint, std::string request, absl::Time deadline) {
  return impl_->Call(endpoint, msg::kAllocate, "allocate", std::move(request), deadline);
}

absl::StatusOr<std::string> UcxClient::Commit(EndpointId endpoint, std::string request, absl::Time deadline) {
  return impl_->Call(endpoint, msg::kCommit, "commit", std::move(request), deadline);
}

void UcxClient::Close(EndpointId endpoint) {
  Impl& im = *impl_;
  {
    std::lock_guard<std::mutex> lock(im.lanes_mu);
    im.listener_of.erase(endpoint);
    im.ticket_of.erase(endpoint);
    for (auto& lane : im.lanes) lane->Forget(endpoint);
  }
  im.Enqueue([p = impl_.get(), endpoint] { p->CloseEndpoint(endpoint); });
}

UcxClient::TransferResult UcxClient::Get(EndpointId endpoint, const CapabilityId& lease_id, bool release,
                                         std::span<const uint32_t> indices,
                                         std::span<const std::span<std::byte>> buffers, absl::Time deadline,
                                         const std::function<void(size_t)>& on_arrival) {
  Impl& im = *impl_;
  const size_t n = indices.size();
  TransferResult result;
  result.items.assign(n, ItemStatus::kError);
  if (n == 0) return result;
  bool use_lanes = false;
  if (n > 1) {
    std::lock_guard<std::mutex> lock(im.lanes_mu);
    use_lanes = im.listener_of.contains(endpoint);
  }
  if (use_lanes) {
    // Split over the lanes: lane l takes items l, l + L, l + 2L, ...
    auto group = std::make_shared<LaneGroup>();
    group->items.assign(n, ItemStatus::kError);
    group->on_arrival = &on_arrival;
    {
      std::lock_guard<std::mutex> lock(im.lanes_mu);
      if (im.lanes.empty() && !im.lanes_failed) {
        for (int i = 0; i < im.get_lanes; ++i) {
          auto lane = GetLane::Start(im.worker->shared_context());
          if (!lane.ok()) break;
          im.lanes.push_back(std::move(lane).value());
        }
        im.lanes_failed = im.lanes.empty();
      }
      auto listener = im.listener_of.find(endpoint);
      if (listener == im.listener_of.end() || im.lanes.empty()) {
        result.endpoint_failed = true;
        return result;
      }
      const size_t lanes = std::min(im.lanes.size(), n);
      group->remaining = lanes;
      for (size_t l = 0; l < lanes; ++l) {
        auto get = std::make_shared<LaneGet>();
        get->group = group;
        get->endpoint = endpoint;
        get->host_port = listener->second;
        if (auto ticket = im.ticket_of.find(endpoint); ticket != im.ticket_of.end()) get->ticket = ticket->second;
        get->lease_id = lease_id;
        get->deadline = deadline;
        for (size_t j = l; j < n; j += lanes) {
          get->slots.push_back(static_cast<uint32_t>(j));
          get->indices.push_back(indices[j]);
          get->buffers.push_back(buffers[j]);
        }
        im.lanes[l]->Post(std::move(get));
      }
    }
    {
      std::unique_lock<std::mutex> lock(group->mu);
      group->cv.wait(lock, [&] { return group->remaining == 0; });  // lanes end by the deadline and grace
    }
    result.items = group->items;
    result.on_lanes = true;
    for (ItemStatus s : result.items) result.endpoint_failed |= s == ItemStatus::kError;
    if (release && !result.endpoint_failed) {
      im.Enqueue([p = impl_.get(), endpoint, lease_id] {
        auto it = p->endpoints.find(endpoint);
        if (it != p->endpoints.end() && !it->second.failed) {
          (void)UcxWorker::SendEagerAm(it->second.ep, msg::kRelease, msg::Encode(msg::Release{.lease_id = lease_id}),
                                       /*reply=*/true);
        }
      });
    }
    return result;
  }
  auto t = std::make_shared<Transfer>();
  t->remaining = n;
  t->items.assign(n, ItemStatus::kError);
  t->requests.assign(n, nullptr);
  for (const auto& b : buffers) t->expected.push_back(b.size());
  const uint64_t tag_base = im.next_tag.fetch_add(n);
  msg::GetRequest req{.request_id = tag_base,
                      .lease_id = lease_id,
                      .tag_base = tag_base,
                      .flags = release ? msg::kGetRelease : 0u,
                      .indices = std::vector<uint32_t>(indices.begin(), indices.end())};
  std::vector<std::span<std::byte>> bufs(buffers.begin(), buffers.end());
  im.Enqueue([&im, t, endpoint, tag_base, bufs = std::move(bufs), payload = msg::Encode(req)]() mutable {
    ucp_ep_h ep = im.UsableEndpoint(endpoint, *t);
    if (ep == nullptr) return;
    // Receives first, so that the blocks land straight in the caller's buffers (no unexpected queue).
    for (uint32_t j = 0; j < bufs.size(); ++j) {
      auto* op = new Impl::Op{.impl = &im, .transfer = t, .slot = j};
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.cb.recv = &Impl::OnRecvDone;
      p.user_data = op;
      ucs_status_ptr_t r =
          ucp_tag_recv_nbx(im.worker->get(), bufs[j].data(), bufs[j].size(), tag_base + j, kFullTagMask, &p);
      if (UCS_PTR_IS_PTR(r)) {
        t->requests[j] = r;
        op->request = r;
        im.live_ops.insert(op);
      } else {
        delete op;
        std::unique_lock<std::mutex> lock(t->mu);
        t->failed = true;
        t->Done(lock);
      }
    }
    if (UcxWorker::SendEagerAm(ep, msg::kGet, std::move(payload), /*reply=*/true) != UCS_OK) {
      {
        std::lock_guard<std::mutex> lock(t->mu);
        t->failed = true;
      }
      for (void* r : t->requests) {
        if (r != nullptr) ucp_request_cancel(im.worker->get(), r);
      }
    }
  });
  const bool in_time = im.Await(
      t, endpoint, deadline, [] {}, on_arrival);
  std::lock_guard<std::mutex> lock(t->mu);
  result.items = t->items;
  result.endpoint_failed = !in_time || t->failed;
  for (ItemStatus s : result.items) result.endpoint_failed |= s == ItemStatus::kError;
  return result;
}

UcxClient::TransferResult UcxClient::Put(EndpointId endpoint, const CapabilityId& reservation_id,
                                         std::span<const uint32_t> indices,
                                         std::span<const std::span<const std::byte>> blocks, absl::Time deadline,
                                         const std::function<void()>& meanwhile) {
  Impl& im = *impl_;
  const size_t n = indices.size();
  TransferResult result;
  result.items.assign(n, ItemStatus::kError);
  if (n == 0) return result;
  for (uint32_t index : indices) {
    if (index > msg::kMaxTagIndex) return result;
  }
  auto t = std::make_shared<Transfer>();
  t->remaining = n + 1;  // every send, and the server's kPutDone
  t->items.assign(n, ItemStatus::kError);
  t->requests.assign(n, nullptr);
  const uint64_t request_id = im.next_id.fetch_add(1);
  msg::PutRequest req{.request_id = request_id,
                      .reservation_id = reservation_id,
                      .indices = std::vector<uint32_t>(indices.begin(), indices.end())};
  std::vector<std::span<const std::byte>> data(blocks.begin(), blocks.end());
  std::vector<uint32_t> idx(indices.begin(), indices.end());
  im.Enqueue([&im, t, endpoint, request_id, reservation_id, data = std::move(data), idx = std::move(idx),
              payload = msg::Encode(req)]() mutable {
    ucp_ep_h ep = im.UsableEndpoint(endpoint, *t);
    if (ep == nullptr) return;
    const uint64_t put_tag_key = im.endpoints[endpoint].put_tag_key;
    im.pending_put[request_id] = t;
    if (UcxWorker::SendEagerAm(ep, msg::kPut, std::move(payload), /*reply=*/true) != UCS_OK) {
      im.pending_put.erase(request_id);
      std::unique_lock<std::mutex> lock(t->mu);
      t->failed = true;
      t->remaining = 0;
      t->cv.notify_all();
      return;
    }
    im.PostPutSends(t, ep, reservation_id, idx, data, put_tag_key);
  });
  if (meanwhile) meanwhile();  // e.g. checksums, while the bytes move
  const bool in_time = im.Await(t, endpoint, deadline, [&im, request_id] { im.Forget(im.pending_put, request_id); });
  std::lock_guard<std::mutex> lock(t->mu);
  result.endpoint_failed = !in_time || t->failed;
  for (size_t j = 0; j < n; ++j) {
    if (t->items[j] != ItemStatus::kOk) {
      result.items[j] = ItemStatus::kError;
      result.endpoint_failed = true;  // a send failed: the connection is broken
    } else if (t->put_done && j < t->put_ok.size()) {
      result.items[j] = t->put_ok[j] != 0 ? ItemStatus::kOk : ItemStatus::kUnavailable;
    }
  }
  return result;
}

UcxClient::PutCommitResult UcxClient::PutAndCommit(EndpointId endpoint, const CapabilityId& reservation_id,
                                                   std::span<const uint32_t> indices,
                                                   std::span<const std::span<const std::byte>> blocks,
                                                   absl::Time deadline,
                                                   const std::function<std::string()>& make_commit) {
  Impl& im = *impl_;
  const size_t n = indices.size();
  PutCommitResult result{.commit = absl::UnavailableError("UCX put: nothing sent")};
  result.transfer.items.assign(n, ItemStatus::kError);
  for (uint32_t index : indices) {
    if (index > msg::kMaxTagIndex) return result;
  }
  auto t = std::make_shared<Transfer>();
  t->remaining = n + 1;  // every send, and the server's kPutCommitReply
  t->items.assign(n, ItemStatus::kError);
  t->requests.assign(n, nullptr);
  const uint64_t request_id = im.next_id.fetch_add(1);
  msg::PutRequest req{.request_id = request_id,
                      .reservation_id = reservation_id,
                      .indices = std::vector<uint32_t>(indices.begin(), indices.end())};
  std::vector<std::span<const std::byte>> data(blocks.begin(), blocks.end());
  std::vector<uint32_t> idx(indices.begin(), indices.end());
  im.Enqueue([&im, t, endpoint, request_id, reservation_id, data = std::move(data), idx = std::move(idx),
              payload = msg::Encode(req)]() mutable {
    ucp_ep_h ep = im.UsableEndpoint(endpoint, *t);
    if (ep == nullptr) return;
    im.pending_lease[request_id] = t;  // the kPutCommitReply, by the kPut's request id
    if (UcxWorker::SendEagerAm(ep, msg::kPut, std::move(payload), /*reply=*/true) != UCS_OK) {
      im.pending_lease.erase(request_id);
      std::unique_lock<std::mutex> lock(t->mu);
      t->failed = true;
      t->remaining = 0;
      t->cv.notify_all();
      return;
    }
    im.PostPutSends(t, ep, reservation_id, idx, data, im.endpoints[endpoint].put_tag_key);
  });
  // The commit (its checksums) while the bytes move, then on the wire right behind the last send.
  std::string commit = make_commit ? make_commit() : std::string();
  im.Enqueue([&im, endpoint, request_id,
              payload = msg::Encode(msg::LeaseMessage{.request_id = request_id, .payload = std::move(commit)},
                                    /*reply=*/false)]() mutable {
    if (!im.pending_lease.contains(request_id)) return;  // the kPut failed
    auto it = im.endpoints.find(endpoint);
    if (it == im.endpoints.end() || it->second.failed ||
        UcxWorker::SendEagerAm(it->second.ep, msg::kPutCommit, std::move(payload), /*reply=*/true) != UCS_OK) {
      Impl::Forget(im.pending_lease, request_id);
    }
  });
  const bool in_time = im.Await(t, endpoint, deadline, [&im, request_id] { im.Forget(im.pending_lease, request_id); });
  std::lock_guard<std::mutex> lock(t->mu);
  const bool refused = in_time && t->failed && t->lease_code != 0;  // the server answered
  result.transfer.endpoint_failed = !in_time || (t->failed && !refused);
  for (size_t j = 0; j < n; ++j) {
    result.transfer.items[j] = t->items[j];
    result.transfer.endpoint_failed |= t->items[j] != ItemStatus::kOk;  // a send failed: the connection is broken
  }
  if (!in_time) {
    result.commit = absl::DeadlineExceededError("UCX put commit: no answer in time");
  } else if (refused) {
    result.commit = absl::Status(static_cast<absl::StatusCode>(t->lease_code), t->lease_reply);
  } else if (t->failed) {
    result.commit = absl::UnavailableError(
        t->lease_reply.empty() ? "UCX put commit failed" : absl::StrCat("UCX put commit refused: ", t->lease_reply));
  } else {
    result.commit = std::move(t->lease_reply);
  }
  return result;
}

}  // namespace kvtier::ucx
