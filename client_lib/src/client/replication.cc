#include "client/replication.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kvtier/common/log.h"

namespace kvtier::client {

uint64_t ReplicaTask::bytes() const {
  uint64_t n = 0;
  for (const ReplicaBlock& b : blocks) n += b.bytes->size();
  return n;
}

uint64_t ReplicaQueue::Push(ReplicaTask task) {
  const uint64_t task_bytes = task.bytes();
  const uint64_t task_blocks = task.blocks.size();
  if (bytes_ + task_bytes <= max_bytes_) {
    bytes_ += task_bytes;
    blocks_ += task_blocks;
    tasks_.push_back(std::move(task));
    return 0;
  }
  if (overflow_ == Overflow::kRejectNew || task_bytes > max_bytes_) return task_blocks;
  uint64_t lost = 0;
  while (bytes_ + task_bytes > max_bytes_) {  // tasks_ is not empty: task_bytes <= max_bytes_
    const ReplicaTask& oldest = tasks_.front();
    bytes_ -= oldest.bytes();
    blocks_ -= oldest.blocks.size();
    lost += oldest.blocks.size();
    tasks_.pop_front();
  }
  bytes_ += task_bytes;
  blocks_ += task_blocks;
  tasks_.push_back(std::move(task));
  return lost;
}

bool ReplicaQueue::Pop(ReplicaTask* task) {
  if (tasks_.empty()) return false;
  *task = std::move(tasks_.front());
  tasks_.pop_front();
  bytes_ -= task->bytes();
  blocks_ -= task->blocks.size();
  return true;
}

std::vector<ReplicaTask> ReplicaQueue::TakeFor(const std::string& node_id) {
  std::vector<ReplicaTask> out;
  std::deque<ReplicaTask> rest;
  for (ReplicaTask& t : tasks_) {
    if (t.node_id == node_id) {
      bytes_ -= t.bytes();
      blocks_ -= t.blocks.size();
      out.push_back(std::move(t));
    } else {
      rest.push_back(std::move(t));
    }
  }
  tasks_ = std::move(rest);
  return out;
}

std::vector<std::string> ReplicaQueue::NodeIds() const {
  std::vector<std::string> ids;
  absl::flat_hash_set<std::string> seen;
  for (const ReplicaTask& t : tasks_) {
    if (seen.insert(t.node_id).second) ids.push_back(t.node_id);
  }
  return ids;
}

Replicator::Replicator(const Options& options, Hooks hooks, ClientStats& stats)
    : options_(options),
      hooks_(std::move(hooks)),
      stats_(stats),
      queue_(options.queue_bytes, ReplicaQueue::Overflow::kRejectNew),
      hints_(options.hint_bytes, ReplicaQueue::Overflow::kDropOldest) {
  thread_ = std::thread([this] { Run(); });
}

Replicator::~Replicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool Replicator::Enqueue(ReplicaTask task) {
  const uint64_t n = task.blocks.size();
  if (n == 0) return true;
  uint64_t lost;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lost = queue_.Push(std::move(task));
  }
  if (lost != 0) {
    stats_.replica_put_failures.fetch_add(lost, std::memory_order_relaxed);
    return false;
  }
  cv_.notify_one();
  return true;
}

