// kvtierctl: the kvtier admin CLI (docs/kvtierctl.md).
//   kvtierctl --members host:port,... status [--json]
//   kvtierctl --members host:port,... stats [--interval-s N] [--json]
// main() is the only code that reads argv or the environment (KVTIER_MEMBERS); everything above it takes a
// CtlOptions. Every member is asked in parallel under one deadline, so a dead member costs at most
// --timeout-ms, and the report is printed with whatever answered (exit code 3 says something did not).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <latch>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvtier/common/hash_ring.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/wire/wire.h"

namespace kvtier::cli {
namespace {

using Json = nlohmann::ordered_json;  // keeps keys in the order written, which follows the proto
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// Exit codes; the --help footer and docs/kvtierctl.md list them too.
constexpr int kExitOk = 0;           // every member answered (status: and is SERVING)
constexpr int kExitFailure = 1;      // anything else, e.g. two members reporting one node id
constexpr int kExitUsage = 2;        // bad flags or arguments (CLI11 errors)
constexpr int kExitUnreachable = 3;  // some member did not answer or is not SERVING; the report is printed

constexpr uint64_t kMaxMessageBytes = 4ULL << 20;  // admin replies are small
constexpr uint32_t kVirtualNodes = 128;            // ring points per member, as the client's default

struct CtlOptions {
  std::vector<std::string> members;                       // host:port, in the order given; required
  absl::Duration rpc_timeout = absl::Milliseconds(2000);  // deadline of every RPC
  bool json = false;                                      // one JSON object on stdout instead of tables
  absl::Duration stats_interval = absl::ZeroDuration();   // stats: > 0 takes two snapshots this far apart
};

// ---------------------------------------------------------------------------------------------------
// RPCs

// One channel per member, shared by its two stubs.
struct Endpoint {
  std::string address;
  std::unique_ptr<v1::AdminService::Stub> admin;
  std::unique_ptr<Health::Stub> health;
};

std::vector<Endpoint> Connect(const std::vector<std::string>& members) {
  const grpc::ChannelArguments args = wire::ChannelArgs(kMaxMessageBytes);
  std::vector<Endpoint> out;
  for (const std::string& address : members) {
    auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    out.push_back({address, v1::AdminService::NewStub(channel), Health::NewStub(channel)});
  }
  return out;
}

// One unary RPC made with the callback API; it must outlive its callback.
template <typename Req, typename Resp>
struct Call {
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
  grpc::Status status;
};
template <typename Req, typename Resp>
using Calls = std::vector<std::unique_ptr<Call<Req, Resp>>>;

// Starts one call per endpoint with start(endpoint, call, on_done), each under a deadline of `timeout`
// and without wait_for_ready (a member that refuses connections fails at once). Each finished call
// counts `done` down; read the calls only after done.wait().
template <typename Req, typename Resp, typename StartFn>
Calls<Req, Resp> StartCalls(const std::vector<Endpoint>& endpoints, absl::Duration timeout, std::latch& done,
                            StartFn start) {
  Calls<Req, Resp> calls;
  for (const Endpoint& ep : endpoints) {
    calls.push_back(std::make_unique<Call<Req, Resp>>());
    Call<Req, Resp>* c = calls.back().get();
    c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    start(ep, c, [c, &done](grpc::Status s) {
      c->status = std::move(s);
      done.count_down();
    });
  }
  return calls;
}

bool IsUnreachable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// "unreachable (UNAVAILABLE: ...)" or "error (UNIMPLEMENTED: ...)".
std::string DescribeFailure(const grpc::Status& s) {
  return absl::StrCat(IsUnreachable(s) ? "unreachable" : "error", " (", wire::FromGrpc(s).ToString(), ")");
}

// ---------------------------------------------------------------------------------------------------
// Formatting

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1023.95 && u + 1 < std::size(kUnits)) {  // 1023.95 would print as "1024.0"
    v /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[u]);
}

std::string HumanDuration(uint64_t ms) {
  const uint64_t s = ms / 1000;
  if (s == 0) return absl::StrCat(ms, "ms");
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100 * fraction); }

