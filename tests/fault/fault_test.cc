// Fault tests with real processes (tests/fault/README.md): three kvtier-server processes with disk
// tiers, the real trace_replay binary replaying the built-in chat workload against them at a steady
// pace, and a fault injected while it runs: a server killed with SIGKILL and restarted on its disk, a
// server cut off by a network partition (a network namespace whose link goes down) and healed, and a
// server restarted with an empty disk under the same node id, and a server whose disk volume fills. trace_replay
// reports every window of kWindowRequests requests (--report_interval_requests), so the test sees the hit ratio, the
// misses from errors and the lookup latency before, during and after each fault.
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fault_harness.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::Child;
using testing::FaultServer;
using testing::NetnsLink;
using testing::NowUnixMs;
using testing::PhaseStats;
using testing::ReadMetric;
using testing::ServerSpec;
using testing::SumWindows;

// The replay: the first kRequests requests of the built-in chat workload (32 KiB blocks of 512 tokens),
// paced at trace time / kTimeScale (about 30 s), reported every kWindowRequests requests.
constexpr int kRequests = 1000;
constexpr int kWindowRequests = 40;
constexpr double kTimeScale = 24;
constexpr int kFaultAfterWindow = 7;  // fault once window 7 (requests 280..319) is reported
constexpr int kHealAfterWindow = 16;  // heal (restart, reconnect) once window 16 is reported
// The client's deadline per RPC (trace_replay --rpc_timeout_ms) and its health checks (ClientOptions
// defaults: every 1 s, 1 s deadline, ejected after 3 failures in a row, back after 2 passes).
constexpr int64_t kRpcTimeoutMs = 500;
constexpr int64_t kHealthIntervalMs = 1000, kHealthTimeoutMs = 1000, kUnhealthyThreshold = 3;
// Misses from errors must stop once the member is ejected: 3 failed checks (each up to interval +
// deadline), then calls already in flight finish within one RPC deadline; plus 2 s of slack for a
// loaded 2-core machine.
constexpr int64_t kErrorsStopWithinMs =
    kUnhealthyThreshold * (kHealthIntervalMs + kHealthTimeoutMs) + kRpcTimeoutMs + 2000;
// A healed or restarted member is back (2 passing checks, a node-id query and gRPC's reconnect) within this.
constexpr int64_t kRejoinWithinMs = 10000;
// LookupPrefix returns within rpc_timeout of its start (its RPCs get that less a 10 ms reserve); the
// measured latency may exceed it only by scheduling noise on a loaded 2-core machine.
constexpr double kLookupSlackMs = 25;

// Servers: 4 MiB of host memory (128 blocks) and a disk tier each, so that most of each server's
// ~900 blocks live on disk and survive a SIGKILL; block bytes over UCX (loopback).
const std::vector<std::string> kServerArgs = {"--host_cache_bytes=4MiB", "--slab_bytes=1MiB", "--max_block_bytes=1MiB",
                                              "--disk_capacity_bytes=1GiB", "--ucx_listen_address=127.0.0.1:0"};

std::string TraceReplayBinary() { return testing::BinaryDir() + "/bench/trace_replay/trace_replay"; }

// True when trace_replay passes --replication_factor to the client.
bool TraceReplayHasReplication() {
  std::string help;
  testing::Shell(TraceReplayBinary() + " --helpfull", &help);
  return help.find("replication_factor") != std::string::npos;
}

// What the test does while the replay runs.
struct FaultPlan {
  std::function<absl::Status()> inject;  // after window kFaultAfterWindow
  std::function<absl::Status()> heal;    // after window kHealAfterWindow; may be empty
  std::function<bool()> rejoined;        // polled after the heal until true; may be empty
};

// What happened.
struct FaultRun {
  int exit_code = -1;
  std::string log;        // trace_replay's stderr
  std::string ucx_line;   // its count of blocks moved over UCX
  nlohmann::json report;  // the final report
  std::vector<nlohmann::json> windows;
  int64_t fault_ms = 0, heal_ms = 0, rejoin_ms = 0;  // Unix ms; 0 = did not happen
  int64_t last_error_ms = 0;  // end of the last request with a miss from error or a put error before the heal
  PhaseStats before, during, after, recovered;

