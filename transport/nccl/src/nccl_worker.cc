#include "kvtier/nccl/nccl_worker.h"

#include <cstring>
#include <mutex>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "kvtier/common/status_macros.h"
#include "kvtier/v1/nccl.grpc.pb.h"
#include "kvtier/wire/wire.h"

namespace kvtier::nccl {

absl::Status NcclWorkerOptions::Validate() const {
  if (server_address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("server_address: \"", server_address, "\" is not host:port"));
  }
  if (worker_id.empty() || worker_id.size() > 255) return absl::InvalidArgumentError("worker_id: must be 1..255 bytes");
  if (device < 0) return absl::InvalidArgumentError("device: must be >= 0");
  if (rpc_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("rpc_timeout: must be > 0");
  if (init_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("init_timeout: must be > 0");
  if (transfer_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("transfer_timeout: must be > 0");
  if (channel.clock == nullptr || !channel.sleep)
    return absl::InvalidArgumentError("channel: clock and sleep are required");
  return absl::OkStatus();
}

const char* NcclFetchResultName(NcclFetchResult r) {
  switch (r) {
    case NcclFetchResult::kHit:
      return "hit";
    case NcclFetchResult::kMiss:
      return "miss";
    case NcclFetchResult::kError:
      return "error";
  }
  return "unknown";
}

namespace {
constexpr int kServerRank = 0;
}  // namespace

class NcclWorker::Impl {
 public:
  Impl(NcclApi& api, const NcclWorkerOptions& options)
      : api_(api),
        options_(options),
        stub_(v1::NcclService::NewStub(grpc::CreateCustomChannel(options.server_address,
                                                                 grpc::InsecureChannelCredentials(),
                                                                 wire::ChannelArgs(options.max_message_bytes)))) {}

  absl::StatusOr<std::vector<NcclFetchResult>> Fetch(const Namespace& ns, std::span<const BlockKey> keys,
                                                     std::span<const DeviceSpan> buffers, void* stream) {
    KVTIER_RETURN_IF_ERROR(ns.Validate());
    if (keys.size() != buffers.size()) {
      return absl::InvalidArgumentError(absl::StrCat(keys.size(), " keys but ", buffers.size(), " buffers"));
    }
    const uint64_t block_bytes = ns.layout.ShardBytes();
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (buffers[i].size_bytes != block_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("buffer ", i, " is ", buffers[i].size_bytes, " bytes, want ", block_bytes));
      }
      if (keys[i].shard >= ns.layout.tp_size) {
        return absl::InvalidArgumentError(absl::StrCat("key ", i, ": shard ", keys[i].shard, " >= tp_size"));
      }
    }
    std::vector<NcclFetchResult> results(keys.size(), NcclFetchResult::kError);
    if (keys.empty()) return results;
    std::lock_guard<std::mutex> lock(mu_);
    v1::NcclFetchResponse resp;
    // One retry: a server that lost our communicator (restart, its own timeout) answers ABORTED, and a
    // fresh bootstrap fixes that.
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!EnsureChannelLocked()) return Fail(results);
      v1::NcclFetchRequest req;
      req.set_worker_id(options_.worker_id);
      req.set_generation(generation_);
      wire::ToProto(ns, req.mutable_namespace_());
      wire::EncodeKeys(keys, req.mutable_keys());
      req.set_block_bytes(block_bytes);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
      if (!options_.auth_token.empty()) ctx.AddMetadata("authorization", "Bearer " + options_.auth_token);
      resp.Clear();
      const grpc::Status st = stub_->Fetch(&ctx, req, &resp);
      if (st.ok()) break;
      // The server may have queued sends we will never match: this communicator is unusable.
      AbortLocked();
      if (st.error_code() != grpc::StatusCode::ABORTED || attempt == 1) return Fail(results);
    }
    if (static_cast<size_t>(resp.sent_size()) != keys.size()) {
      AbortLocked();
      return Fail(results);
    }
    std::vector<DeviceSpan> spans;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (resp.sent(static_cast<int>(i))) {
        spans.push_back(buffers[i]);
      } else {
        results[i] = NcclFetchResult::kMiss;
      }
    }
    absl::Status got = channel_->Transfer(TransferKind::kRecv, spans, kServerRank, stream,
                                          options_.channel.clock->Now() + options_.transfer_timeout);
    if (!got.ok()) {
      stats_.aborts.fetch_add(1, std::memory_order_relaxed);  // the channel aborted itself
      stats_.error_blocks.fetch_add(spans.size(), std::memory_order_relaxed);
      return results;  // sent blocks stay kError
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (results[i] == NcclFetchResult::kError) results[i] = NcclFetchResult::kHit;
    }
    stats_.hit_blocks.fetch_add(spans.size(), std::memory_order_relaxed);
    stats_.hit_bytes.fetch_add(spans.size() * block_bytes, std::memory_order_relaxed);
    return results;
  }

  uint64_t generation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return generation_;
  }
  ChannelState channel_state() const {
    std::lock_guard<std::mutex> lock(mu_);
    return channel_ == nullptr ? ChannelState::kIdle : channel_->state();
  }

  NcclWorkerStats stats_;

 private:
  // A ready communicator, bootstrapping one when there is none or the last one failed.
  bool EnsureChannelLocked() {
    if (channel_ != nullptr && channel_->state() == ChannelState::kReady) return true;
    // Any earlier generation is one that failed (or never came up): ask the server to replace it.
    const uint64_t reset = generation_;
    channel_.reset();
    v1::NcclBootstrapRequest req;
    req.set_worker_id(options_.worker_id);
    req.set_reset_generation(reset);
    v1::NcclBootstrapResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    if (!options_.auth_token.empty()) ctx.AddMetadata("authorization", "Bearer " + options_.auth_token);
    if (!stub_->Bootstrap(&ctx, req, &resp).ok()) return false;
    if (resp.unique_id().size() != NcclUniqueId::kBytes || resp.nranks() != 2) return false;
    stats_.bootstraps.fetch_add(1, std::memory_order_relaxed);
    NcclUniqueId id;
    std::memcpy(id.bytes.data(), resp.unique_id().data(), NcclUniqueId::kBytes);
    generation_ = resp.generation();
    channel_ = std::make_unique<NcclChannel>(api_, options_.channel);
    if (!channel_->StartInit(id, static_cast<int>(resp.nranks()), static_cast<int>(resp.worker_rank()), options_.device)
             .ok() ||
        !channel_->WaitReady(options_.channel.clock->Now() + options_.init_timeout).ok()) {
      stats_.aborts.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    return true;
  }

  void AbortLocked() {
    if (channel_ != nullptr && channel_->state() != ChannelState::kAborted) {
      channel_->Abort();
      stats_.aborts.fetch_add(1, std::memory_order_relaxed);
    }
  }

  absl::StatusOr<std::vector<NcclFetchResult>> Fail(std::vector<NcclFetchResult>& results) {
    for (auto& r : results) r = NcclFetchResult::kError;
    stats_.error_blocks.fetch_add(results.size(), std::memory_order_relaxed);
    return results;
  }

  NcclApi& api_;
  const NcclWorkerOptions options_;
  std::unique_ptr<v1::NcclService::Stub> stub_;
  mutable std::mutex mu_;                 // serializes Fetch: transfers are posted in order
  std::unique_ptr<NcclChannel> channel_;  // guarded by mu_; null before the first bootstrap
  uint64_t generation_ = 0;               // guarded by mu_
};

absl::StatusOr<std::unique_ptr<NcclWorker>> NcclWorker::Create(NcclApi& api, const NcclWorkerOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<NcclWorker>(new NcclWorker(std::make_unique<Impl>(api, options)));
}

NcclWorker::NcclWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclWorker::~NcclWorker() = default;

absl::StatusOr<std::vector<NcclFetchResult>> NcclWorker::Fetch(const Namespace& ns, std::span<const BlockKey> keys,
                                                               std::span<const DeviceSpan> buffers, void* stream) {
  return impl_->Fetch(ns, keys, buffers, stream);
}
uint64_t NcclWorker::generation() const { return impl_->generation(); }
ChannelState NcclWorker::channel_state() const { return impl_->channel_state(); }
const NcclWorkerStats& NcclWorker::stats() const { return impl_->stats_; }

}  // namespace kvtier::nccl
