// kvtierctl lookup: how much of a prompt the cluster holds, on which nodes and tiers (docs/kvtierctl.md).
// Fingerprints the prompt as a client does (ChainFingerprints), places each block with the ring a client
// with these members builds, and asks each block's owner with InspectBlock, which neither takes a lease
// nor counts as a lookup, so asking changes nothing the servers report.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "ctl_common.h"
#include "kvtier/common/fingerprint.h"

namespace kvtier::cli {
namespace {

constexpr size_t kCallsPerWave = 4096;  // InspectBlock calls in flight at once

struct ShardResult {
  grpc::Status status;
  bool found = false;
  v1::BlockRecord block;
};

struct BlockResult {
  Fingerprint fp;
  std::optional<size_t> owner;  // member index
  std::vector<ShardResult> shards;
  bool present() const {
    return std::all_of(shards.begin(), shards.end(), [](const ShardResult& s) { return s.status.ok() && s.found; });
  }
  bool failed() const {
    return std::any_of(shards.begin(), shards.end(), [](const ShardResult& s) { return !s.status.ok(); });
  }
  std::string Tiers() const {  // "host", or "host+disk" when its shards are on both
    std::vector<std::string> tiers;
    for (const ShardResult& s : shards) {
      if (s.found && std::find(tiers.begin(), tiers.end(), s.block.tier()) == tiers.end())
        tiers.push_back(s.block.tier());
    }
    return tiers.empty() ? "-" : absl::StrJoin(tiers, "+");
  }
};

Json NamespaceJson(const Namespace& ns) {
  const KvLayout& l = ns.layout;
  return {{"tenant", ns.tenant},
          {"model", ns.model},
          {"revision", ns.revision ? Json(*ns.revision) : Json(nullptr)},
          {"id", IdHex(ns.Id())},
          {"layout",
           {{"kind", LayoutKindName(l.kind)},
            {"dtype", DTypeName(l.dtype)},
            {"codec", CodecName(l.codec)},
            {"num_layers", l.num_layers},
            {"num_kv_heads", l.num_kv_heads},
            {"head_dim", l.head_dim},
            {"latent_dim", l.latent_dim},
            {"block_tokens", l.block_tokens},
            {"tp_size", l.tp_size},
            {"quant_group_size", l.quant_group_size}}},
          {"shard_bytes", l.ShardBytes()}};
}

// Why member `m` is not on the ring, and what that means for the owners shown.
std::string Unplaced(const ClusterView& view, size_t m) {
  return absl::StrCat(DescribeFailure(view.members()[m].info_status),
                      "; with no node id given (node_id=host:port) it cannot be placed on the ring, so blocks it "
                      "owns are shown on other members");
}

}  // namespace

int RunLookup(const CtlOptions& options, const LookupOptions& lookup) {
  const Namespace& ns = lookup.ns;
  auto fps = ChainFingerprints(ns, lookup.tokens);
  if (!fps.ok()) {
    std::cerr << "kvtierctl: " << fps.status().message() << "\n";
    return kExitUsage;
  }
  const std::vector<Endpoint> endpoints = Connect(options.members, options);
  const ClusterView view = ClusterView::Collect(endpoints, options);
  if (!view.ring()) {
    std::cerr << "kvtierctl: cannot build the ring: " << view.ring_status().ToString() << "\n";
    return view.CountAnswered() == 0 ? kExitUnreachable : kExitFailure;
  }

  const uint32_t shards = ns.layout.tp_size;
  std::vector<BlockResult> blocks(fps->size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].fp = (*fps)[i];
    blocks[i].owner = view.PrimaryOwner((*fps)[i]);
    blocks[i].shards.resize(shards);
  }
  // Owners that did not answer GetInfo are not asked again (a hung one would cost another --timeout-ms):
  // their blocks are absent, failed with that status.
  std::vector<size_t> ask;  // block * shards + shard
  for (size_t b = 0; b < blocks.size(); ++b) {
    const MemberView& owner = view.members()[*blocks[b].owner];
    for (uint32_t s = 0; s < shards; ++s) {
      if (owner.answered()) {
        ask.push_back(b * shards + s);
      } else {
        blocks[b].shards[s].status = owner.info_status;
      }
    }
  }
  for (size_t first = 0; first < ask.size(); first += kCallsPerWave) {
    const size_t n = std::min(kCallsPerWave, ask.size() - first);
    auto calls = RunCalls<v1::InspectBlockRequest, v1::InspectBlockResponse>(
        n, options.rpc_timeout,
        [&](size_t k, auto* c) -> const Endpoint& {
          const BlockResult& b = blocks[ask[first + k] / shards];
          c->req.set_fingerprint(std::string(reinterpret_cast<const char*>(b.fp.bytes.data()), b.fp.bytes.size()));
          c->req.set_shard(static_cast<uint32_t>(ask[first + k] % shards));
          return endpoints[*b.owner];
        },
        [](const Endpoint& ep, auto* c, auto cb) { ep.admin->async()->InspectBlock(&c->ctx, &c->req, &c->resp, cb); });
    for (size_t k = 0; k < n; ++k) {
      ShardResult& r = blocks[ask[first + k] / shards].shards[ask[first + k] % shards];
      r.status = calls[k]->status;
      r.found = calls[k]->status.ok() && calls[k]->resp.found();
      if (r.found) r.block = calls[k]->resp.block();
    }
  }

