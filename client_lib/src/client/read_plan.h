// Read planning of the client (docs/architecture.md "A Get, step by step"): which owner each block is
// asked of at each attempt, how the blocks of one attempt are batched per owner, each attempt's
// deadline, and which blocks go on to their next owner. Pure functions over plain data: no members,
// no sockets, no clock (the caller passes `now`).
#ifndef KVTIER_CLIENT_SRC_CLIENT_READ_PLAN_H_
#define KVTIER_CLIENT_SRC_CLIENT_READ_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/hash_ring.h"
#include "kvtier/common/namespace.h"

namespace kvtier::client {

// Indices of a call's blocks grouped by the owner of each (a ring index), in block order within a
// group; a group holds at most one request's worth of blocks, and the groups of one owner are adjacent.
using OwnerGroups = std::vector<std::pair<uint32_t, std::vector<uint32_t>>>;

// Groups `indices` by owner_of(i), in order of each owner's first block, then splits each group into
// batches of at most `batch` (> 0) blocks.
OwnerGroups GroupByOwner(std::span<const uint32_t> indices, absl::FunctionRef<uint32_t(uint32_t)> owner_of,
                         size_t batch);

// Which owners a read asks for each block, in order.
struct ReadPlan {
  std::vector<std::vector<uint32_t>> owners;  // per block: ring indices; owners[i][0] is asked first
  // Per block: a miss at the first attempt goes on to the next owner (the primary) too: a hot block
  // read from one of its read replicas, which may not have it yet.
  std::vector<bool> retry_miss;

  // Most owners left to ask, this attempt's included, among blocks `idx` at `attempt` (at least 1).
  size_t OwnersLeft(std::span<const uint32_t> idx, size_t attempt) const;
};

// R for `ns`: the first matching options.replication_overrides entry, else options.replication_factor.
uint32_t ReplicationFactor(const ClientOptions& options, const Namespace& ns);

// Whether a block at prefix `depth` may become hot (a read replica candidate): hot_read_replicas > 0
// and depth < hot_depth.
bool ShallowEnough(const ClientOptions& options, uint64_t depth);

// The plan of a read of `fps` over `ring`: each block's `replication_factor` owners, the primary first
// then clockwise. A block with hot[i] set has `hot_read_replicas` more owners and is read first from
// owner number spread % (its owner count), the others following in ring order, so that successive
// calls (successive `spread` values) spread its reads over all of them. `hot` is empty or fps.size()
// long (empty: no block is hot).
ReadPlan PlanReads(const HashRing& ring, std::span<const Fingerprint> fps, uint32_t replication_factor,
                   uint32_t hot_read_replicas, const std::vector<bool>& hot, uint64_t spread);

// Blocks `pending` grouped by the owner each asks at `attempt` (plan.owners[i][attempt], which must
// exist), in batches of at most `batch`.
OwnerGroups GroupByAttempt(const ReadPlan& plan, std::span<const uint32_t> pending, size_t attempt, size_t batch);

// The deadline of a call that started at `start`: rpc_timeout later, less a reserve for assembling the
// result after the last RPC returns (2% of rpc_timeout, between 2 and 20 ms, and never more than half
// of it), so that the call itself returns within rpc_timeout even when an owner hangs until its deadline.
absl::Time CallDeadline(absl::Time start, absl::Duration rpc_timeout);

// Deadline at `now` of an RPC whose blocks have at most `owners_left` owners left to ask (its own
// included): an even share of what is left of the call's budget, so that a silent primary leaves time
// for the replicas; the last owner gets all of it.
absl::Time AttemptDeadline(absl::Time call_deadline, size_t owners_left, absl::Time now);

// After attempt `attempt` of a Get: whether block i, now `result`, is asked of its next owner: not a
// hit, and not a miss unless it is a hot block's first attempt (retry_miss). The caller also stops
// when the block has no owner left.
bool RetryGet(GetResult result, bool retry_miss, size_t attempt);

// After attempt `attempt` of a LookupPrefix: whether a block is asked of its next owner: unanswered,
// or a hot block's miss at the first attempt.
bool RetryLookup(bool answered, bool present, bool retry_miss, size_t attempt);

// A block's result after a later attempt at another owner failed (`now` kMissFromError): a miss an
// earlier owner answered (`before` kMiss) stands, since that owner answered.
GetResult AfterRetry(GetResult now, GetResult before);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_READ_PLAN_H_
