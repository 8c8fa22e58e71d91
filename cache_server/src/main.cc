// kvtier-server: one kvtier cache server. Flags override the YAML config (--config); see docs/config.md.
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "kvtier/server/server.h"

ABSL_FLAG(std::string, config, "", "YAML config file (docs/config.md); flags below override it");
ABSL_FLAG(std::string, node_id, "", "stable node id, the member's ring key (server.node_id)");
ABSL_FLAG(std::string, listen_address, "", "gRPC host:port; port 0 = any (server.listen_address)");
ABSL_FLAG(std::string, metrics_address, "", "/metrics host:port, or \"none\" (server.metrics_address)");
ABSL_FLAG(std::string, port_file, "",
          "write \"<grpc_port> <metrics_port> <ucx_port>\" here once bound (server.port_file)");
ABSL_FLAG(std::string, ucx_listen_address, "",
          "UCX listener host:port, port 0 = any, \"none\" = no UCX (ucx.listen_address)");
ABSL_FLAG(std::string, ucx_transports, "", "UCX_TLS of the server's UCX context, e.g. tcp or tcp,shm (ucx.transports)");
ABSL_FLAG(std::string, health_address, "",
          "plain grpc.health.v1 host:port for probes, or \"none\" (server.health_address)");
ABSL_FLAG(std::string, host_cache_bytes, "", "host memory for blocks, e.g. 2GiB (host_tier.capacity_bytes)");
ABSL_FLAG(std::string, slab_bytes, "", "slab size, e.g. 64MiB (host_tier.slab_bytes)");
ABSL_FLAG(std::string, eviction_policy, "", "adaptive (default), lru, weighted or prefix_lrfu (eviction.policy)");
ABSL_FLAG(std::string, disk_path, "", "RocksDB directory of the disk tier (disk_tier.path)");
ABSL_FLAG(std::string, disk_capacity_bytes, "", "disk tier budget, e.g. 100GiB (disk_tier.capacity_bytes)");
ABSL_FLAG(std::string, disk_min_free_bytes, "",
          "free space the disk tier's volume keeps, e.g. 8GiB (disk_tier.min_free_bytes)");
ABSL_FLAG(std::string, max_block_bytes, "", "largest block accepted, e.g. 64MiB (limits.max_block_bytes)");
ABSL_FLAG(std::string, events_pub_endpoint, "",
          "publish KV events on this ZeroMQ endpoint, e.g. tcp://0.0.0.0:7402 (events.enabled + "
          "events.pub_endpoint); \"none\" turns events off");

namespace {

// A non-empty flag wins over the config file. String flags, so that "unset" differs from any value.
void Override(const absl::Flag<std::string>& flag, std::string& field) {
  if (std::string v = absl::GetFlag(flag); !v.empty()) field = std::move(v);
}

// Same for sizes ("2GiB"); false after printing an error naming the flag.
bool OverrideBytes(const absl::Flag<std::string>& flag, const char* name, uint64_t& field) {
  const std::string v = absl::GetFlag(flag);
  if (v.empty()) return true;
  auto bytes = kvtier::server::ParseByteSize(absl::StrCat("--", name), v);
  if (!bytes.ok()) {
    std::fprintf(stderr, "kvtier-server: %s\n", std::string(bytes.status().message()).c_str());
    return false;
  }
  field = *bytes;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("kvtier cache server. Usage: kvtier-server --config=FILE [--flag=value...]");
  absl::FlagsUsageConfig usage;
  usage.version_string = [] { return std::string("kvtier-server " KVTIER_VERSION "\n"); };  // --version
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);

  // SIGTERM and SIGINT are taken by a waiting thread, so no handler runs inside gRPC's threads.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  kvtier::server::ServerOptions options;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    auto loaded = kvtier::server::LoadServerConfig(path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "kvtier-server: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    options = *loaded;
  }
  Override(FLAGS_node_id, options.node_id);
  Override(FLAGS_listen_address, options.listen_address);
  Override(FLAGS_metrics_address, options.metrics_address);
  if (options.metrics_address == "none") options.metrics_address.clear();
  Override(FLAGS_health_address, options.health_address);
  if (options.health_address == "none") options.health_address.clear();
  Override(FLAGS_port_file, options.port_file);
  Override(FLAGS_ucx_listen_address, options.ucx_listen_address);
  if (options.ucx_listen_address == "none") options.ucx_listen_address.clear();
  Override(FLAGS_ucx_transports, options.ucx_transports);
  Override(FLAGS_disk_path, options.disk_path);
  Override(FLAGS_eviction_policy, options.eviction_policy);
  if (const std::string ep = absl::GetFlag(FLAGS_events_pub_endpoint); !ep.empty()) {
    options.events_enabled = ep != "none";
    if (ep != "none") options.events_pub_endpoint = ep;
  }
  if (!OverrideBytes(FLAGS_disk_capacity_bytes, "disk_capacity_bytes", options.disk_capacity_bytes) ||
      !OverrideBytes(FLAGS_disk_min_free_bytes, "disk_min_free_bytes", options.disk_min_free_bytes) ||
      !OverrideBytes(FLAGS_host_cache_bytes, "host_cache_bytes", options.host_cache_bytes) ||
      !OverrideBytes(FLAGS_slab_bytes, "slab_bytes", options.slab_bytes) ||
      !OverrideBytes(FLAGS_max_block_bytes, "max_block_bytes", options.max_block_bytes)) {
    return 2;
  }

  auto server = kvtier::server::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "kvtier-server: %s\n", std::string(server.status().message()).c_str());
    // A bad config, or a file it names that cannot be read (tls.*, auth.tokens_file): 2, as usage errors.
    const absl::StatusCode code = server.status().code();
    return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ? 2 : 1;
  }
  std::fprintf(stderr,
               "kvtier-server: node %s serving gRPC on port %d, /metrics on port %d, UCX on port %d, %llu bytes of "
               "host tier\n",
               options.node_id.c_str(), (*server)->grpc_port(), (*server)->metrics_port(), (*server)->ucx_port(),
               static_cast<unsigned long long>(options.host_cache_bytes));

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "kvtier-server: %s, shutting down\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->Shutdown();
  return 0;
}
