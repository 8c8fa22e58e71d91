// kvtierctl stats: counters of every member, cluster totals and per-second rates (docs/kvtierctl.md).
#include <chrono>
#include <iostream>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "commands.h"
#include "ctl_common.h"

namespace kvtier::cli {
namespace {

struct MemberStats {
  std::string address;
  grpc::Status status;
  v1::GetStatsResponse stats;
};

struct Snapshot {
  std::chrono::steady_clock::time_point sent;  // when the requests went out
  std::vector<MemberStats> members;
};

Snapshot TakeSnapshot(const std::vector<Endpoint>& endpoints, absl::Duration timeout) {
  Snapshot snap;
  snap.sent = std::chrono::steady_clock::now();
  auto calls = CallEach<v1::GetStatsRequest, v1::GetStatsResponse>(
      endpoints, timeout,
      [](const Endpoint& ep, auto* c, auto cb) { ep.admin->async()->GetStats(&c->ctx, &c->req, &c->resp, cb); });
  for (size_t i = 0; i < endpoints.size(); ++i) {
    snap.members.push_back({endpoints[i].address, calls[i]->status, calls[i]->resp});
  }
  return snap;
}

// Adds every integer field of `from` to `into` (the proto's counters and gauges alike), so totals keep
// up with fields added to GetStatsResponse.
void AddCounters(const v1::GetStatsResponse& from, v1::GetStatsResponse* into) {
  const google::protobuf::Descriptor* d = from.GetDescriptor();
  const google::protobuf::Reflection* r = from.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT64) {
      r->SetUInt64(into, f, r->GetUInt64(*into, f) + r->GetUInt64(from, f));
    } else if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT32) {
      r->SetUInt32(into, f, r->GetUInt32(*into, f) + r->GetUInt32(from, f));
    }
  }
}

// Every integer field by its proto name, then the existence hit ratio.
void AppendCountersJson(const v1::GetStatsResponse& s, Json& out) {
  const google::protobuf::Descriptor* d = s.GetDescriptor();
  const google::protobuf::Reflection* r = s.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT64) out[f->name()] = r->GetUInt64(s, f);
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT32) out[f->name()] = r->GetUInt32(s, f);
  }
  out["existence_hit_ratio"] = RatioJson(HitRatio(s.lookup_blocks_hit(), s.lookup_blocks_miss()));
  out["shadow_would_be_hit_ratio"] =
      RatioJson(HitRatio(s.shadow_hit_blocks(), s.shadow_lookup_blocks() - s.shadow_hit_blocks()));
}

// Per-second rates of one member between two snapshots.
struct Rates {
  double lookup_requests = 0;
  double lookup_blocks = 0;
  double read_blocks = 0;
  double read_bytes = 0;
  double committed_blocks = 0;
  double evictions = 0;

  void Add(const Rates& o) {
    lookup_requests += o.lookup_requests;
    lookup_blocks += o.lookup_blocks;
    read_blocks += o.read_blocks;
    read_bytes += o.read_bytes;
    committed_blocks += o.committed_blocks;
    evictions += o.evictions;
  }
  Json ToJson() const {
    return {{"lookup_requests_per_s", lookup_requests},   {"lookup_blocks_per_s", lookup_blocks},
            {"read_blocks_per_s", read_blocks},           {"read_bytes_per_s", read_bytes},
            {"committed_blocks_per_s", committed_blocks}, {"evictions_per_s", evictions}};
  }
};

