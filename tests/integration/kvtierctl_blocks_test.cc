// kvtierctl's block commands as a real process against a real 3-process cluster: ls (paging, filters,
// one node), inspect (owner, holder, a block on a non-owner), lookup (token file and trace line), evict,
// drain (puts refused, hottest blocks handed to the ring without the node, depths kept, undo) and verify,
// also with a member frozen (SIGSTOP) that accepts connections and answers nothing.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/hash_ring.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtierctl_runner.h"
#include "replayer.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::CtlResult;
using testing::ParseJson;
using testing::Prompt;
using testing::RunCtl;
using testing::ServerProcess;

Namespace TestNamespace() {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "llama-ctl";
  ns.layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64, .block_tokens = 16};
  return ns;
}
// The same namespace as kvtierctl flags.
constexpr const char* kLayoutFlags = "--num-layers 2 --kv-heads 2 --head-dim 64 --block-tokens 16";
const std::string kNamespaceFlags = absl::StrCat("--tenant acme --model llama-ctl ", kLayoutFlags);

Namespace OtherNamespace() {
  Namespace ns = TestNamespace();
  ns.tenant = "globex";
  return ns;
}

// Stops a server process (SIGSTOP) for its lifetime: it accepts connections but answers nothing, as a
// hung member does. Resumed (SIGCONT) when destroyed.
class Frozen {
 public:
  explicit Frozen(pid_t pid) : pid_(pid) { kill(pid_, SIGSTOP); }
  ~Frozen() { kill(pid_, SIGCONT); }
  Frozen(const Frozen&) = delete;
  Frozen& operator=(const Frozen&) = delete;

 private:
  pid_t pid_;
};

class KvtierctlBlocksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* id : {"ctl-a", "ctl-b", "ctl-c"}) {
      auto p = ServerProcess::Start(id);
      ASSERT_OK(p);
      addresses_.push_back((*p)->address());
      servers_.push_back(std::move(p).value());
    }
    auto c = client::Client::Connect({.members = addresses_});
    ASSERT_OK(c);
    client_ = std::move(c).value();
  }

  std::string Members() const { return absl::StrJoin(addresses_, ","); }
  // Global options every call uses; a generous deadline, since the 2-core CI machine is shared.
  std::string Ctl(const std::string& rest) const {
    return absl::StrCat("--members ", Members(), " --timeout-ms 5000 ", rest);
  }
  // The node id the cluster's ring gives `fp` to.
  std::string Owner(const Fingerprint& fp) const { return client_->ring().node_ids()[client_->ring().Primary(fp)]; }
  v1::GetStatsResponse Stats(size_t i) const {
    auto stub = v1::AdminService::NewStub(grpc::CreateChannel(addresses_[i], grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::GetStatsResponse resp;
    EXPECT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok());
    return resp;
  }

  // --members with node ids given (node_id=host:port), so every member has a place on the ring.
  std::string MembersWithIds() const {
    std::vector<std::string> specs;
    for (const auto& s : servers_) specs.push_back(absl::StrCat(s->node_id(), "=", s->address()));
    return absl::StrJoin(specs, ",");
  }

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(KvtierctlBlocksTest, LsListsEveryBlockOnItsOwnerWithPagingAndFilters) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 24, 1);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p));
  auto other = testing::MakePrompt(OtherNamespace(), 6, 2);
  ASSERT_OK(other);
  ASSERT_OK(testing::PutPrompt(*client_, OtherNamespace(), *other));

  const CtlResult all = RunCtl(Ctl("ls --limit 0 --json"));
  ASSERT_EQ(all.exit_code, 0) << all.output;
  const nlohmann::json j = ParseJson(all.output);
  ASSERT_FALSE(j.is_discarded()) << all.output;
  ASSERT_EQ(j["count"].get<size_t>(), 30u);
  EXPECT_TRUE(j["next_cursor"].is_null());
  std::set<std::string> listed;
  for (const auto& b : j["blocks"]) {
    const std::string hex = b["fingerprint"].get<std::string>();
    listed.insert(hex);
    auto fp = Fingerprint::FromHex(hex);
    ASSERT_OK(fp);
    EXPECT_EQ(b["node_id"].get<std::string>(), Owner(*fp)) << "a block lives on its primary owner";
    EXPECT_EQ(b["tier"], "host");
    EXPECT_EQ(b["size_bytes"].get<uint64_t>(), ns.layout.ShardBytes());
    EXPECT_EQ(b["shard"].get<int>(), 0);
    EXPECT_EQ(b["model"], "llama-ctl");
  }
  for (const Fingerprint& fp : p->fps) EXPECT_TRUE(listed.count(fp.Hex())) << fp.Hex();
  for (const Fingerprint& fp : other->fps) EXPECT_TRUE(listed.count(fp.Hex())) << fp.Hex();
  // The depth of each block is its index in the prompt, as the client reported it.
  for (const auto& b : j["blocks"]) {
    for (size_t i = 0; i < p->fps.size(); ++i) {
      if (p->fps[i].Hex() == b["fingerprint"]) {
        EXPECT_EQ(b["depth"].get<size_t>(), i);
      }
    }
  }

  // Pages of 7 walk every member once, without repeats.
  std::set<std::string> paged;
  std::string cursor;
  int pages = 0;
  do {
    const CtlResult r = RunCtl(Ctl(absl::StrCat("ls --json --limit 7", cursor.empty() ? "" : " --cursor " + cursor)));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json page = ParseJson(r.output);
    ASSERT_FALSE(page.is_discarded()) << r.output;
    EXPECT_LE(page["count"].get<size_t>(), 7u);
    for (const auto& b : page["blocks"]) EXPECT_TRUE(paged.insert(b["fingerprint"].get<std::string>()).second);
    cursor = page["next_cursor"].is_null() ? "" : page["next_cursor"].get<std::string>();
    ASSERT_LT(++pages, 20);
  } while (!cursor.empty());
  EXPECT_EQ(paged, listed);

  auto count = [&](const std::string& args) {
    const CtlResult r = RunCtl(Ctl("ls --limit 0 --json " + args));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json out = ParseJson(r.output);
    return out.is_discarded() ? size_t{999} : out["count"].get<size_t>();
  };
  EXPECT_EQ(count("--tenant globex"), 6u);
  EXPECT_EQ(count(absl::StrCat("--namespace-id ", ns.Id())), 24u);
  EXPECT_EQ(count(absl::StrFormat("--namespace-id 0x%x", ns.Id())), 24u);
  EXPECT_EQ(count("--tier disk"), 0u);
  size_t on_b = 0;
  for (const auto& b : j["blocks"]) on_b += b["node_id"] == "ctl-b";
  EXPECT_EQ(count("--node ctl-b"), on_b);
  EXPECT_EQ(count("--node " + addresses_[1]), on_b);  // by address too

  const CtlResult table = RunCtl(Ctl("ls --limit 5"));
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("FINGERPRINT"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("acme/llama-ctl"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("more with --cursor"), std::string::npos) << table.output;

  EXPECT_EQ(RunCtl(Ctl("ls --cursor 9:0")).exit_code, 2);
  EXPECT_EQ(RunCtl(Ctl("ls --cursor nonsense")).exit_code, 2);
  EXPECT_EQ(RunCtl(Ctl("ls --tier gpu")).exit_code, 2);
  EXPECT_EQ(RunCtl(Ctl("ls --namespace-id x1")).exit_code, 2);
  EXPECT_EQ(RunCtl(Ctl("ls --node no-such-node")).exit_code, 1);
}

