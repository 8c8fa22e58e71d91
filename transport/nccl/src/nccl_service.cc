#include "kvtier/nccl/nccl_service.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kvtier/common/status_macros.h"
#include "kvtier/v1/nccl.grpc.pb.h"
#include "kvtier/wire/wire.h"

namespace kvtier::nccl {

absl::Status NcclServiceOptions::Validate() const {
  if (init_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("init_timeout: must be > 0");
  if (transfer_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("transfer_timeout: must be > 0");
  if (lease_ttl <= transfer_timeout) return absl::InvalidArgumentError("lease_ttl: must exceed transfer_timeout");
  if (max_workers == 0) return absl::InvalidArgumentError("max_workers: must be > 0");
  if (max_blocks_per_fetch == 0) return absl::InvalidArgumentError("max_blocks_per_fetch: must be > 0");
  if (channel.clock == nullptr || !channel.sleep)
    return absl::InvalidArgumentError("channel: clock and sleep are required");
  return absl::OkStatus();
}

namespace {

constexpr int kServerRank = 0;
constexpr int kWorkerRank = 1;
constexpr size_t kMaxWorkerIdBytes = 255;

// One announced transfer: the leased blocks to send, in order.
struct Job {
  DeviceBlockLease lease;
  std::vector<DeviceSpan> spans;
  uint64_t bytes = 0;
};

// One worker's communicator and its sender thread.
struct Session {
  std::string worker_id;
  std::optional<std::string> tenant;  // of the caller that bootstrapped it; nullopt: an admin
  uint64_t generation = 0;
  NcclUniqueId id;
  std::unique_ptr<NcclChannel> channel;
  std::atomic<bool> failed{false};
  std::atomic<bool> done{false};  // the sender thread has exited

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> jobs;  // guarded by mu
  bool retired = false;  // guarded by mu: replaced or shutting down; queued jobs are dropped
  std::thread sender;
};

}  // namespace

class NcclService::Impl final : public v1::NcclService::Service {
 public:
  Impl(NcclApi& api, DeviceBlockSource& source, const NcclServiceOptions& options)
      : api_(api), source_(source), options_(options) {}

  ~Impl() override {
    std::vector<std::shared_ptr<Session>> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, s] : sessions_) all.push_back(s);
      for (auto& s : retired_) all.push_back(s);
      sessions_.clear();
      retired_.clear();
    }
    for (auto& s : all) Retire(*s);
    for (auto& s : all) {
      if (s->sender.joinable()) s->sender.join();
    }
  }

