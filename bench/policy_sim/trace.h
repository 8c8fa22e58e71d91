// Request traces for policy_sim, loaded into flat arrays of dense block indices so that a replay of the
// 94M block accesses of the whole kv-cache-tester set fits in memory and runs in seconds.
#ifndef KVTIER_BENCH_POLICY_SIM_TRACE_H_
#define KVTIER_BENCH_POLICY_SIM_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::bench {

// A trace as the simulator replays it. A block is one hash id (one prefix-chained key); the loaders
// number the distinct keys densely from 0 in order of first appearance.
struct SimTrace {
  std::vector<uint32_t> blocks;         // every request's blocks, first to last, requests concatenated
  std::vector<uint64_t> offsets;        // request r's blocks are blocks[offsets[r] .. offsets[r + 1])
  std::vector<int64_t> time_ns;         // per request: its time since the trace's start, ns
  std::vector<uint32_t> namespace_ids;  // per request: a small id of its namespace (model), 0 if one
  std::vector<uint64_t> block_keys;     // per dense block: a 64-bit mix of its key (for --nodes)
  uint32_t block_tokens = 0;            // tokens per block (512 Mooncake, 64 kv-cache-tester)

  size_t num_requests() const { return time_ns.size(); }
  size_t num_accesses() const { return blocks.size(); }
  size_t num_distinct_blocks() const { return block_keys.size(); }
};

// A Mooncake trace (../shared/data/README.md): JSONL with timestamp (ms) and hash_ids per line; the
// key is the hash id. At most `limit` requests (0 = all), in file order.
// Errors: NotFound (file), InvalidArgument (line number and what is wrong).
absl::StatusOr<SimTrace> LoadMooncakeSimTrace(const std::string& path, size_t limit = 0);

// A kv-cache-tester trace directory: one JSON object per session (`*.json`, taken in file-name order;
// the first `sessions` of them, 0 = all). Replayed as ../shared/data/README.md says: the key is
// (session index, hash id); sub-agent requests are flattened in place at the sub-agent's t plus their
// own t; session k starts at k x 60 s; requests are merged by time, ties to the lower session index,
// then to file order. The namespace is the request's "model".
// Errors: NotFound (directory or no *.json in it), InvalidArgument (file and what is wrong).
// `session_spacing_s` replaces the 60 s between session starts (for sensitivity studies only; the
// reference figures use 60).
absl::StatusOr<SimTrace> LoadKvCacheTesterSimTrace(const std::string& dir, size_t sessions = 0,
                                                   double session_spacing_s = 60);

// Loads `path` as kv-cache-tester when it is a directory, else as Mooncake JSONL. `sessions` caps the
// sessions of a kv-cache-tester directory, then `limit` the requests replayed (0 = all, for both).
absl::StatusOr<SimTrace> LoadSimTrace(const std::string& path, size_t limit = 0, size_t sessions = 0,
                                      double session_spacing_s = 60);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_POLICY_SIM_TRACE_H_
