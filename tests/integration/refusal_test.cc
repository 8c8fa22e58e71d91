// A server's refusal of a request reaches the caller with the server's code and message, over gRPC and
// over UCX, while a dead server is still misses (client.h, "Errors"). In-process servers on
// 127.0.0.1:0, the real client library (ctest sets UCX_NET_DEVICES=lo).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/server/block_store.h"
#include "kvtier/server/server.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using client::Client;
using client::GetResult;
using client::PutResult;

// A layout whose shard is exactly `bytes` long: MLA, fp8, one layer, one token.
Namespace NamespaceOfBlockBytes(uint64_t bytes) {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "refusal-test";
  ns.layout = {.kind = LayoutKind::kMla,
               .dtype = DType::kFp8E4m3,
               .num_layers = 1,
               .latent_dim = static_cast<uint32_t>(bytes),
               .block_tokens = 1,
               .tp_size = 1};
  return ns;
}

std::vector<Fingerprint> Fingerprints(const Namespace& ns, size_t n) {
  std::vector<uint32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>(i * 31 + 5);
  auto fps = ChainFingerprints(ns, tokens);
  EXPECT_TRUE(fps.ok());
  return fps.ok() ? *fps : std::vector<Fingerprint>{};
}

constexpr uint64_t kServerMaxBlockBytes = 1ULL << 20;
constexpr char kServerText[] = "this server accepts at most 1048576";

// The parameter is ClientOptions::transport.
class RefusalTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto s = server::Server::Start({.node_id = "node-r",
                                    .metrics_address = "",
                                    .host_cache_bytes = 64ULL << 20,
                                    .max_block_bytes = kServerMaxBlockBytes,
                                    .ucx_listen_address = "127.0.0.1:0"});
    ASSERT_OK(s);
    server_ = std::move(s).value();
    // The client takes blocks of up to 64 MiB (its default): only the server knows its own limit.
    auto c = Client::Connect({.members = {"node-r=127.0.0.1:" + std::to_string(server_->grpc_port())},
                              .rpc_timeout = absl::Seconds(5),
                              .transport = GetParam()});
    ASSERT_OK(c);
    client_ = std::move(c).value();
    if (GetParam() == "ucx") {
      ASSERT_EQ(client_->members()[0].transport, "ucx");
    }
  }

  // The refusal as the caller must see it: the server's code, its text and the member that said it.
  static void ExpectServersRefusal(const absl::Status& s, const std::string& rpc) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), kServerText)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "member node-r (127.0.0.1:")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat(" refused ", rpc, ": "))) << s;
  }

  std::unique_ptr<server::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_P(RefusalTest, AnOversizedBlockIsRefusedWithTheServersCodeAndMessage) {
  const Namespace ns = NamespaceOfBlockBytes(2 * kServerMaxBlockBytes);
  const auto fps = Fingerprints(ns, 3);
  std::vector<std::vector<std::byte>> data(fps.size(), std::vector<std::byte>(2 * kServerMaxBlockBytes));
  std::vector<std::span<const std::byte>> in(data.begin(), data.end());
  std::vector<std::span<std::byte>> out(data.begin(), data.end());

  auto put = client_->Put(ns, fps, 0, in);
  ExpectServersRefusal(put.status(), "Allocate");
  auto got = client_->Get(ns, fps, 0, out);
  ExpectServersRefusal(got.status(), GetParam() == "ucx" ? "Lease" : "Read");
  auto lookup = client_->LookupPrefix(ns, fps);
  ExpectServersRefusal(lookup.status(), "Lookup");
  // Refusals are not misses from error, and the member stays in use.
  EXPECT_EQ(client_->stats().misses_from_errors.load(), 0u);
  EXPECT_EQ(client_->members()[0].transport, GetParam());
  EXPECT_EQ(server_->store_for_test().stats().stored_blocks.load(), 0u);

  // A block the server takes still goes through on the same client.
  const Namespace ok_ns = NamespaceOfBlockBytes(kServerMaxBlockBytes);
  const auto ok_fps = Fingerprints(ok_ns, 2);
  std::vector<std::vector<std::byte>> ok_data(ok_fps.size(),
                                              std::vector<std::byte>(kServerMaxBlockBytes, std::byte{0x5a}));
  std::vector<std::span<const std::byte>> ok_in(ok_data.begin(), ok_data.end());
  auto stored = client_->Put(ok_ns, ok_fps, 0, ok_in);
  ASSERT_OK(stored);
  for (PutResult r : *stored) EXPECT_EQ(r, PutResult::kStored);
  std::vector<std::vector<std::byte>> back(ok_fps.size(), std::vector<std::byte>(kServerMaxBlockBytes));
  std::vector<std::span<std::byte>> back_views(back.begin(), back.end());
  auto hits = client_->Get(ok_ns, ok_fps, 0, back_views);
  ASSERT_OK(hits);
  for (size_t i = 0; i < ok_fps.size(); ++i) {
    EXPECT_EQ((*hits)[i], GetResult::kHit);
    EXPECT_TRUE(back[i] == ok_data[i]);
  }
}

TEST_P(RefusalTest, AStoppedServerIsStillMissesNotAnError) {
  const Namespace ns = NamespaceOfBlockBytes(64 << 10);
  const auto fps = Fingerprints(ns, 2);
  std::vector<std::vector<std::byte>> data(fps.size(), std::vector<std::byte>(64 << 10));
  std::vector<std::span<const std::byte>> in(data.begin(), data.end());
  std::vector<std::span<std::byte>> out(data.begin(), data.end());
  server_->Shutdown();
  auto put = client_->Put(ns, fps, 0, in);
  ASSERT_OK(put);
  for (PutResult r : *put) EXPECT_EQ(r, PutResult::kError);
  auto got = client_->Get(ns, fps, 0, out);
  ASSERT_OK(got);
  for (GetResult r : *got) EXPECT_EQ(r, GetResult::kMissFromError);
  auto lookup = client_->LookupPrefix(ns, fps);
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->blocks_from_errors, 2u);
}

INSTANTIATE_TEST_SUITE_P(Transports, RefusalTest, ::testing::Values("grpc", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace kvtier