TEST_F(KvtierctlBlocksTest, InspectShowsTheOwnerAndWhatTheHolderReports) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 4, 3);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p));
  const Fingerprint& fp = p->fps[2];

  const CtlResult r = RunCtl(Ctl("inspect " + fp.Hex() + " --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["owner"], Owner(fp));
  EXPECT_EQ(j["found_on"], nlohmann::json::array({Owner(fp)}));
  EXPECT_EQ(j["ring_position"], absl::StrFormat("0x%016x", fp.RingPosition()));
  ASSERT_EQ(j["members"].size(), 3u);
  for (const auto& m : j["members"]) {
    EXPECT_TRUE(m["answered"].get<bool>());
    EXPECT_EQ(m["owner"].get<bool>(), m["node_id"] == Owner(fp));
    EXPECT_EQ(m["found"].get<bool>(), m["node_id"] == Owner(fp));
    if (m["found"].get<bool>()) {
      EXPECT_EQ(m["block"]["depth"].get<int>(), 2);
      EXPECT_EQ(m["block"]["size_bytes"].get<uint64_t>(), ns.layout.ShardBytes());
      EXPECT_EQ(m["block"]["tenant"], "acme");
      EXPECT_EQ(m["block"]["checksum"].get<std::string>().size(), 16u);
    }
  }

  const CtlResult table = RunCtl(Ctl("inspect " + fp.Hex()));
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("held by " + Owner(fp)), std::string::npos) << table.output;

  // Absent: exit 1. Not a fingerprint: usage error. Shard 1 of a tp=1 block: absent.
  EXPECT_EQ(RunCtl(Ctl("inspect " + std::string(64, 'a'))).exit_code, 1);
  EXPECT_EQ(RunCtl(Ctl("inspect " + fp.Hex() + " --shard 1")).exit_code, 1);
  EXPECT_EQ(RunCtl(Ctl("inspect 1234")).exit_code, 2);
  EXPECT_EQ(RunCtl(Ctl("inspect")).exit_code, 2);

  // A member that does not answer: exit 3, the block is still reported where it is.
  const size_t victim = Owner(fp) == "ctl-a" ? 1 : 0;
  servers_[victim]->KillAndWait(SIGKILL);
  const CtlResult partial = RunCtl(Ctl("inspect " + fp.Hex() + " --json"));
  EXPECT_EQ(partial.exit_code, 3) << partial.output;
  const nlohmann::json pj = ParseJson(partial.output);
  ASSERT_FALSE(pj.is_discarded()) << partial.output;
  EXPECT_EQ(pj["found_on"], nlohmann::json::array({Owner(fp)}));
}

