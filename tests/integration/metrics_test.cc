// /metrics of real kvtier-server processes: the exposition passes `promtool check metrics` after
// traffic; after a replay the servers' counters agree with what the client observed; every kvtier_*
// metric the deploy/ rules, alerts and dashboard name is one the server exports; and /metrics and
// GetStats list the same counters, every one the components' visitors name among them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kvtier/client/client.h"
#include "kvtier/common/counters.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/server/block_store.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtierctl_runner.h"
#include "replayer.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"
#include "workload.h"

namespace kvtier {
namespace {

using testing::ServerProcess;

// GET http://127.0.0.1:port/metrics (HTTP/1.0, so the body is not chunked); "" on any failure.
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos || !absl::StartsWith(response, "HTTP/1.") || response.find(" 200 ") > body) return "";
  return response.substr(body + 4);
}

// Sum of the samples of `name` whose label set contains every one of `labels` (e.g. `result="hit"`).
double Sample(const std::string& text, const std::string& name, const std::vector<std::string>& labels = {}) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    const absl::string_view series = line.substr(0, space);
    const size_t brace = series.find('{');
    if (series.substr(0, brace) != name) continue;
    bool match = true;
    for (const std::string& l : labels) match = match && absl::StrContains(series, l);
    double v = 0;
    if (match && absl::SimpleAtod(line.substr(space + 1), &v)) sum += v;
  }
  return sum;
}

// Runs `cmd` through the shell; returns its exit status and output (stdout and stderr).
std::pair<int, std::string> Shell(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Every sample of a scraped page: series (name and labels as exposed) -> value.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &v)) {
      out[std::string(line.substr(0, space))] = v;
    }
  }
  return out;
}

// "# TYPE name kind" of a scraped page: name -> kind.
std::map<std::string, std::string> Types(const std::string& text) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "# TYPE ")) continue;
    const std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() == 2) out[parts[0]] = parts[1];
  }
  return out;
}

bool HavePromtool() { return Shell("command -v promtool").first == 0; }

class MetricsTest : public ::testing::Test {
 protected:
  // `disk_dir` non-empty: each server gets a disk tier in a directory of its own under it.
  void StartCluster(const std::string& disk_dir = "") {
    for (int i = 1; i <= 3; ++i) {
      std::vector<std::string> args;
      if (!disk_dir.empty()) {
        args = {absl::StrCat("--disk_path=", disk_dir, "/db-", i), "--disk_capacity_bytes=16MiB"};
      }
      auto p = ServerProcess::Start("metrics-" + std::to_string(i), args);
      ASSERT_OK(p);
      members_.push_back((*p)->address());
      procs_.push_back(std::move(p).value());
    }
    auto c = client::Client::Connect({.members = members_});
    ASSERT_OK(c);
    client_ = std::move(c).value();
  }

  std::vector<std::string> members_;
  std::vector<std::unique_ptr<ServerProcess>> procs_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(MetricsTest, ExpositionPassesPromtoolCheckMetricsAfterTraffic) {
  if (!HavePromtool()) GTEST_SKIP() << "promtool not installed (Debian package prometheus; scripts/install-deps.sh)";
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  auto requests = bench::SyntheticWorkload({.sessions = 10, .max_turns = 3, .block_tokens = 16});
  auto rep = bench::Replay(*client_, requests, {.block_tokens = 16, .block_bytes = 1024});
  ASSERT_OK(rep);
  ASSERT_GT(rep->hit_blocks, 0u);

  for (const auto& proc : procs_) {
    const std::string text = Scrape(proc->metrics_port());
    ASSERT_FALSE(text.empty()) << "no /metrics on port " << proc->metrics_port();
    EXPECT_GT(Sample(text, "kvtier_lookup_requests_total"), 0) << text;
    EXPECT_NE(text.find("kvtier_rpc_duration_seconds_bucket{"), std::string::npos);
    char path[] = "/tmp/kvtier-metrics-XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    close(fd);
    const auto [code, out] = Shell(absl::StrCat("promtool check metrics < ", path));
    unlink(path);
    EXPECT_EQ(code, 0) << out;
    EXPECT_EQ(out, "") << "lint problems:\n" << out;
  }
}

TEST_F(MetricsTest, ServerCountersAgreeWithTheClientAfterAReplay) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  auto requests = bench::SyntheticWorkload({.sessions = 30, .max_turns = 4, .block_tokens = 32});
  auto rep = bench::Replay(*client_, requests, {.block_tokens = 32, .block_bytes = 2048});
  ASSERT_OK(rep);
  ASSERT_EQ(rep->client_errors, 0u);
  ASSERT_EQ(rep->misses_from_errors, 0u);
  ASSERT_GT(rep->hit_blocks, 0u);
  const client::ClientStats& cs = client_->stats();

