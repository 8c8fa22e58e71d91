#include "simulator.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

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

absl::StatusOr<SimResult> SimulatePolicy(const SimTrace& trace, const PolicyFactory& factory,
                                         const SimOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  struct Node {
    std::unique_ptr<server::EvictionPolicy> policy;
    uint64_t capacity = 0;
    uint64_t used = 0;
    std::vector<uint32_t> block_of;      // handle -> dense block
    std::vector<uint32_t> free_handles;  // LIFO, as BlockStore reuses them
  };
  std::vector<Node> nodes(options.nodes);
  for (uint32_t n = 0; n < options.nodes; ++n) {
    auto policy = factory();
    if (!policy.ok()) return policy.status();
    nodes[n].policy = std::move(policy).value();
    nodes[n].capacity = NodeCapacity(options, n);
  }
  const uint64_t block_bytes = options.block_bytes != 0 ? options.block_bytes : uint64_t{trace.block_tokens} * 1024;
  std::vector<uint32_t> handle_of(trace.num_distinct_blocks(), kNil);
  SimResult result;
  const auto always = [](server::EntryHandle) { return true; };
  for (size_t r = 0; r < trace.num_requests(); ++r) {
    result.hit_blocks += LeadingRun(trace, r, [&](uint32_t b) { return handle_of[b] != kNil; });
    result.blocks += trace.offsets[r + 1] - trace.offsets[r];
    server::BlockAccess access{.depth = 0,
                               .namespace_id = trace.namespace_ids[r],
                               .size_bytes = block_bytes,
                               .now_ns = trace.time_ns[r]};
    for (uint64_t p = trace.offsets[r]; p < trace.offsets[r + 1]; ++p, ++access.depth) {
      const uint32_t b = trace.blocks[p];
      Node& node = nodes[NodeOf(trace, b, options.nodes)];
      access.key_hash = trace.block_keys[b];
      if (handle_of[b] != kNil) {
        node.policy->OnAccess(handle_of[b], access);
        continue;
      }
      if (node.used >= node.capacity) {
        const std::optional<server::EntryHandle> victim = node.policy->PickVictim(always);
        if (!victim.has_value()) {  // cannot happen here (every block is eligible); counted if it does
          ++result.not_admitted;
          continue;
        }
        node.policy->OnErase(*victim);
        handle_of[node.block_of[*victim]] = kNil;
        node.free_handles.push_back(*victim);
        --node.used;
        ++result.evictions;
      }
      uint32_t h;
      if (node.free_handles.empty()) {
        h = static_cast<uint32_t>(node.block_of.size());
        node.block_of.push_back(b);
      } else {
        h = node.free_handles.back();
        node.free_handles.pop_back();
        node.block_of[h] = b;
      }
      handle_of[b] = h;
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
    std::vector<uint32_t> cached;                           // the cached blocks, in any order
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
