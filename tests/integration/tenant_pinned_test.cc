// One tenant leasing as fast as it can must not starve another tenant's puts: a real kvtier-server
// process whose host tier one tenant ("greedy") has filled and keeps leasing from several threads,
// never releasing, while a second tenant ("steady") puts new blocks. With the default
// leases.tenant_pinned_share (0.5) every put of the second tenant is stored (at once when it already
// holds blocks; within leases.max_ttl when the first tenant was alone and had pinned everything), and
// the refused leases are counted under the first tenant's name; with the bound lifted (share 1) the
// same load pins the tier and the puts are refused, which is what the bound is for.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
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
using client::GetResult;
using client::PutResult;

constexpr uint64_t kBlockBytes = 64ULL << 10;
constexpr uint64_t kHostBytes = 8ULL << 20;  // 128 blocks
constexpr size_t kTierBlocks = kHostBytes / kBlockBytes;

Namespace TenantNamespace(const std::string& tenant) {
  return testing::SizedNamespace(tenant, "pinned-bound", static_cast<uint32_t>(kBlockBytes));
}

std::vector<Fingerprint> Fingerprints(const Namespace& ns, uint32_t first, size_t n) {
  std::vector<uint32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = first + static_cast<uint32_t>(i);
  auto fps = ChainFingerprints(ns, tokens);
  return fps.ok() ? *fps : std::vector<Fingerprint>{};
}

std::vector<std::byte> Payload(const Fingerprint& fp) { return testing::FingerprintPayload(fp, kBlockBytes); }

std::vector<PutResult> PutAll(Client& c, const Namespace& ns, std::span<const Fingerprint> fps) {
  std::vector<std::vector<std::byte>> data;
  for (const auto& fp : fps) data.push_back(Payload(fp));
  std::vector<std::span<const std::byte>> views(data.begin(), data.end());
  auto r = c.Put(ns, fps, 0, views);
  EXPECT_OK(r);
  return r.ok() ? *r : std::vector<PutResult>(fps.size(), PutResult::kError);
}

struct Outcome {
  size_t stored = 0;
  size_t refused = 0;                                      // anything else
  size_t lookups = 0;                                      // greedy leases taken meanwhile
  double pinned_refusals = -1;                             // the greedy tenant's series; -1: absent from /metrics
  double steady_pinned_refusals = -1;                      // the steady tenant's (never refused)
  absl::Duration first_stored = absl::InfiniteDuration();  // from the steady tenant's first put
};

// How the run starts: "steady" already holds blocks when "greedy" fills the rest of the tier and leases
// it (a shared server), or "greedy" is alone until "steady" arrives.
enum class Start { kSteadyHoldsBlocks, kGreedyAlone };