TEST_F(KvtierctlBlocksTest, InspectFindsABlockOnAMemberThatDoesNotOwnIt) {
  // A client that knows only ctl-a puts every block there; inspect asks every member, so it finds the
  // blocks whose owner in the 3-member ring is someone else, and says so.
  auto lonely = client::Client::Connect({.members = {addresses_[0]}});
  ASSERT_OK(lonely);
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 12, 4);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(**lonely, ns, *p));
  auto it = std::find_if(p->fps.begin(), p->fps.end(), [&](const Fingerprint& f) { return Owner(f) != "ctl-a"; });
  ASSERT_NE(it, p->fps.end());

  const CtlResult r = RunCtl(Ctl("inspect " + it->Hex() + " --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["owner"], Owner(*it));
  EXPECT_EQ(j["found_on"], nlohmann::json::array({"ctl-a"}));
  const CtlResult table = RunCtl(Ctl("inspect " + it->Hex()));
  EXPECT_NE(table.output.find("ctl-a is not the owner"), std::string::npos) << table.output;
}

TEST_F(KvtierctlBlocksTest, LookupCountsTheLeadingCachedBlocksWithoutTouchingServerCounters) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 10, 5);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p, 0, 6));
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p, 8, 1));  // present, but after the first miss
  char path[] = "/tmp/kvtierctl-tokens-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream out(path);
    for (size_t i = 0; i < p->tokens.size(); ++i) out << p->tokens[i] << (i % 16 == 15 ? "\n" : " ");
    out << "77 78 79\n";  // a partial last block: not looked up
  }
  uint64_t lookups_before = 0;
  for (size_t i = 0; i < 3; ++i) lookups_before += Stats(i).lookup_requests();

  const CtlResult r = RunCtl(Ctl(absl::StrCat("lookup ", kNamespaceFlags, " --tokens-file ", path, " --json")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["blocks"].get<int>(), 10);
  EXPECT_EQ(j["prefix_blocks"].get<int>(), 6);
  EXPECT_EQ(j["prefix_tokens"].get<int>(), 6 * 16);
  EXPECT_EQ(j["present_blocks"].get<int>(), 7);
  EXPECT_EQ(j["prompt_tokens"].get<int>(), 163);
  EXPECT_EQ(j["namespace"]["id"], absl::StrFormat("0x%016x", ns.Id()));
  uint64_t by_node = 0;
  for (const auto& n : j["by_node"]) {
    EXPECT_EQ(n["tier"], "host");
    by_node += n["blocks"].get<uint64_t>();
  }
  EXPECT_EQ(by_node, 6u);
  ASSERT_EQ(j["block_detail"].size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    const auto& b = j["block_detail"][i];
    EXPECT_EQ(b["fingerprint"], p->fps[i].Hex());
    EXPECT_EQ(b["owner"], Owner(p->fps[i]));
    EXPECT_EQ(b["present"].get<bool>(), i < 6 || i == 8) << i;
    EXPECT_EQ(b["in_prefix"].get<bool>(), i < 6) << i;
  }
  // What a worker's lookup would find.
  auto look = client_->LookupPrefix(ns, p->fps);
  ASSERT_OK(look);
  EXPECT_EQ(look->prefix_blocks, 6u);
  // kvtierctl lookup asks with InspectBlock: the servers' lookup counters moved only by the client's call.
  uint64_t lookups_after = 0;
  for (size_t i = 0; i < 3; ++i) lookups_after += Stats(i).lookup_requests();
  std::set<uint32_t> owners;
  for (const Fingerprint& fp : p->fps) owners.insert(client_->ring().Primary(fp));
  EXPECT_EQ(lookups_after - lookups_before, owners.size());

  const CtlResult table =
      RunCtl(Ctl(absl::StrCat("lookup ", kNamespaceFlags, " --tokens-file ", path, " --per-block")));
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("cached prefix: 6 of 10 blocks (96 tokens"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("1 more block present after the first miss"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find(p->fps[9].Hex()), std::string::npos) << table.output;

  // Another namespace (a different model): nothing cached.
  const CtlResult miss = RunCtl(
      Ctl(absl::StrCat("lookup --tenant acme --model other ", kLayoutFlags, " --tokens-file ", path, " --json")));
  EXPECT_EQ(miss.exit_code, 0) << miss.output;
  const nlohmann::json mj = ParseJson(miss.output);
  ASSERT_FALSE(mj.is_discarded()) << miss.output;
  EXPECT_EQ(mj["prefix_blocks"].get<int>(), 0) << miss.output;
  // A bad namespace or token file is a usage error that names the flag.
  const CtlResult bad = RunCtl(Ctl(absl::StrCat("lookup --tenant acme --model m --tokens-file ", path)), true);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--num-layers"), std::string::npos) << bad.output;
  EXPECT_EQ(RunCtl(Ctl(absl::StrCat("lookup ", kNamespaceFlags, " --tokens-file /no/such/file"))).exit_code, 2);
  EXPECT_EQ(RunCtl(Ctl(absl::StrCat("lookup ", kNamespaceFlags))).exit_code, 2);
  unlink(path);
}

TEST_F(KvtierctlBlocksTest, LookupOfATraceLineFindsWhatTraceReplayStored) {
  // trace_replay's namespace and tokens (BlockTokens per hash id), at 16 tokens and 1 KiB per block.
  const bench::ReplayOptions ro{.block_tokens = 16, .block_bytes = 1024};
  auto ns = bench::ReplayNamespace(ro);
  ASSERT_OK(ns);
  const std::vector<uint64_t> hash_ids = {5, 6, 7};
  std::vector<uint32_t> tokens(hash_ids.size() * 16);
  for (size_t i = 0; i < hash_ids.size(); ++i) bench::BlockTokens(hash_ids[i], std::span(tokens).subspan(i * 16, 16));
  auto fps = ChainFingerprints(*ns, tokens);
  ASSERT_OK(fps);
  std::vector<std::vector<std::byte>> data(3, std::vector<std::byte>(1024));
  std::vector<std::span<const std::byte>> in;
  for (size_t i = 0; i < 3; ++i) {
    bench::BlockPayload(hash_ids[i], data[i]);
    in.emplace_back(data[i]);
  }
  ASSERT_OK(client_->Put(*ns, *fps, 0, in));

  const std::string line = R"('{"timestamp": 0, "input_length": 60, "output_length": 9, "hash_ids": [5, 6, 7, 8]}')";
  const CtlResult r = RunCtl(Ctl(absl::StrCat("lookup --replay-namespace --block-tokens 16 --replay-block-bytes 1024 ",
                                              "--trace-line ", line, " --json")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["blocks"].get<int>(), 4);
  EXPECT_EQ(j["prefix_blocks"].get<int>(), 3);
  EXPECT_EQ(j["prefix_tokens"].get<int>(), 48);
  EXPECT_EQ(j["prompt_tokens"].get<int>(), 60);
  EXPECT_EQ(j["namespace"]["tenant"], "demo");
  EXPECT_EQ(j["block_detail"][0]["fingerprint"], (*fps)[0].Hex());

  EXPECT_EQ(RunCtl(Ctl("lookup --replay-namespace --trace-line '{\"hash_ids\": [-1]}'")).exit_code, 2);
  EXPECT_EQ(RunCtl(Ctl("lookup --replay-namespace --trace-line 'not json'")).exit_code, 2);
}

TEST_F(KvtierctlBlocksTest, EvictDropsOneBlockATenantOrEverything) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 12, 6);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p));
  auto other = testing::MakePrompt(OtherNamespace(), 5, 7);
  ASSERT_OK(other);
  ASSERT_OK(testing::PutPrompt(*client_, OtherNamespace(), *other));

  const CtlResult one = RunCtl(Ctl("evict --fingerprint " + p->fps[3].Hex() + " --json"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(ParseJson(one.output)["totals"]["evicted"].get<int>(), 1) << one.output;
  EXPECT_EQ(RunCtl(Ctl("inspect " + p->fps[3].Hex())).exit_code, 1);
  auto look = client_->LookupPrefix(ns, p->fps);
  ASSERT_OK(look);
  EXPECT_EQ(look->prefix_blocks, 3u);

  const CtlResult tenant = RunCtl(Ctl("evict --tenant globex --json"));
  ASSERT_EQ(tenant.exit_code, 0) << tenant.output;
  EXPECT_EQ(ParseJson(tenant.output)["totals"]["evicted"].get<int>(), 5) << tenant.output;

  const CtlResult by_ns = RunCtl(Ctl(absl::StrCat("evict --namespace-id ", ns.Id(), " --node ctl-a --json")));
  ASSERT_EQ(by_ns.exit_code, 0) << by_ns.output;
  const nlohmann::json nj = ParseJson(by_ns.output);
  ASSERT_EQ(nj["members"].size(), 1u);
  EXPECT_EQ(nj["members"][0]["node_id"], "ctl-a");
  size_t on_a = 0;
  for (size_t i = 0; i < p->fps.size(); ++i) on_a += i != 3 && Owner(p->fps[i]) == "ctl-a";
  EXPECT_EQ(nj["totals"]["evicted"].get<size_t>(), on_a);

  EXPECT_EQ(RunCtl(Ctl("evict")).exit_code, 2);  // would evict everything: needs --all
  const CtlResult all = RunCtl(Ctl("evict --all"));
  ASSERT_EQ(all.exit_code, 0) << all.output;
  EXPECT_NE(all.output.find("TOTAL"), std::string::npos) << all.output;
  const CtlResult left = RunCtl(Ctl("ls --json --limit 0"));
  EXPECT_EQ(ParseJson(left.output)["count"].get<int>(), 0) << left.output;
  EXPECT_EQ(RunCtl(Ctl("evict --fingerprint zz")).exit_code, 2);
  EXPECT_EQ(RunCtl(Ctl("evict --all --tenant x")).exit_code, 2);
}

TEST_F(KvtierctlBlocksTest, DrainRefusesPutsAndHandsTheHottestBlocksToTheRingWithoutTheNode) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 40, 8);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p));
  std::vector<size_t> on_b;
  for (size_t i = 0; i < p->fps.size(); ++i) {
    if (Owner(p->fps[i]) == "ctl-b") on_b.push_back(i);
  }
  ASSERT_GE(on_b.size(), 4u);
  // Two of ctl-b's blocks become the hottest: read five times each.
  const std::vector<size_t> hot = {on_b[1], on_b[3]};
  for (int k = 0; k < 5; ++k) {
    for (size_t i : hot) {
      std::vector<std::byte> out(ns.layout.ShardBytes());
      std::vector<std::span<std::byte>> views = {out};
      auto got = client_->Get(ns, std::span<const Fingerprint>(&p->fps[i], 1), 0, views);
      ASSERT_OK(got);
      ASSERT_EQ((*got)[0], client::GetResult::kHit);
    }
  }

  const CtlResult r = RunCtl(Ctl(absl::StrCat("drain ctl-b --hand-off 2 --json ", kNamespaceFlags)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_TRUE(j["draining"].get<bool>());
  EXPECT_EQ(j["node_id"], "ctl-b");
  EXPECT_EQ(j["targets"].size(), 2u);
  EXPECT_EQ(j["hand_off"]["listed"].get<size_t>(), on_b.size());
  EXPECT_EQ(j["hand_off"]["chosen"].get<int>(), 2);
  EXPECT_EQ(j["hand_off"]["moved"].get<int>(), 2);
  EXPECT_EQ(j["hand_off"]["skipped_no_namespace"].get<int>(), 0);

  // A worker's ring without ctl-b finds ctl-a's and ctl-c's blocks where they were, and the two hot
  // blocks on their new owners.
  auto without_b = client::Client::Connect({.members = {addresses_[0], addresses_[2]}});
  ASSERT_OK(without_b);
  auto look = (*without_b)->LookupPrefix(ns, p->fps);
  ASSERT_OK(look);
  for (size_t i = 0; i < p->fps.size(); ++i) {
    const bool expected = Owner(p->fps[i]) != "ctl-b" || std::count(hot.begin(), hot.end(), i) > 0;
    EXPECT_EQ(look->present[i], expected) << i;
  }
  // The bytes arrived intact, and each block kept its depth.
  std::vector<std::byte> out(ns.layout.ShardBytes());
  std::vector<std::span<std::byte>> views = {out};
  auto got = (*without_b)->Get(ns, std::span<const Fingerprint>(&p->fps[hot[1]], 1), 0, views);
  ASSERT_OK(got);
  ASSERT_EQ((*got)[0], client::GetResult::kHit);
  EXPECT_EQ(out, p->data[hot[1]]);
  const CtlResult in = RunCtl(Ctl("inspect " + p->fps[hot[1]].Hex() + " --json"));
  const nlohmann::json ij = ParseJson(in.output);
  ASSERT_FALSE(ij.is_discarded()) << in.output;
  EXPECT_EQ(ij["found_on"].size(), 2u) << in.output;  // ctl-b still has it until it leaves
  for (const auto& m : ij["members"]) {
    if (m["found"] == true) {
      EXPECT_EQ(m["block"]["depth"].get<size_t>(), hot[1]) << m;
    }
  }

  // Draining: ctl-b takes no new blocks, and says so.
  const CtlResult st = RunCtl(Ctl("status --json"));
  const nlohmann::json status = ParseJson(st.output);  // a named value: the loop must not outlive it
  for (const auto& m : status["members"]) EXPECT_EQ(m["draining"].get<bool>(), m["node_id"] == "ctl-b");
  auto more = testing::MakePrompt(ns, 30, 9);
  ASSERT_OK(more);
  std::vector<std::span<const std::byte>> blocks(more->data.begin(), more->data.end());
  auto put = client_->Put(ns, more->fps, 0, blocks);
  ASSERT_OK(put);
  for (size_t i = 0; i < put->size(); ++i) {
    EXPECT_EQ((*put)[i] == client::PutResult::kNoSpace, Owner(more->fps[i]) == "ctl-b") << i;
  }

  // The rest of its blocks: the two already moved are found on their new owners.
  const CtlResult rest = RunCtl(Ctl(absl::StrCat("drain ", addresses_[1], " --json ", kNamespaceFlags)));
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  const nlohmann::json rj = ParseJson(rest.output);
  EXPECT_EQ(rj["hand_off"]["moved"].get<size_t>(), on_b.size() - 2) << rest.output;
  EXPECT_EQ(rj["hand_off"]["already_present"].get<int>(), 2) << rest.output;
  look = (*without_b)->LookupPrefix(ns, p->fps);
  ASSERT_OK(look);
  EXPECT_EQ(look->prefix_blocks, p->fps.size());

  // --undo: it takes blocks again.
  const CtlResult undo = RunCtl(Ctl("drain ctl-b --undo"));
  ASSERT_EQ(undo.exit_code, 0) << undo.output;
  EXPECT_NE(undo.output.find("takes new blocks again"), std::string::npos) << undo.output;
  put = client_->Put(ns, more->fps, 0, blocks);
  ASSERT_OK(put);
  for (client::PutResult pr : *put) EXPECT_NE(pr, client::PutResult::kNoSpace);
}

TEST_F(KvtierctlBlocksTest, DrainWithoutTheNamespaceCountsTheBlocksItCannotRead) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 20, 10);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p));
  size_t on_c = 0;
  for (const Fingerprint& fp : p->fps) on_c += Owner(fp) == "ctl-c";

  const CtlResult r = RunCtl(Ctl("drain ctl-c"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("draining: takes no new blocks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("acme/llama-ctl"), std::string::npos) << r.output;
  const CtlResult j = RunCtl(Ctl("drain ctl-c --json"));
  const nlohmann::json dj = ParseJson(j.output);
  ASSERT_FALSE(dj.is_discarded()) << j.output;
  EXPECT_EQ(dj["hand_off"]["skipped_no_namespace"].get<size_t>(), on_c);
  EXPECT_EQ(dj["hand_off"]["moved"].get<int>(), 0);
  ASSERT_EQ(dj["hand_off"]["skipped_namespaces"].size(), 1u);
  const std::string id = dj["hand_off"]["skipped_namespaces"][0]["namespace_id"].get<std::string>();
  EXPECT_EQ(id, absl::StrFormat("0x%016x", ns.Id()));
  // What ls and drain print as a namespace id, --namespace-id takes back.
  const CtlResult listed = RunCtl(Ctl("ls --json --limit 0 --namespace-id " + id));
  EXPECT_EQ(ParseJson(listed.output)["count"].get<size_t>(), p->fps.size()) << listed.output;

  // The namespace from a file instead of flags.
  char path[] = "/tmp/kvtierctl-ns-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path)
      << R"([{"tenant": "nobody", "model": "x", "layout": {"num_layers": 1, "num_kv_heads": 1, "head_dim": 8}},
    {"tenant": "acme", "model": "llama-ctl", "layout": {"kind": "standard", "dtype": "bf16", "num_layers": 2,
     "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16}}])";
  const CtlResult f = RunCtl(Ctl(absl::StrCat("drain ctl-c --json --namespaces-file ", path)));
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_EQ(ParseJson(f.output)["hand_off"]["moved"].get<size_t>(), on_c) << f.output;
  std::ofstream(path) << R"([{"tenant": "acme", "layout": {"num_layers": 1, "bogus": 1}}])";
  EXPECT_EQ(RunCtl(Ctl(absl::StrCat("drain ctl-c --namespaces-file ", path))).exit_code, 2);
  unlink(path);

  EXPECT_EQ(RunCtl(Ctl("drain ctl-c --hand-off 0 --undo")).exit_code, 0);
  EXPECT_EQ(RunCtl(Ctl("drain no-such-node")).exit_code, 1);
  EXPECT_EQ(RunCtl(Ctl("drain")).exit_code, 2);
  servers_[2]->KillAndWait(SIGKILL);
  EXPECT_EQ(RunCtl(Ctl("drain " + addresses_[2])).exit_code, 3);
}

TEST_F(KvtierctlBlocksTest, MembersFromDnsAndANodeListedUnderTwoAddresses) {
  // --members-dns: the addresses a name resolves to are members too (in Kubernetes, the headless Service).
  const int b_port = servers_[1]->grpc_port();
  const CtlResult st = RunCtl(absl::StrCat("--members ", addresses_[0], ",", addresses_[2],
                                           " --members-dns 127.0.0.1:", b_port, " --timeout-ms 5000 status --json"));
  ASSERT_EQ(st.exit_code, 0) << st.output;
  const nlohmann::json sj = ParseJson(st.output);
  ASSERT_FALSE(sj.is_discarded()) << st.output;
  std::set<std::string> ids;
  for (const auto& m : sj["members"]) ids.insert(m["node_id"].get<std::string>());
  EXPECT_EQ(ids, (std::set<std::string>{"ctl-a", "ctl-b", "ctl-c"}));
  EXPECT_EQ(RunCtl("--members-dns no-port status").exit_code, 2);

  // What a pod's preStop sees: its own server at 127.0.0.1 and again at its pod IP from DNS. The node
  // never hands blocks to itself.
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 24, 12);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p));
  size_t on_b = 0;
  for (const Fingerprint& fp : p->fps) on_b += Owner(fp) == "ctl-b";
  const CtlResult r = RunCtl(absl::StrCat("--members ", Members(), ",localhost:", b_port,
                                          " --timeout-ms 5000 drain ctl-b --json ", kNamespaceFlags));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["targets"], nlohmann::json::array({addresses_[0], addresses_[2]}));
  EXPECT_EQ(j["hand_off"]["moved"].get<size_t>(), on_b);
}

