// policy_sim: replays a trace offline through the server's eviction policies and Belady's per-block
// optimum over a capacity sweep. See bench/policy_sim/README.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kvtier/server/eviction_policy.h"
#include "simulator.h"
#include "sweep_report.h"
#include "trace.h"

ABSL_FLAG(std::string, trace, "",
          "a Mooncake JSONL file, or a directory of kv-cache-tester session files (*.json) (required)");
ABSL_FLAG(uint64_t, limit, 0, "replay only the first N requests (0 = all)");
ABSL_FLAG(uint64_t, sessions, 0, "kv-cache-tester: take only the first N sessions (0 = all)");
ABSL_FLAG(double, session_spacing_s, 60,
          "kv-cache-tester: seconds between session starts (60 in the reference rules; for sensitivity studies)");
ABSL_FLAG(double, time_scale, 1, "divide every request time by this (a replay sped up; for sensitivity studies)");
ABSL_FLAG(std::string, policy, "all",
          "comma-separated policies: the server's (lru, weighted, ...), belady, or all (every one of them)");
ABSL_FLAG(std::string, capacities, "1953,5859,19531,inf", "comma-separated capacities in blocks; inf = infinite");
ABSL_FLAG(std::string, sweep, "",
          "MIN:MAX:POINTS adds POINTS capacities spaced geometrically from MIN to MAX blocks (rounded)");
ABSL_FLAG(uint64_t, disk_capacity, 0,
          "the server's tier structure: a disk tier of this many blocks (over all nodes) below each host "
          "capacity of the sweep, with demotion on host eviction (0 = a single tier; not for belady)");
ABSL_FLAG(double, disk_ratio, 0,
          "the tier structure with a disk tier of this many times each host capacity of the sweep (0 = none; "
          "instead of --disk_capacity)");
ABSL_FLAG(std::string, disk_policy, "",
          "with --disk_capacity: the disk tier's own policy (a server policy name; empty = the host tier's)");
ABSL_FLAG(uint32_t, disk_admit_min_requests, 0,
          "with --disk_capacity: write a host victim to disk only if its block was requested at least this "
          "many times so far (0 or 1 = every victim)");
ABSL_FLAG(bool, keep_disk_copy, false,
          "with --disk_capacity: a block promoted from disk keeps its disk copy, so its next demotion writes "
          "nothing (inclusive tiers, an experiment: the server's tiers are exclusive)");
ABSL_FLAG(bool, promote_on_hit, true, "with --disk_capacity: a hit on a disk block moves it back to host");
ABSL_FLAG(uint32_t, nodes, 1, "hash-partition the blocks over N nodes, each with capacity / N and its own policy");
ABSL_FLAG(double, frequency_weight, kvtier::server::EvictionPolicyOptions{}.frequency_weight,
          "weighted: the weight of the frequency term");
ABSL_FLAG(double, recency_weight, kvtier::server::EvictionPolicyOptions{}.recency_weight,
          "weighted: the weight of the recency term");
ABSL_FLAG(std::string, csv, "", "write the sweep as CSV to this file");
ABSL_FLAG(std::string, svg, "", "write a plot of hit ratio against capacity (SVG) to this file");
ABSL_FLAG(std::string, png, "",
          "write the plot as PNG to this file (the SVG rendered by rsvg-convert, Debian's librsvg2-bin)");
ABSL_FLAG(std::string, title, "", "the plot's title (default: the trace's file name)");
ABSL_FLAG(bool, json, false, "print one JSON object per (policy, capacity) instead of the table");

namespace {

using kvtier::bench::SweepPoint;

int Fail(const std::string& message) {
  std::fprintf(stderr, "policy_sim: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Replays a trace through eviction policies offline. See bench/policy_sim/README.md.");
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_trace);
  if (path.empty()) return Fail("--trace is required");

