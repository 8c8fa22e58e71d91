// trace_replay: replays a Mooncake-format trace (or the built-in workload) against a kvtier cluster.
#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "replayer.h"
#include "server_load.h"
#include "workload.h"

ABSL_FLAG(std::string, members, "", "comma-separated host:port of the cluster's members (required)");
ABSL_FLAG(std::string, trace, "", "Mooncake-format JSONL trace; empty = the built-in synthetic workload");
ABSL_FLAG(uint64_t, limit, 0, "replay at most this many requests (0 = all)");
ABSL_FLAG(uint64_t, capacity_blocks, 0, "the cluster's capacity in blocks (for the report and the LRU reference)");
ABSL_FLAG(uint64_t, block_bytes, 32768,
          "payload bytes per block: Llama-3.1-8B's 64 MiB of bf16 KV per 512-token block, scaled by 1/2048");
ABSL_FLAG(uint32_t, block_tokens, 512, "tokens per hash id");
ABSL_FLAG(double, time_scale, 0, "0 = as fast as possible; s > 0 replays at trace time / s");
ABSL_FLAG(int64_t, rpc_timeout_ms, 2000, "client deadline per RPC");
ABSL_FLAG(bool, json, false, "print the report as one JSON object");
ABSL_FLAG(uint64_t, report_interval_requests, 0,
          "every N requests, print that window's hit ratio, misses from errors and lookup latency as it ends "
          "(with --json: one {\"window\": {...}} line each, before the report); 0 = none");
ABSL_FLAG(uint32_t, replication_factor, 1, "copies of each block the client keeps (ClientOptions::replication_factor)");
ABSL_FLAG(uint32_t, hot_read_replicas, 0,
          "extra owners of hot blocks, whose reads spread over all their owners (ClientOptions::hot_read_replicas)");
ABSL_FLAG(uint32_t, hot_depth, 4, "blocks at depth below this are hot (ClientOptions::hot_depth)");
ABSL_FLAG(bool, server_load, true,
          "report the blocks each server was asked (lookup and read, from the servers' GetStats) during the "
          "replay, with max/mean, on stderr (with --json as one {\"servers\": ...} line)");
ABSL_FLAG(std::string, transport, "auto",
          "block bytes over: auto (UCX where a member offers it, else gRPC), grpc, or ucx (UCX only)");
