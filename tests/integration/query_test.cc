// The index query endpoints (/query, /query_by_hash; docs/query.md) of real server processes, asked
// over HTTP and with `kvtierctl query`: per-tier prefixes and per-block tiers as the admin API reports
// them, after evictions and demotions to the disk tier; agreement with `kvtierctl lookup` on a 3-server
// cluster; engine block hashes; admin-token auth; malformed requests.
#include <civetweb.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvtier/client/client.h"
#include "kvtier/common/block_meta.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/namespace_json.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtierctl_runner.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using nlohmann::json;
using testing::CtlResult;
using testing::ParseJson;
using testing::Prompt;
using testing::RunCtl;
using testing::ServerProcess;

Namespace TestNamespace() {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "llama-query";
  ns.layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64, .block_tokens = 16};  // 16 KiB blocks
  return ns;
}
constexpr const char* kNamespaceFlags =
    "--tenant acme --model llama-query --num-layers 2 --kv-heads 2 --head-dim 64 --block-tokens 16";

struct HttpAnswer {
  int status = -1;
  std::string body;
  json j;
};

// One HTTP request to 127.0.0.1:`port`, with the civetweb client kvtierctl uses.
HttpAnswer Http(int port, const std::string& method, const std::string& path, const std::string& body,
                const std::string& token = "") {
  static const int init = mg_init_library(0);
  (void)init;
  HttpAnswer a;
  char ebuf[256] = {0};
  mg_connection* conn = mg_connect_client("127.0.0.1", port, 0, ebuf, sizeof(ebuf));
  if (conn == nullptr) return a;
  std::string head = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ", body.size(),
                                  "\r\nConnection: close\r\n");
  if (!token.empty()) absl::StrAppend(&head, "Authorization: Bearer ", token, "\r\n");
  head += "\r\n";
  mg_write(conn, head.data(), head.size());
  mg_write(conn, body.data(), body.size());
  if (mg_get_response(conn, ebuf, sizeof(ebuf), 10000) >= 0) {
    a.status = mg_get_response_info(conn)->status_code;
    char buf[8192];
    for (int n; (n = mg_read(conn, buf, sizeof(buf))) > 0;) a.body.append(buf, static_cast<size_t>(n));
    a.j = json::parse(a.body, nullptr, false);
  }
  mg_close_connection(conn);
  return a;
}

std::string TokenQuery(const Namespace& ns, const std::vector<uint32_t>& tokens) {
  return json{{"namespace", NamespaceToJson(ns, true)}, {"token_ids", tokens}}.dump();
}

// The tier the admin API reports for (fp, shard 0) on `address`; "" when absent.
std::string AdminTier(const std::string& address, const Fingerprint& fp) {
  auto stub = v1::AdminService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::InspectBlockRequest req;
  req.set_fingerprint(std::string(reinterpret_cast<const char*>(fp.bytes.data()), fp.bytes.size()));
  req.set_shard(0);
  v1::InspectBlockResponse resp;
  EXPECT_TRUE(stub->InspectBlock(&ctx, req, &resp).ok());
  return resp.found() ? resp.block().tier() : "";
}

std::string WriteTokens(const std::vector<uint32_t>& tokens) {
  char path[] = "/tmp/kvtier-query-tokens-XXXXXX";
  const int fd = mkstemp(path);
  close(fd);
  std::ofstream out(path);
  for (uint32_t t : tokens) out << t << " ";
  return path;
}

// A server with a 1 MiB host tier (64 blocks of 16 KiB at most) over a disk tier, so a long prompt
// spills its older blocks to disk.
absl::StatusOr<std::unique_ptr<ServerProcess>> SmallHostServer(const std::string& id, const std::string& disk_dir,
                                                               std::vector<std::string> extra = {}) {
  extra.push_back("--host_cache_bytes=1048576");
  extra.push_back("--disk_path=" + disk_dir);
  extra.push_back("--disk_capacity_bytes=256MiB");
  return ServerProcess::Start(id, std::move(extra));
}

class QueryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/kvtier-query-XXXXXX";
    ASSERT_NE(mkdtemp(t), nullptr);
    dir_ = t;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string dir_;
};

TEST_F(QueryTest, AnswersPerTierPrefixesAndEachBlocksTierAsTheAdminApiReports) {
  auto server = SmallHostServer("q-one", dir_ + "/disk");
  ASSERT_OK(server);
  auto c = client::Client::Connect({.members = {(*server)->address()}});
  ASSERT_OK(c);
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 120, 11);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(**c, ns, *p));  // the host tier holds ~64: the older blocks go to disk

  std::vector<uint32_t> asked = p->tokens;
  asked.insert(asked.end(), {1, 2, 3});  // a partial last block is not asked about
  const HttpAnswer a = Http((*server)->metrics_port(), "POST", "/query", TokenQuery(ns, asked));
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_FALSE(a.j.is_discarded()) << a.body;
  EXPECT_EQ(a.j["node_id"], "q-one");
  EXPECT_EQ(a.j["block_tokens"].get<int>(), 16);
  EXPECT_EQ(a.j["queried_blocks"].get<int>(), 120);
  ASSERT_EQ(a.j["blocks"].size(), 120u);
  std::map<std::string, int> tiers;
  size_t host_prefix = 0, disk_prefix = 0, any_prefix = 0;
  bool host_run = true, disk_run = true, any_run = true;
  for (size_t i = 0; i < 120; ++i) {
    const json& b = a.j["blocks"][i];
    const std::string want = AdminTier((*server)->address(), p->fps[i]);
    EXPECT_EQ(b["fingerprint"], p->fps[i].Hex()) << i;
    EXPECT_EQ(b["tier"].is_null() ? "" : b["tier"].get<std::string>(), want) << i;
    ++tiers[want];
    any_run = any_run && !want.empty();
    host_run = host_run && want == "host";
    disk_run = disk_run && want == "disk";
    any_prefix += any_run;
    host_prefix += host_run;
    disk_prefix += disk_run;
  }
  EXPECT_GT(tiers["host"], 0);
  EXPECT_GT(tiers["disk"], 0) << "the workload should have demoted blocks";
  EXPECT_EQ(a.j["longest_matched"]["blocks"].get<size_t>(), any_prefix);
  EXPECT_EQ(a.j["longest_matched"]["tokens"].get<size_t>(), any_prefix * 16);
  EXPECT_EQ(a.j["tiers"]["host"]["blocks"].get<size_t>(), host_prefix);
  EXPECT_EQ(a.j["tiers"]["disk"]["blocks"].get<size_t>(), disk_prefix);
  EXPECT_EQ(a.j["tiers"]["disk"]["tokens"].get<size_t>(), disk_prefix * 16);
  EXPECT_EQ(a.j["tiers"]["hbm"]["blocks"].get<size_t>(), 0u);

  // Asking is not an access: the same question gets the same answer (no promotion to host).
  const HttpAnswer again = Http((*server)->metrics_port(), "POST", "/query", TokenQuery(ns, asked));
  ASSERT_EQ(again.status, 200);
  EXPECT_EQ(again.j["blocks"], a.j["blocks"]);

  // An evicted block ends the prefix; another namespace has nothing.
  const CtlResult ev =
      RunCtl(absl::StrCat("--members ", (*server)->address(), " evict --fingerprint ", p->fps[0].Hex()));
  ASSERT_EQ(ev.exit_code, 0) << ev.output;
  const HttpAnswer after = Http((*server)->metrics_port(), "POST", "/query", TokenQuery(ns, asked));
  EXPECT_EQ(after.j["longest_matched"]["blocks"].get<int>(), 0);
  EXPECT_TRUE(after.j["blocks"][0]["tier"].is_null());
  Namespace other = ns;
  other.model = "another-model";
  const HttpAnswer none = Http((*server)->metrics_port(), "POST", "/query", TokenQuery(other, asked));
  EXPECT_EQ(none.j["longest_matched"]["blocks"].get<int>(), 0);
  for (const json& b : none.j["blocks"]) EXPECT_TRUE(b["tier"].is_null());

  // /metrics is still the Exposer's.
  const HttpAnswer metrics = Http((*server)->metrics_port(), "GET", "/metrics", "");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("kvtier_"), std::string::npos);
}