// hit / (hit + miss); nullopt when nothing was asked.
std::optional<double> HitRatio(uint64_t hit, uint64_t miss) {
  if (hit + miss == 0) return std::nullopt;
  return static_cast<double>(hit) / static_cast<double>(hit + miss);
}
std::string RatioText(std::optional<double> r) { return r ? absl::StrFormat("%.3f", *r) : "-"; }
Json RatioJson(std::optional<double> r) { return r ? Json(*r) : Json(nullptr); }

std::string DumpJson(const Json& j) {
  // Replace rather than throw on invalid UTF-8 (node ids and gRPC messages come from the network).
  return j.dump(2, ' ', false, Json::error_handler_t::replace);
}

// Columns separated by two spaces; numeric columns right-aligned; no trailing blanks.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<bool> right_aligned)
      : right_(std::move(right_aligned)) {
    rows_.push_back(std::move(header));
  }
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(std::ostream& out) const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (const auto& row : rows_) {
      std::string line;
      for (size_t c = 0; c < row.size(); ++c) {
        const std::string pad(width[c] - row[c].size(), ' ');
        if (c > 0) line += "  ";
        line += right_[c] ? pad + row[c] : row[c] + pad;
      }
      out << std::string(absl::StripTrailingAsciiWhitespace(line)) << "\n";
    }
  }

 private:
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;  // [0] is the header
};

// ---------------------------------------------------------------------------------------------------
// status

struct MemberStatus {
  std::string address;
  grpc::Status health_status;
  HealthCheckResponse health;
  grpc::Status info_status;
  v1::GetInfoResponse info;
  std::optional<double> ring_share;  // set when the member answered GetInfo and the ring was built

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
  const std::vector<Endpoint> endpoints = Connect(options.members);
  std::latch done(static_cast<std::ptrdiff_t>(2 * endpoints.size()));
  auto health = StartCalls<HealthCheckRequest, HealthCheckResponse>(
      endpoints, options.rpc_timeout, done,
      [](const Endpoint& ep, auto* c, auto cb) { ep.health->async()->Check(&c->ctx, &c->req, &c->resp, cb); });
  auto info = StartCalls<v1::GetInfoRequest, v1::GetInfoResponse>(
      endpoints, options.rpc_timeout, done,
      [](const Endpoint& ep, auto* c, auto cb) { ep.admin->async()->GetInfo(&c->ctx, &c->req, &c->resp, cb); });
  done.wait();

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
    if (m.info_status.ok()) {
      ids.push_back(m.info.node_id());
      id_member.push_back(i);
      for (const v1::TierInfo& t : m.info.tiers()) {
        if (tiers.insert(t.tier()).second) report.tiers.push_back(t.tier());
      }
    }
    report.members.push_back(std::move(m));
  }
  SortTiers(report.tiers);
  if (!ids.empty()) {
    auto ring = HashRing::Create(ids, kVirtualNodes);
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
      t.capacity_bytes += ti.capacity_bytes();
      t.used_bytes += ti.used_bytes();
      t.blocks += ti.blocks();
    }
  }
  return t;
}

size_t CountUp(const StatusReport& report) {
  return static_cast<size_t>(std::count_if(report.members.begin(), report.members.end(),
                                           [](const MemberStatus& m) { return m.up(); }));
}

Json StatusJson(const StatusReport& report) {
  Json members = Json::array();
  for (const MemberStatus& m : report.members) {
    const bool has_info = m.info_status.ok();
    Json tiers = Json::array();
    for (const v1::TierInfo& t : m.info.tiers()) {
      tiers.push_back({{"tier", t.tier()},
                       {"capacity_bytes", t.capacity_bytes()},
                       {"used_bytes", t.used_bytes()},
                       {"blocks", t.blocks()}});
    }
    const std::string problem = m.Problem();
    auto info_field = [&](auto v) { return has_info ? Json(v) : Json(nullptr); };
    members.push_back({{"address", m.address},
                       {"node_id", info_field(m.info.node_id())},
                       {"health", m.HealthText()},
                       {"up", m.up()},
                       {"ring_share", m.ring_share ? Json(*m.ring_share) : Json(nullptr)},
                       {"tiers", tiers},
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
    tiers.push_back({{"tier", name},
                     {"capacity_bytes", t.capacity_bytes},
                     {"used_bytes", t.used_bytes},
                     {"blocks", t.blocks}});
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
  }
  header.insert(header.end(), {"POLICY", "TRANSPORT", "UPTIME"});
  right.insert(right.end(), {false, false, true});
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
      } else {
        row.push_back(absl::StrCat(HumanBytes(it->used_bytes()), " / ", HumanBytes(it->capacity_bytes())));
        row.push_back(absl::StrCat(it->blocks()));
      }
    }
    if (has_info) {
      row.insert(row.end(), {m.info.eviction_policy(), m.info.transport(), HumanDuration(m.info.uptime_ms())});
    } else {
      row.insert(row.end(), {"-", "-", "-"});
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
  }
  if (!report.ring_status.ok()) out << "ring: " << report.ring_status.ToString() << "\n";
}

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

