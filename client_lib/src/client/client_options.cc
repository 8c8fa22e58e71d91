// ClientOptions::Validate, the transport option's parser and the result names of client.h.
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/transport_mode.h"
#include "kvtier/client/client.h"
#include "kvtier/client/dns_resolver.h"
#include "kvtier/common/host_port.h"

namespace kvtier::client {

namespace {

constexpr uint32_t kMaxReplicationFactor = 16;

// The replication fields of ClientOptions (docs/config.md "Replication").
absl::Status ValidateReplication(const ClientOptions& o) {
  if (o.replication_factor == 0 || o.replication_factor > kMaxReplicationFactor) {
    return absl::InvalidArgumentError(
        absl::StrCat("replication_factor: ", o.replication_factor, " is not in 1..", kMaxReplicationFactor));
  }
  for (size_t i = 0; i < o.replication_overrides.size(); ++i) {
    const ClientOptions::ReplicationOverride& r = o.replication_overrides[i];
    if (r.tenant.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("replication_overrides[", i, "].tenant: must not be empty"));
    }
    if (r.replication_factor == 0 || r.replication_factor > kMaxReplicationFactor) {
      return absl::InvalidArgumentError(absl::StrCat("replication_overrides[", i, "].replication_factor: ",
                                                     r.replication_factor, " is not in 1..", kMaxReplicationFactor));
    }
  }
  if (o.hot_read_replicas > kMaxReplicationFactor) {
    return absl::InvalidArgumentError(
        absl::StrCat("hot_read_replicas: ", o.hot_read_replicas, " is above ", kMaxReplicationFactor));
  }
  if (o.replica_queue_bytes == 0) return absl::InvalidArgumentError("replica_queue_bytes: must be > 0");
  if (o.hint_retry_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("hint_retry_interval: must be > 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TransportMode> ParseTransport(absl::string_view transport) {
  static constexpr std::pair<absl::string_view, TransportMode> kModes[] = {
      {"auto", TransportMode::kAuto}, {"grpc", TransportMode::kGrpc}, {"ucx", TransportMode::kUcx}};
  for (const auto& [name, mode] : kModes) {
    if (name == transport) return mode;
  }
  return absl::InvalidArgumentError(absl::StrCat("transport: \"", transport, "\" is not auto, grpc or ucx"));
}

absl::Status ClientOptions::Validate() const {
  if (members.empty() && members_dns.empty()) {
    return absl::InvalidArgumentError("members: at least one member (or members_dns) is required");
  }
  for (const std::string& m : members) {
    const std::string addr = m.substr(m.find('=') == std::string::npos ? 0 : m.find('=') + 1);
    if (auto hp = ParseHostPort(addr); !hp.ok()) {
      // gRPC would take port 100403 as 34867: refuse it here, naming the member.
      return absl::InvalidArgumentError(
          absl::StrCat("members: \"", m, "\" is not host:port or node_id=host:port: ", hp.status().message()));
    }
  }
  if (!members_dns.empty()) {
    if (absl::Status s = ValidateDnsName(members_dns); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("members_dns: ", s.message()));
    }
  }
  if (absl::Status s = ValidateDnsServer(dns_server); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("dns_server: ", s.message()));
  }
  if (dns_refresh_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("dns_refresh_interval: must be > 0");
  }
  if (dns_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("dns_timeout: must be > 0");
  if (health_check_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("health_check_interval: must be > 0");
  }
  if (health_check_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("health_check_timeout: must be > 0");
  }
  if (unhealthy_threshold == 0) return absl::InvalidArgumentError("unhealthy_threshold: must be > 0");
  if (healthy_threshold == 0) return absl::InvalidArgumentError("healthy_threshold: must be > 0");
  if (virtual_nodes == 0) return absl::InvalidArgumentError("virtual_nodes: must be > 0");
  if (rpc_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("rpc_timeout: must be > 0");
  if (connect_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("connect_timeout: must be > 0");
  if (max_message_bytes < (4ULL << 20)) return absl::InvalidArgumentError("max_message_bytes: must be >= 4 MiB");
  if (stream_chunk_bytes == 0 || stream_chunk_bytes + (64 << 10) > max_message_bytes) {
    return absl::InvalidArgumentError("stream_chunk_bytes: must be > 0 and below max_message_bytes - 64 KiB");
  }
  if (max_blocks_per_request == 0) return absl::InvalidArgumentError("max_blocks_per_request: must be > 0");
  if (put_batch_blocks == 0) return absl::InvalidArgumentError("put_batch_blocks: must be > 0");
  if (max_block_bytes == 0) return absl::InvalidArgumentError("max_block_bytes: must be > 0");
  if (absl::StatusOr<TransportMode> mode = ParseTransport(transport); !mode.ok()) return mode.status();
  if (ucx_reconnect_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ucx_reconnect_backoff: must be >= 0");
  }
  if (ucx_get_lanes < 1 || ucx_get_lanes > 64) {
    return absl::InvalidArgumentError(absl::StrCat("ucx_get_lanes: ", ucx_get_lanes, " is not in [1, 64]"));
  }
  return ValidateReplication(*this);
}

const char* GetResultName(GetResult r) {
  switch (r) {
    case GetResult::kHit:
      return "hit";
    case GetResult::kMiss:
      return "miss";
    case GetResult::kMissFromError:
      return "miss_from_error";
    case GetResult::kChecksumMismatch:
      return "checksum_mismatch";
  }
  return "unknown";
}

const char* PutResultName(PutResult r) {
  switch (r) {
    case PutResult::kStored:
      return "stored";
    case PutResult::kAlreadyPresent:
      return "already_present";
    case PutResult::kInProgress:
      return "in_progress";
    case PutResult::kNoSpace:
      return "no_space";
    case PutResult::kError:
      return "error";
  }
  return "unknown";
}

}  // namespace kvtier::client