TEST_F(KvtierctlBlocksTest, VerifyChecksEveryBlockOfEveryMember) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 30, 11);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p));

  const CtlResult r = RunCtl(Ctl("verify --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["totals"]["checked"].get<int>(), 30);
  EXPECT_EQ(j["totals"]["corrupt"].get<int>(), 0);
  EXPECT_EQ(j["totals"]["members_verified"].get<int>(), 3);

  // Not a terminal: progress as plain lines on stderr, then the summary table.
  const CtlResult plain = RunCtl(Ctl("verify --node ctl-a"), /*with_stderr=*/true);
  EXPECT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("verify ctl-a: done"), std::string::npos) << plain.output;
  EXPECT_NE(plain.output.find("1/1 members verified"), std::string::npos) << plain.output;

  servers_[2]->KillAndWait(SIGKILL);
  const CtlResult partial = RunCtl(Ctl("verify --json"));
  EXPECT_EQ(partial.exit_code, 3) << partial.output;
  EXPECT_EQ(ParseJson(partial.output)["totals"]["members_verified"].get<int>(), 2) << partial.output;
}

TEST_F(KvtierctlBlocksTest, LookupReportsTheBlocksOfAFrozenOwnerAbsentAndExitsThree) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 12, 21);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p));
  size_t first_on_b = p->fps.size();
  size_t on_b = 0;
  for (size_t i = 0; i < p->fps.size(); ++i) {
    if (Owner(p->fps[i]) != "ctl-b") continue;
    first_on_b = std::min(first_on_b, i);
    ++on_b;
  }
  ASSERT_GT(on_b, 0u);
  char path[] = "/tmp/kvtierctl-tokens-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream out(path);
    for (uint32_t t : p->tokens) out << t << " ";
  }
  const std::string lookup =
      absl::StrCat(" --timeout-ms 1500 lookup ", kNamespaceFlags, " --tokens-file ", path, " --json");
  const Frozen frozen(servers_[1]->pid());

  // Its node id given: ctl-b keeps its place on the ring and its blocks are reported unreachable.
  const CtlResult r = RunCtl(absl::StrCat("--members ", MembersWithIds(), lookup));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["prefix_blocks"].get<size_t>(), first_on_b);
  EXPECT_EQ(j["present_blocks"].get<size_t>(), p->fps.size() - on_b);
  for (size_t i = 0; i < p->fps.size(); ++i) {
    const auto& b = j["block_detail"][i];
    EXPECT_EQ(b["owner"], Owner(p->fps[i])) << i;
    const bool owned_by_b = Owner(p->fps[i]) == "ctl-b";
    EXPECT_EQ(b["present"].get<bool>(), !owned_by_b) << i;
    EXPECT_EQ(b["shards"][0]["error"].is_null(), !owned_by_b) << b;
  }
  ASSERT_EQ(j["errors"].size(), 1u) << r.output;
  EXPECT_EQ(j["errors"][0]["address"], addresses_[1]);

  // Its id unknown: it cannot be placed, and the report says the owners shown may be wrong.
  const CtlResult unplaced = RunCtl(absl::StrCat("--members ", Members(), lookup));
  EXPECT_EQ(unplaced.exit_code, 3) << unplaced.output;
  const nlohmann::json u = ParseJson(unplaced.output);
  ASSERT_FALSE(u.is_discarded()) << unplaced.output;
  ASSERT_EQ(u["errors"].size(), 1u) << unplaced.output;
  EXPECT_EQ(u["errors"][0]["address"], addresses_[1]);
  EXPECT_NE(u["errors"][0]["error"].get<std::string>().find("cannot be placed on the ring"), std::string::npos);

  // A member where nothing listens is the same.
  const CtlResult closed =
      RunCtl(absl::StrCat("--members ctl-a=", addresses_[0], ",ctl-x=127.0.0.1:1,ctl-c=", addresses_[2], lookup));
  EXPECT_EQ(closed.exit_code, 3) << closed.output;
  unlink(path);
}

