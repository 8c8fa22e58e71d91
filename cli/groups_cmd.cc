// kvtierctl groups: the similarity groups with the most lookup traffic, merged across members, with their
// hit ratios (docs/kvtierctl.md, DESIGN.md §7).
#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "commands.h"
#include "ctl_common.h"

namespace kvtier::cli {
namespace {

// One group summed over the members that report it.
struct MergedGroup {
  uint64_t group_key = 0;
  uint64_t lookups = 0;
  uint64_t blocks = 0;
  uint64_t hit_blocks = 0;
  uint64_t shadow_blocks = 0;
  uint64_t shadow_hit_blocks = 0;
  uint64_t error_blocks = 0;
  uint32_t members = 0;
  // Served keys only: the blocks asked outside shadow namespaces.
  std::optional<double> hit_ratio() const { return HitRatio(hit_blocks, blocks - shadow_blocks - hit_blocks); }
  std::optional<double> would_be_hit_ratio() const {
    return HitRatio(shadow_hit_blocks, shadow_blocks - shadow_hit_blocks);
  }
};

}  // namespace

int RunGroups(const CtlOptions& options, const GroupsOptions& groups) {
  const std::vector<Endpoint> endpoints = Connect(options.members, options);
  auto calls = CallEach<v1::ListGroupsRequest, v1::ListGroupsResponse>(
      endpoints, options.rpc_timeout,
      [](const Endpoint& ep, auto* c, auto cb) { ep.admin->async()->ListGroups(&c->ctx, &c->req, &c->resp, cb); });
  absl::flat_hash_map<uint64_t, MergedGroup> merged;
  size_t answered = 0;
  uint64_t untracked = 0;
  for (const auto& c : calls) {
    if (!c->status.ok()) continue;
    ++answered;
    untracked += c->resp.untracked_lookups();
    for (const v1::GroupStats& g : c->resp.groups()) {
      MergedGroup& m = merged[g.group_key()];
      m.group_key = g.group_key();
      m.lookups += g.lookups();
      m.blocks += g.blocks();
      m.hit_blocks += g.hit_blocks();
      m.shadow_blocks += g.shadow_blocks();
      m.shadow_hit_blocks += g.shadow_hit_blocks();
      m.error_blocks += g.error_blocks();
      ++m.members;
    }
  }
  std::vector<MergedGroup> top;
  for (const auto& [k, g] : merged) top.push_back(g);
  std::sort(top.begin(), top.end(), [](const MergedGroup& a, const MergedGroup& b) {
    return a.blocks != b.blocks ? a.blocks > b.blocks : a.group_key < b.group_key;
  });
  const size_t total_groups = top.size();
  if (groups.limit != 0 && top.size() > groups.limit) top.resize(groups.limit);

  if (options.json) {
    Json list = Json::array();
    for (const MergedGroup& g : top) {
      list.push_back({{"group_key", Hex64(g.group_key)},
                      {"lookups", g.lookups},
                      {"blocks", g.blocks},
                      {"hit_blocks", g.hit_blocks},
                      {"hit_ratio", RatioJson(g.hit_ratio())},
                      {"shadow_blocks", g.shadow_blocks},
                      {"shadow_hit_blocks", g.shadow_hit_blocks},
                      {"shadow_would_be_hit_ratio", RatioJson(g.would_be_hit_ratio())},
                      {"error_blocks", g.error_blocks},
                      {"members", g.members}});
    }
    Json members = Json::array();
    for (size_t i = 0; i < endpoints.size(); ++i) {
      const auto& c = calls[i];
      members.push_back({{"address", endpoints[i].address},
                         {"node_id", c->status.ok() ? Json(c->resp.node_id()) : Json(nullptr)},
                         {"answered", c->status.ok()},
                         {"groups_kept", c->status.ok() ? Json(c->resp.groups_size()) : Json(nullptr)},
                         {"capacity", c->status.ok() ? Json(c->resp.capacity()) : Json(nullptr)},
                         {"error", c->status.ok() ? Json(nullptr) : Json(DescribeFailure(c->status))}});
    }
    std::cout << DumpJson({{"groups", list},
                           {"groups_total", total_groups},
                           {"untracked_lookups", untracked},
                           {"members", members},
                           {"members_answered", answered},
                           {"members_total", endpoints.size()}})
              << "\n";
  } else {
    Table table({"GROUP", "LOOKUPS", "BLOCKS", "HIT BLOCKS", "HIT RATIO", "SHADOW BLOCKS", "WOULD-BE HITS",
                 "WOULD-BE RATIO", "MEMBERS"},
                {false, true, true, true, true, true, true, true, true});
    for (const MergedGroup& g : top) {
      table.AddRow({Hex64(g.group_key), absl::StrCat(g.lookups), absl::StrCat(g.blocks), absl::StrCat(g.hit_blocks),
                    RatioText(g.hit_ratio()), absl::StrCat(g.shadow_blocks), absl::StrCat(g.shadow_hit_blocks),
                    RatioText(g.would_be_hit_ratio()), absl::StrCat(g.members)});
    }
    table.Print(std::cout);
    std::cout << "\n"
              << top.size() << " of " << total_groups << " groups; " << untracked << " lookups without a group key\n";
    std::cout << "cluster: " << answered << "/" << endpoints.size() << " members answered\n";
    for (size_t i = 0; i < endpoints.size(); ++i) {
      if (!calls[i]->status.ok())
        std::cout << endpoints[i].address << ": " << DescribeFailure(calls[i]->status) << "\n";
    }
  }
  return answered == endpoints.size() ? kExitOk : kExitUnreachable;
}

}  // namespace kvtier::cli
