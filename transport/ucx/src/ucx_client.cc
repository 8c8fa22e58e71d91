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
#include "ucx_worker.h"

namespace kvtier::ucx {
namespace {

using ItemStatus = UcxClient::ItemStatus;
// After a missed deadline: how long to wait for cancelled receives, then for the force-closed
// endpoint's requests to complete.
constexpr absl::Duration kCancelGrace = absl::Milliseconds(50);
constexpr absl::Duration kCloseGrace = absl::Seconds(1);

// Single-copy transports: the receiver of a rendezvous reads the sender's buffer itself (its kernel, or
// a mapping), on the receiving thread.
constexpr const char* kSingleCopyTransports[] = {"cma", "knem", "xpmem"};

// Whether `ep`'s rendezvous (RMA bandwidth) lanes include a single-copy transport, i.e. the server is on
// this node and a received block is copied by the thread that receives it. UCX 1.13 has no query for an
// endpoint's transports, so this reads ucp_ep_print_info's lane table, whose rows look like
// "lane[1]:  3:cma/memory.0 md[3] -> addr[4].md[3]/cma/sysdev[255] rma_bw#0". Anything it cannot parse
// counts as no, which keeps a Get on the progress thread (correct, only slower).
bool HasSingleCopyLane(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return false;
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  const std::string info(text, size);
  std::free(text);
  bool native = false;
  size_t line_start = 0;
  while (line_start < info.size() && !native) {
    size_t line_end = info.find('\n', line_start);
    if (line_end == std::string::npos) line_end = info.size();
    const std::string_view line(info.data() + line_start, line_end - line_start);
    line_start = line_end + 1;
    const size_t lane = line.find("lane[");
    if (lane == std::string_view::npos || line.find("rma_bw") == std::string_view::npos) continue;
    const size_t colon = line.find("]:", lane);
    if (colon == std::string_view::npos) continue;
    size_t i = colon + 2;
    while (i < line.size() && (line[i] == ' ' || (line[i] >= '0' && line[i] <= '9'))) ++i;
    if (i >= line.size() || line[i] != ':') continue;
    const size_t slash = line.find('/', i + 1);
    if (slash == std::string_view::npos) continue;
    const std::string_view transport = line.substr(i + 1, slash - i - 1);
    for (const char* t : kSingleCopyTransports) native |= transport == t;
  }
  return native;
}

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

// One Get split over lanes: what the caller waits for. Buffers and on_arrival are borrowed (the caller
// waits until remaining is 0).
struct LaneGroup {
  std::mutex mu;
  std::condition_variable cv;
  size_t remaining = 0;           // guarded by mu: lanes still working
  std::vector<ItemStatus> items;  // item j is written by the one lane that has j, before it counts down
  const std::function<void(size_t)>* on_arrival = nullptr;

  void LaneDone() {
    std::lock_guard<std::mutex> lock(mu);
    if (--remaining == 0) cv.notify_all();
  }
};

// One lane's share of a Get.
struct LaneGet {
  std::shared_ptr<LaneGroup> group;
  UcxClient::EndpointId endpoint = 0;  // the main endpoint: names the server
  std::string host_port;               // its UCX listener
  std::string ticket;                  // the session ticket a new lane endpoint presents ("" = none)
  CapabilityId lease_id;
  absl::Time deadline;
  std::vector<uint32_t> slots;    // items j of the group
  std::vector<uint32_t> indices;  // their lease indices
  std::vector<std::span<std::byte>> buffers;
};

// A get lane: a thread with its own UCX worker and its own endpoint to each server, receiving its share
// of Gets (kvtier/wire/ucx_messages.h kGet) and running on_arrival on each block right after it landed.
// Thread-safety: Post and Forget from any thread.
class GetLane {
 public:
  // Errors: Unavailable (no worker).
  static absl::StatusOr<std::unique_ptr<GetLane>> Start(std::shared_ptr<UcxContext> context) {
    auto lane = std::unique_ptr<GetLane>(new GetLane());
    auto worker = UcxWorker::Create(std::move(context));
    if (!worker.ok()) return worker.status();
    lane->worker_ = *std::move(worker);
    // A lane's endpoint sends a hello (its ticket) but does not wait for the reply: its kGet follows on
    // the same endpoint, in order. A refused endpoint is closed by the server; its Gets then fail.
    auto ignore = [](void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) -> ucs_status_t {
      return UCS_OK;
    };
    if (absl::Status s = lane->worker_->SetAmHandler(msg::kHelloReply, ignore, nullptr); !s.ok()) return s;
    lane->thread_ = std::thread([l = lane.get()] { l->Run(); });
    return lane;
  }

