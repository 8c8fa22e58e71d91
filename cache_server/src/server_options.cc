#include "kvtier/server/server_options.h"

#include <algorithm>

#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <openssl/evp.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kvtier/common/host_port.h"
#include "kvtier/server/eviction_policy.h"
#include "kvtier/server/slab_allocator.h"

namespace kvtier::server {
namespace {

absl::Status Bad(const std::string& key, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": ", why));
}

// A listen address: port 0 lets the kernel pick.
bool ValidHostPort(const std::string& s) { return ParseHostPort(s, /*min_port=*/0).ok(); }

}  // namespace

// "123", "64MiB", "2GiB", "512KiB", "1GB", "10MB", "4KB".
absl::StatusOr<uint64_t> ParseByteSize(const std::string& key, const std::string& text) {
  static const std::pair<const char*, uint64_t> kSuffixes[] = {
      {"KiB", 1ULL << 10}, {"MiB", 1ULL << 20},    {"GiB", 1ULL << 30},           {"TiB", 1ULL << 40},
      {"KB", 1000ULL},     {"MB", 1000ULL * 1000}, {"GB", 1000ULL * 1000 * 1000}, {"B", 1}};
  std::string t(absl::StripAsciiWhitespace(text));
  uint64_t mult = 1;
  for (const auto& [suffix, m] : kSuffixes) {
    const std::string sfx = suffix;
    if (t.size() > sfx.size() && t.compare(t.size() - sfx.size(), sfx.size(), sfx) == 0) {
      t = std::string(absl::StripAsciiWhitespace(t.substr(0, t.size() - sfx.size())));
      mult = m;
      break;
    }
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(t, &v)) {
    return Bad(key, absl::StrCat("\"", text, "\" is not a size (bytes, or a number with KiB/MiB/GiB/TiB/KB/MB/GB)"));
  }
  if (v != 0 && mult > UINT64_MAX / v) return Bad(key, "size overflows 64 bits");
  return v * mult;
}