TEST_F(QueryTest, KvtierctlQueryAgreesWithLookupOnThreeServers) {
  std::vector<std::unique_ptr<ServerProcess>> servers;
  std::vector<std::string> addresses;
  for (const char* id : {"q-a", "q-b", "q-c"}) {
    auto s = SmallHostServer(id, dir_ + "/" + id);
    ASSERT_OK(s);
    addresses.push_back((*s)->address());
    servers.push_back(std::move(s).value());
  }
  auto c = client::Client::Connect({.members = addresses});
  ASSERT_OK(c);
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 240, 3);  // ~80 per server: each demotes some to disk
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(**c, ns, *p));
  const std::string members = absl::StrJoin(addresses, ",");
  // A hole at block 150: the prefix ends there, and 89 more blocks are present after it.
  ASSERT_EQ(RunCtl(absl::StrCat("--members ", members, " evict --fingerprint ", p->fps[150].Hex())).exit_code, 0);
  const std::string path = WriteTokens(p->tokens);

  const CtlResult q = RunCtl(absl::StrCat("--members ", members, " --timeout-ms 5000 --json query ", kNamespaceFlags,
                                          " --tokens-file ", path));
  const CtlResult l = RunCtl(absl::StrCat("--members ", members, " --timeout-ms 5000 --json lookup ", kNamespaceFlags,
                                          " --tokens-file ", path));
  std::remove(path.c_str());
  ASSERT_EQ(q.exit_code, 0) << q.output;
  ASSERT_EQ(l.exit_code, 0) << l.output;
  const json qj = ParseJson(q.output), lj = ParseJson(l.output);
  ASSERT_FALSE(qj.is_discarded()) << q.output;
  ASSERT_FALSE(lj.is_discarded()) << l.output;
  EXPECT_EQ(qj["blocks"], lj["blocks"]);
  EXPECT_EQ(qj["prefix_blocks"].get<int>(), 150);
  EXPECT_EQ(qj["prefix_blocks"], lj["prefix_blocks"]);
  EXPECT_EQ(qj["prefix_tokens"], lj["prefix_tokens"]);
  EXPECT_EQ(qj["present_blocks"], lj["present_blocks"]);
  EXPECT_EQ(qj["by_node"], lj["by_node"]);
  std::set<std::string> tiers;
  ASSERT_EQ(qj["block_detail"].size(), 240u);
  ASSERT_EQ(lj["block_detail"].size(), 240u);
  for (size_t i = 0; i < 240; ++i) {
    const json& qb = qj["block_detail"][i];
    const json& lb = lj["block_detail"][i];
    EXPECT_EQ(qb["fingerprint"], lb["fingerprint"]) << i;
    EXPECT_EQ(qb["present"], lb["present"]) << i;
    EXPECT_EQ(qb["in_prefix"], lb["in_prefix"]) << i;
    if (!lb["present"].get<bool>()) continue;
    EXPECT_EQ(qb["node_id"], lb["owner"]) << i;
    EXPECT_EQ(qb["tier"], lb["shards"][0]["tier"]) << i;
    tiers.insert(qb["tier"].get<std::string>());
  }
  EXPECT_EQ(tiers, (std::set<std::string>{"disk", "host"}));
  // Per node, the members' own answers: each holds only what the ring gave it, so no prefix of 150.
  ASSERT_EQ(qj["nodes"].size(), 3u);
  for (const json& n : qj["nodes"]) {
    EXPECT_TRUE(n["error"].is_null()) << n;
    EXPECT_LT(n["longest_matched"]["blocks"].get<int>(), 150) << n;
  }
  // The table form names every member.
  const CtlResult table =
      RunCtl(absl::StrCat("--members ", members, " query ", kNamespaceFlags, " --tokens-file /dev/null"));
  EXPECT_EQ(table.exit_code, 0) << table.output;
  for (const char* id : {"q-a", "q-b", "q-c"}) EXPECT_NE(table.output.find(id), std::string::npos) << table.output;
}