  grpc::Status Bootstrap(grpc::ServerContext* ctx, const v1::NcclBootstrapRequest* req,
                         v1::NcclBootstrapResponse* resp) override {
    absl::StatusOr<std::optional<std::string>> who = Authenticate(*ctx);
    if (!who.ok()) return wire::ToGrpc(who.status());
    if (req->worker_id().empty() || req->worker_id().size() > kMaxWorkerIdBytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker_id: must be 1..255 bytes");
    }
    std::shared_ptr<Session> reply;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ReapLocked();
      uint64_t next_generation = 1;
      auto it = sessions_.find(req->worker_id());
      if (it != sessions_.end()) {
        std::shared_ptr<Session> live = it->second;
        if (grpc::Status s = CheckOwner(*who, *live); !s.ok()) return s;
        if (!live->failed.load() && (req->reset_generation() == 0 || req->reset_generation() != live->generation)) {
          stats_.reuses.fetch_add(1, std::memory_order_relaxed);
          reply = live;
        } else {
          next_generation = live->generation + 1;
          Retire(*live);
          retired_.push_back(live);
          sessions_.erase(it);
        }
      } else if (sessions_.size() >= options_.max_workers) {
        return grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat(sessions_.size(), " workers have communicators, max_workers is ", options_.max_workers));
      }
      if (reply == nullptr) {
        absl::StatusOr<std::shared_ptr<Session>> s = NewSession(req->worker_id(), next_generation);
        if (!s.ok()) return wire::ToGrpc(s.status());
        (*s)->tenant = *who;
        sessions_[req->worker_id()] = *s;
        reply = *s;
      }
    }
    resp->set_unique_id(reinterpret_cast<const char*>(reply->id.bytes.data()), reply->id.bytes.size());
    resp->set_generation(reply->generation);
    resp->set_nranks(2);
    resp->set_worker_rank(kWorkerRank);
    return grpc::Status::OK;
  }

  grpc::Status Fetch(grpc::ServerContext* ctx, const v1::NcclFetchRequest* req, v1::NcclFetchResponse* resp) override {
    absl::StatusOr<std::optional<std::string>> who = Authenticate(*ctx);
    if (!who.ok()) return wire::ToGrpc(who.status());
    std::shared_ptr<Session> session;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sessions_.find(req->worker_id());
      if (it != sessions_.end()) session = it->second;
    }
    if (session == nullptr || session->generation != req->generation() || session->failed.load()) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          absl::StrCat("no live communicator of generation ", req->generation(), " for worker \"",
                                       req->worker_id(), "\"; bootstrap again"));
    }
    if (grpc::Status s = CheckOwner(*who, *session); !s.ok()) return s;
    absl::StatusOr<Namespace> ns = wire::FromProto(req->namespace_());
    if (!ns.ok()) return wire::ToGrpc(ns.status());
    // Every block sent is of this namespace: one check covers them all.
    if (who->has_value() && ns->tenant != **who) {
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("namespace.tenant \"", ns->tenant, "\" is not the caller's tenant \"", **who, "\""));
    }
    absl::StatusOr<std::vector<BlockKey>> keys =
        wire::DecodeKeys(req->keys(), ns->layout.tp_size, options_.max_blocks_per_fetch);
    if (!keys.ok()) return wire::ToGrpc(keys.status());
    if (req->block_bytes() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "block_bytes: must be > 0");
    absl::StatusOr<DeviceBlockLease> lease = source_.Resolve(*ns, *keys, options_.lease_ttl);
    if (!lease.ok()) return wire::ToGrpc(lease.status());
    Job job;
    for (const std::optional<DeviceSpan>& b : lease->blocks()) {
      const bool send = b.has_value() && b->size_bytes == req->block_bytes();
      resp->add_sent(send);
      if (send) {
        job.spans.push_back(*b);
        job.bytes += b->size_bytes;
      }
    }
    if (job.spans.empty()) return grpc::Status::OK;  // nothing to send: no transfer, lease released
    job.lease = std::move(*lease);
    {
      std::lock_guard<std::mutex> lock(session->mu);
      if (session->retired) {
        return grpc::Status(grpc::StatusCode::ABORTED, "the communicator was reset; bootstrap again");
      }
      session->jobs.push_back(std::move(job));
    }
    session->cv.notify_one();
    stats_.fetches.fetch_add(1, std::memory_order_relaxed);
    return grpc::Status::OK;
  }

  std::optional<NcclSessionInfo> SessionInfo(const std::string& worker_id) const {
    std::shared_ptr<Session> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sessions_.find(worker_id);
      if (it == sessions_.end()) return std::nullopt;
      s = it->second;
    }
    NcclSessionInfo info{.generation = s->generation, .failed = s->failed.load()};
    std::lock_guard<std::mutex> lock(s->mu);
    info.queued_transfers = s->jobs.size();
    return info;
  }

  NcclServiceStats stats_;

 private:
  absl::StatusOr<std::optional<std::string>> Authenticate(const grpc::ServerContext& ctx) const {
    if (!options_.authenticate) return std::optional<std::string>();
    return options_.authenticate(ctx);
  }

  // A caller of a tenant may use only a communicator that a caller of the same tenant (or an admin)
  // bootstrapped.
  static grpc::Status CheckOwner(const std::optional<std::string>& who, const Session& s) {
    if (!who.has_value() || !s.tenant.has_value() || *s.tenant == *who) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("worker \"", s.worker_id, "\" belongs to another tenant"));
  }

  absl::StatusOr<std::shared_ptr<Session>> NewSession(const std::string& worker_id, uint64_t generation) {
    KVTIER_ASSIGN_OR_RETURN(NcclUniqueId id, api_.GetUniqueId());
    auto s = std::make_shared<Session>();
    s->worker_id = worker_id;
    s->generation = generation;
    s->id = id;
    s->channel = std::make_unique<NcclChannel>(api_, options_.channel);
    KVTIER_RETURN_IF_ERROR(s->channel->StartInit(id, 2, kServerRank, source_.device()));
    stats_.communicators.fetch_add(1, std::memory_order_relaxed);
    s->sender = std::thread([this, s] { RunSender(*s); });
    return s;
  }

  // Marks `s` retired: its sender drops queued jobs and exits after the transfer in flight, if any.
  static void Retire(Session& s) {
    s.channel->Cancel();  // a wait or transfer in flight ends at its next poll
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.retired = true;
    }
    s.cv.notify_all();
  }

  // Joins the senders of retired sessions that have exited. Called under mu_.
  void ReapLocked() {
    for (auto it = retired_.begin(); it != retired_.end();) {
      if ((*it)->done.load()) {
        (*it)->sender.join();
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void Fail(Session& s) {
    if (!s.failed.exchange(true)) stats_.aborts.fetch_add(1, std::memory_order_relaxed);
  }

  void RunSender(Session& s) {
    void* stream = nullptr;
    if (!s.channel->WaitReady(options_.channel.clock->Now() + options_.init_timeout).ok()) {
      Fail(s);
    } else if (absl::StatusOr<void*> st = api_.CreateStream(source_.device()); st.ok()) {
      stream = *st;
    } else {
      s.channel->Abort();
      Fail(s);
    }
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.cv.wait(lock, [&] { return s.retired || !s.jobs.empty(); });
        if (s.retired || s.failed.load()) {
          for (const Job& j : s.jobs) stats_.failed_blocks.fetch_add(j.spans.size(), std::memory_order_relaxed);
          s.jobs.clear();  // their leases are released here
          if (s.retired) break;
          continue;
        }
        job = std::move(s.jobs.front());
        s.jobs.pop_front();
      }
      absl::Status sent = s.channel->Transfer(TransferKind::kSend, job.spans, kWorkerRank, stream,
                                              options_.channel.clock->Now() + options_.transfer_timeout);
      job.lease.Release();  // the channel has completed or aborted the sends: nothing reads the blocks now
      if (sent.ok()) {
        stats_.sent_blocks.fetch_add(job.spans.size(), std::memory_order_relaxed);
        stats_.sent_bytes.fetch_add(job.bytes, std::memory_order_relaxed);
      } else {
        stats_.failed_blocks.fetch_add(job.spans.size(), std::memory_order_relaxed);
        Fail(s);
      }
    }
    if (s.failed.load()) {
      s.channel->Abort();
    } else {
      s.channel->Close();
    }
    if (stream != nullptr) api_.DestroyStream(stream);
    s.done.store(true);
  }

  NcclApi& api_;
  DeviceBlockSource& source_;
  const NcclServiceOptions options_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_;  // guarded by mu_; live ones
  std::vector<std::shared_ptr<Session>> retired_;                        // guarded by mu_; senders to join
};

absl::StatusOr<std::unique_ptr<NcclService>> NcclService::Create(NcclApi& api, DeviceBlockSource& source,
                                                                 const NcclServiceOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<NcclService>(new NcclService(std::make_unique<Impl>(api, source, options)));
}

NcclService::NcclService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclService::~NcclService() = default;

grpc::Service* NcclService::grpc_service() { return impl_.get(); }
const NcclServiceStats& NcclService::stats() const { return impl_->stats_; }
std::optional<NcclSessionInfo> NcclService::session(const std::string& worker_id) const {
  return impl_->SessionInfo(worker_id);
}

}  // namespace kvtier::nccl
