// Options of one kvtier cache server, and the YAML config file that sets them.
#ifndef KVTIER_SERVER_SERVER_OPTIONS_H_
#define KVTIER_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier::server {

// Settings of the namespaces of one tenant (and model), from the config's `namespaces:` list.
struct NamespaceOptions {
  std::string tenant;  // required
  std::string model;   // empty = every model of the tenant
  // Shadow mode: lookups are answered "absent" and reads miss, so the namespace is never served, while
  // puts are stored and the server counts what would have been a hit (kvtierctl stats / groups,
  // kvtier_shadow_lookup_blocks_total). Default: false.
  bool shadow = false;
};

// One bearer token the server accepts (config `auth.tokens`, or `auth.tokens_file`), docs/config.md.
// Only the token's SHA-256 is kept: a `token:` given in plain text is hashed when the config is parsed.
struct AuthTokenOptions {
  std::string token_sha256;     // required: 64 lowercase hex digits of SHA-256(token)
  std::string tenant;           // the tenant a worker token may touch; required for role "worker"
  std::string role = "worker";  // "worker" (cache RPCs of its tenant) or "admin" (everything)
};

// Every field has a default; Validate() names the first bad one by its YAML key (docs/config.md).
struct ServerOptions {
  std::string node_id;                                  // required: stable id, the member's ring key
  std::string listen_address = "127.0.0.1:0";           // host:port of gRPC; port 0 = the kernel picks
  std::string metrics_address = "127.0.0.1:0";          // host:port of /metrics; empty = no exposer
  uint64_t host_cache_bytes = 1ULL << 30;               // Default: 1 GiB of host memory for blocks
  uint64_t slab_bytes = 64ULL << 20;                    // Default: 64 MiB; also the largest block accepted
  absl::Duration defrag_interval = absl::Seconds(300);  // host-tier compaction (DESIGN.md §8); 0 = off
  // Shards of the committed-block index that lookups without a lease read (BlockStoreOptions::index_shards);
  // 1..65536, default 64.
  uint32_t index_shards = 64;
  std::string disk_path;             // RocksDB directory of the disk tier; empty = none
  uint64_t disk_capacity_bytes = 0;  // budget on logical bytes on disk (docs/config.md)
  bool promote_on_hit = true;        // a hit on disk moves the block back to host memory
  // A host eviction spills its block only if it was requested at least this many times
  // (BlockStoreOptions::disk_admit_min_requests); 0 = every eviction spills (default).
  uint32_t disk_admit_min_requests = 0;
  // The most bytes of blocks waiting for the disk writer (BlockStoreOptions::spill_buffer_bytes); 0 =
  // max(host capacity / 8, 64 MiB, one largest block).
  uint64_t disk_spill_buffer_bytes = 0;
  // The disk tier stops spilling while its volume has less free than this, and resumes at 1.5x it;
  // 0 = max(4 x RocksDB's write buffer, min(volume / 8, 1 GiB)) (docs/config.md, "The disk budget").
  uint64_t disk_min_free_bytes = 0;
  std::string disk_info_log_dir;                          // RocksDB's info log: "" = the server's log
  absl::Duration disk_probe_interval = absl::Seconds(1);  // how often a degraded disk tier is retried
  // Spills skip RocksDB's WAL; the probe flushes write buffers older than this, so a killed server
  // loses at most about this much (plus a probe interval) of its newest spills. Config
  // `disk_tier.flush_interval`.
  absl::Duration disk_flush_interval = absl::Seconds(5);
  // HBM tier (docs/config.md `hbm_tier`): hbm_memory_ratio x the device's free memory at start, at most
  // hbm_max_bytes (0 = no cap), on CUDA device hbm_device. 0 = no HBM tier. When > 0 and no CUDA device
  // is usable (or the build has no CUDA), the server logs why and runs without it. When a device is
  // usable, the host tier is page-locked for DMA as well.
  double hbm_memory_ratio = 0;
  uint64_t hbm_max_bytes = 0;
  uint32_t hbm_device = 0;
  bool hbm_promote_on_hit = true;            // a read hit on host memory moves the block up to HBM
  uint64_t max_block_bytes = 64ULL << 20;    // Default: 64 MiB; <= slab_bytes
  uint32_t max_blocks_per_request = 65536;   // Default: 64 Ki keys per RPC
  uint64_t max_message_bytes = 80ULL << 20;  // Default: 80 MiB gRPC messages both ways
  uint64_t stream_chunk_bytes = 1ULL << 20;  // Default: 1 MiB per streamed data message
  std::string eviction_policy = "adaptive";  // "adaptive", "lru", "weighted" or "prefix_lrfu"
  double eviction_frequency_weight = 0.3;    // "weighted": the two weights, given as operators do
  double eviction_recency_weight = 0.7;      //   ("frequency, recency" = 0.3, 0.7)
  absl::Duration default_lease_ttl = absl::Seconds(10);
  absl::Duration max_lease_ttl = absl::Seconds(60);
  absl::Duration reservation_ttl = absl::Seconds(30);
  // The most of the host tier one tenant's leases may pin (BlockStoreOptions::tenant_pinned_share);
  // config `leases.tenant_pinned_share`, in (0, 1].
  double tenant_pinned_share = 0.5;
  // The most bytes leases may hold in buffers of their own (BlockStoreOptions::lease_buffer_bytes);
  // config `leases.buffer_bytes`; 0 = max(host_tier.capacity_bytes / 8, 64 MiB, one largest block).
  uint64_t lease_buffer_bytes = 0;
  absl::Duration expiry_interval = absl::Milliseconds(200);  // how often leases and reservations expire
  std::string port_file;  // if set: "<grpc_port> <metrics_port> <ucx_port>\n" once bound
  // UCX bulk data plane (docs/architecture.md). Empty: no UCX listener; clients then move bytes over gRPC.
  std::string ucx_listen_address;  // host:port of the UCX listener; port 0 = the kernel picks
  std::string ucx_transports;      // UCX_TLS of the server's UCX context ("" = UCX's own
                                   // default); must include tcp (the listener needs it)
  // Lifetime of a UCX session ticket (OpenUcxSession): the window in which it may open UCX endpoints;
  // an endpoint it opened stays authenticated until it closes. Clients renew at half of it.
  absl::Duration ucx_session_ttl = absl::Minutes(10);
  absl::Duration ucx_transfer_timeout =
      absl::Seconds(10);  // a UCX send or receive still unfinished after
                          // this is cancelled (its endpoint closed) and its pin dropped;
                          // sooner when the lease or reservation it pins expires first
  // A connection to the UCX port that has not become a UCX connection request after this (a peer that
  // sent garbage or nothing) is reset; so are the oldest of one host's beyond the limit
  // (PendingConnectionReaper, docs/architecture.md "Security").
  absl::Duration ucx_pending_connection_timeout = absl::Seconds(10);
  uint64_t ucx_max_pending_connections_per_host = 64;
  // A put batch over UCX commits on its last message (kPutCommit: one reply once the bytes landed and
  // their hashes checked) rather than after a kPutDone and a kCommit round trip; config
  // `ucx.put_commit`. Off: clients commit after kPutDone, as with a server without it. Default: on.
  bool ucx_put_commit = true;