TEST_F(QueryTest, QueryByHashFindsBlocksByTheirEngineHashes) {
  auto server = ServerProcess::Start("q-hash");
  ASSERT_OK(server);
  auto c = client::Client::Connect({.members = {(*server)->address()}});
  ASSERT_OK(c);
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 6, 21);
  ASSERT_OK(p);
  // Blocks 0..4 carry engine hashes 1001.. (block 2 as 8 bytes); block 5 carries none.
  std::vector<BlockMeta> meta(5);
  for (size_t j = 0; j < 5; ++j) {
    meta[j].hash = j == 2 ? EngineBlockHash::Bytes(std::string("\x01\x02\x03\x04\xa0\xb0\xc0\xd0", 8))
                          : EngineBlockHash::Uint(1001 + j);
  }
  std::vector<std::span<const std::byte>> views;
  for (size_t j = 0; j < 5; ++j) views.emplace_back(p->data[j]);
  ASSERT_OK(
      (*c)->Put(ns, std::span<const Fingerprint>(p->fps).first(5), 0, views, client::PutOptions{.block_meta = meta}));
  const json hashes = json::array({1001, 1002, "01020304a0b0c0d0", 1004, 1005, 999});
  const HttpAnswer a = Http((*server)->metrics_port(), "POST", "/query_by_hash",
                            json{{"block_hashes", hashes}, {"block_size", 16}}.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.j["longest_matched"]["blocks"].get<int>(), 5);
  EXPECT_EQ(a.j["longest_matched"]["tokens"].get<int>(), 80);
  EXPECT_EQ(a.j["tiers"]["host"]["blocks"].get<int>(), 5);
  ASSERT_EQ(a.j["blocks"].size(), 6u);
  for (size_t j = 0; j < 5; ++j) {
    EXPECT_EQ(a.j["blocks"][j]["tier"], "host") << j;
    EXPECT_EQ(a.j["blocks"][j]["fingerprint"], p->fps[j].Hex()) << j;
    EXPECT_EQ(a.j["blocks"][j]["block_hash"], hashes[j]) << j;
  }
  EXPECT_TRUE(a.j["blocks"][5]["tier"].is_null());

  // kvtierctl query --block-hashes merges it the same way; an evicted block leaves the index.
  const std::string members = (*server)->address();
  ASSERT_EQ(RunCtl(absl::StrCat("--members ", members, " evict --fingerprint ", p->fps[1].Hex())).exit_code, 0);
  const CtlResult q = RunCtl(
      absl::StrCat("--members ", members, " --json query --block-hashes 1001,1002,01020304a0b0c0d0 --block-size 16"));
  ASSERT_EQ(q.exit_code, 0) << q.output;
  const json qj = ParseJson(q.output);
  EXPECT_EQ(qj["prefix_blocks"].get<int>(), 1);
  EXPECT_EQ(qj["prefix_tokens"].get<int>(), 16);
  EXPECT_EQ(qj["present_blocks"].get<int>(), 2);
  EXPECT_EQ(qj["block_detail"][2]["fingerprint"], p->fps[2].Hex());

  // Malformed hashes and a missing block_size are 400s that name the field.
  for (const std::string& bad :
       {json{{"block_hashes", {"xyz"}}, {"block_size", 16}}.dump(),
        json{{"block_hashes", {1.5}}, {"block_size", 16}}.dump(), json{{"block_hashes", {1}}}.dump()}) {
    const HttpAnswer r = Http((*server)->metrics_port(), "POST", "/query_by_hash", bad);
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_TRUE(r.j.contains("error")) << r.body;
  }
}

