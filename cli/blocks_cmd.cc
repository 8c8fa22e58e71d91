// kvtierctl ls, inspect and evict: the blocks of the cluster, one block, dropping blocks (docs/kvtierctl.md).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "ctl_common.h"

namespace kvtier::cli {
namespace {

v1::BlockFilter ToProto(const FilterOptions& f) {
  v1::BlockFilter out;
  out.set_tenant(f.tenant);
  out.set_namespace_id(f.namespace_id);
  out.set_tier(f.tier);
  return out;
}

// The exit code for members that failed: 3 when one was unreachable, 1 for any other error, else 0.
int ExitForFailures(const std::vector<grpc::Status>& failures) {
  int code = kExitOk;
  for (const grpc::Status& s : failures) {
    if (s.ok()) continue;
    code = std::max(code, IsUnreachable(s) ? kExitUnreachable : kExitFailure);
  }
  return code;
}

// Prints why --node could not be resolved; 3 when a silent member might be the one meant, else 1.
int ReportSelectError(const ClusterView& view, const absl::Status& s) {
  std::cerr << "kvtierctl: --node: " << s.message() << "\n";
  return view.CountAnswered() < view.members().size() ? kExitUnreachable : kExitFailure;
}

std::vector<std::string> BlockCells(const v1::BlockRecord& b) {
  return {HexBytes(b.fingerprint()),
          absl::StrCat(b.shard()),
          NamespaceText(b),
          b.tier(),
          HumanBytes(b.size_bytes()),
          absl::StrCat(b.depth()),
          absl::StrCat(b.access_count()),
          absl::StrCat(b.lease_count()),
          HumanDuration(static_cast<uint64_t>(std::max<int64_t>(0, b.age_ms()))),
          HumanDuration(static_cast<uint64_t>(std::max<int64_t>(0, b.idle_ms())))};
}
const std::vector<std::string> kBlockHeader = {"FINGERPRINT", "SHARD", "NAMESPACE", "TIER", "SIZE",
                                               "DEPTH",       "HITS",  "LEASES",    "AGE",  "IDLE"};
const std::vector<bool> kBlockRight = {false, true, false, false, true, true, true, true, true, true};

}  // namespace

// ---------------------------------------------------------------------------------------------------
// ls

int RunLs(const CtlOptions& options, const LsOptions& ls) {
  const std::vector<Endpoint> endpoints = Connect(options.members, options);
  const ClusterView view = ClusterView::Collect(endpoints, options);
  auto selected = view.Select(ls.nodes);
  if (!selected.ok()) return ReportSelectError(view, selected.status());

  // The cursor is "<position in the selected members>:<that member's cursor>".
  size_t pos = 0;
  uint64_t cursor = 0;
  if (!ls.cursor.empty()) {
    // Both parts whole decimal numbers: from_chars reports an empty or out-of-range part only in ec.
    auto whole = [](const char* b, const char* e, auto& v) {
      const auto [end, ec] = std::from_chars(b, e, v);
      return b != e && ec == std::errc() && end == e;
    };
    const size_t colon = ls.cursor.find(':');
    const char* b = ls.cursor.data();
    const char* e = b + ls.cursor.size();
    if (colon == std::string::npos || !whole(b, b + colon, pos) || !whole(b + colon + 1, e, cursor) ||
        pos >= selected->size()) {
      std::cerr << "kvtierctl: --cursor \"" << ls.cursor
                << "\" is not a cursor of this listing (pass back next_cursor with the same members and --node)\n";
      return kExitUsage;
    }
  }

  struct Row {
    size_t member;
    v1::BlockRecord block;
  };
  std::vector<Row> rows;
  std::vector<grpc::Status> failures(endpoints.size());
  const uint64_t want = ls.limit == 0 ? std::numeric_limits<uint64_t>::max() : ls.limit;
  while (pos < selected->size() && rows.size() < want) {
    const size_t m = (*selected)[pos];
    v1::ListBlocksRequest req;
    *req.mutable_filter() = ToProto(ls.filter);
    req.set_cursor(cursor);
    req.set_limit(static_cast<uint32_t>(std::min<uint64_t>(ls.limit == 0 ? 1000 : want - rows.size(), 10000)));
    v1::ListBlocksResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
    const grpc::Status s = endpoints[m].admin->ListBlocks(&ctx, req, &resp);
    if (!s.ok()) {
      failures[m] = s;
      ++pos;
      cursor = 0;
      continue;
    }
    for (const v1::BlockRecord& b : resp.blocks()) rows.push_back({m, b});
    cursor = resp.next_cursor();
    if (cursor == 0) ++pos;
  }
  const std::string next = pos < selected->size() ? absl::StrCat(pos, ":", cursor) : "";

  if (options.json) {
    Json blocks = Json::array();
    for (const Row& r : rows) {
      Json j = {{"node_id", view.members()[r.member].answered() ? Json(view.Name(r.member)) : Json(nullptr)},
                {"address", endpoints[r.member].address}};
      j.update(BlockJson(r.block));
      blocks.push_back(std::move(j));
    }
    Json errors = Json::array();
    for (size_t i = 0; i < failures.size(); ++i) {
      if (!failures[i].ok())
        errors.push_back({{"address", endpoints[i].address}, {"error", DescribeFailure(failures[i])}});
    }
    std::cout << DumpJson({{"blocks", blocks},
                           {"count", rows.size()},
                           {"next_cursor", next.empty() ? Json(nullptr) : Json(next)},
                           {"errors", errors}})
              << "\n";
  } else {
    std::vector<std::string> header = {"NODE"};
    header.insert(header.end(), kBlockHeader.begin(), kBlockHeader.end());
    std::vector<bool> right = {false};
    right.insert(right.end(), kBlockRight.begin(), kBlockRight.end());
    Table table(std::move(header), std::move(right));
    for (const Row& r : rows) {
      std::vector<std::string> row = {view.Name(r.member)};
      std::vector<std::string> cells = BlockCells(r.block);
      row.insert(row.end(), cells.begin(), cells.end());
      table.AddRow(std::move(row));
    }
    table.Print(std::cout);
    std::cout << "\n" << rows.size() << (rows.size() == 1 ? " block" : " blocks");
    if (!next.empty()) std::cout << "; more with --cursor " << next;
    std::cout << "\n";
    for (size_t i = 0; i < failures.size(); ++i) {
      if (!failures[i].ok()) std::cout << endpoints[i].address << ": " << DescribeFailure(failures[i]) << "\n";
    }
  }
  return ExitForFailures(failures);
}

// ---------------------------------------------------------------------------------------------------
// inspect

int RunInspect(const CtlOptions& options, const InspectOptions& inspect) {
  auto fp_bytes = ParseFingerprintHex(inspect.fingerprint_hex);
  if (!fp_bytes.ok()) {
    std::cerr << "kvtierctl: " << fp_bytes.status().message() << "\n";
    return kExitUsage;
  }
  Fingerprint fp;
  std::copy(fp_bytes->begin(), fp_bytes->end(), reinterpret_cast<char*>(fp.bytes.data()));

  const std::vector<Endpoint> endpoints = Connect(options.members, options);
  const ClusterView view = ClusterView::Collect(endpoints, options);
  auto calls = RunCalls<v1::InspectBlockRequest, v1::InspectBlockResponse>(
      endpoints.size(), options.rpc_timeout,
      [&](size_t i, auto* c) -> const Endpoint& {
        c->req.set_fingerprint(*fp_bytes);
        c->req.set_shard(inspect.shard);
        return endpoints[i];
      },
      [](const Endpoint& ep, auto* c, auto cb) { ep.admin->async()->InspectBlock(&c->ctx, &c->req, &c->resp, cb); });

  const std::optional<size_t> owner = view.PrimaryOwner(fp);
  std::vector<grpc::Status> failures;
  std::vector<size_t> holders;
  for (size_t i = 0; i < calls.size(); ++i) {
    failures.push_back(calls[i]->status);
    if (calls[i]->status.ok() && calls[i]->resp.found()) holders.push_back(i);
  }

  if (options.json) {
    Json members = Json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      const auto& c = *calls[i];
      Json j = {{"address", endpoints[i].address},
                {"node_id", view.members()[i].answered() ? Json(view.Name(i)) : Json(nullptr)},
                {"owner", owner.has_value() && *owner == i},
                {"answered", c.status.ok()},
                {"found", c.status.ok() ? Json(c.resp.found()) : Json(nullptr)},
                {"block", c.status.ok() && c.resp.found() ? BlockJson(c.resp.block()) : Json(nullptr)},
                {"error", c.status.ok() ? Json(nullptr) : Json(DescribeFailure(c.status))}};
      members.push_back(std::move(j));
    }
    Json out = {{"fingerprint", fp.Hex()},
                {"shard", inspect.shard},
                {"ring_position", IdHex(fp.RingPosition())},
                {"owner", owner ? Json(view.Name(*owner)) : Json(nullptr)},
                {"found_on", Json::array()},
                {"members", members}};
    for (size_t i : holders) out["found_on"].push_back(view.Name(i));
    if (!view.ring_status().ok()) out["ring_error"] = view.ring_status().ToString();
    std::cout << DumpJson(out) << "\n";
  } else {
    std::cout << "fingerprint " << fp.Hex() << " shard " << inspect.shard << "\n"
              << "ring position " << absl::StrFormat("0x%016x", fp.RingPosition()) << ", owner "
              << (owner ? view.Name(*owner) : absl::StrCat("unknown (", view.ring_status().ToString(), ")")) << "\n\n";
    Table table({"NODE", "ADDRESS", "OWNER", "HAS IT", "TIER", "SIZE", "CHECKSUM", "NAMESPACE", "DEPTH", "HITS",
                 "LEASES", "AGE", "IDLE"},
                {false, false, false, false, false, true, false, false, true, true, true, true, true});
    for (size_t i = 0; i < calls.size(); ++i) {
      const auto& c = *calls[i];
      std::vector<std::string> row = {view.Name(i), endpoints[i].address, owner && *owner == i ? "owner" : "-"};
      if (!c.status.ok()) {
        row.push_back(IsUnreachable(c.status) ? "unreachable" : "error");
      } else {
        row.push_back(c.resp.found() ? "yes" : "no");
      }
      if (c.status.ok() && c.resp.found()) {
        const v1::BlockRecord& b = c.resp.block();
        row.insert(row.end(), {b.tier(), HumanBytes(b.size_bytes()), Hex64(b.checksum()), NamespaceText(b),
                               absl::StrCat(b.depth()), absl::StrCat(b.access_count()), absl::StrCat(b.lease_count()),
                               HumanDuration(static_cast<uint64_t>(std::max<int64_t>(0, b.age_ms()))),
                               HumanDuration(static_cast<uint64_t>(std::max<int64_t>(0, b.idle_ms())))});
      }
      table.AddRow(std::move(row));
    }
    table.Print(std::cout);
    std::cout << "\n";
    if (holders.empty()) {
      std::cout << "no member that answered holds this block\n";
    } else {
      std::vector<std::string> names;
      for (size_t i : holders) names.push_back(view.Name(i));
      std::cout << "held by " << absl::StrJoin(names, ", ") << "\n";
      for (size_t i : holders) {
        if (!owner || *owner != i) {
          std::cout << view.Name(i)
                    << " is not the owner: clients do not ask it for this block (membership changed?)\n";
        }
      }
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      if (!calls[i]->status.ok())
        std::cout << endpoints[i].address << ": " << DescribeFailure(calls[i]->status) << "\n";
    }
  }
  return std::max(ExitForFailures(failures), holders.empty() ? kExitFailure : kExitOk);
}