// ---------------------------------------------------------------------------------------------------
// stats

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
  std::latch done(static_cast<std::ptrdiff_t>(endpoints.size()));
  auto calls = StartCalls<v1::GetStatsRequest, v1::GetStatsResponse>(
      endpoints, timeout, done,
      [](const Endpoint& ep, auto* c, auto cb) { ep.admin->async()->GetStats(&c->ctx, &c->req, &c->resp, cb); });
  done.wait();
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
    return {{"lookup_requests_per_s", lookup_requests}, {"lookup_blocks_per_s", lookup_blocks},
            {"read_blocks_per_s", read_blocks},         {"read_bytes_per_s", read_bytes},
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

struct StatsReport {
  std::vector<MemberStats> members;             // the latest snapshot
  std::vector<std::optional<Rates>> rates;      // per member; empty without --interval-s
  std::vector<std::string> rate_problems;       // per member, why it has no rates ("" when it has)
  std::optional<double> interval_s;             // measured time between the snapshots
  v1::GetStatsResponse totals;                  // sums over the members that answered the latest snapshot
  std::optional<Rates> total_rates;             // sum of the members' rates
  size_t answered = 0;                          // members that answered every snapshot taken
};

StatsReport CollectStats(const CtlOptions& options) {
  const std::vector<Endpoint> endpoints = Connect(options.members);
  StatsReport report;
  std::optional<Snapshot> first;
  if (options.stats_interval > absl::ZeroDuration()) {
    first = TakeSnapshot(endpoints, options.rpc_timeout);
    std::this_thread::sleep_until(first->sent + absl::ToChronoNanoseconds(options.stats_interval));
  }
  Snapshot last = TakeSnapshot(endpoints, options.rpc_timeout);
  for (size_t i = 0; i < last.members.size(); ++i) {
    const MemberStats& m = last.members[i];
    if (m.status.ok()) AddCounters(m.stats, &report.totals);
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
    if (m.status.ok()) AppendCountersJson(m.stats, j);
    if (report.interval_s) j["rates"] = report.rates[i] ? report.rates[i]->ToJson() : Json(nullptr);
    members.push_back(std::move(j));
  }
  Json totals = {{"members_answered", report.answered}, {"members_total", report.members.size()}};
  AppendCountersJson(report.totals, totals);
  totals.erase("node_id");
  if (report.interval_s) totals["rates"] = report.total_rates->ToJson();
  Json out = {{"members", members}, {"totals", totals}};
  if (report.interval_s) out["interval_s"] = *report.interval_s;
  return out;
}

void PrintStats(const StatsReport& report, std::ostream& out) {
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
    return std::vector<std::string>{n(s.lookup_requests()), n(s.lookup_blocks_hit()), n(s.lookup_blocks_miss()),
                                    RatioText(HitRatio(s.lookup_blocks_hit(), s.lookup_blocks_miss())),
                                    n(s.read_blocks()), HumanBytes(s.read_bytes())};
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

  if (report.interval_s) {
    out << "\nper second, over " << absl::StrFormat("%.1f", *report.interval_s) << " s:\n";
    Table rates({"NODE", "LOOKUPS/S", "LOOKUP BLOCKS/S", "READ BLOCKS/S", "READ BYTES/S", "COMMITS/S", "EVICTIONS/S"},
                {false, true, true, true, true, true, true});
    auto f = [](double v) { return absl::StrFormat("%.1f", v); };
    auto cells = [&](const std::optional<Rates>& r) {
      if (!r) return std::vector<std::string>(6, "-");
      return std::vector<std::string>{f(r->lookup_requests), f(r->lookup_blocks), f(r->read_blocks),
                                      HumanBytes(static_cast<uint64_t>(r->read_bytes)) + "/s",
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

int RunStats(const CtlOptions& options) {
  const StatsReport report = CollectStats(options);
  if (options.json) {
    std::cout << DumpJson(StatsJson(report)) << "\n";
  } else {
    PrintStats(report, std::cout);
  }
  return report.answered == report.members.size() ? kExitOk : kExitUnreachable;
}

constexpr const char* kFooter =
    "Members come from --members or, when it is absent, from the environment variable KVTIER_MEMBERS\n"
    "(the same comma-separated host:port list).\n"
    "\n"
    "Exit codes:\n"
    "  0  every member answered (status: and reports SERVING)\n"
    "  1  other failure (e.g. two members report the same node id)\n"
    "  2  usage error (bad flag or argument)\n"
    "  3  some member is unreachable, failed, or is not SERVING; the report is still printed\n"
    "\n"
    "See docs/kvtierctl.md.";

}  // namespace
}  // namespace kvtier::cli

int main(int argc, char** argv) {
  using namespace kvtier::cli;
  CLI::App app{"kvtierctl: inspect a kvtier cluster."};
  app.footer(kFooter);
  app.require_subcommand(1);
  app.fallthrough();  // global options may also follow the subcommand: `kvtierctl status --json`

  std::vector<std::string> members;
  app.add_option("--members", members, "Comma-separated host:port of every member (gRPC address)")
      ->delimiter(',')
      ->expected(1)
      ->allow_extra_args(false)  // one list per --members: a stray word is an error, not a member
      ->take_all()   // --members may be repeated; the lists are joined
      ->envname("KVTIER_MEMBERS")
      ->required()
      ->type_name("HOST:PORT,...")
      ->check([](const std::string& m) -> std::string {
        const absl::string_view s = absl::StripAsciiWhitespace(m);
        if (s.empty()) return "";  // tolerate "a:1,,b:2" and a trailing comma
        const size_t colon = s.rfind(':');
        if (colon == absl::string_view::npos || colon == 0 || colon + 1 == s.size()) {
          return absl::StrCat("\"", m, "\" is not host:port");
        }
        return "";
      });
  int64_t timeout_ms = 2000;
  app.add_option("--timeout-ms", timeout_ms, "Deadline of each RPC, in milliseconds")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}))
      ->capture_default_str();
  bool json = false;
  app.add_flag("--json", json, "Print one JSON object instead of tables");

  CLI::App* status = app.add_subcommand(
      "status", "Health, node id, ring share, usage per tier, policy, transport and uptime of each member");
  CLI::App* stats = app.add_subcommand(
      "stats", "Lookup, read, write, eviction, rejection and lease counters of each member, with cluster totals");
  double interval_s = 0;
  stats->add_option("--interval-s", interval_s,
                    "Take two snapshots this many seconds apart and also print per-second rates")
      ->check(CLI::Range(0.001, 86400.0));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;  // --help exits 0
  }

  CtlOptions options;
  absl::flat_hash_set<std::string> seen;
  for (const std::string& m : members) {
    const std::string address(absl::StripAsciiWhitespace(m));
    if (address.empty()) continue;
    if (!seen.insert(address).second) {
      std::cerr << "--members: " << address << " is given twice\n" << "Run with --help for more information.\n";
      return kExitUsage;
    }
    options.members.push_back(address);
  }
  if (options.members.empty()) {
    std::cerr << "--members: no member given\nRun with --help for more information.\n";
    return kExitUsage;
  }
  options.rpc_timeout = absl::Milliseconds(timeout_ms);
  options.json = json;
  options.stats_interval = absl::Seconds(interval_s);

  try {
    return status->parsed() ? RunStatus(options) : RunStats(options);
  } catch (const std::exception& e) {  // e.g. std::bad_alloc; nothing of ours throws
    std::cerr << "kvtierctl: " << e.what() << "\n";
    return kExitFailure;
  }
}