namespace {

absl::StatusOr<absl::Duration> ParseDurationKey(const std::string& key, const std::string& text) {
  absl::Duration d;
  if (!absl::ParseDuration(std::string(absl::StripAsciiWhitespace(text)), &d)) {
    return Bad(key, absl::StrCat("\"", text, "\" is not a duration (e.g. \"10s\", \"200ms\")"));
  }
  return d;
}

using Setter = std::function<absl::Status(const std::string& key, const YAML::Node& value, ServerOptions& o)>;

Setter String(std::string ServerOptions::*field) {
  return [field](const std::string& key, const YAML::Node& v, ServerOptions& o) -> absl::Status {
    if (!v.IsScalar()) return Bad(key, "must be a string");
    o.*field = v.as<std::string>();
    return absl::OkStatus();
  };
}
Setter StringList(std::vector<std::string> ServerOptions::*field) {
  return [field](const std::string& key, const YAML::Node& v, ServerOptions& o) -> absl::Status {
    if (!v.IsSequence()) return Bad(key, "must be a list of strings");
    std::vector<std::string> out;
    for (const YAML::Node& item : v) {
      if (!item.IsScalar() || item.Scalar().empty()) return Bad(key, "must be a list of non-empty strings");
      out.push_back(item.Scalar());
    }
    o.*field = std::move(out);
    return absl::OkStatus();
  };
}
template <typename T>
Setter Bytes(T ServerOptions::*field) {
  return [field](const std::string& key, const YAML::Node& v, ServerOptions& o) -> absl::Status {
    if (!v.IsScalar()) return Bad(key, "must be a size");
    auto b = ParseByteSize(key, v.as<std::string>());
    if (!b.ok()) return b.status();
    if (*b > std::numeric_limits<T>::max()) return Bad(key, "too large");
    o.*field = static_cast<T>(*b);
    return absl::OkStatus();
  };
}
// A plain non-negative integer (a count or an index: no size suffix).
template <typename T>
Setter Count(T ServerOptions::*field) {
  return [field](const std::string& key, const YAML::Node& v, ServerOptions& o) -> absl::Status {
    uint64_t n = 0;
    if (!v.IsScalar() || !absl::SimpleAtoi(std::string(absl::StripAsciiWhitespace(v.Scalar())), &n)) {
      return Bad(key, "must be a whole number");
    }
    if (n > std::numeric_limits<T>::max()) return Bad(key, "too large");
    o.*field = static_cast<T>(n);
    return absl::OkStatus();
  };
}

Setter Duration(absl::Duration ServerOptions::*field) {
  return [field](const std::string& key, const YAML::Node& v, ServerOptions& o) -> absl::Status {
    if (!v.IsScalar()) return Bad(key, "must be a duration");
    auto d = ParseDurationKey(key, v.as<std::string>());
    if (!d.ok()) return d.status();
    o.*field = *d;
    return absl::OkStatus();
  };
}

Setter Double(double ServerOptions::*field) {
  return [field](const std::string& key, const YAML::Node& v, ServerOptions& o) -> absl::Status {
    double d = 0;
    if (!v.IsScalar() || !YAML::convert<double>::decode(v, d)) return Bad(key, "must be a number");
    o.*field = d;
    return absl::OkStatus();
  };
}

Setter Bool(bool ServerOptions::*field) {
  return [field](const std::string& key, const YAML::Node& v, ServerOptions& o) -> absl::Status {
    bool b = false;
    if (!v.IsScalar() || !YAML::convert<bool>::decode(v, b)) return Bad(key, "must be true or false");
    o.*field = b;
    return absl::OkStatus();
  };
}

// `namespaces:` is a list of {tenant, model, shadow} mappings (docs/config.md).
absl::Status ParseNamespaces(const YAML::Node& list, ServerOptions& o) {
  if (list.IsNull()) return absl::OkStatus();
  if (!list.IsSequence()) return Bad("namespaces", "must be a list of {tenant, model, shadow}");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = absl::StrCat("namespaces[", i, "]");
    const YAML::Node& item = list[i];
    if (!item.IsMap()) return Bad(at, "must be a mapping with tenant, model, shadow");
    NamespaceOptions ns;
    for (const auto& kv : item) {
      if (!kv.first.IsScalar()) return Bad(at, "keys must be plain strings");
      const std::string key = kv.first.Scalar();
      const std::string full = absl::StrCat(at, ".", key);
      if (key == "tenant" || key == "model") {
        if (!kv.second.IsScalar()) return Bad(full, "must be a string");
        (key == "tenant" ? ns.tenant : ns.model) = kv.second.Scalar();
      } else if (key == "shadow") {
        if (!kv.second.IsScalar() || !YAML::convert<bool>::decode(kv.second, ns.shadow)) {
          return Bad(full, "must be true or false");
        }
      } else {
        return Bad(full, "unknown key; known in namespaces: model, shadow, tenant");
      }
    }
    o.namespaces.push_back(std::move(ns));
  }
  return absl::OkStatus();
}

// A list of {token | token_sha256, tenant, role} mappings (docs/config.md `auth`).
absl::StatusOr<std::vector<AuthTokenOptions>> ParseTokenList(const std::string& key, const YAML::Node& list) {
  std::vector<AuthTokenOptions> out;
  if (list.IsNull()) return out;
  if (!list.IsSequence()) return Bad(key, "must be a list of {token or token_sha256, tenant, role}");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = absl::StrCat(key, "[", i, "]");
    const YAML::Node& item = list[i];
    if (!item.IsMap()) return Bad(at, "must be a mapping with token or token_sha256, tenant, role");
    AuthTokenOptions t;
    bool plain = false;
    for (const auto& kv : item) {
      if (!kv.first.IsScalar()) return Bad(at, "keys must be plain strings");
      const std::string k = kv.first.Scalar();
      const std::string full = absl::StrCat(at, ".", k);
      if (!kv.second.IsScalar()) return Bad(full, "must be a string");
      const std::string v = kv.second.Scalar();
      if (k == "token") {
        if (v.empty()) return Bad(full, "must not be empty");
        t.token_sha256 = Sha256Hex(v);
        plain = true;
      } else if (k == "token_sha256") {
        t.token_sha256 = absl::AsciiStrToLower(v);
      } else if (k == "tenant") {
        t.tenant = v;
      } else if (k == "role") {
        t.role = v;
      } else {
        return Bad(full, "unknown key; known in a token: role, tenant, token, token_sha256");
      }
    }
    if (plain && item["token_sha256"]) return Bad(at, "give token or token_sha256, not both");
    if (t.token_sha256.empty()) return Bad(at, "needs token or token_sha256");
    out.push_back(std::move(t));
  }
  return out;
}