  int64_t errors_stopped_after_ms() const { return last_error_ms > 0 ? last_error_ms - fault_ms : 0; }
  std::string Summary() const {
    nlohmann::json totals = report;
    if (totals.is_object()) totals.erase("windows");
    return absl::StrCat("before:    ", before.ToString(), "\nduring:    ", during.ToString(),
                        "\nafter:     ", after.ToString(), "\nrecovered: ", recovered.ToString(),
                        "\nmisses from errors stopped ", errors_stopped_after_ms(), " ms after the fault; rejoined ",
                        rejoin_ms > 0 ? rejoin_ms - heal_ms : -1, " ms after the heal\n", ucx_line,
                        "\ntotal: ", totals.dump());
  }
};

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/kvtier-fault-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override {
    servers_.clear();  // kills what still runs
    netns_.reset();
    if (!HasFailure()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    } else {
      std::fprintf(stderr, "logs kept in %s\n", dir_.c_str());
    }
  }

  std::string DiskPath(const std::string& node_id) const {
    if (auto it = disk_paths_.find(node_id); it != disk_paths_.end()) return it->second;
    return dir_ + "/disk-" + node_id;
  }

  // Starts node-1..3; node_in_netns (1-based, 0 = none) runs inside netns_ and listens on its address.
  void StartCluster(int node_in_netns = 0) {
    for (int i = 1; i <= 3; ++i) {
      ServerSpec spec{.node_id = absl::StrCat("node-", i),
                      .disk_path = DiskPath(absl::StrCat("node-", i)),
                      .extra_args = kServerArgs};
      if (i == node_in_netns) {
        spec.host = netns_->ns_ip();
        spec.exec_prefix = netns_->ExecPrefix();
        // The client's UCX runs on loopback only (UCX_NET_DEVICES=lo), so this member's block bytes
        // go over gRPC.
        spec.extra_args.push_back("--ucx_listen_address=none");
      }
      auto s = FaultServer::Start(spec, dir_);
      ASSERT_OK(s);
      servers_.push_back(*std::move(s));
    }
  }

  // Kills server `i` (0-based) and starts it again on the same address and node id; with
  // `wipe_disk` its disk directory is deleted in between.
  absl::Status Restart(size_t i, bool wipe_disk) {
    ServerSpec spec = servers_[i]->spec();
    spec.grpc_port = servers_[i]->grpc_port();
    servers_[i]->Kill();
    if (wipe_disk) {
      std::error_code ec;
      std::filesystem::remove_all(spec.disk_path, ec);
      if (ec) return absl::InternalError(absl::StrCat("cannot delete ", spec.disk_path, ": ", ec.message()));
    }
    auto s = FaultServer::Start(spec, dir_);
    if (!s.ok()) return s.status();
    servers_[i] = *std::move(s);
    return absl::OkStatus();
  }

  std::vector<std::string> Members() const {
    std::vector<std::string> m;
    for (const auto& s : servers_) m.push_back(s->address());
    return m;
  }

  std::vector<std::string> ReplayArgs(uint32_t replication_factor, bool paced, int64_t rpc_timeout_ms) const {
    std::vector<std::string> args = {TraceReplayBinary(),
                                     "--members=" + absl::StrJoin(Members(), ","),
                                     "--json",
                                     absl::StrCat("--limit=", kRequests),
                                     absl::StrCat("--report_interval_requests=", kWindowRequests),
                                     absl::StrCat("--rpc_timeout_ms=", rpc_timeout_ms)};
    if (paced) args.push_back(absl::StrCat("--time_scale=", kTimeScale));
    if (replication_factor != 1) args.push_back(absl::StrCat("--replication_factor=", replication_factor));
    return args;
  }

  // Runs trace_replay to the end, applying `plan` as its windows arrive, and sums the phases.
  FaultRun Replay(const FaultPlan& plan, uint32_t replication_factor = 1, bool paced = true,
                  int64_t rpc_timeout_ms = kRpcTimeoutMs) {
    FaultRun run;
    const std::string log = absl::StrCat(dir_, "/trace_replay-", ++replays_, ".log");
    auto child = Child::Start(ReplayArgs(replication_factor, paced, rpc_timeout_ms), log, /*capture_stdout=*/true);
    EXPECT_OK(child);
    if (!child.ok()) return run;
    int64_t last_poll_ms = 0;
    const absl::Time give_up = absl::Now() + absl::Seconds(240);
    std::string line;
    while (absl::Now() < give_up) {
      const Child::Read r = (*child)->ReadLine(&line, absl::Milliseconds(100));
      if (r == Child::Read::kEof) break;
      if (r == Child::Read::kLine) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded()) {
          // Not a report: UCX writes its own warnings to stdout.
          std::fprintf(stderr, "trace_replay stdout: %s\n", line.c_str());
        } else if (j.contains("window")) {
          run.windows.push_back(j["window"]);
          const int index = j["window"]["index"].get<int>();
          if (index == kFaultAfterWindow && plan.inject) {
            run.fault_ms = NowUnixMs();
            const absl::Status injected = plan.inject();
            EXPECT_OK(injected);
          }
          if (index == kHealAfterWindow && plan.heal) {
            run.heal_ms = NowUnixMs();
            const absl::Status healed = plan.heal();
            EXPECT_OK(healed);
          }
        } else if (j.contains("requests")) {
          run.report = std::move(j);  // the final report; other lines (e.g. {"servers": ...}) are skipped
        }
      }
      if (run.heal_ms > 0 && run.rejoin_ms == 0 && plan.rejoined && NowUnixMs() - last_poll_ms >= 200) {
        last_poll_ms = NowUnixMs();
        if (plan.rejoined()) run.rejoin_ms = last_poll_ms;
      }
    }
    const int status = (*child)->Kill(SIGKILL);  // already gone unless it hung
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    testing::Shell("cat " + log, &run.log);
    if (const size_t ucx = run.log.find("over UCX:"); ucx != std::string::npos) {
      run.ucx_line = run.log.substr(ucx, run.log.find('\n', ucx) - ucx);
    }

    for (const auto& w : run.windows) {
      if (run.heal_ms == 0 || w["start_unix_ms"].get<int64_t>() < run.heal_ms) {
        run.last_error_ms = std::max(run.last_error_ms, w["last_error_unix_ms"].get<int64_t>());
      }
    }
    const int64_t fault_end = std::max(run.fault_ms, run.last_error_ms);
    const int64_t heal = run.heal_ms > 0 ? run.heal_ms : INT64_MAX;
    auto start = [](const nlohmann::json& w) { return w["start_unix_ms"].get<int64_t>(); };
    auto end = [](const nlohmann::json& w) { return w["end_unix_ms"].get<int64_t>(); };
    run.before = SumWindows(run.windows, [&](const nlohmann::json& w) {
      const int i = w["index"].get<int>();
      return i > kFaultAfterWindow - 3 && i <= kFaultAfterWindow;
    });
    if (run.fault_ms > 0) {
      run.during = SumWindows(run.windows, [&](const nlohmann::json& w) {
        return end(w) >= run.fault_ms && start(w) <= fault_end && w["index"].get<int>() > kFaultAfterWindow;
      });
      run.after =
          SumWindows(run.windows, [&](const nlohmann::json& w) { return start(w) > fault_end && end(w) <= heal; });
    }
    if (run.rejoin_ms > 0) {
      run.recovered = SumWindows(run.windows, [&](const nlohmann::json& w) { return start(w) >= run.rejoin_ms; });
    }
    if (run.fault_ms > 0) std::fprintf(stderr, "%s\n", run.Summary().c_str());
    return run;
  }

  // The guarantees of every fault: the replay ran to the end without a client error or a wrong byte,
  // the fault cost misses from errors, and they stopped within kErrorsStopWithinMs.
  void ExpectCorrectAndBounded(const FaultRun& run, bool expect_misses_from_errors = true) {
    ASSERT_FALSE(run.report.is_null()) << "no report from trace_replay:\n" << run.log;
    EXPECT_EQ(run.exit_code, 0) << run.log;
    EXPECT_EQ(run.report["requests"].get<int>(), kRequests) << "every request completes";
    EXPECT_EQ(run.report["client_errors"].get<int>(), 0);
    EXPECT_EQ(run.report["payload_mismatches"].get<int>(), 0);
    EXPECT_EQ(run.report["checksum_failures"].get<int>(), 0);
    EXPECT_EQ(run.windows.size(), static_cast<size_t>((kRequests + kWindowRequests - 1) / kWindowRequests));
    EXPECT_GT(run.fault_ms, 0);
    if (expect_misses_from_errors) {
      EXPECT_GT(run.report["misses_from_errors"].get<int>() + run.report["put_errors"].get<int>(), 0)
          << "the fault was never seen";
    }
    EXPECT_LE(run.errors_stopped_after_ms(), kErrorsStopWithinMs)
        << "misses from errors went on after the member should have been ejected";
    EXPECT_GE(run.before.windows, 3u);
    EXPECT_GE(run.after.windows, 1u) << "no window between the end of the errors and the heal";
    EXPECT_EQ(run.after.misses_from_errors + run.after.put_errors, 0u);
  }

  std::string dir_;
  std::map<std::string, std::string> disk_paths_;  // node id -> disk directory, when not under dir_
  int replays_ = 0;
  std::unique_ptr<NetnsLink> netns_;
  std::vector<std::unique_ptr<FaultServer>> servers_;
};