  double served = 0, looked_up = 0, lookup_hits = 0, committed = 0, read_bytes = 0, lookup_requests = 0,
         lookup_rpcs = 0, read_rpcs = 0;
  for (const auto& proc : procs_) {
    const std::string text = Scrape(proc->metrics_port());
    ASSERT_FALSE(text.empty());
    served += Sample(text, "kvtier_read_blocks_total", {"result=\"hit\""});
    looked_up += Sample(text, "kvtier_lookup_blocks_total");
    lookup_hits += Sample(text, "kvtier_lookup_blocks_total", {"result=\"hit\""});
    committed += Sample(text, "kvtier_committed_blocks_total");
    read_bytes += Sample(text, "kvtier_transfer_bytes_total", {"direction=\"read\"", "transport=\"grpc\""});
    lookup_requests += Sample(text, "kvtier_lookup_requests_total");
    lookup_rpcs += Sample(text, "kvtier_rpc_duration_seconds_count", {"method=\"Lookup\"", "code=\"OK\""});
    read_rpcs += Sample(text, "kvtier_rpc_duration_seconds_count", {"method=\"Read\""});
  }
  // Blocks served = blocks fetched; existence queries = blocks looked up.
  EXPECT_EQ(served, static_cast<double>(cs.retrieve_hit_blocks.load()));
  EXPECT_EQ(served, static_cast<double>(rep->hit_blocks));
  EXPECT_EQ(looked_up, static_cast<double>(cs.lookup_blocks.load()));
  EXPECT_EQ(read_bytes, static_cast<double>(rep->bytes_fetched));
  EXPECT_EQ(committed, static_cast<double>(cs.put_stored_blocks.load()));
  // The histogram counts the same requests as the counter.
  EXPECT_EQ(lookup_rpcs, lookup_requests);
  EXPECT_GT(read_rpcs, 0);
  // Servers count every present block asked; the client's prefix hit counts only leading runs, so the
  // prefix and retrieve hit ratios come from the client and are at most the servers' existence ratio.
  EXPECT_GE(lookup_hits, static_cast<double>(cs.prefix_hit_blocks.load()));
  EXPECT_EQ(cs.prefix_hit_blocks.load(), rep->lookup_prefix_blocks);
}

TEST_F(MetricsTest, DeployRulesAndDashboardNameOnlyMetricsTheServerExports) {
  char dir_template[] = "/tmp/kvtier-metrics-disk-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  // A disk tier, so that the disk series exist too.
  ASSERT_NO_FATAL_FAILURE(StartCluster(dir_template));
  auto requests = bench::SyntheticWorkload({.sessions = 4, .max_turns = 2, .block_tokens = 16});
  ASSERT_OK(bench::Replay(*client_, requests, {.block_tokens = 16, .block_bytes = 1024}));
  const std::string text = Scrape(procs_[0]->metrics_port());
  ASSERT_FALSE(text.empty());
  std::set<std::string> exported;  // from "# TYPE name type"; histograms add their series' suffixes
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "# TYPE ")) continue;
    const std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 2) continue;
    exported.insert(parts[0]);
    if (parts[1] == "histogram") {
      for (const char* s : {"_bucket", "_sum", "_count"}) exported.insert(parts[0] + s);
    }
  }
  ASSERT_TRUE(exported.count("kvtier_lookup_blocks_total")) << text;

  const std::filesystem::path deploy = std::filesystem::path(testing::SourceDir()) / "deploy";
  std::vector<std::filesystem::path> files = {deploy / "grafana" / "kvtier-dashboard.json"};
  for (const auto& e : std::filesystem::directory_iterator(deploy / "prometheus")) files.push_back(e.path());
  // kvtier_* names, but not inside a recording rule's name (instance:kvtier_usage_ratio).
  const std::regex metric(R"((^|[^:A-Za-z0-9_])(kvtier_[a-z0-9_]+))");
  size_t names = 0;
  for (const auto& f : files) {
    std::ifstream in(f);
    ASSERT_TRUE(in) << f;
    std::stringstream s;
    s << in.rdbuf();
    const std::string body = s.str();
    for (auto it = std::sregex_iterator(body.begin(), body.end(), metric); it != std::sregex_iterator(); ++it) {
      ++names;
      const std::string name = (*it)[2].str();
      EXPECT_TRUE(exported.count(name)) << f.filename() << " names " << name << ", which kvtier-server does not export";
    }
  }
  EXPECT_GT(names, 10u);
  std::error_code ignored;
  procs_.clear();
  std::filesystem::remove_all(dir_template, ignored);
}

