// The kvtierctl subcommands (docs/kvtierctl.md). Each Run* prints its report (a table, or one JSON
// object with CtlOptions::json) on stdout, notes and progress on stderr, and returns the exit code.
#ifndef KVTIER_CLI_COMMANDS_H_
#define KVTIER_CLI_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ctl_common.h"
#include "kvtier/common/namespace.h"

namespace kvtier::cli {

// status: health, node id, ring share, tiers, policy, transport, uptime, draining of each member.
int RunStatus(const CtlOptions& options);

// stats: counters of each member and the totals; with an interval, per-second rates too.
struct StatsOptions {
  absl::Duration interval = absl::ZeroDuration();  // > 0 takes two snapshots this far apart
  bool counters = false;  // also print every counter of GetStatsResponse.counters, per member and summed
};
int RunStats(const CtlOptions& options, const StatsOptions& stats);

// groups: the similarity groups with the most lookup blocks, merged across members (group keys are the
// clients' LookupRequest.group_key), with their hit ratios and shadow would-be hit ratios.
struct GroupsOptions {
  uint32_t limit = 20;  // groups shown; 0 = every group the members keep
};
int RunGroups(const CtlOptions& options, const GroupsOptions& groups);

// Which blocks ls and evict apply to; empty fields match everything.
struct FilterOptions {
  std::string tenant;
  uint64_t namespace_id = 0;  // 0 = any
  std::string tier;           // "", "host" or "disk"
  bool empty() const { return tenant.empty() && namespace_id == 0 && tier.empty(); }
};

// ls: blocks of the selected members (all by default), in pages.
struct LsOptions {
  FilterOptions filter;
  std::vector<std::string> nodes;  // node ids or addresses; empty = every member
  uint32_t limit = 100;            // blocks per page; 0 = every page
  std::string cursor;              // from the previous page's next_cursor; "" = the first page
};
int RunLs(const CtlOptions& options, const LsOptions& ls);

// inspect: the owners of one block by the ring, and what every member holding it reports.
struct InspectOptions {
  std::string fingerprint_hex;
  uint32_t shard = 0;
};
int RunInspect(const CtlOptions& options, const InspectOptions& inspect);

// lookup: how many leading blocks of a prompt the cluster holds, on which nodes and tiers.
struct LookupOptions {
  Namespace ns;                          // with tenant_salt when the tenant has one
  std::vector<uint32_t> tokens;          // the prompt (a partial last block is not looked up)
  std::optional<uint32_t> input_length;  // from a trace line: tokens the request really had
  bool per_block = false;                // tables: one row per block too
};
int RunLookup(const CtlOptions& options, const LookupOptions& lookup);

// query: each member's /query (by token ids) or /query_by_hash (by engine block hashes) answer, and the
// answers merged per node (docs/query.md): the leading run of blocks some member holds, by node and tier.
struct QueryOptions {
  Namespace ns;                           // token queries: fingerprinted as a client does
  std::vector<uint32_t> tokens;           // the prompt (a partial last block is not asked about)
  std::optional<uint32_t> input_length;   // from a trace line: cached tokens are capped at it (as lookup)
  std::vector<std::string> block_hashes;  // set: ask by engine hash (decimal integers or hex bytes)
  uint32_t block_size = 16;               // hash queries: tokens per block
  uint32_t tp_size = 1;                   // hash queries: shards per block
};
int RunQuery(const CtlOptions& options, const QueryOptions& query);

// evict: one block (on every member, or the selected ones) or the blocks matching a filter.
struct EvictOptions {
  std::string fingerprint_hex;  // set: this block only (with shard); the filter must be empty
  uint32_t shard = 0;
  FilterOptions filter;
  bool all = false;                // required with an empty filter and no fingerprint
  std::vector<std::string> nodes;  // empty = every member
};
int RunEvict(const CtlOptions& options, const EvictOptions& evict);

// drain: stop a member taking new blocks, then copy its hottest blocks to their owners on the ring
// without it. Blocks are read and written with the client library, which needs each block's full
// namespace: only blocks of the `namespaces` given are handed off; the others are counted as skipped.
struct DrainOptions {
  std::string node;                     // node id or address
  bool undo = false;                    // resume taking blocks; nothing is handed off
  uint32_t hand_off = 1000;             // at most this many blocks, by access count; 0 = none
  std::vector<Namespace> namespaces;    // whose blocks may be handed off
  uint64_t batch_bytes = 256ULL << 20;  // bytes read and written per batch (memory of kvtierctl)
};
int RunDrain(const CtlOptions& options, const DrainOptions& drain);

// verify: checksum scrub of every block of the selected members, in parallel, with progress.
struct VerifyOptions {
  std::vector<std::string> nodes;            // empty = every member
  absl::Duration deadline = absl::Hours(1);  // of each member's Verify stream
  bool progress = true;                      // on stderr: a bar on a terminal, else plain lines
};
int RunVerify(const CtlOptions& options, const VerifyOptions& verify);

}  // namespace kvtier::cli

#endif  // KVTIER_CLI_COMMANDS_H_