// Kill -9 node-2 mid-replay, then restart it on its disk: the kill costs misses (never errors or wrong
// bytes), which stop once the client ejects it; lookups stay within the deadline; the restarted server
// serves its disk tier again and the hit ratio recovers.
TEST_F(FaultTest, KilledServerCostsBoundedMissesThenRecoversItsDiskTierOnRestart) {
  StartCluster();
  FaultPlan plan{
      .inject =
          [&] {
            servers_[1]->Kill();
            return absl::OkStatus();
          },
      .heal = [&] { return Restart(1, /*wipe_disk=*/false); },
      .rejoined =
          [&] {
            auto v = ReadMetric(servers_[1]->metrics_address(), "kvtier_lookup_requests_total");
            return v.ok() && *v > 0;
          },
  };
  const FaultRun run = Replay(plan);
  ExpectCorrectAndBounded(run);
  // A refused connection fails at once: the dead owner costs far less than the deadline.
  EXPECT_LE(run.during.max_p99_lookup_ms, kRpcTimeoutMs);
  auto recovered = ReadMetric(servers_[1]->metrics_address(), "kvtier_recovered_blocks");
  ASSERT_OK(recovered);
  EXPECT_GT(*recovered, 0) << "the restarted server found no block on its disk";
  std::fprintf(stderr, "node-2 found %.0f blocks on its disk at restart\n", *recovered);
  ASSERT_GT(run.rejoin_ms, 0) << "the restarted server never served a lookup";
  EXPECT_LE(run.rejoin_ms - run.heal_ms, kRejoinWithinMs);
  auto hits = ReadMetric(servers_[1]->metrics_address(), "kvtier_read_blocks_total", "result=\"hit\"");
  ASSERT_OK(hits);
  EXPECT_GT(*hits, 0) << "the restarted server served no block";
  EXPECT_GE(run.recovered.windows, 3u);
  EXPECT_GT(run.recovered.hit_ratio(), run.during.hit_ratio());
}