// nullopt when the member restarted in between (a counter went down) or another node answers there now.
std::optional<Rates> ComputeRates(const v1::GetStatsResponse& a, const v1::GetStatsResponse& b, double seconds) {
  const uint64_t a_lookup_blocks = a.lookup_blocks_hit() + a.lookup_blocks_miss();
  const uint64_t b_lookup_blocks = b.lookup_blocks_hit() + b.lookup_blocks_miss();
  if (a.node_id() != b.node_id() || seconds <= 0 || b.lookup_requests() < a.lookup_requests() ||
      b_lookup_blocks < a_lookup_blocks || b.read_blocks() < a.read_blocks() || b.read_bytes() < a.read_bytes() ||
      b.committed_blocks() < a.committed_blocks() || b.evictions() < a.evictions()) {
    return std::nullopt;
  }
  auto rate = [seconds](uint64_t x, uint64_t y) { return static_cast<double>(y - x) / seconds; };
  return Rates{.lookup_requests = rate(a.lookup_requests(), b.lookup_requests()),
               .lookup_blocks = rate(a_lookup_blocks, b_lookup_blocks),
               .read_blocks = rate(a.read_blocks(), b.read_blocks()),
               .read_bytes = rate(a.read_bytes(), b.read_bytes()),
               .committed_blocks = rate(a.committed_blocks(), b.committed_blocks()),
               .evictions = rate(a.evictions(), b.evictions())};
}

// GetStatsResponse.counters of the members that answered, by sample name in first-seen order, each
// summed over those members (gauges too, as the typed totals are).
struct CounterTotals {
  std::vector<std::string> names;
  absl::flat_hash_map<std::string, uint64_t> sums;

  void Add(const v1::GetStatsResponse& s) {
    for (const v1::CounterSample& c : s.counters()) {
      auto [it, inserted] = sums.try_emplace(c.name(), 0);
      if (inserted) names.push_back(c.name());
      it->second += c.value();
    }
  }
};

// The counters of one member as {sample name: value}.
Json CountersJson(const v1::GetStatsResponse& s) {
  Json out = Json::object();
  for (const v1::CounterSample& c : s.counters()) out[c.name()] = c.value();
  return out;
}

struct StatsReport {
  std::vector<MemberStats> members;         // the latest snapshot
  std::vector<std::optional<Rates>> rates;  // per member; empty without --interval-s
  std::vector<std::string> rate_problems;   // per member, why it has no rates ("" when it has)
  std::optional<double> interval_s;         // measured time between the snapshots
  v1::GetStatsResponse totals;              // sums over the members that answered the latest snapshot
  CounterTotals counter_totals;             // GetStatsResponse.counters, summed likewise
  std::optional<Rates> total_rates;         // sum of the members' rates
  size_t answered = 0;                      // members that answered every snapshot taken
};

StatsReport CollectStats(const CtlOptions& options, const StatsOptions& stats) {
  const std::vector<Endpoint> endpoints = Connect(options.members, options);
  StatsReport report;
  std::optional<Snapshot> first;
  if (stats.interval > absl::ZeroDuration()) {
    first = TakeSnapshot(endpoints, options.rpc_timeout);
    std::this_thread::sleep_until(first->sent + absl::ToChronoNanoseconds(stats.interval));
  }
  Snapshot last = TakeSnapshot(endpoints, options.rpc_timeout);
  for (size_t i = 0; i < last.members.size(); ++i) {
    const MemberStats& m = last.members[i];
    if (m.status.ok()) {
      AddCounters(m.stats, &report.totals);
      report.counter_totals.Add(m.stats);
    }
    bool answered = m.status.ok();
    if (first) {
      const MemberStats& f = first->members[i];
      answered = answered && f.status.ok();
      const double seconds = std::chrono::duration<double>(last.sent - first->sent).count();
      report.interval_s = seconds;
      std::optional<Rates> r;
      std::string problem;
      if (!f.status.ok()) {
        problem = absl::StrCat("first snapshot: ", DescribeFailure(f.status));
      } else if (m.status.ok()) {
        r = ComputeRates(f.stats, m.stats, seconds);
        if (!r) problem = "counters went down or the node id changed between snapshots (restarted?)";
      }
      if (r) {
        if (!report.total_rates) report.total_rates = Rates{};
        report.total_rates->Add(*r);
      }
      report.rates.push_back(r);
      report.rate_problems.push_back(std::move(problem));
    }
    report.answered += answered ? 1 : 0;
  }
  if (first && !report.total_rates) report.total_rates = Rates{};  // nobody had rates: zeros, not null
  report.members = std::move(last.members);
  return report;
}