  // KV events (docs/events.md): BlockStored/BlockRemoved/BlockMoved/AllBlocksCleared on a ZeroMQ PUB
  // socket; Replay and Snapshot over gRPC (kvtier.v1.EventService on listen_address). Off by default.
  bool events_enabled = false;
  std::string events_pub_endpoint = "tcp://0.0.0.0:7402";       // ZeroMQ endpoint; port 0 = the kernel picks
  uint32_t events_replay_buffer_events = 65536;                 // Default: the latest 64 Ki events kept for Replay
  uint32_t events_max_batch_events = 256;                       // Default: at most 256 events per PUB message
  absl::Duration events_heartbeat_interval = absl::Seconds(1);  // an empty batch when idle this long
  // Which streams: "kvtier" (the protobuf stream above), "vllm" (vLLM's msgpack KVEventBatch stream and
  // replay socket, which KV-aware routers built for vLLM read) or "both".
  std::string events_format = "kvtier";
  std::string events_vllm_pub_endpoint = "tcp://0.0.0.0:5557";  // vLLM-format PUB (vLLM's default port)
  std::string events_vllm_replay_endpoint;                      // vLLM-format replay ROUTER; empty = none
  std::string events_vllm_topic;                                // first frame of each message; Default: "" (vLLM's)
  uint32_t events_vllm_block_size = 16;                         // BlockStored.block_size: tokens per block
  std::string events_vllm_block_hash = "int";   // "int" (last 8 fingerprint bytes, big-endian) or "bytes" (all 32)
  std::string events_vllm_encoding = "array";   // "array" (structs as arrays, array_like) or "map" (by field name)
  uint32_t events_vllm_data_parallel_rank = 0;  // KVEventBatch.data_parallel_rank
  // Who the events are credited to (docs/events.md, "Backend and instances"): this node as the backend
  // that holds the blocks ("" = node_id), and the engine instances that can read them (Default: none).
  // With instance_ids set, every map-form vLLM event carries "backend_id" and "instance_ids" beside its
  // fields, as the Mooncake/Dynamo KV event envelope does; the kvtier format always carries both.
  std::string events_backend_id;
  std::vector<std::string> events_instance_ids;

