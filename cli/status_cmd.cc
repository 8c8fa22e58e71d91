// kvtierctl status: health, identity, ring share and tier usage of every member (docs/kvtierctl.md).
#include <algorithm>
#include <future>
#include <iostream>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "ctl_common.h"

namespace kvtier::cli {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

struct MemberStatus {
  std::string address;
  grpc::Status health_status;
  HealthCheckResponse health;
  grpc::Status info_status;
  v1::GetInfoResponse info;
  std::optional<double> ring_share;  // set when its node id is known (reported or given) and the ring was built

  bool serving() const { return health_status.ok() && health.status() == HealthCheckResponse::SERVING; }
  bool up() const { return serving() && info_status.ok(); }
  std::string HealthText() const {
    if (!health_status.ok()) return IsUnreachable(health_status) ? "unreachable" : "error";
    return HealthCheckResponse::ServingStatus_Name(health.status());
  }
  // What went wrong with this member, for the notes under the table; empty when nothing did.
  std::string Problem() const {
    if (!health_status.ok() && !info_status.ok() && health_status.error_code() == info_status.error_code() &&
        health_status.error_message() == info_status.error_message()) {
      return DescribeFailure(health_status);  // the usual case of a dead member: say it once
    }
    std::vector<std::string> parts;
    if (!health_status.ok()) parts.push_back(absl::StrCat("health: ", DescribeFailure(health_status)));
    if (!info_status.ok()) parts.push_back(absl::StrCat("info: ", DescribeFailure(info_status)));
    if (health_status.ok() && !serving()) parts.push_back(absl::StrCat("health: ", HealthText()));
    return absl::StrJoin(parts, "; ");
  }
};

struct StatusReport {
  std::vector<MemberStatus> members;
  absl::Status ring_status;        // not OK when the ring cannot be built (e.g. a node id reported twice)
  std::vector<std::string> tiers;  // every tier name reported, fastest first
};

// Sorts tier names fastest first: hbm, host, disk, then any other by name.
void SortTiers(std::vector<std::string>& tiers) {
  auto rank = [](const std::string& t) { return t == "hbm" ? 0 : t == "host" ? 1 : t == "disk" ? 2 : 3; };
  std::sort(tiers.begin(), tiers.end(), [&](const std::string& a, const std::string& b) {
    return std::make_pair(rank(a), a) < std::make_pair(rank(b), b);
  });
}

StatusReport CollectStatus(const CtlOptions& options) {
  const std::vector<Endpoint> endpoints = Connect(options.members, options);
  // Health and GetInfo at once, so a hung member costs one deadline, not two.
  auto health_future = std::async(std::launch::async, [&] {
    return CallEach<HealthCheckRequest, HealthCheckResponse>(
        endpoints, options.rpc_timeout,
        [](const Endpoint& ep, auto* c, auto cb) { ep.health->async()->Check(&c->ctx, &c->req, &c->resp, cb); });
  });
  auto info = CallEach<v1::GetInfoRequest, v1::GetInfoResponse>(
      endpoints, options.rpc_timeout,
      [](const Endpoint& ep, auto* c, auto cb) { ep.admin->async()->GetInfo(&c->ctx, &c->req, &c->resp, cb); });
  auto health = health_future.get();

  StatusReport report;
  absl::flat_hash_set<std::string> tiers;
  std::vector<std::string> ids;
  std::vector<size_t> id_member;  // ring index -> member index
  for (size_t i = 0; i < endpoints.size(); ++i) {
    MemberStatus m{.address = endpoints[i].address,
                   .health_status = health[i]->status,
                   .health = health[i]->resp,
                   .info_status = info[i]->status,
                   .info = info[i]->resp,
                   .ring_share = std::nullopt};
    // The ring of ClusterView: an id given with node_id=host:port places the member answering or not.
    const auto given = options.node_ids.find(m.address);
    if (given != options.node_ids.end() || m.info_status.ok()) {
      ids.push_back(given != options.node_ids.end() ? given->second : m.info.node_id());
      id_member.push_back(i);
    }
    if (m.info_status.ok()) {
      for (const v1::TierInfo& t : m.info.tiers()) {
        if (tiers.insert(t.tier()).second) report.tiers.push_back(t.tier());
      }
    }
    report.members.push_back(std::move(m));
  }
  SortTiers(report.tiers);
  if (!ids.empty()) {
    auto ring = HashRing::Create(ids, options.virtual_nodes);
    if (ring.ok()) {
      const std::vector<double> shares = ring->Shares();
      for (size_t r = 0; r < shares.size(); ++r) report.members[id_member[r]].ring_share = shares[r];
    } else {
      report.ring_status = ring.status();
    }
  }
  return report;
}

struct TierTotals {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t blocks = 0;
};

// Sums over the members that answered GetInfo; `tier` empty sums every tier.
TierTotals SumTiers(const StatusReport& report, const std::string& tier) {
  TierTotals t;
  for (const MemberStatus& m : report.members) {
    if (!m.info_status.ok()) continue;
    for (const v1::TierInfo& ti : m.info.tiers()) {
      if (!tier.empty() && ti.tier() != tier) continue;
      // A disk tier that is off holds nothing and takes nothing: its budget is no capacity.
      if (ti.state() != "off") t.capacity_bytes += ti.capacity_bytes();
      t.used_bytes += ti.used_bytes();
      t.blocks += ti.blocks();
    }
  }
  return t;
}

size_t CountUp(const StatusReport& report) {
  return static_cast<size_t>(
      std::count_if(report.members.begin(), report.members.end(), [](const MemberStatus& m) { return m.up(); }));
}

Json StatusJson(const StatusReport& report) {
  Json members = Json::array();
  for (const MemberStatus& m : report.members) {
    const bool has_info = m.info_status.ok();
    Json tiers = Json::array();
    for (const v1::TierInfo& t : m.info.tiers()) {
      Json tier = {{"tier", t.tier()},
                   {"capacity_bytes", t.capacity_bytes()},
                   {"used_bytes", t.used_bytes()},
                   {"blocks", t.blocks()}};
      if (!t.state().empty()) {  // the disk tier
        tier["state"] = t.state();
        tier["state_reason"] = t.state_reason();
        tier["volume_free_bytes"] = t.volume_free_bytes();
        tier["min_free_bytes"] = t.min_free_bytes();
        tier["database_bytes"] = t.database_bytes();
      }
      tiers.push_back(std::move(tier));
    }
    const std::string problem = m.Problem();
    auto info_field = [&](auto v) { return has_info ? Json(v) : Json(nullptr); };
    members.push_back({{"address", m.address},
                       {"node_id", info_field(m.info.node_id())},
                       {"health", m.HealthText()},
                       {"up", m.up()},
                       {"ring_share", m.ring_share ? Json(*m.ring_share) : Json(nullptr)},
                       {"tiers", tiers},
                       {"draining", info_field(m.info.draining())},
                       {"eviction_policy", info_field(m.info.eviction_policy())},
                       {"transport", info_field(m.info.transport())},
                       {"version", info_field(m.info.version())},
                       {"uptime_ms", info_field(m.info.uptime_ms())},
                       {"max_block_bytes", info_field(m.info.max_block_bytes())},
                       {"max_blocks_per_request", info_field(m.info.max_blocks_per_request())},
                       {"error", problem.empty() ? Json(nullptr) : Json(problem)}});
  }
  const TierTotals all = SumTiers(report, "");
  Json tiers = Json::array();
  for (const std::string& name : report.tiers) {
    const TierTotals t = SumTiers(report, name);
    tiers.push_back(
        {{"tier", name}, {"capacity_bytes", t.capacity_bytes}, {"used_bytes", t.used_bytes}, {"blocks", t.blocks}});
  }
  Json totals = {{"members_up", CountUp(report)},
                 {"members_total", report.members.size()},
                 {"capacity_bytes", all.capacity_bytes},
                 {"used_bytes", all.used_bytes},
                 {"blocks", all.blocks},
                 {"tiers", tiers}};
  Json out = {{"members", members}, {"totals", totals}};
  if (!report.ring_status.ok()) out["ring_error"] = report.ring_status.ToString();
  return out;
}

void PrintStatus(const StatusReport& report, std::ostream& out) {
  std::vector<std::string> header = {"NODE", "ADDRESS", "HEALTH", "RING"};
  std::vector<bool> right = {false, false, false, true};
  for (const std::string& tier : report.tiers) {
    const std::string name = absl::AsciiStrToUpper(tier);
    header.insert(header.end(), {name + " USED / CAPACITY", name + " BLOCKS"});
    right.insert(right.end(), {true, true});
    if (tier == "disk") {
      header.push_back("DISK STATE");
      right.push_back(false);
    }
  }
  header.insert(header.end(), {"MODE", "POLICY", "TRANSPORT", "UPTIME"});
  right.insert(right.end(), {false, false, false, true});
  Table table(std::move(header), std::move(right));
  for (const MemberStatus& m : report.members) {
    const bool has_info = m.info_status.ok();
    std::vector<std::string> row = {has_info ? m.info.node_id() : "-", m.address, m.HealthText(),
                                    m.ring_share ? Percent(*m.ring_share) : "-"};
    for (const std::string& tier : report.tiers) {
      auto it = std::find_if(m.info.tiers().begin(), m.info.tiers().end(),
                             [&](const v1::TierInfo& t) { return t.tier() == tier; });
      if (!has_info || it == m.info.tiers().end()) {
        row.insert(row.end(), {"-", "-"});
        if (tier == "disk") row.push_back("-");
      } else {
        row.push_back(absl::StrCat(HumanBytes(it->used_bytes()), " / ", HumanBytes(it->capacity_bytes())));
        row.push_back(absl::StrCat(it->blocks()));
        if (tier == "disk") row.push_back(it->state().empty() ? "-" : it->state());
      }
    }
    if (has_info) {
      row.insert(row.end(), {m.info.draining() ? "draining" : "active", m.info.eviction_policy(), m.info.transport(),
                             HumanDuration(m.info.uptime_ms())});
    } else {
      row.insert(row.end(), {"-", "-", "-", "-"});
    }
    table.AddRow(std::move(row));
  }
  table.Print(out);

  const TierTotals all = SumTiers(report, "");
  out << "\ncluster: " << CountUp(report) << "/" << report.members.size() << " members up, used "
      << HumanBytes(all.used_bytes) << " of " << HumanBytes(all.capacity_bytes);
  if (all.capacity_bytes > 0) {
    out << " (" << Percent(static_cast<double>(all.used_bytes) / static_cast<double>(all.capacity_bytes)) << ")";
  }
  out << ", " << all.blocks << " blocks\n";
  for (const MemberStatus& m : report.members) {
    if (const std::string p = m.Problem(); !p.empty()) out << m.address << ": " << p << "\n";
    for (const v1::TierInfo& t : m.info.tiers()) {
      if (t.state().empty() || t.state() == "ok") continue;
      out << m.address << ": disk tier " << t.state() << ": " << t.state_reason() << "; serving from memory\n";
    }
  }
  if (!report.ring_status.ok()) out << "ring: " << report.ring_status.ToString() << "\n";
}

}  // namespace

int RunStatus(const CtlOptions& options) {
  const StatusReport report = CollectStatus(options);
  if (options.json) {
    std::cout << DumpJson(StatusJson(report)) << "\n";
  } else {
    PrintStatus(report, std::cout);
  }
  if (!report.ring_status.ok()) {
    std::cerr << "kvtierctl: cannot build the ring: " << report.ring_status.ToString() << "\n";
    return kExitFailure;
  }
  return CountUp(report) == report.members.size() ? kExitOk : kExitUnreachable;
}

}  // namespace kvtier::cli
