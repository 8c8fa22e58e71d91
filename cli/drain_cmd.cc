// kvtierctl drain: stop a member taking new blocks, then hand its hottest blocks to their owners on the
// ring without it (docs/kvtierctl.md). Reading and writing blocks goes through the client library (one
// client whose only member is the draining node, one over the others), so bytes are checksummed both
// ways and placed exactly as workers will look for them once the node has left.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "commands.h"
#include "ctl_common.h"
#include "kvtier/client/client.h"

namespace kvtier::cli {
namespace {

struct HandOff {
  uint64_t listed = 0;                // blocks the node held
  uint64_t chosen = 0;                // the hottest min(listed, --hand-off)
  uint64_t moved = 0;                 // stored on their new owner
  uint64_t already_present = 0;       // the new owner had them (or was storing them)
  uint64_t no_space = 0;              // the new owner refused them (full or draining)
  uint64_t put_errors = 0;            // the new owner failed or was unreachable
  uint64_t gone = 0;                  // evicted from the draining node since it was listed
  uint64_t read_errors = 0;           // reading from the draining node failed, or the bytes failed their checksum
  uint64_t skipped_no_namespace = 0;  // no namespace given for them: their bytes cannot be read
  std::map<uint64_t, std::pair<std::string, uint64_t>> skipped_namespaces;  // id -> (tenant/model, blocks)
  std::vector<std::string> notes;
};

Json HandOffJson(const HandOff& h) {
  Json skipped = Json::array();
  for (const auto& [id, v] : h.skipped_namespaces) {
    skipped.push_back({{"namespace_id", IdHex(id)}, {"namespace", v.first}, {"blocks", v.second}});
  }
  return {{"listed", h.listed},
          {"chosen", h.chosen},
          {"moved", h.moved},
          {"already_present", h.already_present},
          {"no_space", h.no_space},
          {"put_errors", h.put_errors},
          {"gone", h.gone},
          {"read_errors", h.read_errors},
          {"skipped_no_namespace", h.skipped_no_namespace},
          {"skipped_namespaces", skipped}};
}

// Every block of member `ep`, in pages. Errors: the failed page's status.
grpc::Status ListAll(const Endpoint& ep, absl::Duration timeout, std::vector<v1::BlockRecord>* out) {
  uint64_t cursor = 0;
  do {
    v1::ListBlocksRequest req;
    req.set_cursor(cursor);
    req.set_limit(10000);
    v1::ListBlocksResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (grpc::Status s = ep.admin->ListBlocks(&ctx, req, &resp); !s.ok()) return s;
    for (const v1::BlockRecord& b : resp.blocks()) out->push_back(b);
    cursor = resp.next_cursor();
  } while (cursor != 0);
  return grpc::Status::OK;
}

// Splits blocks (of one namespace and shard) into batches whose depths run d, d+1, d+2, ... (so a put
// of the batch with first_block_index = d gives every block its own depth back), each at most
// `max_blocks` long. Greedy: start at the shallowest block left and take the next depth while any is left.
std::vector<std::vector<v1::BlockRecord>> DepthRuns(std::vector<v1::BlockRecord> blocks, size_t max_blocks) {
  std::multimap<uint32_t, v1::BlockRecord> left;
  for (v1::BlockRecord& b : blocks) left.emplace(b.depth(), std::move(b));
  std::vector<std::vector<v1::BlockRecord>> runs;
  while (!left.empty()) {
    std::vector<v1::BlockRecord> run;
    auto it = left.begin();
    while (it != left.end() && run.size() < max_blocks) {
      const uint32_t depth = it->first;
      run.push_back(std::move(it->second));
      left.erase(it);
      it = left.find(depth + 1);
    }
    runs.push_back(std::move(run));
  }
  return runs;
}

// Copies `blocks` (one namespace and shard) from `source` to `dest`, counting into `h`.
void MoveBlocks(client::Client& source, client::Client& dest, const Namespace& ns, uint32_t shard,
                std::vector<v1::BlockRecord> blocks, uint64_t batch_bytes, HandOff& h) {
  const uint64_t block_bytes = ns.layout.ShardBytes();
  const size_t max_blocks =
      static_cast<size_t>(std::max<uint64_t>(1, batch_bytes / std::max<uint64_t>(1, block_bytes)));
  for (const std::vector<v1::BlockRecord>& run : DepthRuns(std::move(blocks), max_blocks)) {
    std::vector<Fingerprint> fps(run.size());
    for (size_t i = 0; i < run.size(); ++i) {
      std::copy(run[i].fingerprint().begin(), run[i].fingerprint().end(), reinterpret_cast<char*>(fps[i].bytes.data()));
    }
    std::vector<std::vector<std::byte>> data(run.size(), std::vector<std::byte>(block_bytes));
    std::vector<std::span<std::byte>> views(data.begin(), data.end());
    auto got = source.Get(ns, fps, shard, views);
    if (!got.ok()) {
      h.read_errors += run.size();
      h.notes.push_back(absl::StrCat("reading ", run.size(), " blocks: ", got.status().ToString()));
      continue;
    }
    // Put each run of consecutive hits with the depth of its first block.
    size_t i = 0;
    while (i < run.size()) {
      const client::GetResult g = (*got)[i];
      if (g != client::GetResult::kHit) {
        (g == client::GetResult::kMiss ? h.gone : h.read_errors) += 1;
        ++i;
        continue;
      }
      size_t j = i;
      while (j < run.size() && (*got)[j] == client::GetResult::kHit) ++j;
      std::vector<std::span<const std::byte>> in(data.begin() + static_cast<std::ptrdiff_t>(i),
                                                 data.begin() + static_cast<std::ptrdiff_t>(j));
      auto put = dest.Put(ns, std::span<const Fingerprint>(fps).subspan(i, j - i), shard, in, run[i].depth());
      if (!put.ok()) {
        h.put_errors += j - i;
        h.notes.push_back(absl::StrCat("storing ", j - i, " blocks: ", put.status().ToString()));
      } else {
        for (client::PutResult p : *put) {
          switch (p) {
            case client::PutResult::kStored:
              ++h.moved;
              break;
            case client::PutResult::kAlreadyPresent:
            case client::PutResult::kInProgress:
              ++h.already_present;
              break;
            case client::PutResult::kNoSpace:
              ++h.no_space;
              break;
            case client::PutResult::kError:
              ++h.put_errors;
              break;
          }
        }
      }
      i = j;
    }
  }
}

}  // namespace

int RunDrain(const CtlOptions& options, const DrainOptions& drain) {
  std::vector<std::string> members = options.members;
  if (std::find(members.begin(), members.end(), drain.node) == members.end() &&
      drain.node.find(':') != std::string::npos) {
    members.push_back(drain.node);  // an address not in --members: ask it too
  }
  const std::vector<Endpoint> endpoints = Connect(members, options);
  const ClusterView view = ClusterView::Collect(endpoints, options);
  auto target_or = view.Find(drain.node);
  if (!target_or.ok()) {
    std::cerr << "kvtierctl: drain: " << target_or.status().message() << "\n";
    return view.CountAnswered() < view.members().size() ? kExitUnreachable : kExitFailure;
  }
  const size_t target = *target_or;
  const Endpoint& ep = endpoints[target];

  v1::SetDrainingRequest req;
  req.set_draining(!drain.undo);
  v1::SetDrainingResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
  if (grpc::Status s = ep.admin->SetDraining(&ctx, req, &resp); !s.ok()) {
    std::cerr << "kvtierctl: drain: " << ep.address << ": " << DescribeFailure(s) << "\n";
    return IsUnreachable(s) ? kExitUnreachable : kExitFailure;
  }
  const std::string name = view.Name(target);

  HandOff h;
  int code = kExitOk;
  // The members taking its blocks: the ring without the node, of every member whose node id is known,
  // answering or not (as a client places blocks); blocks a silent one owns fail to store.
  const std::string& target_id = view.members()[target].node_id;
  std::vector<std::string> targets;     // their addresses
  std::vector<std::string> dest_specs;  // node_id=host:port of each
  for (size_t i = 0; i < view.members().size(); ++i) {
    const MemberView& m = view.members()[i];
    // Not the node itself, under another address either (127.0.0.1 and its pod IP from DNS).
    if (i == target || m.node_id.empty() || (!target_id.empty() && m.node_id == target_id)) continue;
    targets.push_back(m.address);
    dest_specs.push_back(absl::StrCat(m.node_id, "=", m.address));
  }
  const bool hand_off = !drain.undo && drain.hand_off > 0;
  if (hand_off) {
    for (size_t i = 0; i < view.members().size(); ++i) {
      const MemberView& m = view.members()[i];
      if (i == target || m.answered()) continue;
      code = kExitUnreachable;
      h.notes.push_back(absl::StrCat(
          m.address, " did not answer (", DescribeFailure(m.info_status), "): ",
          m.node_id.empty() ? "with no node id given (node_id=host:port) it is not on the ring, so blocks it would own "
                              "were handed to other members"
                            : "blocks it owns could not be handed to it"));
    }
  }
  if (hand_off && targets.empty()) h.notes.push_back("no other member has a known node id: nothing to hand blocks to");
  if (hand_off && !targets.empty()) {
    std::vector<v1::BlockRecord> blocks;
    if (grpc::Status s = ListAll(ep, options.rpc_timeout, &blocks); !s.ok()) {
      std::cerr << "kvtierctl: drain: listing the blocks of " << ep.address << ": " << DescribeFailure(s) << "\n";
      return IsUnreachable(s) ? kExitUnreachable : kExitFailure;
    }
    h.listed = blocks.size();
    // Hottest first: most accesses, then most recently used.
    std::sort(blocks.begin(), blocks.end(), [](const v1::BlockRecord& a, const v1::BlockRecord& b) {
      if (a.access_count() != b.access_count()) return a.access_count() > b.access_count();
      return a.idle_ms() < b.idle_ms();
    });
    if (blocks.size() > drain.hand_off) blocks.resize(drain.hand_off);
    h.chosen = blocks.size();

    absl::flat_hash_map<uint64_t, size_t> by_id;  // namespace id -> index in drain.namespaces
    for (size_t i = 0; i < drain.namespaces.size(); ++i) by_id.emplace(drain.namespaces[i].Id(), i);
    std::map<std::pair<size_t, uint32_t>, std::vector<v1::BlockRecord>> groups;  // (namespace, shard) -> blocks
    for (v1::BlockRecord& b : blocks) {
      auto it = by_id.find(b.namespace_id());
      if (it == by_id.end()) {
        ++h.skipped_no_namespace;
        auto& s = h.skipped_namespaces[b.namespace_id()];
        s.first = NamespaceText(b);
        ++s.second;
        continue;
      }
      groups[{it->second, b.shard()}].push_back(std::move(b));
    }
    if (!groups.empty()) {
      client::ClientOptions source_options{.members = {ep.address},
                                           .virtual_nodes = options.virtual_nodes,
                                           .rpc_timeout = options.rpc_timeout,
                                           .transport = "grpc",
                                           .tls_ca_file = options.security.ca_file,
                                           .tls_cert_file = options.security.cert_file,
                                           .tls_key_file = options.security.key_file,
                                           .tls_server_name = options.security.server_name,
                                           .auth_token = options.security.auth_token};
      client::ClientOptions dest_options = source_options;
      dest_options.members = dest_specs;
      auto source = client::Client::Connect(source_options);
      auto dest = client::Client::Connect(dest_options);
      if (!source.ok() || !dest.ok()) {
        std::cerr << "kvtierctl: drain: connecting: "
                  << (!source.ok() ? source.status().ToString() : dest.status().ToString()) << "\n";
        return kExitUnreachable;
      }
      for (auto& [key, group] : groups) {
        MoveBlocks(**source, **dest, drain.namespaces[key.first], key.second, std::move(group), drain.batch_bytes, h);
      }
    }
    if (h.put_errors > 0 || h.read_errors > 0) code = kExitUnreachable;
  }

  if (options.json) {
    Json out = {{"address", ep.address},
                {"node_id", view.members()[target].answered() ? Json(name) : Json(nullptr)},
                {"draining", resp.draining()},
                {"targets", targets},
                {"hand_off", hand_off ? HandOffJson(h) : Json(nullptr)},
                {"notes", h.notes}};
    std::cout << DumpJson(out) << "\n";
  } else {
    std::cout << name << " (" << ep.address << "): "
              << (resp.draining() ? "draining: takes no new blocks, still serves reads"
                                  : "active: takes new blocks again")
              << "\n";
    if (hand_off) {
      std::cout << "hand-off to " << targets.size() << (targets.size() == 1 ? " member" : " members") << ": "
                << h.chosen << " hottest of " << h.listed << " blocks chosen\n\n";
      Table table({"OUTCOME", "BLOCKS"}, {false, true});
      table.AddRow({"moved", absl::StrCat(h.moved)});
      table.AddRow({"already on the new owner", absl::StrCat(h.already_present)});
      table.AddRow({"refused: no space", absl::StrCat(h.no_space)});
      table.AddRow({"failed to store", absl::StrCat(h.put_errors)});
      table.AddRow({"evicted meanwhile", absl::StrCat(h.gone)});
      table.AddRow({"failed to read", absl::StrCat(h.read_errors)});
      table.AddRow({"skipped: namespace not given", absl::StrCat(h.skipped_no_namespace)});
      table.Print(std::cout);
      if (!h.skipped_namespaces.empty()) {
        std::cout << "\nskipped namespaces (pass them with the namespace flags or --namespaces-file):\n";
        for (const auto& [id, v] : h.skipped_namespaces) {
          std::cout << "  " << IdHex(id) << "  " << v.first << "  " << v.second << " blocks\n";
        }
      }
    }
    for (const std::string& n : h.notes) std::cout << "note: " << n << "\n";
  }
  return code;
}

}  // namespace kvtier::cli