// ---------------------------------------------------------------------------------------------------
// evict

int RunEvict(const CtlOptions& options, const EvictOptions& evict) {
  v1::EvictRequest req;
  if (!evict.fingerprint_hex.empty()) {
    auto fp = ParseFingerprintHex(evict.fingerprint_hex);
    if (!fp.ok()) {
      std::cerr << "kvtierctl: " << fp.status().message() << "\n";
      return kExitUsage;
    }
    req.set_fingerprint(*fp);
    req.set_shard(evict.shard);
  } else {
    *req.mutable_filter() = ToProto(evict.filter);
    req.set_all(evict.all);
  }

  const std::vector<Endpoint> endpoints = Connect(options.members, options);
  const ClusterView view = ClusterView::Collect(endpoints, options);
  auto selected = view.Select(evict.nodes);
  if (!selected.ok()) return ReportSelectError(view, selected.status());
  auto calls = RunCalls<v1::EvictRequest, v1::EvictResponse>(
      selected->size(), options.rpc_timeout,
      [&](size_t i, auto* c) -> const Endpoint& {
        c->req = req;
        return endpoints[(*selected)[i]];
      },
      [](const Endpoint& ep, auto* c, auto cb) { ep.admin->async()->Evict(&c->ctx, &c->req, &c->resp, cb); });

  uint64_t evicted = 0, leased = 0;
  std::vector<grpc::Status> failures;
  for (const auto& c : calls) {
    failures.push_back(c->status);
    if (c->status.ok()) {
      evicted += c->resp.evicted();
      leased += c->resp.skipped_leased();
    }
  }
  if (options.json) {
    Json members = Json::array();
    for (size_t k = 0; k < calls.size(); ++k) {
      const size_t i = (*selected)[k];
      const auto& c = *calls[k];
      members.push_back({{"address", endpoints[i].address},
                         {"node_id", view.members()[i].answered() ? Json(view.Name(i)) : Json(nullptr)},
                         {"evicted", c.status.ok() ? Json(c.resp.evicted()) : Json(nullptr)},
                         {"skipped_leased", c.status.ok() ? Json(c.resp.skipped_leased()) : Json(nullptr)},
                         {"error", c.status.ok() ? Json(nullptr) : Json(DescribeFailure(c.status))}});
    }
    std::cout << DumpJson({{"members", members}, {"totals", {{"evicted", evicted}, {"skipped_leased", leased}}}})
              << "\n";
  } else {
    Table table({"NODE", "EVICTED", "SKIPPED (LEASED)"}, {false, true, true});
    for (size_t k = 0; k < calls.size(); ++k) {
      const auto& c = *calls[k];
      table.AddRow({view.Name((*selected)[k]), c.status.ok() ? absl::StrCat(c.resp.evicted()) : "-",
                    c.status.ok() ? absl::StrCat(c.resp.skipped_leased()) : "-"});
    }
    table.AddRow({"TOTAL", absl::StrCat(evicted), absl::StrCat(leased)});
    table.Print(std::cout);
    if (leased > 0) std::cout << "\nleased blocks are being read; run evict again once the readers are done\n";
    for (size_t k = 0; k < calls.size(); ++k) {
      if (!calls[k]->status.ok()) {
        std::cout << endpoints[(*selected)[k]].address << ": " << DescribeFailure(calls[k]->status) << "\n";
      }
    }
  }
  return ExitForFailures(failures);
}

}  // namespace kvtier::cli
