#include "client/read_plan.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace kvtier::client {

OwnerGroups GroupByOwner(std::span<const uint32_t> indices, absl::FunctionRef<uint32_t(uint32_t)> owner_of,
                         size_t batch) {
  absl::flat_hash_map<uint32_t, size_t> slot;
  OwnerGroups groups;
  for (uint32_t i : indices) {
    const uint32_t m = owner_of(i);
    auto [it, inserted] = slot.try_emplace(m, groups.size());
    if (inserted) groups.push_back({m, {}});
    groups[it->second].second.push_back(i);
  }
  // Split batches above the per-request limit.
  OwnerGroups out;
  for (auto& [m, idx] : groups) {
    for (size_t off = 0; off < idx.size(); off += batch) {
      const size_t end = std::min(idx.size(), off + batch);
      out.push_back({m, std::vector<uint32_t>(idx.begin() + off, idx.begin() + end)});
    }
  }
  return out;
}

size_t ReadPlan::OwnersLeft(std::span<const uint32_t> idx, size_t attempt) const {
  size_t left = 1;
  for (uint32_t i : idx) left = std::max(left, owners[i].size() - attempt);
  return left;
}

uint32_t ReplicationFactor(const ClientOptions& options, const Namespace& ns) {
  for (const ClientOptions::ReplicationOverride& o : options.replication_overrides) {
    if (o.tenant == ns.tenant && (o.model.empty() || o.model == ns.model)) return o.replication_factor;
  }
  return options.replication_factor;
}

bool ShallowEnough(const ClientOptions& options, uint64_t depth) {
  return options.hot_read_replicas > 0 && depth < options.hot_depth;
}

ReadPlan PlanReads(const HashRing& ring, std::span<const Fingerprint> fps, uint32_t replication_factor,
                   uint32_t hot_read_replicas, const std::vector<bool>& hot, uint64_t spread) {
  ReadPlan plan;
  plan.owners.resize(fps.size());
  plan.retry_miss.resize(fps.size());
  for (size_t i = 0; i < fps.size(); ++i) {
    const bool is_hot = !hot.empty() && hot[i];
    std::vector<uint32_t>& o = plan.owners[i];
    o = ring.Owners(fps[i], replication_factor + (is_hot ? hot_read_replicas : 0));
    const size_t pick = is_hot ? spread % o.size() : 0;
    if (pick != 0) {
      std::rotate(o.begin(), o.begin() + static_cast<ptrdiff_t>(pick), o.begin() + static_cast<ptrdiff_t>(pick) + 1);
      plan.retry_miss[i] = true;
    }
  }
  return plan;
}

OwnerGroups GroupByAttempt(const ReadPlan& plan, std::span<const uint32_t> pending, size_t attempt, size_t batch) {
  return GroupByOwner(
      pending, [&](uint32_t i) { return plan.owners[i][attempt]; }, batch);
}

absl::Time CallDeadline(absl::Time start, absl::Duration rpc_timeout) {
  const absl::Duration reserve = std::clamp(rpc_timeout / 50, absl::Milliseconds(2), absl::Milliseconds(20));
  return start + std::max(rpc_timeout - reserve, rpc_timeout / 2);
}

absl::Time AttemptDeadline(absl::Time call_deadline, size_t owners_left, absl::Time now) {
  if (owners_left <= 1 || call_deadline <= now) return call_deadline;
  return now + (call_deadline - now) / static_cast<int64_t>(owners_left);
}

bool RetryGet(GetResult result, bool retry_miss, size_t attempt) {
  return result != GetResult::kHit && (result != GetResult::kMiss || (retry_miss && attempt == 0));
}

bool RetryLookup(bool answered, bool present, bool retry_miss, size_t attempt) {
  return !answered || (!present && retry_miss && attempt == 0);
}

GetResult AfterRetry(GetResult now, GetResult before) {
  return now == GetResult::kMissFromError && before == GetResult::kMiss ? GetResult::kMiss : now;
}

}  // namespace kvtier::client
