// Per-server load of a replay: the blocks each cluster member was asked to look up or read, from the
// members' own counters (admin GetStats), so that hot-block read replicas can be measured.
#ifndef KVTIER_BENCH_TRACE_REPLAY_SERVER_LOAD_H_
#define KVTIER_BENCH_TRACE_REPLAY_SERVER_LOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/client/client.h"

namespace kvtier::bench {

// Counters of one member (GetStatsResponse fields), or their increase over a replay (LoadSince).
struct ServerLoad {
  std::string node_id;
  std::string address;
  bool ok = false;               // false: GetStats failed; the counts are 0
  uint64_t lookup_requests = 0;  // Lookup RPCs
  uint64_t lookup_blocks = 0;    // keys asked of Lookup (hit + miss)
  uint64_t read_blocks = 0;      // keys asked of Read (served + absent)
  uint64_t blocks() const { return lookup_blocks + read_blocks; }
};

// GetStats of every member in `members` (in order), over channels secured as `options` says (TLS, token),
// each with a 5 s deadline. A member that does not answer gives ok = false. Thread-compatible.
std::vector<ServerLoad> ReadServerLoad(const std::vector<client::MemberInfo>& members,
                                       const client::ClientOptions& options);
// after - before per member (matched by address); members missing from either are ok = false.
std::vector<ServerLoad> LoadSince(const std::vector<ServerLoad>& before, const std::vector<ServerLoad>& after);
// Largest over mean of ServerLoad::blocks() (lookup_requests when `requests`) among the ok members;
// 0 when none is ok or all are 0.
double MaxOverMean(const std::vector<ServerLoad>& load, bool requests = false);
// {"members": [{"node_id", "address", "lookup_requests", "lookup_blocks", "read_blocks", "blocks"}...],
//  "max_over_mean_blocks", "max_over_mean_lookup_requests"} (bench/README.md).
std::string ServerLoadJson(const std::vector<ServerLoad>& load);
// One line per member and one with max/mean, for the text report.
std::string ServerLoadText(const std::vector<ServerLoad>& load);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_TRACE_REPLAY_SERVER_LOAD_H_
