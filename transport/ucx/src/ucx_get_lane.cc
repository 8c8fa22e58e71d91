#include "ucx_get_lane.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "kvtier/ucx/ucx_messages.h"

namespace kvtier::ucx {
namespace {

using ItemStatus = UcxClient::ItemStatus;

// Single-copy transports: the receiver of a rendezvous reads the sender's buffer itself (its kernel, or
// a mapping), on the receiving thread.
constexpr const char* kSingleCopyTransports[] = {"cma", "knem", "xpmem"};

}  // namespace

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
    const std::string_view uct_name = line.substr(i + 1, slash - i - 1);  // a UCT transport, e.g. "cma"
    for (const char* t : kSingleCopyTransports) native |= uct_name == t;
  }
  return native;
}

absl::StatusOr<std::unique_ptr<GetLane>> GetLane::Start(std::shared_ptr<UcxContext> context) {
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

GetLane::~GetLane() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<UcxClient::EndpointId> ids;
  for (const auto& [id, ep] : eps_) ids.push_back(id);
  for (auto id : ids) CloseEndpoint(id);
  // Receives given up on that even the forced closes did not complete: released here, before the
  // worker goes, so that no callback can run for them afterwards.
  for (Recv* r : abandoned_recvs_) {
    if (r->request != nullptr) ucp_request_free(r->request);
    delete r;
  }
  abandoned_recvs_.clear();
}

void GetLane::Post(std::shared_ptr<LaneGet> get) {
  Enqueue([this, get = std::move(get)] {
    Work(*get);
    get->group->LaneDone();
  });
}

void GetLane::Forget(UcxClient::EndpointId endpoint) {
  Enqueue([this, endpoint] { CloseEndpoint(endpoint); });
}

void GetLane::Enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void GetLane::Run() {
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

void GetLane::OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
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

void GetLane::Work(LaneGet& g) {
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

ucp_ep_h GetLane::EndpointFor(const LaneGet& g) {
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

void GetLane::CloseEndpoint(UcxClient::EndpointId id) {
  auto it = eps_.find(id);
  if (it == eps_.end()) return;
  ucp_ep_h ep = it->second;
  eps_.erase(it);
  worker_->CloseEndpoint(ep);
  worker_->DrainCloses(absl::Now() + kCloseGrace);
}

}  // namespace kvtier::ucx