ABSL_FLAG(std::string, tls_ca_file, "", "PEM CA of the servers' certificates: TLS (ClientOptions::tls_ca_file)");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM client certificate for mutual TLS (ClientOptions::tls_cert_file)");
ABSL_FLAG(std::string, tls_key_file, "", "PEM key of --tls_cert_file (ClientOptions::tls_key_file)");
ABSL_FLAG(std::string, tls_server_name, "", "name on the servers' certificates (ClientOptions::tls_server_name)");
ABSL_FLAG(std::string, token, "",
          "bearer token of the replayed namespace's tenant; default: $KVTIER_TOKEN (ClientOptions::auth_token)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Replays a request trace against a kvtier cluster. See bench/README.md.");
  absl::ParseCommandLine(argc, argv);
  const std::string members = absl::GetFlag(FLAGS_members);
  if (members.empty()) {
    std::fprintf(stderr, "trace_replay: --members is required\n");
    return 2;
  }
  std::vector<kvtier::bench::TraceRequest> requests;
  if (const std::string path = absl::GetFlag(FLAGS_trace); !path.empty()) {
    auto loaded = kvtier::bench::LoadMooncakeTrace(path, absl::GetFlag(FLAGS_limit));
    if (!loaded.ok()) {
      std::fprintf(stderr, "trace_replay: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    requests = std::move(loaded).value();
  } else {
    requests = kvtier::bench::SyntheticWorkload({.block_tokens = absl::GetFlag(FLAGS_block_tokens)});
    if (const uint64_t limit = absl::GetFlag(FLAGS_limit); limit != 0 && requests.size() > limit) {
      requests.resize(limit);
    }
  }
  kvtier::client::ClientOptions copts;
  copts.members = absl::StrSplit(members, ',', absl::SkipEmpty());
  copts.rpc_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms));
  copts.transport = absl::GetFlag(FLAGS_transport);
  copts.replication_factor = absl::GetFlag(FLAGS_replication_factor);
  copts.hot_read_replicas = absl::GetFlag(FLAGS_hot_read_replicas);
  copts.hot_depth = absl::GetFlag(FLAGS_hot_depth);
  copts.tls_ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  copts.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  copts.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  copts.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  copts.auth_token = absl::GetFlag(FLAGS_token);
  if (const char* env = std::getenv("KVTIER_TOKEN"); copts.auth_token.empty() && env != nullptr) copts.auth_token = env;
  auto client = kvtier::client::Client::Connect(copts);
  if (!client.ok()) {
    std::fprintf(stderr, "trace_replay: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  for (const auto& m : (*client)->members()) {
    std::fprintf(stderr, "trace_replay: member %s (%s): block bytes over %s\n", m.node_id.c_str(), m.address.c_str(),
                 m.transport.c_str());
  }
  kvtier::bench::ReplayOptions ropts;
  ropts.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  ropts.block_bytes = absl::GetFlag(FLAGS_block_bytes);
  ropts.capacity_blocks = absl::GetFlag(FLAGS_capacity_blocks);
  ropts.time_scale = absl::GetFlag(FLAGS_time_scale);
  ropts.report_interval_requests = absl::GetFlag(FLAGS_report_interval_requests);
  const bool json = absl::GetFlag(FLAGS_json);
  ropts.on_window = [json](const kvtier::bench::WindowReport& w) {
    if (json) {
      std::printf("{\"window\": %s}\n", w.ToJson().c_str());
    } else {
      std::printf(
          "window %llu: requests %llu-%llu, hit ratio %.4f, %llu misses from errors, %llu put errors, "
          "%llu client errors, %llu mismatches, lookup p99 %.2f ms\n",
          static_cast<unsigned long long>(w.index), static_cast<unsigned long long>(w.first_request),
          static_cast<unsigned long long>(w.first_request + w.requests - 1), w.block_hit_ratio(),
          static_cast<unsigned long long>(w.misses_from_errors), static_cast<unsigned long long>(w.put_errors),
          static_cast<unsigned long long>(w.client_errors), static_cast<unsigned long long>(w.payload_mismatches),
          w.lookup_ms.p99);
    }
    std::fflush(stdout);
  };
  const bool server_load = absl::GetFlag(FLAGS_server_load);
  std::vector<kvtier::bench::ServerLoad> load_before;
  if (server_load) load_before = kvtier::bench::ReadServerLoad((*client)->members(), copts);
  auto report = kvtier::bench::Replay(**client, requests, ropts);
  if (!report.ok()) {
    std::fprintf(stderr, "trace_replay: %s\n", std::string(report.status().message()).c_str());
    return 2;
  }
  if (absl::Status s = (*client)->FlushReplicas(absl::Seconds(60)); !s.ok()) {
    std::fprintf(stderr, "trace_replay: %s\n", std::string(s.message()).c_str());
  }
  std::fprintf(stderr,
               "trace_replay: replication: %llu replica blocks stored, %llu failed, %llu hinted, %llu "
               "delivered, %llu dropped; %llu blocks read from a replica\n",
               static_cast<unsigned long long>((*client)->stats().replica_puts.load()),
               static_cast<unsigned long long>((*client)->stats().replica_put_failures.load()),
               static_cast<unsigned long long>((*client)->stats().hints_queued.load()),
               static_cast<unsigned long long>((*client)->stats().hints_delivered.load()),
               static_cast<unsigned long long>((*client)->stats().hints_dropped.load()),
               static_cast<unsigned long long>((*client)->stats().replica_read_blocks.load()));
  if (server_load) {
    const std::vector<kvtier::bench::ServerLoad> load =
        kvtier::bench::LoadSince(load_before, kvtier::bench::ReadServerLoad((*client)->members(), copts));
    if (json) {  // stdout stays the one report object
      std::fprintf(stderr, "{\"servers\": %s}\n", kvtier::bench::ServerLoadJson(load).c_str());
    } else {
      std::fprintf(stderr, "%s", kvtier::bench::ServerLoadText(load).c_str());
    }
  }
  const kvtier::client::ClientStats& cs = (*client)->stats();
  std::fprintf(
      stderr,
      "trace_replay: over UCX: %llu blocks fetched (%llu by the get lanes), %llu stored; %llu endpoint failures\n",
      static_cast<unsigned long long>(cs.ucx_get_blocks.load()),
      static_cast<unsigned long long>(cs.ucx_lane_get_blocks.load()),
      static_cast<unsigned long long>(cs.ucx_put_blocks.load()),
      static_cast<unsigned long long>(cs.ucx_endpoint_failures.load()));
  if (json) {
    std::printf("%s\n", report->ToJson().c_str());
  } else {
    std::printf("%s", report->ToText().c_str());
  }
  return report->payload_mismatches == 0 && report->client_errors == 0 ? 0 : 1;
}
