#include "simulator.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtier/server/request_history.h"

namespace kvtier::bench {
namespace {

constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

absl::Status CheckOptions(const SimOptions& options) {
  if (options.nodes == 0) return absl::InvalidArgumentError("nodes must be >= 1");
  if (options.capacity_blocks != 0 && options.capacity_blocks < options.nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity of ", options.capacity_blocks, " blocks is fewer than ", options.nodes, " nodes"));
  }
  return absl::OkStatus();
}

uint64_t NodeCapacity(const SimOptions& options, uint32_t node) {
  if (options.capacity_blocks == 0) return kNever;
  return options.capacity_blocks / options.nodes + (node < options.capacity_blocks % options.nodes ? 1 : 0);
}

uint32_t NodeOf(const SimTrace& trace, uint32_t block, uint32_t nodes) {
  return nodes == 1 ? 0 : static_cast<uint32_t>(trace.block_keys[block] % nodes);
}

// The leading run of request r's blocks for which `present` holds.
template <typename Present>
uint64_t LeadingRun(const SimTrace& trace, size_t r, Present present) {
  uint64_t hit = 0;
  for (uint64_t p = trace.offsets[r]; p < trace.offsets[r + 1] && present(trace.blocks[p]); ++p) ++hit;
  return hit;
}

}  // namespace

absl::StatusOr<SimResult> SimulatePolicy(const SimTrace& trace, const PolicyFactory& factory, const SimOptions& options,
                                         const PolicyFactory& disk_factory) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  const bool tiered = options.disk_capacity_blocks != 0;
  if (tiered && (options.capacity_blocks == 0 || options.disk_capacity_blocks < options.nodes)) {
    return absl::InvalidArgumentError(absl::StrCat("a disk tier of ", options.disk_capacity_blocks,
                                                   " blocks needs a finite host capacity and at least ", options.nodes,
                                                   " blocks"));
  }
  enum : uint8_t { kAbsent = 0, kHost = 1, kDisk = 2 };
  struct Node {
    std::unique_ptr<server::EvictionPolicy> policy;       // host tier
    std::unique_ptr<server::EvictionPolicy> disk_policy;  // disk tier (tiered only)
    uint64_t capacity = 0;
    uint64_t disk_capacity = 0;
    uint64_t used = 0;
    uint64_t disk_used = 0;
    std::vector<uint32_t> block_of;      // handle -> dense block
    std::vector<uint32_t> depth_of;      // handle -> depth at insert (BlockStore keeps the writer's)
    std::vector<uint64_t> namespace_of;  // handle -> namespace id
    std::vector<uint32_t> free_handles;  // LIFO, as BlockStore reuses them
    server::RequestHistory history;      // disk admission: requests of dropped blocks
  };
  std::vector<Node> nodes(options.nodes);
  for (uint32_t n = 0; n < options.nodes; ++n) {
    auto policy = factory();
    if (!policy.ok()) return policy.status();
    nodes[n].policy = std::move(policy).value();
    nodes[n].capacity = NodeCapacity(options, n);
    if (tiered) {
      auto disk_policy = disk_factory ? disk_factory() : factory();
      if (!disk_policy.ok()) return disk_policy.status();
      nodes[n].disk_policy = std::move(disk_policy).value();
      nodes[n].disk_capacity =
          options.disk_capacity_blocks / options.nodes + (n < options.disk_capacity_blocks % options.nodes ? 1 : 0);
    }
  }
  const uint64_t block_bytes = options.block_bytes != 0 ? options.block_bytes : uint64_t{trace.block_tokens} * 1024;
  std::vector<uint32_t> handle_of(trace.num_distinct_blocks(), kNil);
  std::vector<uint8_t> tier_of(trace.num_distinct_blocks(), kAbsent);
  // By block: on the host tier with its disk copy kept (keep_disk_copy), which the disk policy still holds.
  std::vector<uint8_t> has_copy(trace.num_distinct_blocks(), 0);
  // The chain: each block's parent (the block before it in the first request that named it, kNil at
  // depth 0) and how many of its children are in some tier.
  std::vector<uint32_t> parent_of(trace.num_distinct_blocks(), kNil);
  {
    std::vector<bool> seen(trace.num_distinct_blocks(), false);
    for (size_t r = 0; r < trace.num_requests(); ++r) {
      for (uint64_t p = trace.offsets[r]; p < trace.offsets[r + 1]; ++p) {
        const uint32_t b = trace.blocks[p];
        if (seen[b]) continue;
        seen[b] = true;
        if (p > trace.offsets[r]) parent_of[b] = trace.blocks[p - 1];
      }
    }
  }
  std::vector<uint32_t> present_children(trace.num_distinct_blocks(), 0);
  // By block: requests that named it while stored, plus what its node remembered of it when it was
  // stored again (disk admission only; the store's access_count plus earlier_requests).
  std::vector<uint32_t> requests_of;
  if (options.disk_admit_min_requests > 1) requests_of.assign(trace.num_distinct_blocks(), 0);
  SimResult result;
  const auto always = [](server::EntryHandle) { return true; };

