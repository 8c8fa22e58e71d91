// Replication machinery of the client (docs/architecture.md "Replication"): the bounded queue of
// replica puts, the hinted-handoff queue, and the background thread that drains both.
#ifndef KVTIER_CLIENT_SRC_CLIENT_REPLICATION_H_
#define KVTIER_CLIENT_SRC_CLIENT_REPLICATION_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/client/client.h"
#include "kvtier/common/block_meta.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/namespace.h"

namespace kvtier::client {

// One block to store on a replica owner. The bytes are owned (copied from the caller's buffer at Put)
// and shared between the tasks of the block's replica owners.
struct ReplicaBlock {
  Fingerprint fingerprint;
  uint32_t depth = 0;                                   // index in its prompt's chain
  std::shared_ptr<const std::vector<std::byte>> bytes;  // one shard's bytes, never null
  std::shared_ptr<const BlockMeta> meta;                // its metadata as the primary got it; null: none
};

// Blocks of one namespace and shard for one replica owner, named by its node id (not a ring index:
// the ring may change before the task runs).
struct ReplicaTask {
  std::string node_id;
  Namespace ns;
  uint32_t shard = 0;
  std::vector<ReplicaBlock> blocks;

  // Sum of the blocks' sizes. A block shared with other tasks counts in each of them, so queue bounds
  // are on the bytes the tasks would send.
  uint64_t bytes() const;
};

// FIFO of ReplicaTasks bounded by bytes. Not thread-safe: the Replicator guards it with its mutex.
class ReplicaQueue {
 public:
  enum class Overflow : uint8_t {
    kRejectNew,   // a task that does not fit is refused (the replica queue: back-pressure on Put)
    kDropOldest,  // the oldest tasks are dropped until it fits (the hint queue: newest hints matter most)
  };
  ReplicaQueue(uint64_t max_bytes, Overflow overflow) : max_bytes_(max_bytes), overflow_(overflow) {}

  // Appends `task`. Returns the number of blocks lost: with kRejectNew, task's own blocks when it does
  // not fit (the queue is unchanged); with kDropOldest, the blocks of the oldest tasks dropped to make
  // room (a task larger than max_bytes on its own is itself dropped). 0 when everything fits.
  uint64_t Push(ReplicaTask task);
  // Removes and returns the oldest task; false when empty.
  bool Pop(ReplicaTask* task);
  // Removes and returns every task for `node_id`, oldest first.
  std::vector<ReplicaTask> TakeFor(const std::string& node_id);
  // The distinct node ids of the queued tasks, in the order of their oldest task.
  std::vector<std::string> NodeIds() const;

  bool empty() const { return tasks_.empty(); }
  uint64_t bytes() const { return bytes_; }
  uint64_t blocks() const { return blocks_; }
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  uint64_t max_bytes_;
  Overflow overflow_;
  std::deque<ReplicaTask> tasks_;
  uint64_t bytes_ = 0;   // sum of tasks_[i].bytes()
  uint64_t blocks_ = 0;  // sum of tasks_[i].blocks.size()
};

// Drains the replica queue on one background thread and keeps the hints of owners that are down.
// Thread-safety: Enqueue and Flush may be called concurrently from any thread; the hooks run on the
// background thread only.
class Replicator {
 public:
  struct Options {
    uint64_t queue_bytes = 256ULL << 20;  // ReplicaQueue bound (kRejectNew)
    uint64_t hint_bytes = 256ULL << 20;   // hint queue bound (kDropOldest); 0 = no hints
    absl::Duration hint_retry_interval = absl::Seconds(1);
  };
  struct Hooks {
    // Stores `task` on its owner; per-block results in task order. Errors: Unavailable (the owner is
    // not in the ring now: the blocks are hinted), any other code (the owner refused the request, e.g.
    // InvalidArgument for a block above its limits.max_block_bytes: the blocks are dropped and counted,
    // since no later attempt would be answered otherwise). An owner that fails or times out gives OK
    // with kError blocks.
    std::function<absl::StatusOr<std::vector<PutResult>>(const ReplicaTask&)> put;
    // Whether the owner named `node_id` is in the ring now (hints are tried only then).
    std::function<bool(const std::string& node_id)> in_ring;
  };

  // Starts the background thread. `stats` must outlive the Replicator; it counts replica_puts,
  // replica_put_failures and hints_*.
  Replicator(const Options& options, Hooks hooks, ClientStats& stats);
  // Stops the thread after its current put; queued replicas and hints are dropped (not counted).
  ~Replicator();

  // Queues `task` for its owner. Returns false (counting its blocks in replica_put_failures) when the
  // queue has no room for it.
  bool Enqueue(ReplicaTask task);
  // Puts `task` straight into the hint queue (its owner has just failed a put within a call: a primary
  // copy Put could not store), counted in hints_queued; delivered like any hint.
  void HintNow(ReplicaTask task);
  // Waits until the queue is empty and no task is being put (hints excluded), at most `timeout`.
  // Errors: DeadlineExceeded.
  absl::Status Flush(absl::Duration timeout);
  // Blocks in the hint queue now.
  uint64_t hinted_blocks() const;

 private:
  void Run();
  // Puts `task`; blocks refused for a reason the owner may get over (error, unreachable) are hinted.
  // Returns true when the owner answered (even with no space for some blocks). `from_hints`: count
  // delivered blocks in hints_delivered too. Called without mu_.
  bool PutOrHint(ReplicaTask task, bool from_hints);
  void Hint(ReplicaTask task);  // takes mu_
  void DeliverHints(const std::string& node_id);

  const Options options_;
  const Hooks hooks_;
  ClientStats& stats_;

  mutable std::mutex mu_;
  std::condition_variable cv_;                               // work arrived, or stopping
  std::condition_variable idle_cv_;                          // the queue drained (Flush)
  ReplicaQueue queue_;                                       // guarded by mu_
  ReplicaQueue hints_;                                       // guarded by mu_
  absl::flat_hash_map<std::string, absl::Time> down_until_;  // guarded by mu_; owners that just failed
  bool busy_ = false;                                        // guarded by mu_; a task from queue_ is being put
  bool stopping_ = false;                                    // guarded by mu_
  std::thread thread_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_REPLICATION_H_