  ~GetLane() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    std::vector<UcxClient::EndpointId> ids;
    for (const auto& [id, ep] : eps_) ids.push_back(id);
    for (auto id : ids) CloseEndpoint(id);
  }

  void Post(std::shared_ptr<LaneGet> get) {
    Enqueue([this, get = std::move(get)] {
      Work(*get);
      get->group->LaneDone();
    });
  }
  // Closes this lane's endpoint to the server of `endpoint`, if any.
  void Forget(UcxClient::EndpointId endpoint) {
    Enqueue([this, endpoint] { CloseEndpoint(endpoint); });
  }

  uint64_t abandoned() const { return abandoned_.load(std::memory_order_relaxed); }

 private:
  // One receive; heap-allocated, since an abandoned receive may complete after its Get returned.
  struct Recv {
    GetLane* lane = nullptr;
    size_t k = 0;  // position in the LaneGet
    uint64_t expected = 0;
    void* request = nullptr;
    bool done = false;
    ItemStatus status = ItemStatus::kError;
  };

  GetLane() = default;

  void Enqueue(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

  void Run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  static void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
    auto* r = static_cast<Recv*>(user_data);
    ucp_request_free(request);
    r->request = nullptr;
    r->done = true;
    if (status == UCS_OK && info != nullptr) {
      if (info->length == r->expected) {
        r->status = ItemStatus::kOk;
      } else if (info->length == 0) {
        r->status = ItemStatus::kUnavailable;  // the server could not send this block
      }
    }
    if (r->lane->abandoned_recvs_.erase(r) > 0) delete r;  // its Get gave up on it earlier
  }

  void Work(LaneGet& g) {
    LaneGroup& group = *g.group;
    ucp_ep_h ep = absl::Now() < g.deadline ? EndpointFor(g) : nullptr;
    if (ep == nullptr) return;  // every item stays kError
    const size_t n = g.indices.size();
    const uint64_t tag_base = next_tag_;
    next_tag_ += n;
    std::vector<Recv*> recvs(n, nullptr);
    size_t pending = 0;
    for (size_t k = 0; k < n; ++k) {
      auto* r = new Recv{.lane = this, .k = k, .expected = g.buffers[k].size()};
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.cb.recv = &GetLane::OnRecv;
      p.user_data = r;
      ucs_status_ptr_t q =
          ucp_tag_recv_nbx(worker_->get(), g.buffers[k].data(), g.buffers[k].size(), tag_base + k, kFullTagMask, &p);
      if (UCS_PTR_IS_PTR(q)) {
        r->request = q;
        recvs[k] = r;
        ++pending;
      } else {
        delete r;
      }
    }
    msg::GetRequest req{
        .request_id = tag_base, .lease_id = g.lease_id, .tag_base = tag_base, .flags = 0, .indices = g.indices};
    bool sent = pending == n && UcxWorker::SendEagerAm(ep, msg::kGet, msg::Encode(req), /*reply=*/true) == UCS_OK;
    // Progress until every receive completed; check each block as soon as it is in.
    std::vector<uint8_t> seen(n, 0);  // 1: settled in time; 2: done after the deadline
    auto settle = [&] {
      for (size_t k = 0; k < n; ++k) {
        Recv* r = recvs[k];
        if (r == nullptr || !r->done || seen[k] != 0) continue;
        seen[k] = 1;
        --pending;
        const uint32_t j = g.slots[k];
        if (r->status == ItemStatus::kOk && group.on_arrival != nullptr && *group.on_arrival &&
            absl::Now() < g.deadline) {
          (*group.on_arrival)(j);
        }
        group.items[j] = r->status;
      }
    };
    // Spin a little, then sleep until UCX has something: a lane that spun while waiting for the server
    // would take a core from the server's sender on a small machine.
    absl::Time now = absl::Now();
    worker_->Run(
        [&] {
          now = absl::Now();
          return sent && pending > 0 && now < g.deadline;
        },
        [&](bool progressed) {
          if (progressed) settle();
          return progressed;
        },
        [&] {
          return std::clamp(g.deadline - now + absl::Milliseconds(1), absl::Milliseconds(1), absl::Milliseconds(100));
        });
    settle();
    if (pending == 0) {
      for (Recv* r : recvs) delete r;
      return;
    }
    // Past the deadline (or the request could not go out): cancel what is unmatched, then force-close
    // the endpoint, which completes the rest; only then may the caller's buffers be given back.
    for (Recv* r : recvs) {
      if (r != nullptr && !r->done) ucp_request_cancel(worker_->get(), r->request);
    }
    auto count_done = [&] {  // too late to check or count: only whether UCX is done with the buffer
      for (size_t k = 0; k < n; ++k) {
        if (recvs[k] != nullptr && recvs[k]->done && seen[k] == 0) {
          seen[k] = 2;  // done, but after the deadline
          --pending;
        }
      }
    };
    const absl::Time cancel_until = absl::Now() + kCancelGrace;
    while (pending > 0 && absl::Now() < cancel_until) {
      ucp_worker_progress(worker_->get());
      count_done();
    }
    if (pending > 0) {
      CloseEndpoint(g.endpoint);
      const absl::Time close_until = absl::Now() + kCloseGrace;
      while (pending > 0 && absl::Now() < close_until) {
        ucp_worker_progress(worker_->get());
        count_done();
      }
    }
    for (size_t k = 0; k < n; ++k) {
      Recv* r = recvs[k];
      if (r == nullptr) continue;
      if (r->done) {
        delete r;
      } else {
        abandoned_recvs_.insert(r);  // freed by its callback, if UCX ever completes it
        abandoned_.fetch_add(1, std::memory_order_relaxed);
      }
      if (seen[k] != 1) group.items[g.slots[k]] = ItemStatus::kError;  // too late: not counted
    }
    CloseEndpoint(g.endpoint);  // no longer trusted
  }

