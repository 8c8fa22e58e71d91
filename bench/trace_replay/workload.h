// Request traces for trace_replay: Mooncake-format JSONL files and a built-in synthetic workload.
#ifndef KVTIER_BENCH_TRACE_REPLAY_WORKLOAD_H_
#define KVTIER_BENCH_TRACE_REPLAY_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::bench {

// One request of a trace. `hash_ids` are prefix-chained block ids: an id names the whole prefix up to
// and including its block, so two requests share KV exactly for their common leading ids.
struct TraceRequest {
  int64_t timestamp_ms = 0;        // since the trace's start
  uint32_t input_length = 0;       // prompt tokens
  uint32_t output_length = 0;      // generated tokens
  std::vector<uint64_t> hash_ids;  // one per block of `block_tokens` (the last may be partial)
};

// Parses a Mooncake trace (../shared/data/README.md): one JSON object per line with timestamp,
// input_length, output_length and hash_ids. Blank lines are skipped. At most `limit` requests (0 = all).
// Errors: NotFound (file), InvalidArgument (line number and what is wrong).
absl::StatusOr<std::vector<TraceRequest>> LoadMooncakeTrace(const std::string& path, size_t limit = 0);

// The built-in workload when no trace is given: a chat service with a few shared system prompts and
// many multi-turn sessions. Each turn's prompt is its system prompt, the session's history (earlier
// turns and answers) and a new user message, so later turns reuse earlier turns' blocks; sessions are
// interleaved in time. Deterministic for a given seed.
struct SyntheticOptions {
  uint32_t system_prompts = 6;  // distinct shared system prompts
  uint32_t sessions = 240;      // conversations
  uint32_t max_turns = 8;       // turns per session: uniform in [1, max_turns]
  uint32_t block_tokens = 512;  // tokens per hash id
  uint64_t seed = 42;
};
std::vector<TraceRequest> SyntheticWorkload(const SyntheticOptions& options);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_TRACE_REPLAY_WORKLOAD_H_