  std::vector<NamespaceOptions> namespaces;  // per-namespace settings; the first match applies

  // Plain (never TLS) gRPC port that serves only grpc.health.v1, for probes that cannot present a
  // client certificate (the kubelet's). Empty (default): none; health is then served on listen_address
  // only, with its credentials.
  std::string health_address;
  // TLS on listen_address (config `tls:`). Both files set: TLS; both empty (default): plaintext.
  std::string tls_cert_file;       // PEM certificate chain of this server
  std::string tls_key_file;        // PEM private key of tls_cert_file
  std::string tls_client_ca_file;  // PEM CA(s) that sign client certificates; empty = none
  // Refuse clients without a certificate signed by tls_client_ca_file (mutual TLS). Default false:
  // a certificate, when presented, is still verified against tls_client_ca_file.
  bool tls_require_client_cert = false;
  // Bearer tokens (config `auth:`). With any token (inline or from the file), every RPC but
  // grpc.health.v1 needs one: UNAUTHENTICATED without a valid token, PERMISSION_DENIED for a worker
  // token outside its tenant or on an admin RPC. Default: none (no authentication).
  std::vector<AuthTokenOptions> auth_tokens;
  std::string auth_tokens_file;  // YAML list of the same entries, read at Start()
  // Per-tenant byte quotas (config `quotas: {tenant: size}`): BlockStoreOptions::tenant_quota_bytes.
  std::vector<std::pair<std::string, uint64_t>> tenant_quotas;

  // Whether any token is configured (inline or a file): authentication is then on.
  bool auth_enabled() const { return !auth_tokens.empty() || !auth_tokens_file.empty(); }
  // Whether listen_address serves TLS.
  bool tls_enabled() const { return !tls_cert_file.empty(); }

  // The settings of namespace (tenant, model): the first entry of `namespaces` with this tenant and
  // this model or an empty one; nullptr when none matches.
  const NamespaceOptions* FindNamespace(const std::string& tenant, const std::string& model) const;

  // Errors: InvalidArgument naming the key, e.g. "limits.max_block_bytes: must be <= host_tier.slab_bytes".
  absl::Status Validate() const;
};

// Parses a YAML config (docs/config.md). Unknown keys are errors, so typos never pass silently.
// Sizes accept plain integers of bytes or suffixed strings ("64MiB", "2GiB"); durations accept strings
// like "10s", "200ms". Errors: InvalidArgument naming the key ("host_tier.capacity_bytes: ...").
absl::StatusOr<ServerOptions> ParseServerConfig(const std::string& yaml_text);
// Parses a size: plain bytes or a number with KiB/MiB/GiB/TiB/KB/MB/GB ("64MiB"). `key` names the setting
// in the error. Errors: InvalidArgument ("<key>: \"x\" is not a size ...").
absl::StatusOr<uint64_t> ParseByteSize(const std::string& key, const std::string& text);

// Reads and parses `path`. Errors: NotFound (missing file), InvalidArgument (as above).
absl::StatusOr<ServerOptions> LoadServerConfig(const std::string& path);

// Parses a token list (the `auth.tokens` entries: {token | token_sha256, tenant, role}) from YAML text;
// `key` names the list in errors ("auth.tokens_file"). Plain tokens are hashed. Errors: InvalidArgument
// naming the entry ("auth.tokens_file[2].role: ...").
absl::StatusOr<std::vector<AuthTokenOptions>> ParseAuthTokens(const std::string& key, const std::string& yaml_text);
// Lowercase hex of SHA-256(`token`). Thread-safe.
std::string Sha256Hex(const std::string& token);

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SERVER_OPTIONS_H_
