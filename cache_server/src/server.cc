#include "kvtier/server/server.h"

#include <prometheus/exposer.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "admin_service.h"
#include "auth.h"
#include "block_requests.h"
#include "cache_service.h"
#include "events/event_publisher.h"
#include "events/event_service.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvtier/common/log.h"
#include "kvtier/nccl/nccl_service.h"
#include "kvtier/server/block_store.h"
#include "kvtier/ucx/ucx_server.h"
#include "kvtier/v1/cache.pb.h"
#include "kvtier/wire/wire.h"
#include "query/engine_hash_index.h"
#include "query/query_handler.h"
#include "query/query_http.h"
#include "server_metrics.h"
#include "transport/hbm_block_source.h"
#include "transport/store_block_source.h"
#include "transport/ucx_sessions.h"

namespace kvtier::server {
namespace {

// Writes `text` to `path` atomically (temporary file + rename), so readers never see a partial file.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
    out << text;
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::InternalError(absl::StrCat("cannot rename to ", path));
  return absl::OkStatus();
}

// The whole of `path`, which config key `key` names. Errors: NotFound, InvalidArgument (empty, or no
// PEM block in it).
absl::StatusOr<std::string> ReadPemFile(const std::string& key, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(key, ": ", path, " cannot be read"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", path, " holds no PEM block"));
  }
  return text;
}

// The credentials of listen_address: plaintext, TLS, or mutual TLS (docs/config.md `tls`).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenCredentials(const ServerOptions& o) {
  if (!o.tls_enabled()) return grpc::InsecureServerCredentials();
  auto cert = ReadPemFile("tls.cert_file", o.tls_cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile("tls.key_file", o.tls_key_file);
  if (!key.ok()) return key.status();
  grpc_ssl_client_certificate_request_type request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  std::string roots;
  if (!o.tls_client_ca_file.empty()) {
    auto ca = ReadPemFile("tls.client_ca_file", o.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    roots = *std::move(ca);
    request = o.tls_require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                        : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  grpc::SslServerCredentialsOptions ssl(request);
  ssl.pem_root_certs = roots;
  ssl.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(ssl);
}

// grpc.health.v1 Check for the plain health port: SERVING until Shutdown() begins, NOT_SERVING after.
// (A server with only gRPC's default health service has no synchronous service to poll it.)
class PlainHealthService final : public grpc::health::v1::Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse* resp) override {
    resp->set_status(serving_.load(std::memory_order_acquire) ? grpc::health::v1::HealthCheckResponse::SERVING
                                                              : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    return grpc::Status::OK;
  }
  void SetNotServing() { serving_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> serving_{true};
};

}  // namespace

struct Server::Impl {
  ServerOptions options;
  std::unique_ptr<BlockStore> store;
  std::unique_ptr<PinnedHostRegion> pinned_host;  // the host tier page-locked, when a device is usable
  std::unique_ptr<ServerMetrics> metrics;
  NamespaceRegistry namespaces;
  std::unique_ptr<Authenticator> auth;
  std::unique_ptr<UcxSessions> ucx_sessions;  // with the UCX listener; outlives it and the gRPC server
  std::unique_ptr<BlockRequests> requests;    // the data plane's rules, for the gRPC service and UCX alike
  std::unique_ptr<CacheServiceImpl> cache_service;
  std::unique_ptr<AdminServiceImpl> admin_service;
  // The NCCL transport (docs/gpu.md), served when the store has an HBM tier and the build has NCCL.
  std::unique_ptr<nccl::NcclApi> nccl_api;
  std::unique_ptr<HbmBlockSource> hbm_source;
  std::unique_ptr<nccl::NcclService> nccl_service;  // outlives grpc_server (declared before it)
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<PlainHealthService> plain_health;  // outlives health_server
  std::unique_ptr<grpc::Server> health_server;       // plain grpc.health.v1 on health_address; null without it
  std::unique_ptr<prometheus::Exposer> exposer;
  std::unique_ptr<StoreBlockSource> ucx_source;  // what `ucx` serves from; outlives it
  std::unique_ptr<ucx::UcxServer> ucx;           // null without ucx_listen_address; destroyed before the store
  std::unique_ptr<EventPublisher> events;        // null unless events_enabled; detached and destroyed before the store
  std::unique_ptr<EventServiceImpl> event_service;
  // The query endpoints (docs/query.md), with the metrics listener: the store's sink, forwarding to
  // `events`; detached before it is destroyed.
  std::unique_ptr<EngineHashIndex> hash_index;
  std::unique_ptr<QueryHandler> query_handler;  // routed to while the exposer runs
  int grpc_port = 0;
  int metrics_port = 0;
  int health_port = 0;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;  // guarded by mu
  bool stopped = false;   // guarded by mu
  std::thread expiry_thread;

  // Expires leases and reservations every expiry_interval, compacts the host tier every
  // defrag_interval, and checks the disk tier (ProbeDisk) every disk_probe_interval.
  void ExpiryLoop() {
    std::unique_lock<std::mutex> lock(mu);
    absl::Time next_defrag = absl::Now() + options.defrag_interval;
    absl::Time next_disk_probe = absl::Now() + options.disk_probe_interval;
    while (!stopping) {
      cv.wait_for(lock, absl::ToChronoMilliseconds(options.expiry_interval));
      if (stopping) break;
      lock.unlock();
      store->ExpireNow();
      if (options.defrag_interval > absl::ZeroDuration() && absl::Now() >= next_defrag) {
        store->Defragment();
        next_defrag = absl::Now() + options.defrag_interval;
      }
      if (absl::Now() >= next_disk_probe) {
        store->ProbeDisk();
        next_disk_probe = absl::Now() + options.disk_probe_interval;
      }
      lock.lock();
    }
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Shutdown(); }

namespace {
constexpr uint64_t kFewSlabs = 8;  // fewer slabs than this in the host tier gets a warning at start
}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  // No block larger than the host tier's longest slot can ever be stored: advertise and enforce what fits
  // (Validate already refused a max_block_bytes that no full-length slab can hold).
  if (const uint64_t largest = SlabAllocator::LargestBlockBytes(
          {.capacity_bytes = options.host_cache_bytes, .slab_bytes = options.slab_bytes});
      options.max_block_bytes > largest) {
    KVTIER_LOG(warn,
               "kvtier-server: warning: limits.max_block_bytes {} lowered to {}: host_tier.capacity_bytes {} is "
               "below host_tier.slab_bytes {}, so the tier is one slab that long, and slots round up to {} bytes",
               options.max_block_bytes, largest, options.host_cache_bytes, options.slab_bytes, kSlotAlignmentBytes);
    impl->options.max_block_bytes = largest;
  }
  // With few slabs, the first block of a new size class takes a whole slab, evicting up to that slab's
  // share of the tier (docs/architecture.md "Size classes").
  // A short last slab (capacity not a multiple of slab_bytes) holds only blocks that fit it: it is
  // named apart, not counted as a slab.
  if (const uint64_t slabs = options.host_cache_bytes / options.slab_bytes; slabs < kFewSlabs) {
    const uint64_t rest = options.host_cache_bytes % options.slab_bytes;
    KVTIER_LOG(warn,
               "kvtier-server: warning: host_tier.slab_bytes {} cuts host_tier.capacity_bytes {} into {} full "
               "slab(s){}, and the first block of each new size may evict a whole slab ({:.0f}% of the tier); "
               "lower host_tier.slab_bytes (and limits.max_block_bytes) to have at least {}",
               options.slab_bytes, options.host_cache_bytes, slabs,
               rest > 0 ? absl::StrCat(" and a short one of ", rest, " bytes") : std::string(),
               100.0 * static_cast<double>(std::min(options.slab_bytes, options.host_cache_bytes)) /
                   static_cast<double>(options.host_cache_bytes),
               kFewSlabs);
  }
  if (const double bound = options.tenant_pinned_share * static_cast<double>(options.host_cache_bytes);
      bound < static_cast<double>(impl->options.max_block_bytes)) {
    KVTIER_LOG(warn,
               "kvtier-server: warning: leases.tenant_pinned_share {} bounds each tenant's pinned bytes at {:.0f}, "
               "less than one largest block ({} bytes): while tenants share this server each may lease one block "
               "at a time",
               options.tenant_pinned_share, bound, impl->options.max_block_bytes);
  }
  // The HBM tier, when asked for and a CUDA device is usable; without one the server runs without it.
  std::shared_ptr<DeviceTierMemory> hbm;
  if (options.hbm_memory_ratio > 0) {
    auto memory =
        NewCudaDeviceTierMemory(static_cast<int>(options.hbm_device), options.hbm_memory_ratio, options.hbm_max_bytes);
    if (memory.ok()) {
      hbm = std::move(memory).value();
      KVTIER_LOG(info, "kvtier-server: HBM tier on {}", hbm->Describe());
    } else if (memory.status().code() == absl::StatusCode::kFailedPrecondition) {
      KVTIER_LOG(info, "kvtier-server: no HBM tier: {}", std::string(memory.status().message()));
    } else {
      return memory.status();
    }
  }
  absl::flat_hash_map<uint64_t, uint64_t> quotas;
  for (const auto& [tenant, bytes] : options.tenant_quotas) quotas[TenantId(tenant)] = bytes;
  auto store = BlockStore::Create({.capacity_bytes = options.host_cache_bytes,
                                   .slab_bytes = options.slab_bytes,
                                   .eviction_policy = options.eviction_policy,
                                   .frequency_weight = options.eviction_frequency_weight,
                                   .recency_weight = options.eviction_recency_weight,
                                   .default_lease_ttl = options.default_lease_ttl,
                                   .max_lease_ttl = options.max_lease_ttl,
                                   .reservation_ttl = options.reservation_ttl,
                                   .tenant_pinned_share = options.tenant_pinned_share,
                                   .lease_buffer_bytes = options.lease_buffer_bytes,
                                   .disk_path = options.disk_path,
                                   .disk_capacity_bytes = options.disk_capacity_bytes,
                                   .disk_min_free_bytes = options.disk_min_free_bytes,
                                   .disk_info_log_dir = options.disk_info_log_dir,
                                   .disk_flush_interval = options.disk_flush_interval,
                                   .promote_on_hit = options.promote_on_hit,
                                   .disk_admit_min_requests = options.disk_admit_min_requests,
                                   .spill_buffer_bytes = options.disk_spill_buffer_bytes,
                                   .index_shards = options.index_shards,
                                   .hbm_memory = hbm,
                                   .hbm_promote_on_hit = options.hbm_promote_on_hit,
                                   .tenant_quota_bytes = std::move(quotas)});
  if (!store.ok()) return store.status();
  impl->store = std::move(store).value();
  if (hbm != nullptr) {
    // Page-locked host memory makes the copies between the tiers DMA transfers. Best effort: the
    // OS may refuse to lock that much (RLIMIT_MEMLOCK); the copies then stage through the driver.
    auto pinned = PinHostRegion(impl->store->HostRegion());
    if (pinned.ok()) {
      impl->pinned_host = std::move(pinned).value();
    } else {
      KVTIER_LOG(warn, "kvtier-server: host tier not page-locked: {}", std::string(pinned.status().message()));
    }
  }
  impl->metrics = std::make_unique<ServerMetrics>(*impl->store, options.node_id);
  // Tenants named by the configuration have their per-tenant counters from the start (the token
  // tenants are declared by the Authenticator, the others from their first namespace on).
  for (const auto& [tenant, bytes] : options.tenant_quotas) impl->metrics->DeclareTenant(tenant);
  for (const NamespaceOptions& ns : options.namespaces) impl->metrics->DeclareTenant(ns.tenant);
  auto auth = Authenticator::Create(impl->options, *impl->metrics);
  if (!auth.ok()) return auth.status();
  impl->auth = std::move(auth).value();
  auto credentials = ListenCredentials(impl->options);
  if (!credentials.ok()) return credentials.status();
  impl->requests =
      std::make_unique<BlockRequests>(impl->options, *impl->store, *impl->metrics, impl->namespaces, *impl->auth);
  impl->cache_service =
      std::make_unique<CacheServiceImpl>(impl->options, *impl->store, *impl->metrics, *impl->requests, *impl->auth);
  impl->admin_service =
      std::make_unique<AdminServiceImpl>(impl->options, *impl->store, *impl->metrics, impl->namespaces, *impl->auth);

  // The UCX listener first, so that GetInfo advertises it from the first RPC on.
  if (!options.ucx_listen_address.empty()) {
    ucx::UcxServerOptions ucx_options{.listen_address = options.ucx_listen_address,
                                      .node_id = options.node_id,
                                      .transports = options.ucx_transports,
                                      .transfer_timeout = options.ucx_transfer_timeout,
                                      .pending_connection_timeout = options.ucx_pending_connection_timeout,
                                      .max_pending_connections_per_host = options.ucx_max_pending_connections_per_host,
                                      .offer_put_commit = options.ucx_put_commit};
    // Tokens or TLS on: a UCX endpoint must prove a credential of the gRPC plane (a session ticket).
    impl->ucx_sessions =
        std::make_unique<UcxSessions>(options.ucx_session_ttl, impl->auth->enabled() || options.tls_enabled());
    impl->cache_service->set_ucx_sessions(impl->ucx_sessions.get());
    ucx_options.tickets_required = impl->ucx_sessions->required();
    ucx_options.find_ticket = [sessions = impl->ucx_sessions.get()](std::string_view ticket) {
      return sessions->Find(ticket);
    };
    // A lease, and the two phases of a put, over UCX as the endpoint's principal: what the RPCs would
    // allow it, one gRPC round trip less each (StoreBlockSource answers them through BlockRequests).
    impl->ucx_source = std::make_unique<StoreBlockSource>(*impl->store, *impl->metrics, *impl->requests);
    auto ucx = ucx::UcxServer::Start(ucx_options, *impl->ucx_source);
    if (!ucx.ok()) return ucx.status();
    impl->ucx = std::move(ucx).value();
    impl->admin_service->set_ucx_port(impl->ucx->port());
  }

  // KV events: the first event is AllBlocksCleared, then a BlockStored per block recovered from disk, so
  // subscribers drop whatever they knew of this node's previous instance.
  if (options.events_enabled) {
    auto events = EventPublisher::Start(
        {.node_id = options.node_id,
         .format = options.events_format == "vllm"   ? EventFormat::kVllm
                   : options.events_format == "both" ? EventFormat::kBoth
                                                     : EventFormat::kKvtier,
         .pub_endpoint = options.events_pub_endpoint,
         .replay_buffer_events = options.events_replay_buffer_events,
         .max_batch_events = options.events_max_batch_events,
         .heartbeat_interval = options.events_heartbeat_interval,
         .vllm_pub_endpoint = options.events_vllm_pub_endpoint,
         .vllm_replay_endpoint = options.events_vllm_replay_endpoint,
         .vllm_topic = options.events_vllm_topic,
         .vllm_block_size = options.events_vllm_block_size,
         .vllm_block_hash =
             options.events_vllm_block_hash == "bytes" ? VllmBlockHashForm::kBytes : VllmBlockHashForm::kInt,
         .vllm_encoding = options.events_vllm_encoding == "map" ? VllmEncoding::kMap : VllmEncoding::kArray,
         .vllm_data_parallel_rank = options.events_vllm_data_parallel_rank,
         .backend_id = options.events_backend_id.empty() ? options.node_id : options.events_backend_id,
         .instance_ids = options.events_instance_ids,
         .namespace_names = [p = impl.get()](uint64_t id) { return p->namespaces.Find(id); }});
    if (!events.ok()) return events.status();
    impl->events = std::move(events).value();
    impl->metrics->SetEventPublisher(impl->events.get());
    impl->event_service = std::make_unique<EventServiceImpl>(*impl->events, *impl->store,
                                                             impl->auth->enabled() ? impl->auth.get() : nullptr);
  }

  // With the query endpoints the engine-hash index sees the store's changes first and forwards them
  // to the publisher; attaching restates the store's blocks (AllBlocksCleared, then one BlockStored each).
  if (!options.metrics_address.empty()) {
    impl->hash_index = std::make_unique<EngineHashIndex>(impl->events.get());
    impl->query_handler = std::make_unique<QueryHandler>(*impl->store, *impl->hash_index, *impl->auth, options.node_id);
  }
  if (impl->hash_index != nullptr) {
    impl->store->SetEventSink(impl->hash_index.get());
  } else if (impl->events != nullptr) {
    impl->store->SetEventSink(impl->events.get());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  wire::ConfigureServerBuilder(builder, options.max_message_bytes);
  builder.AddListeningPort(options.listen_address, *credentials, &impl->grpc_port);
  builder.RegisterService(impl->cache_service.get());
  builder.RegisterService(impl->admin_service.get());
  if (impl->store->has_hbm_tier() && nccl::NcclBuilt()) {
    auto api = nccl::CreateNcclApi();
    if (!api.ok()) return api.status();
    impl->nccl_api = std::move(api).value();
    impl->hbm_source = std::make_unique<HbmBlockSource>(*impl->store, static_cast<int32_t>(options.hbm_device));
    nccl::NcclServiceOptions nccl_options;
    // The caller's token, checked as on the cache service; each Fetch's namespace must be its tenant's.
    nccl_options.authenticate =
        [auth = impl->auth.get()](const grpc::ServerContext& ctx) -> absl::StatusOr<std::optional<std::string>> {
      Principal who;
      if (grpc::Status s = auth->Authenticate(ctx, &who); !s.ok()) return wire::FromGrpc(s);
      return who.admin() ? std::nullopt : std::optional<std::string>(who.tenant);
    };
    auto service = nccl::NcclService::Create(*impl->nccl_api, *impl->hbm_source, nccl_options);
    if (!service.ok()) return service.status();
    impl->nccl_service = std::move(service).value();
    builder.RegisterService(impl->nccl_service->grpc_service());
    impl->admin_service->set_nccl(true);  // GetInfo tells clients to read into GPU buffers over NCCL
  }
  if (impl->event_service != nullptr) builder.RegisterService(impl->event_service.get());
  impl->grpc_server = builder.BuildAndStart();
  if (impl->grpc_server == nullptr || impl->grpc_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen_address,
                                               options.tls_enabled() ? " (or tls.cert_file/tls.key_file are not "
                                                                       "a matching certificate and key)"
                                                                     : ""));
  }
  if (!options.health_address.empty()) {
    // Probes that cannot present a client certificate (the kubelet's) get grpc.health.v1 here, in
    // plaintext, and nothing else: no cache or admin service is registered on this server.
    impl->plain_health = std::make_unique<PlainHealthService>();
    grpc::EnableDefaultHealthCheckService(false);  // global: would register a second grpc.health.v1 here
    grpc::ServerBuilder health_builder;
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port in use fails the start
    health_builder.AddListeningPort(options.health_address, grpc::InsecureServerCredentials(), &impl->health_port);
    health_builder.RegisterService(impl->plain_health.get());
    impl->health_server = health_builder.BuildAndStart();
    if (impl->health_server == nullptr || impl->health_port == 0) {
      impl->grpc_server->Shutdown();
      return absl::UnavailableError(absl::StrCat("cannot listen on server.health_address ", options.health_address));
    }
  }

  if (!options.metrics_address.empty()) {
    try {
      // /query and /query_by_hash are answered by the civetweb callbacks (query/query_http.h).
      impl->exposer = std::make_unique<prometheus::Exposer>(options.metrics_address, 2, QueryHttpCallbacks());
    } catch (const std::exception& e) {
      impl->grpc_server->Shutdown();
      return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", options.metrics_address, ": ", e.what()));
    }
    impl->exposer->RegisterCollectable(impl->metrics->registry());
    impl->exposer->RegisterCollectable(impl->metrics->counters_collectable());
    auto ports = impl->exposer->GetListeningPorts();
    impl->metrics_port = ports.empty() ? 0 : ports.front();
    RegisterQueryHttp(impl->metrics_port, impl->query_handler.get());
    impl->admin_service->set_http_port(impl->metrics_port);
  }

  impl->expiry_thread = std::thread([p = impl.get()] { p->ExpiryLoop(); });
  auto server = std::unique_ptr<Server>(new Server(std::move(impl)));
  if (!options.port_file.empty()) {
    // A fourth number, the health port, only with health_address (readers of three numbers stay valid).
    const std::string health = options.health_address.empty() ? "" : absl::StrCat(" ", server->health_port());
    absl::Status s = WriteFileAtomically(
        options.port_file,
        absl::StrCat(server->grpc_port(), " ", server->metrics_port(), " ", server->ucx_port(), health, "\n"));
    if (!s.ok()) return s;  // ~Server shuts down
  }
  return server;
}

void Server::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping) {
      return;
    }
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  // Health turns NOT_SERVING first, so that probes and clients stop sending new work.
  if (auto* health = impl_->grpc_server->GetHealthCheckService(); health != nullptr) health->Shutdown();
  if (impl_->plain_health != nullptr) impl_->plain_health->SetNotServing();
  // In-flight RPCs get a short grace period, then are cancelled.
  impl_->grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (impl_->health_server != nullptr) impl_->health_server->Shutdown(std::chrono::system_clock::now());
  // Then the UCX plane: transfers in flight are cancelled (clients see misses) and their pins dropped.
  if (impl_->ucx != nullptr) impl_->ucx->Shutdown();
  if (impl_->expiry_thread.joinable()) impl_->expiry_thread.join();
  impl_->exposer.reset();  // joins civetweb's threads: no query is in flight after this
  if (impl_->query_handler != nullptr) UnregisterQueryHttp(impl_->metrics_port);
  if (impl_->events != nullptr || impl_->hash_index != nullptr) impl_->store->SetEventSink(nullptr);
  if (impl_->events != nullptr) impl_->events->Stop();  // what is queued is published first
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopped = true;
  }
  impl_->cv.notify_all();
}

void Server::Wait() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->cv.wait(lock, [this] { return impl_->stopped; });
}

int Server::grpc_port() const { return impl_->grpc_port; }
int Server::metrics_port() const { return impl_->metrics_port; }
int Server::health_port() const { return impl_->health_port; }
int Server::ucx_port() const { return impl_->ucx != nullptr ? impl_->ucx->port() : 0; }
const ServerOptions& Server::options() const { return impl_->options; }
BlockStore& Server::store_for_test() { return *impl_->store; }

}  // namespace kvtier::server