  auto drop = [&](Node& node, uint32_t h) {
    const uint32_t b = node.block_of[h];
    if (has_copy[b] != 0) {
      node.disk_policy->OnErase(h);
      --node.disk_used;
      has_copy[b] = 0;
    }
    if (!requests_of.empty()) {  // as BlockStore::DropLocked: its requests are remembered for a later put
      node.history.Remember(trace.block_keys[b], requests_of[b], 2 * (node.used + node.disk_used));
      requests_of[b] = 0;
    }
    if (present_children[b] > 0) ++result.orphaning_drops;
    if (parent_of[b] != kNil) --present_children[parent_of[b]];
    handle_of[b] = kNil;
    tier_of[b] = kAbsent;
    node.free_handles.push_back(h);
  };
  // Makes room for one block on the host tier: the victim is demoted to disk (which drops its own
  // victims, never `keep`) or dropped. False when the policy names no victim.
  auto make_host_room = [&](Node& node, const server::BlockAccess& access, uint32_t keep) {
    while (node.used >= node.capacity) {
      const std::optional<server::EntryHandle> victim = node.policy->PickVictim(always);
      if (!victim.has_value()) return false;
      node.policy->OnErase(*victim);
      --node.used;
      ++result.evictions;
      if (!tiered) {
        drop(node, *victim);
        continue;
      }
      // As BlockStore::AccessOf: the block's own depth and namespace, the time of the demotion.
      server::BlockAccess demoted = access;
      demoted.depth = node.depth_of[*victim];
      demoted.namespace_id = node.namespace_of[*victim];
      demoted.key_hash = trace.block_keys[node.block_of[*victim]];
      if (has_copy[node.block_of[*victim]] != 0) {  // its copy is on disk already: no write
        has_copy[node.block_of[*victim]] = 0;
        tier_of[node.block_of[*victim]] = kDisk;
        node.disk_policy->OnErase(*victim);
        node.disk_policy->OnInsert(*victim, demoted);
        ++result.demotions;
        ++result.clean_demotions;
        continue;
      }
      if (!requests_of.empty() && requests_of[node.block_of[*victim]] < options.disk_admit_min_requests) {
        ++result.disk_refused;
        drop(node, *victim);
        continue;
      }
      while (node.disk_used >= node.disk_capacity) {
        const std::optional<server::EntryHandle> disk_victim =
            node.disk_policy->PickVictim([&](server::EntryHandle h) { return h != keep; });
        if (!disk_victim.has_value()) break;
        ++result.disk_evictions;
        if (has_copy[node.block_of[*disk_victim]] != 0) {  // a copy of a host block: only the copy goes
          node.disk_policy->OnErase(*disk_victim);
          has_copy[node.block_of[*disk_victim]] = 0;
          --node.disk_used;
          continue;
        }
        node.disk_policy->OnErase(*disk_victim);
        drop(node, *disk_victim);
        --node.disk_used;
      }
      if (node.disk_used >= node.disk_capacity) {
        drop(node, *victim);
        continue;
      }
      tier_of[node.block_of[*victim]] = kDisk;
      ++node.disk_used;
      ++result.demotions;
      node.disk_policy->OnInsert(*victim, demoted);
    }
    return true;
  };

  for (size_t r = 0; r < trace.num_requests(); ++r) {
    const uint64_t hit = LeadingRun(trace, r, [&](uint32_t b) { return handle_of[b] != kNil; });
    result.hit_blocks += hit;
    result.blocks += trace.offsets[r + 1] - trace.offsets[r];
    server::BlockAccess access{
        .depth = 0, .namespace_id = trace.namespace_ids[r], .size_bytes = block_bytes, .now_ns = trace.time_ns[r]};
    for (uint64_t p = trace.offsets[r]; p < trace.offsets[r + 1]; ++p) {
      const uint32_t b = trace.blocks[p];
      Node& node = nodes[NodeOf(trace, b, options.nodes)];
      access.key_hash = trace.block_keys[b];
      access.depth = static_cast<uint32_t>(p - trace.offsets[r]);
      access.namespace_id = trace.namespace_ids[r];
      const bool in_leading_run = p - trace.offsets[r] < hit;
      if (!requests_of.empty()) ++requests_of[b];
      if (tier_of[b] != kAbsent) {  // as BlockStore::AccessOf: the depth and namespace of its insert
        access.depth = node.depth_of[handle_of[b]];
        access.namespace_id = node.namespace_of[handle_of[b]];
      }
      if (tier_of[b] == kHost) {
        node.policy->OnAccess(handle_of[b], access);
        continue;
      }
      if (tier_of[b] == kDisk) {
        if (in_leading_run) ++result.disk_hit_blocks;
        if (!in_leading_run || !options.promote_on_hit || !make_host_room(node, access, handle_of[b])) {
          node.disk_policy->OnAccess(handle_of[b], access);
          continue;
        }
        // Promotion: the block leaves the disk (or keeps its copy there) as it enters host memory, then
        // counts the access.
        if (options.keep_disk_copy) {
          has_copy[b] = 1;
        } else {
          node.disk_policy->OnErase(handle_of[b]);
          --node.disk_used;
        }
        tier_of[b] = kHost;
        ++node.used;
        ++result.promotions;
        node.policy->OnInsert(handle_of[b], access);
        node.policy->OnAccess(handle_of[b], access);
        continue;
      }
      if (!make_host_room(node, access, kNil)) {  // cannot happen here (every block is eligible)
        ++result.not_admitted;
        continue;
      }
      uint32_t h;
      if (node.free_handles.empty()) {
        h = static_cast<uint32_t>(node.block_of.size());
        node.block_of.push_back(b);
        node.depth_of.push_back(0);
        node.namespace_of.push_back(0);
      } else {
        h = node.free_handles.back();
        node.free_handles.pop_back();
        node.block_of[h] = b;
      }
      node.depth_of[h] = access.depth;
      node.namespace_of[h] = access.namespace_id;
      handle_of[b] = h;
      tier_of[b] = kHost;
      if (!requests_of.empty()) requests_of[b] += node.history.Take(trace.block_keys[b]);
      if (parent_of[b] != kNil) ++present_children[parent_of[b]];
      ++node.used;
      node.policy->OnInsert(h, access);
    }
  }
  return result;
}

