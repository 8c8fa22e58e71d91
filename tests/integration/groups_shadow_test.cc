// Similarity groups and shadow namespaces against a real 3-process cluster: a namespace in shadow mode
// (config `namespaces: [{tenant, shadow: true}]`) stores puts but answers every lookup and read as a
// miss, while `kvtierctl stats`, `kvtierctl groups` and /metrics report the would-be hits; the group key
// that LookupPrefix sends is aggregated per group across members by `kvtierctl groups`.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kvtier/client/client.h"
#include "kvtier/common/similarity.h"
#include "kvtierctl_runner.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::ParseJson;
using testing::RunCtl;
using testing::ServerProcess;

Namespace MakeNamespace(const std::string& tenant) {
  Namespace ns;
  ns.tenant = tenant;
  ns.model = "llama-groups";
  ns.layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64, .block_tokens = 16};
  return ns;
}

// GET /metrics over HTTP/1.0; "" on any failure.
std::string ScrapeMetrics(int port) {
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
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of the sample line that starts with `prefix` (e.g. `kvtier_x{result="hit"}`), or -1.
double Sample(const std::string& text, const std::string& prefix) {
  size_t pos = 0;
  while ((pos = text.find(prefix, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') {
      const size_t end = text.find('\n', pos);
      return std::stod(text.substr(pos + prefix.size(), end - pos - prefix.size()));
    }
    pos += prefix.size();
  }
  return -1;
}

class GroupsShadowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvtier-groups-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    config_ = std::string(dir) + "/kvtier.yaml";
    std::ofstream(config_) << "namespaces:\n  - tenant: shadowco\n    shadow: true\n";
    for (const char* id : {"grp-a", "grp-b", "grp-c"}) {
      auto p = ServerProcess::Start(id, {"--config=" + config_});
      ASSERT_OK(p);
      servers_.push_back(std::move(p).value());
    }
    std::vector<std::string> addrs;
    for (const auto& s : servers_) addrs.push_back(s->address());
    members_ = absl::StrJoin(addrs, ",");
    auto c = client::Client::Connect({.members = addrs});
    ASSERT_OK(c);
    client_ = std::move(c).value();
  }
  void TearDown() override {
    servers_.clear();
    std::remove(config_.c_str());
  }
  std::string Ctl(const std::string& rest) const {
    return absl::StrCat("--members ", members_, " --timeout-ms 5000 ", rest);
  }

  std::string config_;
  std::string members_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(GroupsShadowTest, ShadowNamespaceStoresButNeverServesAndReportsWouldBeHits) {
  constexpr size_t kBlocks = 12;
  const Namespace served = MakeNamespace("acme");
  const Namespace shadow = MakeNamespace("shadowco");
  auto sp = testing::MakePrompt(served, kBlocks, 11);
  auto hp = testing::MakePrompt(shadow, kBlocks, 22);
  ASSERT_OK(sp);
  ASSERT_OK(hp);
  ASSERT_OK(testing::PutPrompt(*client_, served, *sp));
  ASSERT_OK(testing::PutPrompt(*client_, shadow, *hp));  // stored: the would-be hits are real

  auto served_hit = client_->LookupPrefix(served, sp->fps);
  ASSERT_OK(served_hit);
  EXPECT_EQ(served_hit->prefix_blocks, kBlocks);
  auto shadow_hit = client_->LookupPrefix(shadow, hp->fps);
  ASSERT_OK(shadow_hit);
  EXPECT_EQ(shadow_hit->prefix_blocks, 0u);  // never served
  EXPECT_EQ(shadow_hit->blocks_from_errors, 0u);

  // Gets of a shadow namespace miss, although every block is stored.
  std::vector<std::vector<std::byte>> bufs(kBlocks, std::vector<std::byte>(shadow.layout.ShardBytes()));
  std::vector<std::span<std::byte>> spans(bufs.begin(), bufs.end());
  auto got = client_->Get(shadow, hp->fps, 0, spans);
  ASSERT_OK(got);
  for (client::GetResult r : *got) EXPECT_EQ(r, client::GetResult::kMiss);
  auto served_got = client_->Get(served, sp->fps, 0, spans);
  ASSERT_OK(served_got);
  for (client::GetResult r : *served_got) EXPECT_EQ(r, client::GetResult::kHit);

  // kvtierctl stats: the would-be hits, cluster-wide.
  auto stats = RunCtl(Ctl("--json stats"));
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  auto sj = ParseJson(stats.output);
  ASSERT_FALSE(sj.is_discarded()) << stats.output;
  EXPECT_EQ(sj["totals"]["shadow_lookup_blocks"], kBlocks);
  EXPECT_EQ(sj["totals"]["shadow_hit_blocks"], kBlocks);
  EXPECT_EQ(sj["totals"]["shadow_read_blocks"], kBlocks);
  EXPECT_DOUBLE_EQ(sj["totals"]["shadow_would_be_hit_ratio"].get<double>(), 1.0);
  auto human = RunCtl(Ctl("stats"));
  EXPECT_NE(human.output.find("WOULD-BE HITS"), std::string::npos) << human.output;

  // kvtierctl groups: both prompts' groups, merged across the members that own their blocks.
  auto groups = RunCtl(Ctl("--json groups --limit 0"));
  ASSERT_EQ(groups.exit_code, 0) << groups.output;
  auto gj = ParseJson(groups.output);
  ASSERT_FALSE(gj.is_discarded()) << groups.output;
  const std::string served_key = absl::StrFormat("%016x", PromptGroupKey(sp->fps));
  const std::string shadow_key = absl::StrFormat("%016x", PromptGroupKey(hp->fps));
  bool saw_served = false, saw_shadow = false;
  for (const auto& g : gj["groups"]) {
    if (g["group_key"] == served_key) {
      saw_served = true;
      EXPECT_EQ(g["blocks"], kBlocks);
      EXPECT_EQ(g["hit_blocks"], kBlocks);
      EXPECT_DOUBLE_EQ(g["hit_ratio"].get<double>(), 1.0);
      EXPECT_EQ(g["shadow_blocks"], 0u);
    }
    if (g["group_key"] == shadow_key) {
      saw_shadow = true;
      EXPECT_EQ(g["blocks"], kBlocks);
      EXPECT_EQ(g["hit_blocks"], 0u);
      EXPECT_EQ(g["shadow_hit_blocks"], kBlocks);
      EXPECT_DOUBLE_EQ(g["shadow_would_be_hit_ratio"].get<double>(), 1.0);
    }
  }
  EXPECT_TRUE(saw_served) << groups.output;
  EXPECT_TRUE(saw_shadow) << groups.output;
  auto groups_table = RunCtl(Ctl("groups"));
  EXPECT_EQ(groups_table.exit_code, 0);
  EXPECT_NE(groups_table.output.find(served_key), std::string::npos) << groups_table.output;

  // /metrics: the would-be hits summed over the members.
  double hits = 0, misses = 0;
  for (const auto& s : servers_) {
    const std::string text = ScrapeMetrics(s->metrics_port());
    hits += Sample(text, "kvtier_shadow_lookup_blocks_total{result=\"hit\"} ");
    misses += Sample(text, "kvtier_shadow_lookup_blocks_total{result=\"miss\"} ");
  }
  EXPECT_EQ(hits, static_cast<double>(kBlocks));
  EXPECT_EQ(misses, 0.0);
}

TEST_F(GroupsShadowTest, AMissingMemberMakesGroupsExitUnreachable) {
  servers_.back().reset();
  auto r = RunCtl(Ctl("--json groups"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  auto j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["members_answered"], 2);
}

}  // namespace
}  // namespace kvtier
