// Replays a request trace against a running kvtier cluster through the real client library.
#ifndef KVTIER_BENCH_TRACE_REPLAY_REPLAYER_H_
#define KVTIER_BENCH_TRACE_REPLAY_REPLAYER_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/client/client.h"
#include "kvtier/common/namespace.h"
#include "workload.h"

namespace kvtier::bench {

// The prefill cost model behind the TTFT estimate (bench/README.md). Prefilling tokens [s, e) of a prompt
// costs flops_per_token x (e - s) + attention_flops_per_token_per_position x (e^2 - s^2) / 2 FLOPs at
// peak_flops x mfu; a cache hit of h blocks also pays h x model_block_bytes / fetch_bytes_per_s plus the
// measured lookup latency. Defaults: Llama-3.1-8B (2 x 8.0e9 FLOPs per token; 4 x 32 layers x 4096
// hidden = 524,288 attention FLOPs per token and earlier position; 64 MiB of bf16 KV per 512-token
// block) on one H100 (989e12 bf16 FLOP/s at 50% MFU), fetching at 25e9 B/s (a 200 Gb/s NIC).
struct PrefillModel {
  double flops_per_token = 16.0e9;
  double attention_flops_per_token_position = 524288.0;
  double peak_flops = 989.0e12;
  double mfu = 0.5;
  double model_block_bytes = 64.0 * 1024 * 1024;
  double fetch_bytes_per_s = 25.0e9;

  // Seconds to prefill prompt positions [start, end).
  double PrefillSeconds(double start, double end) const;
};

// Latency percentiles in milliseconds.
struct LatencySummary {
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
  uint64_t count = 0;
};

// The requests [first_request, first_request + requests) of a replay, reported on their own so that a
// fault can be seen as it starts and ends (trace_replay --report_interval_requests). Times are Unix
// epoch milliseconds, so a driver can line them up with what it did to the cluster.
struct WindowReport {
  uint64_t index = 0;
  uint64_t first_request = 0;
  uint64_t requests = 0;
  uint64_t blocks = 0;
  uint64_t hit_blocks = 0;
  uint64_t lookup_prefix_blocks = 0;
  uint64_t payload_mismatches = 0;
  uint64_t checksum_failures = 0;
  uint64_t client_errors = 0;
  uint64_t misses_from_errors = 0;
  uint64_t put_errors = 0;
  int64_t start_unix_ms = 0;       // when the window's first request started
  int64_t end_unix_ms = 0;         // when its last request ended
  int64_t last_error_unix_ms = 0;  // end of the last request with a miss from error or a put error; 0: none
  LatencySummary lookup_ms;

  double block_hit_ratio() const { return blocks ? double(hit_blocks) / double(blocks) : 0; }
  // One JSON object with every field (bench/README.md).
  std::string ToJson() const;
};

struct ReplayOptions {
  uint32_t block_tokens = 512;      // tokens per hash id (Mooncake: 512)
  uint64_t block_bytes = 32 << 10;  // payload bytes per block (one shard); a multiple of 2 * block_tokens * 2
  uint64_t capacity_blocks = 0;     // cluster capacity, for the report and the reference LRU (0: none)
  double time_scale = 0;            // 0: as fast as possible; s > 0: request at timestamp / s
  std::string tenant = "demo";
  std::string model = "llama-3.1-8b-scaled";
  PrefillModel prefill;
  // Called after each request with its index (fault tests kill servers from here). May be empty.
  std::function<void(size_t)> after_request;
  // Every this many requests (and at the end, for the rest) a WindowReport is added to the report and
  // given to on_window. 0 = no windows.
  uint64_t report_interval_requests = 0;
  // Called with each window as it ends (trace_replay prints it at once). May be empty.
  std::function<void(const WindowReport&)> on_window;
};

struct ReplayReport {
  uint64_t requests = 0;
  uint64_t blocks = 0;  // hash ids over all requests
  uint64_t capacity_blocks = 0;
  uint64_t hit_blocks = 0;            // leading blocks fetched intact
  uint64_t lookup_prefix_blocks = 0;  // leading blocks the lookups reported
  uint64_t input_tokens = 0;
  uint64_t hit_tokens = 0;          // sum of min(hit blocks x block_tokens, input_length)
  uint64_t lru_sim_hit_blocks = 0;  // the reference LRU (data/README.md) at capacity_blocks
  uint64_t payload_mismatches = 0;  // fetched bytes that differ from the block's generated payload
  uint64_t checksum_failures = 0;   // blocks the client discarded because their checksum failed
  uint64_t client_errors = 0;       // client calls that returned an error status
  uint64_t misses_from_errors = 0;  // blocks turned into misses because an owner failed (client count)
  uint64_t put_errors = 0;          // blocks whose put failed because an owner failed
  uint64_t put_rejected = 0;        // blocks refused for lack of space (RESOURCE_EXHAUSTED)
  uint64_t bytes_fetched = 0;
  uint64_t bytes_stored = 0;
  double duration_s = 0;
  LatencySummary lookup_ms, get_ms, put_ms;
  std::vector<WindowReport> windows;  // options.report_interval_requests > 0 only
  double ttft_no_cache_mean_s = 0;    // PrefillModel estimates
  double ttft_cached_mean_s = 0;

  double block_hit_ratio() const { return blocks ? double(hit_blocks) / double(blocks) : 0; }
  double token_hit_ratio() const { return input_tokens ? double(hit_tokens) / double(input_tokens) : 0; }
  double lru_sim_hit_ratio() const { return blocks ? double(lru_sim_hit_blocks) / double(blocks) : 0; }
  // One JSON object with every field (documented in bench/README.md).
  std::string ToJson() const;
  // A short human report.
  std::string ToText() const;
};

// The namespace whose layout makes one block exactly options.block_bytes (bf16, 1 layer, 1 KV head,
// head_dim = block_bytes / (2 x block_tokens x 2)). Errors: InvalidArgument (not a multiple).
absl::StatusOr<Namespace> ReplayNamespace(const ReplayOptions& options);

// The deterministic token ids of the block named `hash_id` (block_tokens of them, < 128256).
void BlockTokens(uint64_t hash_id, std::span<uint32_t> out);
// The deterministic payload of the block named `hash_id`.
void BlockPayload(uint64_t hash_id, std::span<std::byte> out);

// For each request: fingerprint its blocks with ChainFingerprints, look up the longest cached prefix,
// fetch it and compare every byte with the generated payload, then put the blocks after the hit.
// Errors: InvalidArgument (options); per-request failures are counted in the report, never returned.
absl::StatusOr<ReplayReport> Replay(client::Client& client, std::span<const TraceRequest> requests,
                                    const ReplayOptions& options);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_TRACE_REPLAY_REPLAYER_H_