  // Capacities: the list, then the sweep; sorted, distinct, infinite last.
  std::vector<uint64_t> capacities;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_capacities), ',', absl::SkipWhitespace())) {
    uint64_t v = 0;
    if (c == "inf") {
      capacities.push_back(0);
    } else if (absl::SimpleAtoi(c, &v) && v > 0) {
      capacities.push_back(v);
    } else {
      return Fail(absl::StrCat("--capacities: \"", c, "\" is not a positive integer or inf"));
    }
  }
  if (const std::string sweep = absl::GetFlag(FLAGS_sweep); !sweep.empty()) {
    std::vector<std::string> parts = absl::StrSplit(sweep, ':');
    uint64_t lo = 0, hi = 0, points = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &lo) || !absl::SimpleAtoi(parts[1], &hi) ||
        !absl::SimpleAtoi(parts[2], &points) || lo == 0 || hi < lo || points < 2) {
      return Fail("--sweep must be MIN:MAX:POINTS with 0 < MIN <= MAX and POINTS >= 2");
    }
    for (uint64_t i = 0; i < points; ++i) {
      capacities.push_back(static_cast<uint64_t>(
          std::llround(lo * std::pow(static_cast<double>(hi) / lo, static_cast<double>(i) / (points - 1)))));
    }
  }
  std::sort(capacities.begin(), capacities.end(),
            [](uint64_t a, uint64_t b) { return (a == 0 ? UINT64_MAX : a) < (b == 0 ? UINT64_MAX : b); });
  capacities.erase(std::unique(capacities.begin(), capacities.end()), capacities.end());
  if (capacities.empty()) return Fail("no capacities given");

  // Policies: the server's, by name, plus belady.
  std::vector<std::string> policies;
  bool belady = false;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_policy), ',', absl::SkipWhitespace())) {
    if (p == "all") {
      for (const std::string& name : kvtier::server::EvictionPolicyNames()) policies.push_back(name);
      belady = true;
    } else if (p == "belady") {
      belady = true;
    } else {
      policies.emplace_back(p);
    }
  }
  kvtier::server::EvictionPolicyOptions policy_options;
  policy_options.frequency_weight = absl::GetFlag(FLAGS_frequency_weight);
  policy_options.recency_weight = absl::GetFlag(FLAGS_recency_weight);
  for (const std::string& name : policies) {
    if (auto p = kvtier::server::NewEvictionPolicy(name, policy_options); !p.ok()) {
      return Fail(std::string(p.status().message()));
    }
  }

  const auto t0 = std::chrono::steady_clock::now();
  auto trace = kvtier::bench::LoadSimTrace(path, absl::GetFlag(FLAGS_limit), absl::GetFlag(FLAGS_sessions),
                                           absl::GetFlag(FLAGS_session_spacing_s));
  if (!trace.ok()) return Fail(std::string(trace.status().message()));
  if (const double scale = absl::GetFlag(FLAGS_time_scale); scale != 1) {
    if (!(scale > 0)) return Fail("--time_scale must be > 0");
    for (int64_t& t : trace->time_ns) t = static_cast<int64_t>(static_cast<double>(t) / scale);
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool json = absl::GetFlag(FLAGS_json);
  const uint32_t nodes = absl::GetFlag(FLAGS_nodes);
  const double disk_ratio = absl::GetFlag(FLAGS_disk_ratio);
  if (!(disk_ratio >= 0) || (disk_ratio > 0 && absl::GetFlag(FLAGS_disk_capacity) != 0)) {
    return Fail("--disk_ratio must be >= 0, and not given with --disk_capacity");
  }
  // The table's and JSON's disk column: the flag, or (with --disk_ratio) nonzero for "tiered".
  const uint64_t disk_capacity = disk_ratio > 0 ? 1 : absl::GetFlag(FLAGS_disk_capacity);
  const std::string disk_policy = absl::GetFlag(FLAGS_disk_policy);
  if (!disk_policy.empty()) {
    if (disk_capacity == 0) return Fail("--disk_policy needs --disk_capacity or --disk_ratio");
    if (auto p = kvtier::server::NewEvictionPolicy(disk_policy, policy_options); !p.ok()) {
      return Fail(std::string(p.status().message()));
    }
  }
  const uint32_t admit_min_requests = absl::GetFlag(FLAGS_disk_admit_min_requests);
  const auto disk_blocks_at = [&](uint64_t capacity) -> uint64_t {
    return disk_ratio > 0 ? static_cast<uint64_t>(std::llround(disk_ratio * static_cast<double>(capacity)))
                          : disk_capacity;
  };
  const bool promote_on_hit = absl::GetFlag(FLAGS_promote_on_hit);
  if (disk_capacity != 0 && std::find(capacities.begin(), capacities.end(), 0) != capacities.end()) {
    return Fail("--disk_capacity needs finite host capacities (drop inf)");
  }
  if (!json) {
    std::printf("trace %s: %zu requests, %zu block accesses, %zu distinct blocks (%u tokens each); loaded in %.1f s\n",
                path.c_str(), trace->num_requests(), trace->num_accesses(), trace->num_distinct_blocks(),
                trace->block_tokens, load_s);
    std::printf("nodes %u; weighted: frequency %.3g, recency %.3g\n", nodes, policy_options.frequency_weight,
                policy_options.recency_weight);
    if (disk_capacity != 0) {
      const std::string disk = disk_ratio > 0 ? absl::StrCat(disk_ratio, " x capacity") : absl::StrCat(disk_capacity);
      std::printf(
          "tiers: host = capacity, disk = %s blocks (policy %s, admit after %u requests, promote_on_hit %s); "
          "belady is single-tier\n",
          disk.c_str(), disk_policy.empty() ? "as host" : disk_policy.c_str(), admit_min_requests,
          promote_on_hit ? "true" : "false");
    }
    std::printf("%-12s %12s %10s %9s %12s %12s %8s", "policy", "capacity", "hit_ratio", "%belady", "evictions",
                "not_admitted", "seconds");
    std::printf(disk_capacity != 0 ? " %10s %12s %12s\n" : "\n", "disk_hit", "disk_writes", "writes/hit");
  }

  std::vector<SweepPoint> points;
  auto report = [&](const SweepPoint& p) {
    points.push_back(p);
    const std::string cap = p.capacity_blocks == 0 ? std::string("inf") : absl::StrCat(p.capacity_blocks);
    if (json) {
      std::printf(
          "{\"policy\":\"%s\",\"capacity_blocks\":%s,\"disk_capacity_blocks\":%llu,\"nodes\":%u,"
          "\"hit_blocks\":%llu,\"blocks\":%llu,"
          "\"hit_ratio\":%.6f,\"belady_fraction\":%.4f,\"evictions\":%llu,\"not_admitted\":%llu,"
          "\"disk_hit_blocks\":%llu,\"demotions\":%llu,\"promotions\":%llu,\"disk_evictions\":%llu,"
          "\"disk_refused\":%llu,\"disk_writes\":%llu,\"orphaning_drops\":%llu,\"seconds\":%.3f}\n",
          p.policy.c_str(), p.capacity_blocks == 0 ? "null" : cap.c_str(),
          static_cast<unsigned long long>(p.policy == "belady" ? 0 : disk_blocks_at(p.capacity_blocks)), nodes,
          static_cast<unsigned long long>(p.hit_blocks), static_cast<unsigned long long>(p.blocks), p.hit_ratio,
          p.belady_fraction, static_cast<unsigned long long>(p.evictions),
          static_cast<unsigned long long>(p.not_admitted), static_cast<unsigned long long>(p.disk_hit_blocks),
          static_cast<unsigned long long>(p.demotions), static_cast<unsigned long long>(p.promotions),
          static_cast<unsigned long long>(p.disk_evictions), static_cast<unsigned long long>(p.disk_refused),
          static_cast<unsigned long long>(p.demotions - p.clean_demotions),
          static_cast<unsigned long long>(p.orphaning_drops), p.seconds);
    } else if (disk_capacity != 0 && p.policy != "belady") {
      std::printf(
          "%-12s %12s %10.4f %9s %12llu %12llu %8.2f %10.4f %12llu %12.3f\n", p.policy.c_str(), cap.c_str(),
          p.hit_ratio, p.belady_fraction > 0 ? absl::StrFormat("%.1f%%", 100 * p.belady_fraction).c_str() : "-",
          static_cast<unsigned long long>(p.evictions), static_cast<unsigned long long>(p.not_admitted), p.seconds,
          p.blocks == 0 ? 0.0 : static_cast<double>(p.disk_hit_blocks) / p.blocks,
          static_cast<unsigned long long>(p.demotions - p.clean_demotions),
          p.disk_hit_blocks == 0 ? 0.0 : static_cast<double>(p.demotions - p.clean_demotions) / p.disk_hit_blocks);
    } else {
      std::printf("%-12s %12s %10.4f %9s %12llu %12llu %8.2f\n", p.policy.c_str(), cap.c_str(), p.hit_ratio,
                  p.belady_fraction > 0 ? absl::StrFormat("%.1f%%", 100 * p.belady_fraction).c_str() : "-",
                  static_cast<unsigned long long>(p.evictions), static_cast<unsigned long long>(p.not_admitted),
                  p.seconds);
    }
    std::fflush(stdout);
  };
  for (uint64_t capacity : capacities) {
    const kvtier::bench::SimOptions sim{.capacity_blocks = capacity, .nodes = nodes};
    kvtier::bench::SimOptions tiered = sim;
    tiered.disk_capacity_blocks = disk_blocks_at(capacity);
    tiered.promote_on_hit = promote_on_hit;
    tiered.disk_admit_min_requests = admit_min_requests;
    tiered.keep_disk_copy = absl::GetFlag(FLAGS_keep_disk_copy);
    double belady_ratio = 0;
    if (belady) {
      const auto start = std::chrono::steady_clock::now();
      auto r = kvtier::bench::SimulateBelady(*trace, sim);
      if (!r.ok()) return Fail(std::string(r.status().message()));
      belady_ratio = r->hit_ratio();
      report({.policy = "belady",
              .capacity_blocks = capacity,
              .hit_blocks = r->hit_blocks,
              .blocks = r->blocks,
              .hit_ratio = r->hit_ratio(),
              .belady_fraction = 1.0,
              .evictions = r->evictions,
              .not_admitted = r->not_admitted,
              .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
    }
    for (const std::string& name : policies) {
      const auto start = std::chrono::steady_clock::now();
      auto r = kvtier::bench::SimulatePolicy(
          *trace, [&] { return kvtier::server::NewEvictionPolicy(name, policy_options); }, tiered,
          disk_policy.empty() ? kvtier::bench::PolicyFactory(nullptr) : kvtier::bench::PolicyFactory([&] {
            return kvtier::server::NewEvictionPolicy(disk_policy, policy_options);
          }));
      if (!r.ok()) return Fail(std::string(r.status().message()));
      report({.policy = name,
              .capacity_blocks = capacity,
              .hit_blocks = r->hit_blocks,
              .blocks = r->blocks,
              .hit_ratio = r->hit_ratio(),
              .belady_fraction = belady_ratio > 0 ? r->hit_ratio() / belady_ratio : 0.0,
              .evictions = r->evictions,
              .not_admitted = r->not_admitted,
              .disk_hit_blocks = r->disk_hit_blocks,
              .demotions = r->demotions,
              .clean_demotions = r->clean_demotions,
              .promotions = r->promotions,
              .disk_evictions = r->disk_evictions,
              .disk_refused = r->disk_refused,
              .orphaning_drops = r->orphaning_drops,
              .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
    }
  }
  if (const std::string csv = absl::GetFlag(FLAGS_csv); !csv.empty()) {
    if (absl::Status s = kvtier::bench::WriteSweepCsv(csv, points); !s.ok()) return Fail(std::string(s.message()));
  }
  const std::string png = absl::GetFlag(FLAGS_png);
  std::string svg = absl::GetFlag(FLAGS_svg);
  if (svg.empty() && !png.empty()) svg = png + ".svg";
  if (!svg.empty()) {
    std::string title = absl::GetFlag(FLAGS_title);
    if (title.empty()) {
      const size_t slash = path.find_last_of('/');
      title = absl::StrCat(slash == std::string::npos ? path : path.substr(slash + 1), ": ", trace->num_requests(),
                           " requests", nodes > 1 ? absl::StrCat(", ", nodes, " nodes") : "");
    }
    if (absl::Status s = kvtier::bench::WriteSweepSvg(svg, title, points); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  if (!png.empty()) {
    const std::string cmd = absl::StrCat("rsvg-convert --background-color=white -o '", png, "' '", svg, "'");
    if (png.find('\'') != std::string::npos || svg.find('\'') != std::string::npos) {
      return Fail("--png/--svg: file names may not contain a single quote");
    }
    if (std::system(cmd.c_str()) != 0) {
      return Fail(absl::StrCat("rendering ", png, " failed: is rsvg-convert (librsvg2-bin) installed?"));
    }
    if (absl::GetFlag(FLAGS_svg).empty()) std::remove(svg.c_str());
  }
  return 0;
}