// `auth:` {tokens_file, tokens}.
absl::Status ParseAuth(const YAML::Node& node, ServerOptions& o) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return Bad("auth", "must be a mapping with tokens_file and/or tokens");
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) return Bad("auth", "keys must be plain strings");
    const std::string k = kv.first.Scalar();
    if (k == "tokens_file") {
      if (!kv.second.IsScalar()) return Bad("auth.tokens_file", "must be a string");
      o.auth_tokens_file = kv.second.Scalar();
    } else if (k == "tokens") {
      auto tokens = ParseTokenList("auth.tokens", kv.second);
      if (!tokens.ok()) return tokens.status();
      o.auth_tokens.insert(o.auth_tokens.end(), tokens->begin(), tokens->end());
    } else {
      return Bad(absl::StrCat("auth.", k), "unknown key; known in auth: tokens, tokens_file");
    }
  }
  return absl::OkStatus();
}

// `quotas:` {tenant: size}.
absl::Status ParseQuotas(const YAML::Node& node, ServerOptions& o) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return Bad("quotas", "must be a mapping of tenant: size");
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) return Bad("quotas", "keys must be tenant names");
    const std::string key = absl::StrCat("quotas.", kv.first.Scalar());
    if (!kv.second.IsScalar()) return Bad(key, "must be a size");
    auto bytes = ParseByteSize(key, kv.second.Scalar());
    if (!bytes.ok()) return bytes.status();
    o.tenant_quotas.emplace_back(kv.first.Scalar(), *bytes);
  }
  return absl::OkStatus();
}