TEST_F(MetricsTest, MetricsAndGetStatsListEveryCounterOfTheVisitors) {
  char dir_template[] = "/tmp/kvtier-metrics-all-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  ASSERT_NO_FATAL_FAILURE(StartCluster(dir_template));  // a disk tier, so that its counters are listed
  auto requests = bench::SyntheticWorkload({.sessions = 4, .max_turns = 2, .block_tokens = 16});
  ASSERT_OK(bench::Replay(*client_, requests, {.block_tokens = 16, .block_bytes = 1024}));

  for (const auto& proc : procs_) {
    SCOPED_TRACE(proc->address());
    auto stub = v1::AdminService::NewStub(grpc::CreateChannel(proc->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::GetStatsResponse stats;
    ASSERT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
    const std::string text = Scrape(proc->metrics_port());
    ASSERT_FALSE(text.empty());
    const std::map<std::string, double> samples = Samples(text);
    const std::map<std::string, std::string> types = Types(text);

    // Every sample GetStats lists is on /metrics, of the same kind; counters with the same value (no
    // traffic runs between the two reads; gauges such as free bytes may move).
    std::set<std::string> listed;
    for (const v1::CounterSample& c : stats.counters()) {
      EXPECT_TRUE(listed.insert(c.name()).second) << "listed twice: " << c.name();
      const auto it = samples.find(c.name());
      ASSERT_NE(it, samples.end()) << c.name() << " is in GetStats but not on /metrics";
      const std::string family = c.name().substr(0, c.name().find('{'));
      EXPECT_EQ(types.at(family), c.kind() == v1::CounterSample::GAUGE ? "gauge" : "counter") << family;
      if (c.kind() == v1::CounterSample::COUNTER) {
        EXPECT_EQ(it->second, static_cast<double>(c.value())) << c.name();
      }
    }
    // And the other way: every kvtier_ sample on /metrics but the histograms and build info is listed.
    for (const auto& [series, value] : samples) {
      if (!absl::StartsWith(series, "kvtier_") || absl::StartsWith(series, "kvtier_rpc_duration_seconds") ||
          absl::StartsWith(series, "kvtier_build_info")) {
        continue;
      }
      EXPECT_TRUE(listed.count(series)) << series << " is on /metrics but not in GetStats";
    }
    // The components' visitors: every sample of the block store's and the disk tier's is listed.
    size_t store_samples = 0;
    auto expect_listed = [&](const CounterInfo& info, uint64_t) {
      ++store_samples;
      EXPECT_TRUE(listed.count(SampleName(info))) << SampleName(info) << " is not in GetStats";
    };
    server::BlockStoreStats().ForEach(expect_listed, {.hbm = false, .disk = true});
    server::DiskTierStatus().ForEach(expect_listed);
    EXPECT_GT(store_samples, 40u);

    // The typed fields are filled as before and agree with the list.
    std::map<std::string, uint64_t> by_name;
    for (const v1::CounterSample& c : stats.counters()) by_name[c.name()] = c.value();
    EXPECT_GT(stats.committed_blocks(), 0u);
    EXPECT_EQ(by_name.at("kvtier_committed_blocks_total"), stats.committed_blocks());
    EXPECT_EQ(by_name.at("kvtier_committed_bytes_total"), stats.committed_bytes());
    EXPECT_EQ(by_name.at("kvtier_lookup_blocks_total{result=\"hit\"}"), stats.lookup_blocks_hit());
    EXPECT_EQ(by_name.at("kvtier_read_bytes_total"), stats.read_bytes());
    EXPECT_EQ(by_name.at("kvtier_stored_blocks{tier=\"disk\"}"), stats.disk_blocks());
    EXPECT_EQ(by_name.at("kvtier_capacity_bytes{tier=\"host\"}"), stats.capacity_bytes());
    EXPECT_EQ(by_name.at("kvtier_disk_io_errors_total{op=\"write\"}"), stats.disk_write_errors());
    EXPECT_EQ(by_name.at("kvtier_transfer_bytes_total{direction=\"read\",transport=\"grpc\"}"),
              stats.grpc_read_bytes());
    EXPECT_EQ(by_name.at("kvtier_rejections_total{reason=\"invalid_argument\"}"), stats.rejections_invalid());
    // Counters the typed fields never had are there too (quota, defrag).
    EXPECT_TRUE(by_name.count("kvtier_quota_evictions_total"));
    EXPECT_TRUE(by_name.count("kvtier_defrag_moved_blocks_total"));
  }
  std::error_code ignored;
  procs_.clear();
  std::filesystem::remove_all(dir_template, ignored);
}

}  // namespace
}  // namespace kvtier