TEST_F(QueryTest, MalformedRequestsAreRefusedAndTheServerKeepsServing) {
  auto server = ServerProcess::Start("q-bad");
  ASSERT_OK(server);
  const int port = (*server)->metrics_port();
  const Namespace ns = TestNamespace();
  EXPECT_EQ(Http(port, "GET", "/query", "").status, 405);
  EXPECT_EQ(Http(port, "POST", "/query", "not json").status, 400);
  EXPECT_EQ(Http(port, "POST", "/query", "[1, 2]").status, 400);
  const HttpAnswer unknown =
      Http(port, "POST", "/query",
           json{{"namespace", NamespaceToJson(ns, false)}, {"token_ids", {1}}, {"model", "m"}}.dump());
  EXPECT_EQ(unknown.status, 400);
  EXPECT_NE(unknown.body.find("model"), std::string::npos) << unknown.body;
  EXPECT_EQ(Http(port, "POST", "/query", json{{"token_ids", {1}}}.dump()).status, 400);
  EXPECT_EQ(
      Http(port, "POST", "/query", json{{"namespace", NamespaceToJson(ns, false)}, {"token_ids", {-1}}}.dump()).status,
      400);
  json bad_ns = NamespaceToJson(ns, false);
  bad_ns["layout"]["num_layers"] = 0;
  const HttpAnswer invalid = Http(port, "POST", "/query", json{{"namespace", bad_ns}, {"token_ids", {1}}}.dump());
  EXPECT_EQ(invalid.status, 400);
  EXPECT_NE(invalid.body.find("num_layers"), std::string::npos) << invalid.body;
  // Still serving, both endpoints and /metrics.
  const HttpAnswer ok = Http(port, "POST", "/query",
                             json{{"namespace", NamespaceToJson(ns, false)}, {"token_ids", json::array()}}.dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.j["queried_blocks"].get<int>(), 0);
  EXPECT_EQ(Http(port, "GET", "/metrics", "").status, 200);
}

TEST_F(QueryTest, WithTokensConfiguredTheEndpointsNeedAnAdminToken) {
  std::ofstream(dir_ + "/kvtier.yaml") << "auth:\n  tokens:\n"
                                       << "    - {token: query-admin, role: admin}\n"
                                       << "    - {token: query-worker, tenant: acme, role: worker}\n";
  auto server = ServerProcess::Start("q-auth", {"--config=" + dir_ + "/kvtier.yaml"});
  ASSERT_OK(server);
  const int port = (*server)->metrics_port();
  const std::string body = TokenQuery(TestNamespace(), std::vector<uint32_t>(32, 5));
  EXPECT_EQ(Http(port, "POST", "/query", body).status, 401);
  EXPECT_EQ(Http(port, "POST", "/query", body, "wrong").status, 401);
  EXPECT_EQ(Http(port, "POST", "/query", body, "query-worker").status, 403);
  EXPECT_EQ(Http(port, "POST", "/query_by_hash", R"({"block_hashes": [1], "block_size": 16})", "query-worker").status,
            403);
  const HttpAnswer ok = Http(port, "POST", "/query", body, "query-admin");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.j["queried_blocks"].get<int>(), 2);
  // kvtierctl sends its --token.
  const std::string path = WriteTokens(std::vector<uint32_t>(32, 5));
  const std::string args =
      absl::StrCat("--members ", (*server)->address(), " query ", kNamespaceFlags, " --tokens-file ", path);
  EXPECT_EQ(RunCtl(absl::StrCat("--token query-admin ", args)).exit_code, 0);
  const CtlResult worker = RunCtl(absl::StrCat("--token query-worker --json ", args));
  std::remove(path.c_str());
  EXPECT_EQ(worker.exit_code, 3) << worker.output;
  EXPECT_NE(worker.output.find("HTTP 403"), std::string::npos) << worker.output;
}

}  // namespace
}  // namespace kvtier