Json StatsJson(const StatsReport& report) {
  Json members = Json::array();
  for (size_t i = 0; i < report.members.size(); ++i) {
    const MemberStats& m = report.members[i];
    Json j = {{"address", m.address},
              {"node_id", m.status.ok() ? Json(m.stats.node_id()) : Json(nullptr)},
              {"answered", m.status.ok()},
              {"error", m.status.ok() ? Json(nullptr) : Json(DescribeFailure(m.status))}};
    if (m.status.ok()) {
      AppendCountersJson(m.stats, j);
      j["counters"] = CountersJson(m.stats);
    }
    if (report.interval_s) j["rates"] = report.rates[i] ? report.rates[i]->ToJson() : Json(nullptr);
    members.push_back(std::move(j));
  }
  Json totals = {{"members_answered", report.answered}, {"members_total", report.members.size()}};
  AppendCountersJson(report.totals, totals);
  totals.erase("node_id");
  Json counters = Json::object();
  for (const std::string& name : report.counter_totals.names) counters[name] = report.counter_totals.sums.at(name);
  totals["counters"] = std::move(counters);
  if (report.interval_s) totals["rates"] = report.total_rates->ToJson();
  Json out = {{"members", members}, {"totals", totals}};
  if (report.interval_s) out["interval_s"] = *report.interval_s;
  return out;
}

// Every counter sample: one row each, a column per member (its value, "-" when it did not answer or
// does not have that sample), then the TOTAL.
void PrintCounters(const StatsReport& report, std::ostream& out) {
  std::vector<std::string> header = {"COUNTER"};
  std::vector<bool> right = {false};
  std::vector<absl::flat_hash_map<std::string, uint64_t>> by_member;
  for (const MemberStats& m : report.members) {
    header.push_back(m.status.ok() ? m.stats.node_id() : m.address);
    right.push_back(true);
    auto& values = by_member.emplace_back();
    if (m.status.ok()) {
      for (const v1::CounterSample& c : m.stats.counters()) values[c.name()] = c.value();
    }
  }
  header.push_back("TOTAL");
  right.push_back(true);
  Table table(std::move(header), std::move(right));
  for (const std::string& name : report.counter_totals.names) {
    std::vector<std::string> row = {name};
    for (const auto& values : by_member) {
      const auto it = values.find(name);
      row.push_back(it == values.end() ? "-" : absl::StrCat(it->second));
    }
    row.push_back(absl::StrCat(report.counter_totals.sums.at(name)));
    table.AddRow(std::move(row));
  }
  table.Print(out);
}