  size_t prefix = 0;
  while (prefix < blocks.size() && blocks[prefix].present()) ++prefix;
  const size_t present = static_cast<size_t>(
      std::count_if(blocks.begin(), blocks.end(), [](const BlockResult& b) { return b.present(); }));
  uint64_t prefix_tokens = uint64_t{prefix} * ns.layout.block_tokens;
  if (lookup.input_length) prefix_tokens = std::min<uint64_t>(prefix_tokens, *lookup.input_length);
  const uint64_t prompt_tokens = lookup.input_length.value_or(static_cast<uint32_t>(lookup.tokens.size()));
  // Shard-blocks of the leading run by (node, tier).
  std::map<std::pair<std::string, std::string>, uint64_t> by_node;
  for (size_t i = 0; i < prefix; ++i) {
    for (const ShardResult& s : blocks[i].shards) ++by_node[{view.Name(*blocks[i].owner), s.block.tier()}];
  }
  std::vector<size_t> failed_members;
  for (const BlockResult& b : blocks) {
    if (b.failed() && std::find(failed_members.begin(), failed_members.end(), *b.owner) == failed_members.end()) {
      failed_members.push_back(*b.owner);
    }
  }
  auto first_failure = [&](size_t member) -> grpc::Status {
    for (const BlockResult& b : blocks) {
      if (*b.owner != member) continue;
      for (const ShardResult& s : b.shards) {
        if (!s.status.ok()) return s.status;
      }
    }
    return grpc::Status::OK;
  };

  if (options.json) {
    Json nodes = Json::array();
    for (const auto& [key, count] : by_node)
      nodes.push_back({{"node_id", key.first}, {"tier", key.second}, {"blocks", count}});
    Json detail = Json::array();
    for (size_t i = 0; i < blocks.size(); ++i) {
      const BlockResult& b = blocks[i];
      Json sh = Json::array();
      for (uint32_t s = 0; s < shards; ++s) {
        const ShardResult& r = b.shards[s];
        sh.push_back({{"shard", s},
                      {"found", r.found},
                      {"tier", r.found ? Json(r.block.tier()) : Json(nullptr)},
                      {"size_bytes", r.found ? Json(r.block.size_bytes()) : Json(nullptr)},
                      {"access_count", r.found ? Json(r.block.access_count()) : Json(nullptr)},
                      {"error", r.status.ok() ? Json(nullptr) : Json(DescribeFailure(r.status))}});
      }
      detail.push_back({{"index", i},
                        {"fingerprint", b.fp.Hex()},
                        {"owner", view.Name(*b.owner)},
                        {"present", b.present()},
                        {"in_prefix", i < prefix},
                        {"shards", sh}});
    }
    Json errors = Json::array();
    for (size_t m : failed_members) {
      errors.push_back({{"address", endpoints[m].address}, {"error", DescribeFailure(first_failure(m))}});
    }
    for (size_t m : view.unplaced())
      errors.push_back({{"address", endpoints[m].address}, {"error", Unplaced(view, m)}});
    std::cout << DumpJson({{"namespace", NamespaceJson(ns)},
                           {"prompt_tokens", prompt_tokens},
                           {"blocks", blocks.size()},
                           {"prefix_blocks", prefix},
                           {"prefix_tokens", prefix_tokens},
                           {"present_blocks", present},
                           {"by_node", nodes},
                           {"block_detail", detail},
                           {"errors", errors}})
              << "\n";
  } else {
    std::cout << "namespace " << ns.tenant << "/" << ns.model;
    if (ns.revision) std::cout << "@" << *ns.revision;
    std::cout << " (id " << absl::StrFormat("0x%016x", ns.Id()) << "), layout " << ns.layout.DebugString() << ", "
              << HumanBytes(ns.layout.ShardBytes()) << " per shard\n";
    std::cout << "prompt: " << prompt_tokens << " tokens, " << blocks.size() << " full blocks of "
              << ns.layout.block_tokens << " tokens\n";
    std::cout << "cached prefix: " << prefix << " of " << blocks.size() << " blocks (" << prefix_tokens << " tokens";
    if (prompt_tokens > 0) {
      std::cout << ", " << Percent(static_cast<double>(prefix_tokens) / static_cast<double>(prompt_tokens));
    }
    std::cout << ")";
    if (present > prefix) {
      std::cout << "; " << present - prefix << (present - prefix == 1 ? " more block" : " more blocks")
                << " present after the first miss";
    }
    std::cout << "\n";
    if (!by_node.empty()) {
      std::cout << "\n";
      Table table({"NODE", "TIER", "BLOCKS"}, {false, false, true});
      for (const auto& [key, count] : by_node) table.AddRow({key.first, key.second, absl::StrCat(count)});
      table.Print(std::cout);
    }
    if (lookup.per_block) {
      std::cout << "\n";
      Table table({"#", "FINGERPRINT", "OWNER", "PRESENT", "TIER"}, {true, false, false, false, false});
      for (size_t i = 0; i < blocks.size(); ++i) {
        const BlockResult& b = blocks[i];
        std::string state = b.present() ? "yes" : b.failed() ? "unreachable" : "no";
        if (!b.present() && !b.failed() && b.Tiers() != "-") state = "partial";
        table.AddRow({absl::StrCat(i), b.fp.Hex(), view.Name(*b.owner), state, b.Tiers()});
      }
      table.Print(std::cout);
    }
    for (size_t m : failed_members) {
      std::cout << endpoints[m].address << ": " << DescribeFailure(first_failure(m)) << "\n";
    }
    for (size_t m : view.unplaced()) std::cout << endpoints[m].address << ": " << Unplaced(view, m) << "\n";
  }
  return failed_members.empty() && view.unplaced().empty() ? kExitOk : kExitUnreachable;
}

}  // namespace kvtier::cli