// The same kill with every block on two owners (--replication_factor=2): reads of the dead owner's
// blocks fail over to the other owner within the call, so most of the hit ratio survives the kill.
TEST_F(FaultTest, KilledServerWithReplicationFactorTwoKeepsMostOfTheHitRatio) {
  if (!TraceReplayHasReplication()) GTEST_SKIP() << "trace_replay has no --replication_factor";
  StartCluster();
  FaultPlan plan{
      .inject =
          [&] {
            servers_[1]->Kill();
            return absl::OkStatus();
          },
      .heal = [&] { return Restart(1, /*wipe_disk=*/false); },
      .rejoined =
          [&] {
            auto v = ReadMetric(servers_[1]->metrics_address(), "kvtier_lookup_requests_total");
            return v.ok() && *v > 0;
          },
  };
  const FaultRun run = Replay(plan, /*replication_factor=*/2);
  ExpectCorrectAndBounded(run, /*expect_misses_from_errors=*/false);
  EXPECT_LE(run.during.max_p99_lookup_ms, kRpcTimeoutMs);
  EXPECT_GE(run.during.hit_ratio(), 0.8 * run.before.hit_ratio()) << "replication kept too few hits";
  ASSERT_GT(run.rejoin_ms, 0) << "the restarted server never served a lookup";
  EXPECT_LE(run.rejoin_ms - run.heal_ms, kRejoinWithinMs);
}

