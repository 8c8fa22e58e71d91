// Offline replay of a trace through an eviction policy (the server's own code) or through Belady's
// per-block optimum, by the reference rules of ../shared/data/README.md:
//   - a request's hit is its count of leading blocks present before it is served; the block hit ratio
//     is the sum of hits over the sum of blocks (every hash id counts as one block);
//   - after each request its blocks are touched (present: OnAccess) or inserted (absent: evict while
//     full, then OnInsert) in order, first to last.
// With `nodes` > 1 the blocks are partitioned by a hash of their key, each node has capacity / nodes
// blocks (the remainder to the first nodes) and its own policy, and a hit is the leading run present
// on whichever node owns each block (what the client computes across owners).
// With disk_capacity_blocks > 0 each node has the server's tier structure (BlockStore): a host tier and
// a disk tier, each with its own policy instance and exclusive of each other. A block evicted from host
// is demoted to disk (the disk evicting by its own policy to make room; a block that is being promoted
// is never the disk's victim); a block of a request's leading run that is on disk is promoted back to
// host (promote_on_hit; the client fetches the leading run); a block after the leading run that is on
// disk only refreshes its recency there (the server answers the put "already present"). A demotion is
// a disk write unless keep_disk_copy kept the block's copy; disk_admit_min_requests can refuse the writes of blocks
// requested only once.
#ifndef KVTIER_BENCH_POLICY_SIM_SIMULATOR_H_
#define KVTIER_BENCH_POLICY_SIM_SIMULATOR_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "kvtier/server/eviction_policy.h"
#include "trace.h"

namespace kvtier::bench {

struct SimOptions {
  uint64_t capacity_blocks = 0;  // over all nodes; 0 = infinite (nothing is ever evicted)
  uint32_t nodes = 1;            // hash partitions, each with its own policy instance
  uint64_t block_bytes = 0;      // BlockAccess::size_bytes of every block; 0 = block_tokens x 1 KiB
  // Disk tier below the host tier (capacity_blocks), over all nodes; 0 = none. SimulatePolicy only.
  uint64_t disk_capacity_blocks = 0;
  bool promote_on_hit = true;  // a hit on a disk block moves it back to the host tier
  // Disk admission (the store's disk_admit_min_requests): a host victim is written to disk only if its
  // block has been requested at least this many times (every request that named it, on any tier, and
  // the requests its node remembers from before it was last dropped: RequestHistory, the last
  // 2 x stored-blocks drops); the others are dropped. 0 or 1 = every victim is written.
  uint32_t disk_admit_min_requests = 0;
  // Inclusive tiers (an experiment; the store's tiers are exclusive): a block promoted from disk keeps
  // its disk copy, so its next demotion writes nothing, and a copy the disk evicts drops only the copy
  // (the block stays in host memory). The copy takes disk room.
  bool keep_disk_copy = false;
};

struct SimResult {
  uint64_t hit_blocks = 0;       // sum over requests of the leading run present
  uint64_t blocks = 0;           // sum over requests of their blocks
  uint64_t evictions = 0;        // blocks evicted to make room
  uint64_t not_admitted = 0;     // absent blocks left out (Admit() said no, or Belady's rule)
  uint64_t disk_hit_blocks = 0;  // hit blocks that were on the disk tier
  uint64_t demotions = 0;        // host -> disk
  uint64_t promotions = 0;       // disk -> host
  uint64_t disk_evictions = 0;   // dropped from the disk tier
  uint64_t disk_refused = 0;     // host victims not written to disk by the admission rule
  uint64_t clean_demotions = 0;  // host victims whose disk copy was kept: no write (keep_disk_copy)
  uint64_t disk_writes() const { return demotions - clean_demotions; }
  // Blocks dropped from every tier while a child of theirs (the next block of a request that named
  // them, first such request) stayed in some tier: each leaves an unreachable tail behind.
  uint64_t orphaning_drops = 0;
  double hit_ratio() const { return blocks == 0 ? 0.0 : static_cast<double>(hit_blocks) / blocks; }
};

using PolicyFactory = std::function<absl::StatusOr<std::unique_ptr<server::EvictionPolicy>>()>;

// Replays `trace` through fresh policies from `factory` (one per node and tier; the disk tier's from
// `disk_factory` when it is given, a policy of its own below the host tier). BlockAccess carries the
// block's depth in its request, the request's namespace, `block_bytes` and the request's time.
// Handles are dense and the most recently freed one is reused first, as BlockStore does; a block keeps
// its handle when it moves between tiers. `evictions` counts host evictions (demoted or dropped).
// Errors: whatever `factory` returns; InvalidArgument when capacity_blocks < nodes, or
// disk_capacity_blocks is neither 0 nor >= nodes, or a disk tier is asked for with infinite capacity.
absl::StatusOr<SimResult> SimulatePolicy(const SimTrace& trace, const PolicyFactory& factory, const SimOptions& options,
                                         const PolicyFactory& disk_factory = nullptr);

// Belady's per-block reference: the victim is the cached block whose next use is farthest; an
// incoming block whose next use is farther than every cached block's, or that is never used again, is
// not admitted. A block's next use is the position of its next access in the trace's access sequence
// (requests concatenated, blocks first to last), so among the blocks of one future request the later
// (deeper) one is the farther. Errors: InvalidArgument when capacity_blocks < nodes.
absl::StatusOr<SimResult> SimulateBelady(const SimTrace& trace, const SimOptions& options);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_POLICY_SIM_SIMULATOR_H_