  // This lane's endpoint to the server of g.endpoint, connected through its listener like the main one.
  ucp_ep_h EndpointFor(const LaneGet& g) {
    if (auto it = eps_.find(g.endpoint); it != eps_.end()) return it->second;
    auto addr = ResolveIpv4(g.host_port, /*min_port=*/1);
    if (!addr.ok()) return nullptr;
    absl::StatusOr<ucp_ep_h> connected = worker_->Connect(*addr, nullptr, nullptr);
    if (!connected.ok()) return nullptr;
    ucp_ep_h ep = *connected;
    eps_[g.endpoint] = ep;
    if (UcxWorker::SendEagerAm(ep, msg::kHello, msg::Encode(msg::Hello{.nonce = 0, .ticket = g.ticket}), true) !=
        UCS_OK) {
      CloseEndpoint(g.endpoint);
      return nullptr;
    }
    return ep;
  }

  void CloseEndpoint(UcxClient::EndpointId id) {
    auto it = eps_.find(id);
    if (it == eps_.end()) return;
    ucp_ep_h ep = it->second;
    eps_.erase(it);
    worker_->CloseEndpoint(ep);
    worker_->DrainCloses(absl::Now() + kCloseGrace);
  }

  std::unique_ptr<UcxWorker> worker_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::atomic<uint64_t> abandoned_{0};
  // The lane's thread only (and the destructor, after it stopped).
  uint64_t next_tag_ = 1;
  absl::flat_hash_map<UcxClient::EndpointId, ucp_ep_h> eps_;
  absl::flat_hash_set<Recv*> abandoned_recvs_;
};

}  // namespace

struct UcxClient::Impl {
  struct Op {
    Impl* impl = nullptr;
    std::shared_ptr<Transfer> transfer;
    uint32_t slot = 0;
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

  absl::Status Init(const std::string& transports) {
    auto context = UcxContext::Create(transports, "ucx_transports", /*several_workers=*/true);
    if (!context.ok()) return context.status();
    auto w = UcxWorker::Create(*std::move(context));
    if (!w.ok()) return w.status();
    worker = *std::move(w);
    const std::pair<uint16_t, ucp_am_recv_callback_t> handlers[] = {{msg::kHelloReply, &Impl::OnHelloReply},
                                                                    {msg::kPutDone, &Impl::OnPutDone},
                                                                    {msg::kLeaseReply, &Impl::OnLeaseReply},
                                                                    {msg::kAllocateReply, &Impl::OnLeaseReply},
                                                                    {msg::kCommitReply, &Impl::OnLeaseReply}};
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
      worker->DrainCloses(absl::Now() + kCloseGrace);
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
                    .takes_puts = (t->hello_flags & msg::kTakesPuts) != 0};
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
    for (uint32_t j = 0; j < data.size(); ++j) {
      auto* op = new Impl::Op{.impl = &im, .transfer = t, .slot = j};
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = &Impl::OnSendDone;
      p.user_data = op;
      ucs_status_ptr_t r = ucp_tag_send_nbx(ep, data[j].data(), data[j].size(),
                                            msg::SessionPutTag(reservation_id, idx[j], put_tag_key), &p);
      if (UCS_PTR_IS_PTR(r)) {
        t->requests[j] = r;
        continue;
      }
      delete op;
      std::unique_lock<std::mutex> lock(t->mu);
      t->items[j] = UCS_PTR_STATUS(r) == UCS_OK ? ItemStatus::kOk : ItemStatus::kError;
      t->Done(lock);
    }
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

}  // namespace kvtier::ucx