// node-2 runs in its own network namespace behind a veth pair; mid-replay its link goes down (packets
// vanish: every call to it hangs until its deadline), later it comes back. The partition costs misses
// (never errors or wrong bytes) that stop once the client ejects it, lookups return within the deadline
// (LookupPrefix returns within rpc_timeout of its start), and after the heal node-2 rejoins with the
// blocks it kept and serves them again. With R=2 the other owner serves node-2's blocks meanwhile.
class PartitionTest : public FaultTest {
 protected:
  // Runs the partition with `replication_factor`; false (with a skip) when namespaces are refused here.
  bool RunPartition(uint32_t replication_factor, FaultRun* run, double* read_hits_at_heal) {
    auto link = NetnsLink::Create();
    if (absl::IsFailedPrecondition(link.status())) {
      skip_reason_ = std::string(link.status().message());
      return false;
    }
    EXPECT_OK(link);
    if (!link.ok()) return false;
    netns_ = *std::move(link);
    StartCluster(/*node_in_netns=*/2);
    double lookups_at_heal = 0;
    FaultPlan plan{
        .inject = [&] { return netns_->Cut(); },
        .heal =
            [&] {
              if (absl::Status healed = netns_->Heal(); !healed.ok()) return healed;
              // Ejected by now, so the client sends it nothing until it rejoins. The link takes a moment to
              // carry packets again.
              const absl::Time deadline = absl::Now() + absl::Seconds(5);
              while (true) {
                auto lookups = ReadMetric(servers_[1]->metrics_address(), "kvtier_lookup_requests_total");
                auto hits = ReadMetric(servers_[1]->metrics_address(), "kvtier_read_blocks_total", "result=\"hit\"");
                if (lookups.ok() && hits.ok()) {
                  lookups_at_heal = *lookups;
                  *read_hits_at_heal = *hits;
                  return absl::OkStatus();
                }
                if (absl::Now() > deadline) return lookups.ok() ? hits.status() : lookups.status();
                absl::SleepFor(absl::Milliseconds(100));
              }
            },
        .rejoined =
            [&] {
              // More than a few lookups, so that requests cut off in flight and delivered late do not count.
              auto v = ReadMetric(servers_[1]->metrics_address(), "kvtier_lookup_requests_total");
              return v.ok() && *v > lookups_at_heal + 5;
            },
    };
    *run = Replay(plan, replication_factor);
    return true;
  }

  void ExpectRejoinedAndServing(const FaultRun& run, double read_hits_at_heal) {
    ASSERT_GT(run.rejoin_ms, 0) << "the healed server never served a lookup again";
    EXPECT_LE(run.rejoin_ms - run.heal_ms, kRejoinWithinMs);
    auto hits = ReadMetric(servers_[1]->metrics_address(), "kvtier_read_blocks_total", "result=\"hit\"");
    ASSERT_OK(hits);
    EXPECT_GT(*hits, read_hits_at_heal) << "the healed server served none of its blocks";
    EXPECT_GE(run.recovered.windows, 3u);
  }

  std::string skip_reason_;
};

TEST_F(PartitionTest, PartitionedServerCostsBoundedMissesWithinTheDeadlineAndRejoinsWhenHealed) {
  FaultRun run;
  double read_hits_at_heal = 0;
  if (!RunPartition(1, &run, &read_hits_at_heal)) GTEST_SKIP() << skip_reason_;
  ExpectCorrectAndBounded(run);
  EXPECT_GT(run.during.misses_from_errors, 0u);
  EXPECT_LE(run.during.max_p99_lookup_ms, kRpcTimeoutMs + kLookupSlackMs);
  ExpectRejoinedAndServing(run, read_hits_at_heal);
  EXPECT_GT(run.recovered.hit_ratio(), run.during.hit_ratio());
}

TEST_F(PartitionTest, PartitionedServerWithReplicationFactorTwoKeepsMostOfTheHitRatio) {
  if (!TraceReplayHasReplication()) GTEST_SKIP() << "trace_replay has no --replication_factor";
  FaultRun run;
  double read_hits_at_heal = 0;
  if (!RunPartition(2, &run, &read_hits_at_heal)) GTEST_SKIP() << skip_reason_;
  ExpectCorrectAndBounded(run, /*expect_misses_from_errors=*/false);
  EXPECT_LE(run.during.max_p99_lookup_ms, kRpcTimeoutMs + kLookupSlackMs);
  EXPECT_GE(run.during.hit_ratio(), 0.8 * run.before.hit_ratio()) << "replication kept too few hits";
  ExpectRejoinedAndServing(run, read_hits_at_heal);
}