const std::map<std::string, std::map<std::string, Setter>>& Schema() {
  static const auto* schema = new std::map<std::string, std::map<std::string, Setter>>{
      {"server",
       {{"node_id", String(&ServerOptions::node_id)},
        {"listen_address", String(&ServerOptions::listen_address)},
        {"metrics_address", String(&ServerOptions::metrics_address)},
        {"port_file", String(&ServerOptions::port_file)},
        {"health_address", String(&ServerOptions::health_address)}}},
      {"tls",
       {{"cert_file", String(&ServerOptions::tls_cert_file)},
        {"key_file", String(&ServerOptions::tls_key_file)},
        {"client_ca_file", String(&ServerOptions::tls_client_ca_file)},
        {"require_client_cert", Bool(&ServerOptions::tls_require_client_cert)}}},
      {"host_tier",
       {{"capacity_bytes", Bytes(&ServerOptions::host_cache_bytes)},
        {"slab_bytes", Bytes(&ServerOptions::slab_bytes)},
        {"defrag_interval", Duration(&ServerOptions::defrag_interval)},
        {"index_shards", Count(&ServerOptions::index_shards)}}},
      {"hbm_tier",
       {{"memory_ratio", Double(&ServerOptions::hbm_memory_ratio)},
        {"max_bytes", Bytes(&ServerOptions::hbm_max_bytes)},
        {"device", Count(&ServerOptions::hbm_device)},
        {"promote_on_hit", Bool(&ServerOptions::hbm_promote_on_hit)}}},
      {"disk_tier",
       {{"path", String(&ServerOptions::disk_path)},
        {"capacity_bytes", Bytes(&ServerOptions::disk_capacity_bytes)},
        {"promote_on_hit", Bool(&ServerOptions::promote_on_hit)},
        {"admit_min_requests", Count(&ServerOptions::disk_admit_min_requests)},
        {"spill_buffer_bytes", Bytes(&ServerOptions::disk_spill_buffer_bytes)},
        {"min_free_bytes", Bytes(&ServerOptions::disk_min_free_bytes)},
        {"info_log_dir", String(&ServerOptions::disk_info_log_dir)},
        {"probe_interval", Duration(&ServerOptions::disk_probe_interval)},
        {"flush_interval", Duration(&ServerOptions::disk_flush_interval)}}},
      {"limits",
       {{"max_block_bytes", Bytes(&ServerOptions::max_block_bytes)},
        {"max_blocks_per_request", Count(&ServerOptions::max_blocks_per_request)},
        {"max_message_bytes", Bytes(&ServerOptions::max_message_bytes)},
        {"stream_chunk_bytes", Bytes(&ServerOptions::stream_chunk_bytes)}}},
      {"ucx",
       {{"listen_address", String(&ServerOptions::ucx_listen_address)},
        {"transports", String(&ServerOptions::ucx_transports)},
        {"transfer_timeout", Duration(&ServerOptions::ucx_transfer_timeout)},
        {"session_ttl", Duration(&ServerOptions::ucx_session_ttl)},
        {"pending_connection_timeout", Duration(&ServerOptions::ucx_pending_connection_timeout)},
        {"max_pending_connections_per_host", Count(&ServerOptions::ucx_max_pending_connections_per_host)},
        {"put_commit", Bool(&ServerOptions::ucx_put_commit)}}},
      {"events",
       {{"enabled", Bool(&ServerOptions::events_enabled)},
        {"pub_endpoint", String(&ServerOptions::events_pub_endpoint)},
        {"replay_buffer_events", Count(&ServerOptions::events_replay_buffer_events)},
        {"max_batch_events", Count(&ServerOptions::events_max_batch_events)},
        {"heartbeat_interval", Duration(&ServerOptions::events_heartbeat_interval)},
        {"format", String(&ServerOptions::events_format)},
        {"vllm_pub_endpoint", String(&ServerOptions::events_vllm_pub_endpoint)},
        {"vllm_replay_endpoint", String(&ServerOptions::events_vllm_replay_endpoint)},
        {"vllm_topic", String(&ServerOptions::events_vllm_topic)},
        {"vllm_block_size", Count(&ServerOptions::events_vllm_block_size)},
        {"vllm_block_hash", String(&ServerOptions::events_vllm_block_hash)},
        {"vllm_encoding", String(&ServerOptions::events_vllm_encoding)},
        {"vllm_data_parallel_rank", Count(&ServerOptions::events_vllm_data_parallel_rank)},
        {"backend_id", String(&ServerOptions::events_backend_id)},
        {"instance_ids", StringList(&ServerOptions::events_instance_ids)}}},
      {"eviction",
       {{"policy", String(&ServerOptions::eviction_policy)},
        {"frequency_weight", Double(&ServerOptions::eviction_frequency_weight)},
        {"recency_weight", Double(&ServerOptions::eviction_recency_weight)}}},
      {"leases",
       {{"default_ttl", Duration(&ServerOptions::default_lease_ttl)},
        {"max_ttl", Duration(&ServerOptions::max_lease_ttl)},
        {"reservation_ttl", Duration(&ServerOptions::reservation_ttl)},
        {"tenant_pinned_share", Double(&ServerOptions::tenant_pinned_share)},
        {"buffer_bytes", Bytes(&ServerOptions::lease_buffer_bytes)},
        {"expiry_interval", Duration(&ServerOptions::expiry_interval)}}},
  };
  return *schema;
}