TEST_F(KvtierctlBlocksTest, DrainExitsThreeWhenAMemberThatWouldTakeBlocksIsFrozen) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 40, 22);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p));
  // The ring without ctl-b gives some of ctl-b's blocks to ctl-c.
  auto without_b = HashRing::Create({"ctl-a", "ctl-c"}, HashRing::kDefaultVirtualNodes);
  ASSERT_OK(without_b);
  size_t b_to_c = 0;
  for (const Fingerprint& fp : p->fps) {
    b_to_c += Owner(fp) == "ctl-b" && without_b->node_ids()[without_b->Primary(fp)] == "ctl-c";
  }
  ASSERT_GT(b_to_c, 0u);
  const std::string drain = absl::StrCat(" --timeout-ms 1500 drain ctl-b --hand-off 100 --json ", kNamespaceFlags);
  {
    const Frozen frozen(servers_[2]->pid());
    const CtlResult r = RunCtl(absl::StrCat("--members ", MembersWithIds(), drain));
    EXPECT_EQ(r.exit_code, 3) << r.output;
    const nlohmann::json j = ParseJson(r.output);
    ASSERT_FALSE(j.is_discarded()) << r.output;
    EXPECT_TRUE(j["draining"].get<bool>());
    // Those blocks fail to store (until the client's health checks take ctl-c off its ring).
    EXPECT_GT(j["hand_off"]["put_errors"].get<size_t>(), 0u) << r.output;
    EXPECT_NE(j["notes"].dump().find(addresses_[2]), std::string::npos) << r.output;

    const CtlResult unplaced = RunCtl(absl::StrCat("--members ", Members(), drain));
    EXPECT_EQ(unplaced.exit_code, 3) << unplaced.output;
    EXPECT_NE(unplaced.output.find("not on the ring"), std::string::npos) << unplaced.output;
  }
  EXPECT_EQ(RunCtl(Ctl("drain ctl-b --undo")).exit_code, 0);
}

TEST_F(KvtierctlBlocksTest, VerifyReportsAFrozenMemberFailedWithinTheTimeout) {
  const Namespace ns = TestNamespace();
  auto p = testing::MakePrompt(ns, 10, 23);
  ASSERT_OK(p);
  ASSERT_OK(testing::PutPrompt(*client_, ns, *p));
  const Frozen frozen(servers_[2]->pid());
  const absl::Time start = absl::Now();
  const CtlResult r = RunCtl(absl::StrCat("--members ", Members(), " --timeout-ms 1000 verify --json"));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(r.exit_code, 3) << r.output;
  const nlohmann::json j = ParseJson(r.output);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["totals"]["members_verified"].get<int>(), 2) << r.output;
  EXPECT_FALSE(j["members"][2]["verified"].get<bool>()) << r.output;
  // One GetInfo deadline and the scrubs of the others; gRPC's 20 s connect timeout is not waited out.
  EXPECT_LT(took, absl::Seconds(10));
}

}  // namespace
}  // namespace kvtier