// node-2 is killed mid-replay and restarted at once under the same node id and address with its disk
// deleted. Its blocks are gone, so clients must get misses for them, never stale or wrong bytes, and
// the client's checksum check must never fire; a later replay reads back what was stored since.
TEST_F(FaultTest, ServerRestartedWithAnEmptyDiskServesMissesNeverStaleBytes) {
  StartCluster();
  FaultPlan plan{.inject = [&] { return Restart(1, /*wipe_disk=*/true); }};
  const FaultRun run = Replay(plan);
  ExpectCorrectAndBounded(run, /*expect_misses_from_errors=*/false);
  auto recovered = ReadMetric(servers_[1]->metrics_address(), "kvtier_recovered_blocks");
  ASSERT_OK(recovered);
  EXPECT_EQ(*recovered, 0) << "the disk was deleted";
  auto misses = ReadMetric(servers_[1]->metrics_address(), "kvtier_lookup_blocks_total", "result=\"miss\"");
  ASSERT_OK(misses);
  EXPECT_GT(*misses, 0) << "clients never asked the restarted server for a block it lost";
  auto checksum = ReadMetric(servers_[1]->metrics_address(), "kvtier_checksum_failures_total");
  if (checksum.ok()) {
    EXPECT_EQ(*checksum, 0);
  }

  // A fresh client replays the same requests: everything node-2 holds now was put after its restart
  // and comes back byte for byte. This replay checks bytes, not fault bounds, and runs unpaced: with
  // the fault replay's 500 ms deadline, a 2-core machine running other tests beside it stalls the
  // servers past the deadline, and such misses would be load, not faults. So it gets 2 s.
  const FaultRun again = Replay(FaultPlan{}, 1, /*paced=*/false, /*rpc_timeout_ms=*/2000);
  ASSERT_FALSE(again.report.is_null()) << again.log;
  std::fprintf(stderr, "fresh replay after the restart: hit ratio %.4f, %d mismatches, %d checksum failures; %s\n",
               again.report["block_hit_ratio"].get<double>(), again.report["payload_mismatches"].get<int>(),
               again.report["checksum_failures"].get<int>(), again.ucx_line.c_str());
  EXPECT_EQ(again.exit_code, 0) << again.log;
  EXPECT_EQ(again.report["requests"].get<int>(), kRequests);
  EXPECT_EQ(again.report["payload_mismatches"].get<int>(), 0);
  EXPECT_EQ(again.report["checksum_failures"].get<int>(), 0);
  EXPECT_EQ(again.report["client_errors"].get<int>(), 0);
  // Misses from errors here are load (a fresh client's UCX endpoints dropped by a stalled 2-core
  // machine fall back to gRPC past their deadline), not the fault: bounded at 2% of the blocks, while
  // wrong bytes stay at exactly 0.
  EXPECT_LE(again.report["misses_from_errors"].get<int>(), again.report["blocks"].get<int>() / 50) << again.ucx_line;
  EXPECT_GT(again.report["block_hit_ratio"].get<double>(), run.report["block_hit_ratio"].get<double>());
  auto hits = ReadMetric(servers_[1]->metrics_address(), "kvtier_read_blocks_total", "result=\"hit\"");
  ASSERT_OK(hits);
  EXPECT_GT(*hits, 0);
}

// node-2's disk tier is on a 64 MiB tmpfs of its own; mid-replay a filler file takes every free byte of
// it, later it is deleted. A full disk is not a failed server: no client error, no miss from error, no
// wrong byte; node-2 serves on from host memory (the disk tier degraded-full, host evictions dropped),
// and its disk tier resumes by itself once the space is back.
class DiskFullFaultTest : public FaultTest {
 protected:
  void TearDown() override {
    FaultTest::TearDown();
    if (!volume_.empty()) {
      umount2(volume_.c_str(), MNT_DETACH);
      rmdir(volume_.c_str());
    }
  }
  std::string volume_;
};

uint64_t VolumeFreeBytes(const std::string& dir) {
  struct statvfs st {};
  return statvfs(dir.c_str(), &st) == 0 ? static_cast<uint64_t>(st.f_bavail) * st.f_frsize : 0;
}

