// trace_replay: replays a Mooncake-format trace (or the built-in workload) against a kvtier cluster.
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "replayer.h"
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
ABSL_FLAG(std::string, transport, "auto",
          "block bytes over: auto (UCX where a member offers it, else gRPC), grpc, or ucx (UCX only)");

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
  auto report = kvtier::bench::Replay(**client, requests, ropts);
  if (!report.ok()) {
    std::fprintf(stderr, "trace_replay: %s\n", std::string(report.status().message()).c_str());
    return 2;
  }
  const kvtier::client::ClientStats& cs = (*client)->stats();
  std::fprintf(stderr, "trace_replay: over UCX: %llu blocks fetched, %llu stored; %llu endpoint failures\n",
               static_cast<unsigned long long>(cs.ucx_get_blocks.load()),
               static_cast<unsigned long long>(cs.ucx_put_blocks.load()),
               static_cast<unsigned long long>(cs.ucx_endpoint_failures.load()));
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", report->ToJson().c_str());
  } else {
    std::printf("%s", report->ToText().c_str());
  }
  return report->payload_mismatches == 0 && report->client_errors == 0 ? 0 : 1;
}