void PrintStats(const StatsReport& report, std::ostream& out, bool counters) {
  // Three narrow tables read better than one 16 columns wide. A member that did not answer shows its
  // address and dashes; the notes under the tables say why.
  auto name = [](const MemberStats& m) { return m.status.ok() ? m.stats.node_id() : m.address; };
  auto add_rows = [&](Table& table, auto cells) {
    for (const MemberStats& m : report.members) {
      std::vector<std::string> row = {name(m)};
      std::vector<std::string> c = cells(m.stats);
      if (!m.status.ok()) c.assign(c.size(), "-");
      row.insert(row.end(), c.begin(), c.end());
      table.AddRow(std::move(row));
    }
    std::vector<std::string> row = {"TOTAL"};
    std::vector<std::string> c = cells(report.totals);
    row.insert(row.end(), c.begin(), c.end());
    table.AddRow(std::move(row));
    table.Print(out);
  };
  auto n = [](uint64_t v) { return absl::StrCat(v); };

  Table reads({"NODE", "LOOKUPS", "HIT BLOCKS", "MISS BLOCKS", "HIT RATIO", "READ BLOCKS", "READ BYTES"},
              {false, true, true, true, true, true, true});
  add_rows(reads, [&](const v1::GetStatsResponse& s) {
    return std::vector<std::string>{
        n(s.lookup_requests()),    n(s.lookup_blocks_hit()),
        n(s.lookup_blocks_miss()), RatioText(HitRatio(s.lookup_blocks_hit(), s.lookup_blocks_miss())),
        n(s.read_blocks()),        HumanBytes(s.read_bytes())};
  });
  out << "\n";
  Table writes({"NODE", "COMMITTED", "ALREADY PRESENT", "EVICTIONS", "REJECTED NO SPACE", "REJECTED INVALID"},
               {false, true, true, true, true, true});
  add_rows(writes, [&](const v1::GetStatsResponse& s) {
    return std::vector<std::string>{n(s.committed_blocks()), n(s.already_present()), n(s.evictions()),
                                    n(s.rejections_no_space()), n(s.rejections_invalid())};
  });
  out << "\n";
  Table leases({"NODE", "CHECKSUM FAILURES", "ACTIVE LEASES", "EXPIRED LEASES", "EXPIRED RESERVATIONS"},
               {false, true, true, true, true});
  add_rows(leases, [&](const v1::GetStatsResponse& s) {
    return std::vector<std::string>{n(s.checksum_failures()), n(s.active_leases()), n(s.expired_leases()),
                                    n(s.expired_reservations())};
  });

  if (report.totals.shadow_lookup_blocks() + report.totals.shadow_read_blocks() > 0) {
    // Shadow namespaces (docs/config.md): answered "absent"; what would have been a hit.
    out << "\nshadow namespaces (never served):\n";
    Table shadow({"NODE", "LOOKUP BLOCKS", "WOULD-BE HITS", "WOULD-BE HIT RATIO", "READ BLOCKS"},
                 {false, true, true, true, true});
    add_rows(shadow, [&](const v1::GetStatsResponse& s) {
      return std::vector<std::string>{
          n(s.shadow_lookup_blocks()), n(s.shadow_hit_blocks()),
          RatioText(HitRatio(s.shadow_hit_blocks(), s.shadow_lookup_blocks() - s.shadow_hit_blocks())),
          n(s.shadow_read_blocks())};
    });
  }

  if (report.interval_s) {
    out << "\nper second, over " << absl::StrFormat("%.1f", *report.interval_s) << " s:\n";
    Table rates({"NODE", "LOOKUPS/S", "LOOKUP BLOCKS/S", "READ BLOCKS/S", "READ BYTES/S", "COMMITS/S", "EVICTIONS/S"},
                {false, true, true, true, true, true, true});
    auto f = [](double v) { return absl::StrFormat("%.1f", v); };
    auto cells = [&](const std::optional<Rates>& r) {
      if (!r) return std::vector<std::string>(6, "-");
      return std::vector<std::string>{f(r->lookup_requests),  f(r->lookup_blocks),
                                      f(r->read_blocks),      HumanBytes(static_cast<uint64_t>(r->read_bytes)) + "/s",
                                      f(r->committed_blocks), f(r->evictions)};
    };
    for (size_t i = 0; i < report.members.size(); ++i) {
      std::vector<std::string> row = {name(report.members[i])};
      std::vector<std::string> c = cells(report.rates[i]);
      row.insert(row.end(), c.begin(), c.end());
      rates.AddRow(std::move(row));
    }
    std::vector<std::string> row = {"TOTAL"};
    std::vector<std::string> c = cells(report.total_rates);
    row.insert(row.end(), c.begin(), c.end());
    rates.AddRow(std::move(row));
    rates.Print(out);
  }

  if (counters) {
    out << "\nevery counter (the samples /metrics serves):\n";
    PrintCounters(report, out);
  }

  out << "\ncluster: " << report.answered << "/" << report.members.size() << " members answered\n";
  for (size_t i = 0; i < report.members.size(); ++i) {
    const MemberStats& m = report.members[i];
    if (!m.status.ok()) {
      out << m.address << ": " << DescribeFailure(m.status) << "\n";
    } else if (report.interval_s && !report.rate_problems[i].empty()) {
      out << m.address << ": no rates: " << report.rate_problems[i] << "\n";
    }
  }
}

}  // namespace

int RunStats(const CtlOptions& options, const StatsOptions& stats) {
  const StatsReport report = CollectStats(options, stats);
  if (options.json) {
    std::cout << DumpJson(StatsJson(report)) << "\n";
  } else {
    PrintStats(report, std::cout, stats.counters);
  }
  return report.answered == report.members.size() ? kExitOk : kExitUnreachable;
}

}  // namespace kvtier::cli