TEST_F(DiskFullFaultTest, TheDiskFillsUnderTraceReplayAndTheServerGoesOnFromMemoryThenResumes) {
  char vol[] = "/tmp/kvtier-fault-vol-XXXXXX";
  ASSERT_NE(mkdtemp(vol), nullptr);
  if (mount("tmpfs", vol, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=0700") != 0) {
    const std::string why = strerror(errno);
    rmdir(vol);
    GTEST_SKIP() << "mounting a tmpfs is not permitted here (mount(2): " << why << "); needs CAP_SYS_ADMIN";
  }
  volume_ = vol;
  disk_paths_["node-2"] = volume_ + "/db";
  StartCluster();
  const std::string filler = volume_ + "/filler";
  const std::string metrics = servers_[1]->metrics_address();
  auto state_is = [&](const char* state) {
    auto v = ReadMetric(metrics, "kvtier_disk_tier_state", absl::StrCat("state=\"", state, "\""));
    return v.ok() && *v == 1;
  };
  double hits_at_fault = 0, hits_at_heal = 0, refused_at_heal = 0, demotions_at_heal = 0;
  bool full_at_heal = false;
  FaultPlan plan{
      .inject =
          [&] {
            auto hits = ReadMetric(metrics, "kvtier_read_blocks_total", "result=\"hit\"");
            hits_at_fault = hits.ok() ? *hits : 0;
            // Every free byte of the volume, as another writer on it would take them.
            std::FILE* f = std::fopen(filler.c_str(), "wb");
            if (f == nullptr) return absl::InternalError("cannot create the filler");
            static const std::vector<char> chunk(1 << 20, 0);
            while (VolumeFreeBytes(volume_) > 0 && std::fwrite(chunk.data(), 1, chunk.size(), f) > 0) {
            }
            std::fclose(f);
            return absl::OkStatus();
          },
      .heal =
          [&] {
            full_at_heal = state_is("degraded-full");
            auto hits = ReadMetric(metrics, "kvtier_read_blocks_total", "result=\"hit\"");
            auto refused = ReadMetric(metrics, "kvtier_disk_spill_refused_total");
            auto demoted = ReadMetric(metrics, "kvtier_tier_moves_total", "to=\"disk\"");
            hits_at_heal = hits.ok() ? *hits : 0;
            refused_at_heal = refused.ok() ? *refused : 0;
            demotions_at_heal = demoted.ok() ? *demoted : 0;
            std::error_code ec;
            std::filesystem::remove(filler, ec);
            return ec ? absl::InternalError(ec.message()) : absl::OkStatus();
          },
      .rejoined = [&] { return state_is("ok"); },
  };
  const FaultRun run = Replay(plan);
  ExpectCorrectAndBounded(run, /*expect_misses_from_errors=*/false);
  // The server never went away: not one miss from error or put error.
  EXPECT_EQ(run.report["misses_from_errors"].get<int>(), 0);
  EXPECT_EQ(run.report["put_errors"].get<int>(), 0);
  EXPECT_TRUE(full_at_heal) << "node-2's disk tier should have been degraded-full while the volume was full";
  EXPECT_GT(refused_at_heal, 0) << "host evictions should have been dropped, not spilled";
  EXPECT_GT(hits_at_heal, hits_at_fault) << "node-2 stopped serving while its disk was full";
  ASSERT_GT(run.rejoin_ms, 0) << "the disk tier never resumed";
  EXPECT_LE(run.rejoin_ms - run.heal_ms, kRejoinWithinMs);
  auto demoted = ReadMetric(metrics, "kvtier_tier_moves_total", "to=\"disk\"");
  ASSERT_OK(demoted);
  EXPECT_GT(*demoted, demotions_at_heal) << "nothing spilled to disk after the tier resumed";
  std::fprintf(stderr,
               "disk full: node-2 spills refused %.0f, read hits during the fault %.0f, disk tier ok %lld ms after "
               "the filler was deleted, %.0f blocks spilled since\n",
               refused_at_heal, hits_at_heal - hits_at_fault, static_cast<long long>(run.rejoin_ms - run.heal_ms),
               *demoted - demotions_at_heal);
}

}  // namespace
}  // namespace kvtier
