#include "client/nccl_endpoints.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kvtier/common/log.h"
#include "kvtier/v1/admin.grpc.pb.h"

namespace kvtier::client {

namespace {

std::atomic<nccl::NcclApi*> test_api{nullptr};

std::string WorkerPrefix(const void* self) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(host, "/", getpid(), "/", reinterpret_cast<uintptr_t>(self));
}

}  // namespace

void SetNcclApiForTest(nccl::NcclApi* api) { test_api.store(api, std::memory_order_release); }

NcclEndpoints::NcclEndpoints(const ClientOptions& options, TransportMode mode)
    : options_(options),
      enabled_(mode == TransportMode::kAuto && options.tls_ca_file.empty()),
      worker_prefix_(WorkerPrefix(this)),
      api_(test_api.load(std::memory_order_acquire)),
      api_tried_(api_ != nullptr) {}

nccl::NcclApi* NcclEndpoints::Api() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!api_tried_) {
    api_tried_ = true;
    if (auto api = nccl::CreateNcclApi(); api.ok()) {
      owned_api_ = std::move(api).value();
      api_ = owned_api_.get();
    }
  }
  return api_;
}

nccl::NcclWorker* NcclEndpoints::Worker(Member& member, int32_t device, absl::Time deadline) {
  if (!enabled_) return nullptr;
  nccl::NcclApi* api = Api();
  if (api == nullptr) return nullptr;
  Peer* peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<Peer>& p = peers_[member.address];
    if (p == nullptr) p = std::make_unique<Peer>();
    peer = p.get();
  }
  std::lock_guard<std::mutex> lock(peer->mu);
  if (!peer->offered) {
    const absl::Time now = absl::Now();
    if (now < peer->ask_after) return nullptr;
    v1::GetInfoResponse info;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(deadline, now + options_.rpc_timeout)));
    const bool answered = member.admin->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok();
    peer->offered = answered && info.nccl();
    if (!peer->offered) {  // a member that is down is not waited for on every read either
      peer->ask_after = now + kNcclUnsupportedRecheck;
      return nullptr;
    }
  }
  std::unique_ptr<nccl::NcclWorker>& worker = peer->workers[device];
  if (worker == nullptr) {
    auto made = nccl::NcclWorker::Create(*api, {.server_address = member.address,
                                                .worker_id = absl::StrCat(worker_prefix_, "/gpu", device),
                                                .device = device,
                                                .rpc_timeout = options_.rpc_timeout,
                                                .init_timeout = options_.connect_timeout,
                                                .transfer_timeout = options_.rpc_timeout,
                                                .max_message_bytes = options_.max_message_bytes,
                                                .auth_token = options_.auth_token});
    if (!made.ok()) {
      KVTIER_LOG(warn, "NCCL worker for member {}: {}", member.address, made.status().ToString());
      return nullptr;
    }
    worker = std::move(made).value();
  }
  return worker.get();
}

}  // namespace kvtier::client
