// Per-similarity-group lookup statistics of one server (DESIGN.md §7): a bounded table of the groups with
// the most traffic, keyed by the group key clients send with lookups (kvtier/common/similarity.h).
#ifndef KVTIER_SERVER_SRC_GROUP_STATS_H_
#define KVTIER_SERVER_SRC_GROUP_STATS_H_

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace kvtier::server {

// Counters of one group, in blocks (keys asked of Lookup) and calls.
struct GroupCounters {
  uint64_t group_key = 0;
  uint64_t lookups = 0;            // Lookup calls that carried the key
  uint64_t blocks = 0;             // keys asked (the table's weight)
  uint64_t hit_blocks = 0;         // keys present and answered present
  uint64_t shadow_blocks = 0;      // keys asked in shadow namespaces (included in blocks)
  uint64_t shadow_hit_blocks = 0;  // keys present in shadow namespaces, answered absent
  uint64_t error_blocks = 0;       // space-saving error: blocks inherited from the evicted group
};

// Space-saving top-K (Metwally, Agrawal, El Abbadi 2005) weighted by blocks asked: at most `capacity`
// groups are kept; a new group arriving at a full table replaces the one with the fewest blocks and
// inherits that count as its `blocks` and `error_blocks` (its true count is within error_blocks below
// `blocks`), while its other counters start from zero. Any group with more than total / capacity blocks
// is guaranteed to be in the table. Eviction scans the table (O(capacity)), only when a new group
// arrives at a full table.
// Thread-safety: all methods may be called concurrently (one std::mutex).
class GroupStatsTable {
 public:
  static constexpr size_t kDefaultCapacity = 1024;

  explicit GroupStatsTable(size_t capacity = kDefaultCapacity) : capacity_(std::max<size_t>(capacity, 1)) {}

  // Records one Lookup of `blocks` keys of which `hit_blocks` were present. `shadow`: the namespace is in
  // shadow mode (the hits were answered absent). group_key 0 counts as a lookup without a group.
  void Record(uint64_t group_key, uint64_t blocks, uint64_t hit_blocks, bool shadow) {
    std::lock_guard<std::mutex> lock(mu_);
    if (group_key == 0) {
      ++untracked_lookups_;
      return;
    }
    auto it = groups_.find(group_key);
    if (it == groups_.end()) {
      GroupCounters fresh{.group_key = group_key};
      if (groups_.size() >= capacity_) {
        auto smallest = std::min_element(groups_.begin(), groups_.end(), [](const auto& a, const auto& b) {
          return a.second.blocks < b.second.blocks;
        });
        fresh.blocks = fresh.error_blocks = smallest->second.blocks;
        groups_.erase(smallest);
      }
      it = groups_.emplace(group_key, fresh).first;
    }
    GroupCounters& g = it->second;
    ++g.lookups;
    g.blocks += blocks;
    if (shadow) {
      g.shadow_blocks += blocks;
      g.shadow_hit_blocks += hit_blocks;
    } else {
      g.hit_blocks += hit_blocks;
    }
  }

  // The `limit` groups with the most blocks (0 = all kept), largest first; ties by key.
  std::vector<GroupCounters> Top(size_t limit) const {
    std::vector<GroupCounters> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      out.reserve(groups_.size());
      for (const auto& [key, g] : groups_) out.push_back(g);
    }
    std::sort(out.begin(), out.end(), [](const GroupCounters& a, const GroupCounters& b) {
      return a.blocks != b.blocks ? a.blocks > b.blocks : a.group_key < b.group_key;
    });
    if (limit != 0 && out.size() > limit) out.resize(limit);
    return out;
  }

  uint64_t untracked_lookups() const {
    std::lock_guard<std::mutex> lock(mu_);
    return untracked_lookups_;
  }
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, GroupCounters> groups_;  // guarded by mu_
  uint64_t untracked_lookups_ = 0;                       // guarded by mu_
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_GROUP_STATS_H_