// Starts a server with `tenant_pinned_share` (leases of at most 2 s), fills its tier with "greedy" blocks
// and leases them from four threads without releasing, while "steady" retries its first batch of 8 for
// up to 8 s, then puts 192 more.
Outcome RunGreedyAgainstSteady(double tenant_pinned_share, Start start) {
  Outcome out;
  char dir[] = "/tmp/kvtier-pinned-XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  const std::string config = std::string(dir) + "/kvtier.yaml";
  std::ofstream(config) << "leases:\n  default_ttl: 1s\n  max_ttl: 2s\n  tenant_pinned_share: " << tenant_pinned_share
                        << "\n";
  auto server =
      testing::ServerProcess::Start("node-p", {"--config=" + config, absl::StrCat("--host_cache_bytes=", kHostBytes),
                                               "--slab_bytes=1MiB", "--max_block_bytes=64KiB"});
  EXPECT_OK(server);
  if (!server.ok()) return out;
  auto c = Client::Connect({.members = {(*server)->address()}, .rpc_timeout = absl::Seconds(20), .transport = "grpc"});
  EXPECT_OK(c);
  if (!c.ok()) return out;

  const Namespace steady = TenantNamespace("steady");
  const std::vector<Fingerprint> steady_fps = Fingerprints(steady, 100'000, 208);
  size_t held = 0;
  if (start == Start::kSteadyHoldsBlocks) {
    held = 8;
    PutAll(**c, steady, std::span<const Fingerprint>(steady_fps).first(held));
  }
  const Namespace greedy = TenantNamespace("greedy");
  const std::vector<Fingerprint> greedy_fps = Fingerprints(greedy, 1, kTierBlocks - held);
  for (size_t i = 0; i < greedy_fps.size(); i += 16) {
    PutAll(**c, greedy,
           std::span<const Fingerprint>(greedy_fps).subspan(i, std::min<size_t>(16, greedy_fps.size() - i)));
  }
  v1::LookupRequest req;
  wire::ToProto(greedy, req.mutable_namespace_());
  std::vector<BlockKey> keys;
  for (const auto& fp : greedy_fps) keys.push_back({fp, 0});
  wire::EncodeKeys(keys, req.mutable_keys());
  req.set_lease_ms(60'000);

  std::atomic<bool> stop{false};
  std::atomic<size_t> lookups{0};
  std::vector<std::thread> leasers;
  for (int t = 0; t < 4; ++t) {
    leasers.emplace_back([&] {
      auto stub =
          v1::CacheService::NewStub(grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
      while (!stop.load()) {
        v1::LookupResponse resp;
        grpc::ClientContext ctx;
        if (stub->Lookup(&ctx, req, &resp).ok()) lookups.fetch_add(1);
      }
    });
  }
  // Let the leases take hold before the other tenant starts.
  while (lookups.load() < 20) std::this_thread::sleep_for(std::chrono::milliseconds(5));

  // The first batch, retried until stored: a tenant alone may have pinned the whole tier, which its
  // leases give back within max_ttl once another tenant is refused space.
  const absl::Time began = absl::Now();
  const auto first = std::span<const Fingerprint>(steady_fps).subspan(held, 8);
  while (absl::Now() - began < absl::Seconds(8)) {
    const std::vector<PutResult> r = PutAll(**c, steady, first);
    if (std::all_of(r.begin(), r.end(), [](PutResult p) { return p == PutResult::kStored; })) {
      out.first_stored = absl::Now() - began;
      out.stored += r.size();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (size_t i = held + 8; out.first_stored != absl::InfiniteDuration() && i < steady_fps.size(); i += 8) {
    for (PutResult r : PutAll(**c, steady, std::span<const Fingerprint>(steady_fps).subspan(i, 8))) {
      (r == PutResult::kStored ? out.stored : out.refused) += 1;
    }
  }
  if (out.first_stored == absl::InfiniteDuration()) out.refused = steady_fps.size() - held;
  // The last batch is readable, byte for byte, while the leasing goes on.
  const auto last = std::span<const Fingerprint>(steady_fps).last(8);
  std::vector<std::vector<std::byte>> back(last.size(), std::vector<std::byte>(kBlockBytes));
  std::vector<std::span<std::byte>> views(back.begin(), back.end());
  auto got = (*c)->Get(steady, last, 0, views);
  EXPECT_OK(got);
  if (got.ok() && out.refused == 0) {
    for (size_t i = 0; i < last.size(); ++i) {
      EXPECT_EQ((*got)[i], GetResult::kHit) << i;
      EXPECT_EQ(back[i], Payload(last[i])) << i;
    }
  }
  stop.store(true);
  for (auto& t : leasers) t.join();
  out.lookups = lookups.load();
  out.pinned_refusals = testing::MetricValue(testing::ScrapeMetrics((*server)->metrics_port()),
                                             "kvtier_lease_refusals_total{tenant=\"greedy\",reason=\"pinned_bound\"}");
  out.steady_pinned_refusals =
      testing::MetricValue(testing::ScrapeMetrics((*server)->metrics_port()),
                           "kvtier_lease_refusals_total{tenant=\"steady\",reason=\"pinned_bound\"}");
  std::printf(
      "tenant_pinned_share %.2f, %s: steady put %zu stored, %zu refused, first stored after %s; greedy took %zu "
      "leases, %.0f blocks refused\n",
      tenant_pinned_share, start == Start::kSteadyHoldsBlocks ? "steady holds blocks" : "greedy alone first",
      out.stored, out.refused, absl::FormatDuration(out.first_stored).c_str(), out.lookups, out.pinned_refusals);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return out;
}

TEST(TenantPinnedTest, ALeasingTenantCannotStarveAnotherTenantsPuts) {
  const Outcome o = RunGreedyAgainstSteady(0.5, Start::kSteadyHoldsBlocks);
  EXPECT_EQ(o.stored, 200u);
  EXPECT_EQ(o.refused, 0u);
  EXPECT_LT(o.first_stored, absl::Seconds(1)) << "the bound held from the start: nothing to wait for";
  EXPECT_GT(o.lookups, 20u);
  EXPECT_GT(o.pinned_refusals, 0) << "the greedy tenant's refused leases are counted under its name";
  EXPECT_EQ(o.steady_pinned_refusals, 0) << "a tenant never refused is exported at 0, not left out";
}

TEST(TenantPinnedTest, ATenantAloneGivesBackItsLeasesWithinMaxTtlWhenAnotherArrives) {
  const Outcome o = RunGreedyAgainstSteady(0.5, Start::kGreedyAlone);
  EXPECT_LT(o.first_stored, absl::Seconds(2 + 3)) << "max_ttl is 2 s";
  EXPECT_EQ(o.stored, 208u);
  EXPECT_EQ(o.refused, 0u);
  EXPECT_GT(o.pinned_refusals, 0);
}

TEST(TenantPinnedTest, WithoutTheBoundTheSameLoadPinsTheTier) {
  const Outcome o = RunGreedyAgainstSteady(1.0, Start::kGreedyAlone);
  EXPECT_EQ(o.first_stored, absl::InfiniteDuration())
      << "every greedy block leased: nothing is left to evict for the other tenant";
  EXPECT_EQ(o.pinned_refusals, 0) << "exported at 0 from the tenant's first namespace on";
  EXPECT_EQ(o.steady_pinned_refusals, 0);
}

}  // namespace
}  // namespace kvtier