absl::StatusOr<SimResult> SimulateBelady(const SimTrace& trace, const SimOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  // next_use[p]: the position of the next access of blocks[p] after p, kNever if none.
  std::vector<uint64_t> next_use(trace.num_accesses());
  {
    std::vector<uint64_t> seen(trace.num_distinct_blocks(), kNever);
    for (uint64_t p = trace.num_accesses(); p-- > 0;) {
      next_use[p] = seen[trace.blocks[p]];
      seen[trace.blocks[p]] = p;
    }
  }
  struct Node {
    uint64_t capacity = 0;
    std::vector<uint32_t> cached;                                // the cached blocks, in any order
    std::priority_queue<std::pair<uint64_t, uint32_t>> by_next;  // (next use, block); lazy: stale entries
  };
  std::vector<Node> nodes(options.nodes);
  for (uint32_t n = 0; n < options.nodes; ++n) nodes[n].capacity = NodeCapacity(options, n);
  std::vector<uint64_t> current_next(trace.num_distinct_blocks(), 0);  // valid while cached
  std::vector<uint32_t> slot_of(trace.num_distinct_blocks(), kNil);    // index in Node::cached, kNil = absent
  SimResult result;
  auto erase = [&](Node& node, uint32_t b) {
    const uint32_t last = node.cached.back();
    node.cached[slot_of[b]] = last;
    slot_of[last] = slot_of[b];
    node.cached.pop_back();
    slot_of[b] = kNil;
  };
  for (size_t r = 0; r < trace.num_requests(); ++r) {
    result.hit_blocks += LeadingRun(trace, r, [&](uint32_t b) { return slot_of[b] != kNil; });
    result.blocks += trace.offsets[r + 1] - trace.offsets[r];
    for (uint64_t p = trace.offsets[r]; p < trace.offsets[r + 1]; ++p) {
      const uint32_t b = trace.blocks[p];
      const uint64_t next = next_use[p];
      Node& node = nodes[NodeOf(trace, b, options.nodes)];
      if (slot_of[b] != kNil) {
        current_next[b] = next;
        node.by_next.emplace(next, b);
      } else {
        if (next == kNever) {
          ++result.not_admitted;
          continue;
        }
        if (node.cached.size() >= node.capacity) {
          // Drop stale heap entries: blocks gone, or re-keyed since the entry was pushed.
          while (slot_of[node.by_next.top().second] == kNil ||
                 current_next[node.by_next.top().second] != node.by_next.top().first) {
            node.by_next.pop();
          }
          const auto [farthest, victim] = node.by_next.top();
          if (farthest <= next) {  // positions are distinct, so only kNever could tie, and it is excluded
            ++result.not_admitted;
            continue;
          }
          node.by_next.pop();
          erase(node, victim);
          ++result.evictions;
        }
        slot_of[b] = static_cast<uint32_t>(node.cached.size());
        node.cached.push_back(b);
        current_next[b] = next;
        node.by_next.emplace(next, b);
      }
      // Keep the lazy heap within a constant factor of the cache: rebuild it from the live entries.
      if (node.by_next.size() > 4 * node.cached.size() + 4096) {
        std::vector<std::pair<uint64_t, uint32_t>> live;
        live.reserve(node.cached.size());
        for (uint32_t c : node.cached) live.emplace_back(current_next[c], c);
        node.by_next = std::priority_queue<std::pair<uint64_t, uint32_t>>({}, std::move(live));
      }
    }
  }
  return result;
}

}  // namespace kvtier::bench
