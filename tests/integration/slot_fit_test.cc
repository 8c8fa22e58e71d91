// Slab and block sizes whose slots cannot fit, on real kvtier-server processes: a configuration whose
// largest block could never be stored is refused at start, and a block that could not fit even an empty
// tier is refused without evicting anything.
#include <sys/wait.h>

#include <cstring>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/wire/wire.h"
#include "testing/scrape_metrics.h"
#include "testing/server_process.h"
#include "testing/sized_blocks.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using client::Client;
using client::PutResult;

Namespace SizedNamespace(uint32_t bytes) {
  return testing::SizedNamespace("acme", "slot-fit-" + std::to_string(bytes), bytes);
}

TEST(SlotFitTest, ASlabThatCannotHoldTheLargestBlocksSlotIsRefusedAtStart) {
  // Both 1000001: the block's slot rounds up to 1000064 bytes, so every such put would have evicted the
  // whole tier and then been refused.
  std::string out;
  const int status = testing::RunServerToExit(
      "--node_id=x --metrics_address=none --listen_address=127.0.0.1:0 --host_cache_bytes=64MiB "
      "--slab_bytes=1000001 --max_block_bytes=1000001",
      out);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_NE(out.find("limits.max_block_bytes: 1000001 needs a 1000064-byte slot"), std::string::npos) << out;
  EXPECT_NE(out.find("at least 1000064"), std::string::npos) << out;
}

TEST(SlotFitTest, ABlockThatCouldNotFitAnEmptyTierEvictsNothing) {
  // A host tier shorter than a slab is one slab of 1000001 bytes: the largest block is 1000000.
  auto server = testing::ServerProcess::Start("node-s", {"--host_cache_bytes=1000001"});
  ASSERT_OK(server);
  auto c = Client::Connect({.members = {(*server)->address()}, .transport = "grpc"});
  ASSERT_OK(c);

  const Namespace small = SizedNamespace(64 << 10);
  std::vector<uint32_t> tokens(15);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = 7 + i;
  auto fps = ChainFingerprints(small, tokens);
  ASSERT_OK(fps);
  std::vector<std::vector<std::byte>> data(fps->size(), std::vector<std::byte>(64 << 10, std::byte{0x5a}));
  std::vector<std::span<const std::byte>> views(data.begin(), data.end());
  auto put = (*c)->Put(small, *fps, 0, views);
  ASSERT_OK(put);
  for (PutResult r : *put) ASSERT_EQ(r, PutResult::kStored);

  // The server refuses the 1000001-byte block itself (a raw request, past any client-side check).
  const Namespace huge = SizedNamespace(1000001);
  auto huge_fps = ChainFingerprints(huge, tokens);
  ASSERT_OK(huge_fps);
  v1::AllocateRequest req;
  wire::ToProto(huge, req.mutable_namespace_());
  std::vector<BlockKey> keys = {{huge_fps->front(), 0}};
  wire::EncodeKeys(keys, req.mutable_keys());
  v1::AllocateResponse resp;
  grpc::ClientContext ctx;
  auto stub = v1::CacheService::NewStub(grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  const grpc::Status s = stub->Allocate(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("at most 1000000"), std::string::npos) << s.error_message();

  auto hit = (*c)->LookupPrefix(small, *fps);
  ASSERT_OK(hit);
  EXPECT_EQ(hit->prefix_blocks, fps->size()) << "every block of the tier is still there";
  EXPECT_EQ(
      testing::MetricValue(testing::ScrapeMetrics((*server)->metrics_port()), "kvtier_evictions_total{tier=\"host\"}"),
      0);
}

}  // namespace
}  // namespace kvtier