absl::Status ValidateToken(const std::string& at, const AuthTokenOptions& t) {
  if (t.token_sha256.size() != 64 || t.token_sha256.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return Bad(absl::StrCat(at, ".token_sha256"), "must be 64 hex digits (sha256sum of the token)");
  }
  if (t.role != "worker" && t.role != "admin") {
    return Bad(absl::StrCat(at, ".role"), absl::StrCat("\"", t.role, "\" is not worker or admin"));
  }
  if (t.role == "worker" && t.tenant.empty()) return Bad(absl::StrCat(at, ".tenant"), "is required for a worker token");
  return absl::OkStatus();
}

}  // namespace

const NamespaceOptions* ServerOptions::FindNamespace(const std::string& tenant, const std::string& model) const {
  for (const NamespaceOptions& ns : namespaces) {
    if (ns.tenant == tenant && (ns.model.empty() || ns.model == model)) return &ns;
  }
  return nullptr;
}

absl::Status ServerOptions::Validate() const {
  for (size_t i = 0; i < namespaces.size(); ++i) {
    if (namespaces[i].tenant.empty()) return Bad(absl::StrCat("namespaces[", i, "].tenant"), "is required");
  }
  if (node_id.empty()) return Bad("server.node_id", "is required (a stable id such as the host name)");
  if (node_id.size() > 255) return Bad("server.node_id", "must be at most 255 bytes");
  if (!ValidHostPort(listen_address)) return Bad("server.listen_address", "must be host:port");
  if (!metrics_address.empty() && !ValidHostPort(metrics_address)) {
    return Bad("server.metrics_address", "must be host:port or empty");
  }
  if (!metrics_address.empty() && metrics_address.front() == '[') {  // Debian's civetweb has no IPv6
    return Bad("server.metrics_address", "must be an IPv4 address or a host name (the /metrics server has no IPv6)");
  }
  if (!ucx_listen_address.empty() && !ValidHostPort(ucx_listen_address)) {
    return Bad("ucx.listen_address", "must be host:port or empty");
  }
  if (ucx_transfer_timeout <= absl::ZeroDuration()) return Bad("ucx.transfer_timeout", "must be > 0");
  if (ucx_session_ttl < absl::Seconds(1) || ucx_session_ttl > absl::Hours(24)) {
    return Bad("ucx.session_ttl", "must be in [1s, 24h]");
  }
  if (ucx_pending_connection_timeout < absl::Milliseconds(100) || ucx_pending_connection_timeout > absl::Hours(1)) {
    return Bad("ucx.pending_connection_timeout", "must be in [100ms, 1h]");
  }
  if (ucx_max_pending_connections_per_host < 1) return Bad("ucx.max_pending_connections_per_host", "must be >= 1");
  if (!ucx_listen_address.empty() && !ucx_transports.empty()) {
    const std::vector<std::string> tls = absl::StrSplit(ucx_transports, ',');
    if (std::find(tls.begin(), tls.end(), "tcp") == tls.end()) {
      return Bad("ucx.transports",
                 absl::StrCat("\"", ucx_transports, "\" must include tcp: clients connect through the tcp listener"));
    }
  }
  if (host_cache_bytes == 0) return Bad("host_tier.capacity_bytes", "must be > 0");
  if (host_cache_bytes > SlabAllocator::kMaxCapacityBytes) {
    return Bad("host_tier.capacity_bytes", absl::StrCat(host_cache_bytes, " is above the 128 TiB a process can map"));
  }
  if (slab_bytes == 0) return Bad("host_tier.slab_bytes", "must be > 0");
  if (std::min(host_cache_bytes, slab_bytes) < kSlotAlignmentBytes) {
    return Bad(host_cache_bytes < slab_bytes ? "host_tier.capacity_bytes" : "host_tier.slab_bytes",
               absl::StrCat("must hold at least one ", kSlotAlignmentBytes, "-byte slot"));
  }
  if (const uint64_t slabs = host_cache_bytes / slab_bytes + (host_cache_bytes % slab_bytes != 0 ? 1 : 0);
      slabs > SlabAllocator::kMaxSlabs) {
    return Bad("host_tier.slab_bytes", absl::StrCat(slab_bytes, " cuts host_tier.capacity_bytes (", host_cache_bytes,
                                                    ") into ", slabs, " slabs; at most ", SlabAllocator::kMaxSlabs));
  }
  if (!(hbm_memory_ratio >= 0 && hbm_memory_ratio <= 1)) {
    return Bad("hbm_tier.memory_ratio", "must be in [0, 1] (0 = no HBM tier)");
  }
  if (!disk_path.empty() && disk_capacity_bytes == 0) {
    return Bad("disk_tier.capacity_bytes", "must be > 0 when disk_tier.path is set");
  }
  if (disk_path.empty() && disk_capacity_bytes != 0) {
    return Bad("disk_tier.path", "is required when disk_tier.capacity_bytes is set");
  }
  if (disk_probe_interval <= absl::ZeroDuration()) return Bad("disk_tier.probe_interval", "must be > 0");
  if (disk_flush_interval < absl::ZeroDuration() || disk_flush_interval == absl::InfiniteDuration()) {
    return Bad("disk_tier.flush_interval", "must be >= 0 and finite");
  }
  if (max_block_bytes == 0) return Bad("limits.max_block_bytes", "must be > 0");
  if (max_block_bytes > slab_bytes) {
    return Bad("limits.max_block_bytes", absl::StrCat("must be <= host_tier.slab_bytes (", slab_bytes, ")"));
  }
  // A block is stored in a slot of its size rounded up to the slot alignment; a largest block whose slot
  // does not fit in a slab could never be stored, and every put of one would evict in vain.
  if (const uint64_t largest =
          SlabAllocator::LargestBlockBytes({.capacity_bytes = slab_bytes, .slab_bytes = slab_bytes});
      max_block_bytes > largest) {
    const uint64_t slot = (max_block_bytes + kSlotAlignmentBytes - 1) / kSlotAlignmentBytes * kSlotAlignmentBytes;
    return Bad("limits.max_block_bytes",
               absl::StrCat(max_block_bytes, " needs a ", slot, "-byte slot (slots round up to ", kSlotAlignmentBytes,
                            " bytes), which a host_tier.slab_bytes of ", slab_bytes,
                            " cannot hold; raise host_tier.slab_bytes to at least ", slot,
                            " or lower limits.max_block_bytes to at most ", largest));
  }
  if (max_blocks_per_request == 0) return Bad("limits.max_blocks_per_request", "must be > 0");
  if (max_message_bytes < (4ULL << 20) || max_message_bytes > (1ULL << 31) - 1) {
    return Bad("limits.max_message_bytes", "must be in [4MiB, 2GiB)");
  }
  if (stream_chunk_bytes == 0 || stream_chunk_bytes + (64 << 10) > max_message_bytes) {
    return Bad("limits.stream_chunk_bytes", "must be > 0 and leave 64 KiB of headroom below max_message_bytes");
  }
  if (const auto names = EvictionPolicyNames(); std::find(names.begin(), names.end(), eviction_policy) == names.end()) {
    return Bad("eviction.policy",
               absl::StrCat("\"", eviction_policy, "\" is unknown; one of: ", absl::StrJoin(names, ", ")));
  }
  if (absl::Status s = EvictionPolicyOptions{.frequency_weight = eviction_frequency_weight,
                                             .recency_weight = eviction_recency_weight}
                           .Validate();
      !s.ok()) {
    return Bad("eviction", std::string(s.message()));
  }
  // An infinite lease would pin its block for the server's lifetime (a client that died holding it too).
  const auto finite_positive = [](absl::Duration d) {
    return d > absl::ZeroDuration() && d != absl::InfiniteDuration();
  };
  if (!finite_positive(default_lease_ttl)) return Bad("leases.default_ttl", "must be > 0 and finite");
  if (!finite_positive(max_lease_ttl)) return Bad("leases.max_ttl", "must be > 0 and finite");
  if (max_lease_ttl < default_lease_ttl) return Bad("leases.max_ttl", "must be >= leases.default_ttl");
  if (!finite_positive(reservation_ttl)) return Bad("leases.reservation_ttl", "must be > 0 and finite");
  if (!(tenant_pinned_share > 0 && tenant_pinned_share <= 1)) {
    return Bad("leases.tenant_pinned_share",
               "must be in (0, 1] (the share of the host tier one tenant's leases may pin)");
  }
  if (!finite_positive(expiry_interval)) return Bad("leases.expiry_interval", "must be > 0 and finite");
  if (defrag_interval < absl::ZeroDuration()) return Bad("host_tier.defrag_interval", "must be >= 0 (0 = off)");
  if (index_shards < 1 || index_shards > 65536) return Bad("host_tier.index_shards", "must be in [1, 65536]");
  if (!health_address.empty() && !ValidHostPort(health_address)) {
    return Bad("server.health_address", "must be host:port or empty");
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return Bad(tls_cert_file.empty() ? "tls.cert_file" : "tls.key_file", "tls.cert_file and tls.key_file go together");
  }
  if (tls_cert_file.empty() && (!tls_client_ca_file.empty() || tls_require_client_cert)) {
    return Bad("tls.cert_file", "is required for tls.client_ca_file and tls.require_client_cert");
  }
  if (tls_require_client_cert && tls_client_ca_file.empty()) {
    return Bad("tls.client_ca_file", "is required when tls.require_client_cert is true");
  }
  for (size_t i = 0; i < auth_tokens.size(); ++i) {
    if (absl::Status s = ValidateToken(absl::StrCat("auth.tokens[", i, "]"), auth_tokens[i]); !s.ok()) return s;
  }
  for (const auto& [tenant, bytes] : tenant_quotas) {
    if (tenant.empty()) return Bad("quotas", "a tenant name is empty");
    if (bytes == 0) return Bad(absl::StrCat("quotas.", tenant), "must be > 0");
  }
  if (events_enabled) {
    if (events_pub_endpoint.find("://") == std::string::npos) {
      return Bad("events.pub_endpoint", "must be a ZeroMQ endpoint such as tcp://0.0.0.0:7402");
    }
    if (events_replay_buffer_events == 0) return Bad("events.replay_buffer_events", "must be > 0");
    if (events_max_batch_events == 0) return Bad("events.max_batch_events", "must be > 0");
    if (events_heartbeat_interval <= absl::ZeroDuration()) return Bad("events.heartbeat_interval", "must be > 0");
    if (events_format != "kvtier" && events_format != "vllm" && events_format != "both") {
      return Bad("events.format", absl::StrCat("\"", events_format, "\" is not kvtier, vllm or both"));
    }
    if (events_format != "kvtier") {
      if (events_vllm_pub_endpoint.find("://") == std::string::npos) {
        return Bad("events.vllm_pub_endpoint", "must be a ZeroMQ endpoint such as tcp://0.0.0.0:5557");
      }
      if (!events_vllm_replay_endpoint.empty() && events_vllm_replay_endpoint.find("://") == std::string::npos) {
        return Bad("events.vllm_replay_endpoint", "must be empty or a ZeroMQ endpoint such as tcp://0.0.0.0:5558");
      }
      if (events_vllm_replay_endpoint == events_vllm_pub_endpoint) {
        return Bad("events.vllm_replay_endpoint", "must differ from events.vllm_pub_endpoint");
      }
      if (events_format == "both" && events_vllm_pub_endpoint == events_pub_endpoint) {
        return Bad("events.vllm_pub_endpoint", "must differ from events.pub_endpoint");
      }
      if (events_vllm_block_size == 0) return Bad("events.vllm_block_size", "must be > 0");
      if (events_vllm_block_hash != "int" && events_vllm_block_hash != "bytes") {
        return Bad("events.vllm_block_hash", absl::StrCat("\"", events_vllm_block_hash, "\" is not int or bytes"));
      }
      if (events_vllm_encoding != "array" && events_vllm_encoding != "map") {
        return Bad("events.vllm_encoding", absl::StrCat("\"", events_vllm_encoding, "\" is not array or map"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ServerOptions> ParseServerConfig(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config is not valid YAML: ", e.what()));
  }
  ServerOptions options;
  if (root.IsNull()) return options;
  if (!root.IsMap()) return absl::InvalidArgumentError("config: the top level must be a mapping");
  const auto& schema = Schema();
  std::set<std::string> sections;
  for (const auto& section : root) {
    // Keys must be plain scalars: YAML allows sequences and maps as keys ("? [a]"), and as<>() throws.
    if (!section.first.IsScalar()) return absl::InvalidArgumentError("config: a section name must be a plain string");
    const std::string name = section.first.Scalar();
    // YAML forbids a key twice in one mapping; yaml-cpp would keep both and the last would win silently.
    if (!sections.insert(name).second) return Bad(name, "appears twice");
    if (name == "namespaces") {  // the one list-valued section
      if (absl::Status s = ParseNamespaces(section.second, options); !s.ok()) return s;
      continue;
    }
    if (name == "auth" || name == "quotas") {  // free-form keys (tenants) or lists
      try {
        absl::Status s = name == "auth" ? ParseAuth(section.second, options) : ParseQuotas(section.second, options);
        if (!s.ok()) return s;
      } catch (const YAML::Exception& e) {
        return Bad(name, e.what());
      }
      continue;
    }
    auto sit = schema.find(name);
    if (sit == schema.end()) {
      std::vector<std::string> known;
      for (const auto& [k, _] : schema) known.push_back(k);
      known.push_back("namespaces");
      known.push_back("auth");
      known.push_back("quotas");
      return Bad(name, absl::StrCat("unknown section; known: ", absl::StrJoin(known, ", ")));
    }
    if (section.second.IsNull()) continue;
    if (!section.second.IsMap()) return Bad(name, "must be a mapping");
    std::set<std::string> keys;
    for (const auto& kv : section.second) {
      if (!kv.first.IsScalar()) return Bad(name, "keys must be plain strings");
      const std::string key = kv.first.Scalar();
      const std::string full = absl::StrCat(name, ".", key);
      if (!keys.insert(key).second) return Bad(full, "appears twice");
      auto kit = sit->second.find(key);
      if (kit == sit->second.end()) {
        std::vector<std::string> known;
        for (const auto& [k, _] : sit->second) known.push_back(k);
        return Bad(full, absl::StrCat("unknown key; known in ", name, ": ", absl::StrJoin(known, ", ")));
      }
      try {
        if (absl::Status s = kit->second(full, kv.second, options); !s.ok()) return s;
      } catch (const YAML::Exception& e) {
        return Bad(full, e.what());
      }
    }
  }
  return options;
}

std::string Sha256Hex(const std::string& token) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(token.data(), token.size(), digest, &n, EVP_sha256(), nullptr) != 1) return std::string();
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), n));
}

absl::StatusOr<std::vector<AuthTokenOptions>> ParseAuthTokens(const std::string& key, const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return Bad(key, absl::StrCat("is not valid YAML: ", e.what()));
  }
  std::vector<AuthTokenOptions> tokens;
  try {
    auto parsed = ParseTokenList(key, root);
    if (!parsed.ok()) return parsed.status();
    tokens = *std::move(parsed);
  } catch (const YAML::Exception& e) {
    return Bad(key, e.what());
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (absl::Status s = ValidateToken(absl::StrCat(key, "[", i, "]"), tokens[i]); !s.ok()) return s;
  }
  return tokens;
}

absl::StatusOr<ServerOptions> LoadServerConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config file ", path, " cannot be read"));
  std::stringstream buf;
  buf << in.rdbuf();
  return ParseServerConfig(buf.str());
}

}  // namespace kvtier::server