absl::Status Replicator::Flush(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!idle_cv_.wait_until(lock, absl::ToChronoTime(absl::Now() + timeout),
                           [this] { return queue_.empty() && !busy_; })) {
    return absl::DeadlineExceededError(
        absl::StrCat(queue_.blocks(), " replica blocks still queued after ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

uint64_t Replicator::hinted_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hints_.blocks();
}

void Replicator::HintNow(ReplicaTask task) {
  if (options_.hint_bytes == 0 || task.blocks.empty()) return;
  stats_.hints_queued.fetch_add(task.blocks.size(), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    down_until_[task.node_id] = absl::Now() + options_.hint_retry_interval;
  }
  Hint(std::move(task));
}

void Replicator::Hint(ReplicaTask task) {
  if (options_.hint_bytes == 0 || task.blocks.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.hints_dropped.fetch_add(hints_.Push(std::move(task)), std::memory_order_relaxed);
}

bool Replicator::PutOrHint(ReplicaTask task, bool from_hints) {
  const uint64_t n = task.blocks.size();
  auto mark_down = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    down_until_[task.node_id] = absl::Now() + options_.hint_retry_interval;
  };
  absl::StatusOr<std::vector<PutResult>> results = hooks_.put(task);
  if (!results.ok() && results.status().code() != absl::StatusCode::kUnavailable) {
    // The owner refused the request itself: no hint would be taken either.
    if (!from_hints) stats_.replica_put_failures.fetch_add(n, std::memory_order_relaxed);
    KVTIER_LOG_EVERY(std::chrono::seconds(10), warn, "kvtier: replica put to {} refused: {}", task.node_id,
                     results.status().ToString());
    return true;  // it answered
  }
  if (!results.ok() || results->size() != n) {  // the owner is not in the ring
    if (!from_hints) {
      stats_.replica_put_failures.fetch_add(n, std::memory_order_relaxed);
      if (options_.hint_bytes != 0) stats_.hints_queued.fetch_add(n, std::memory_order_relaxed);
    }
    mark_down();
    Hint(std::move(task));
    return false;
  }
  ReplicaTask retry{.node_id = task.node_id, .ns = task.ns, .shard = task.shard, .blocks = {}};
  uint64_t stored = 0, refused = 0, failed = 0;
  for (size_t k = 0; k < n; ++k) {
    switch ((*results)[k]) {
      case PutResult::kStored:
      case PutResult::kAlreadyPresent:
        ++stored;
        break;
      case PutResult::kNoSpace:
        ++refused;
        break;  // the owner answered: nothing to hand off later
      case PutResult::kError:
        ++failed;
        retry.blocks.push_back(std::move(task.blocks[k]));
        break;
      case PutResult::kInProgress:
        // Reserved there and not committed: another writer's put, or a reservation left by one of this
        // client's puts that timed out (a stopped owner runs it when it resumes, and it lasts until the
        // owner's reservation_ttl). Ask again later rather than count a copy that may never come.
        retry.blocks.push_back(std::move(task.blocks[k]));
        break;
    }
  }
  stats_.replica_puts.fetch_add(stored, std::memory_order_relaxed);
  if (from_hints) {
    stats_.hints_delivered.fetch_add(stored, std::memory_order_relaxed);
    stats_.replica_put_failures.fetch_add(refused, std::memory_order_relaxed);
  } else {
    stats_.replica_put_failures.fetch_add(refused + failed, std::memory_order_relaxed);
    if (options_.hint_bytes != 0) stats_.hints_queued.fetch_add(retry.blocks.size(), std::memory_order_relaxed);
  }
  const bool answered = failed < n;
  if (failed != 0) mark_down();
  if (!retry.blocks.empty()) Hint(std::move(retry));
  return answered;
}

void Replicator::DeliverHints(const std::string& node_id) {
  std::vector<ReplicaTask> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks = hints_.TakeFor(node_id);
  }
  for (size_t t = 0; t < tasks.size(); ++t) {
    bool stop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop = stopping_;
    }
    if (stop || !PutOrHint(std::move(tasks[t]), /*from_hints=*/true)) {
      // Still down (or stopping): the rest wait for the next round, as they were.
      for (size_t rest = t + 1; rest < tasks.size(); ++rest) Hint(std::move(tasks[rest]));
      return;
    }
  }
}

void Replicator::Run() {
  absl::Time next_hints = absl::Now() + options_.hint_retry_interval;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    if (now >= next_hints) {
      // Hints first, so that a busy queue cannot starve them.
      std::vector<std::string> nodes = hints_.NodeIds();
      std::erase_if(nodes, [&](const std::string& id) {
        auto it = down_until_.find(id);
        return it != down_until_.end() && it->second > now;
      });
      lock.unlock();
      for (const std::string& id : nodes) {
        if (hooks_.in_ring(id)) DeliverHints(id);
      }
      lock.lock();
      next_hints = absl::Now() + options_.hint_retry_interval;
      continue;
    }
    ReplicaTask task;
    if (queue_.Pop(&task)) {
      busy_ = true;
      auto it = down_until_.find(task.node_id);
      const bool down = it != down_until_.end() && it->second > now;
      const bool has_hints = !hints_.empty();
      lock.unlock();
      const std::string node_id = task.node_id;
      if (down) {  // failed moments ago: hint without waiting for another timeout
        const uint64_t n = task.blocks.size();
        stats_.replica_put_failures.fetch_add(n, std::memory_order_relaxed);
        if (options_.hint_bytes != 0) stats_.hints_queued.fetch_add(n, std::memory_order_relaxed);
        Hint(std::move(task));
      } else if (PutOrHint(std::move(task), /*from_hints=*/false) && has_hints) {
        DeliverHints(node_id);  // the owner answers again: hand its hints over now
      }
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
      continue;
    }
    cv_.wait_until(lock, absl::ToChronoTime(next_hints), [this] { return stopping_ || !queue_.empty(); });
  }
  busy_ = false;
  idle_cv_.notify_all();
}

}  // namespace kvtier::client
