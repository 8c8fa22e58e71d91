// The reference worker (examples/reference_worker) against real in-process servers: logits computed with
// KV fetched from kvtier equal logits of a full recompute, bit for bit for the plain bf16 codec and
// within a bound fixed below for int8 / fp8_e4m3, over prompts sharing prefixes at and off block
// boundaries, on 1 and 3 servers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/reference_worker/reference_worker.h"
#include "kvtier/server/server.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using reference_worker::ReferenceWorker;
using reference_worker::ServeResult;
using reference_worker::WorkerOptions;

constexpr uint32_t kB = 32;  // block_tokens (two 16-token pages)

// The bound on quantized codecs, fixed before running: max_v |logit_v - ref_v| <= 4 * eps * max_v |ref_v|,
// where eps bounds one stored KV element's error relative to its group's largest magnitude (quantize.h):
//   int8: scale / 2 * (1 + 2^-13) with scale = amax / 127, plus bf16 rounding of the dequantized value
//         (2^-8 relative): eps = (1 + 2^-13) / 254 + 2^-8 ~= 0.0079
//   fp8:  2^-4 relative (3 mantissa bits) * (1 + 2^-13), plus 2^-8 bf16 rounding: eps ~= 0.0664
// Why 4 eps: the logits are an RMS-normalized function of the residual stream, to which each layer's
// attention adds a convex combination of V rows (V error <= eps of its scale) computed with softmax
// weights whose scores move by about as much again through K (q . dk / sqrt(head_dim)): ~2 eps per
// fetched generation. A block stored by a worker that itself attended over dequantized KV carries a
// second generation of error (the "extends" cases below), hence 2 x 2 eps.
double QuantEps(Codec codec) {
  const double bf16 = std::ldexp(1.0, -8), fp32 = 1.0 + std::ldexp(1.0, -13);
  switch (codec) {
    case Codec::kInt8:
      return fp32 / 254.0 + bf16;
    case Codec::kFp8E4m3:
      return std::ldexp(1.0, -4) * fp32 + bf16;
    case Codec::kNone:
      break;
  }
  return 0.0;
}
double LogitBound(Codec codec) { return 4.0 * QuantEps(codec); }

std::vector<uint32_t> Tokens(uint64_t seed, size_t n, uint32_t vocab) {
  std::vector<uint32_t> t(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 7;
  for (auto& v : t) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<uint32_t>(x % vocab);
  }
  return t;
}

// base[0, shared) followed by `suffix_len` other tokens; the first of them differs from base[shared],
// so exactly `shared` tokens are common to both prompts.
std::vector<uint32_t> Diverging(const std::vector<uint32_t>& base, size_t shared, size_t suffix_len, uint64_t seed,
                                uint32_t vocab) {
  std::vector<uint32_t> p(base.begin(), base.begin() + shared);
  std::vector<uint32_t> suffix = Tokens(seed, suffix_len, vocab);
  if (shared < base.size() && suffix[0] == base[shared]) suffix[0] = (suffix[0] + 1) % vocab;
  p.insert(p.end(), suffix.begin(), suffix.end());
  return p;
}

struct Case {
  std::string name;
  std::vector<uint32_t> prompt;
  uint32_t want_fetched_blocks;
  uint32_t want_computed_from;
};

struct Param {
  int servers;
  Codec codec;
};
void PrintTo(const Param& p, std::ostream* os) { *os << CodecName(p.codec) << " on " << p.servers << " server(s)"; }

// In-process servers on 127.0.0.1:0, a client of all of them, and two workers with the same weights:
// `cached_` serves through kvtier, `plain_` always recomputes (the reference).
class ReferenceWorkerFixture : public ::testing::Test {
 protected:
  void StartCluster(int servers) {
    std::vector<std::string> members;
    for (int i = 1; i <= servers; ++i) {
      // 1 MiB slabs, so blocks of two sizes (plain and int8) both fit: with one 64 MiB slab the second
      // size class would take the only slab and evict every block of the first.
      auto s = server::Server::Start({.node_id = "node-" + std::to_string(i),
                                      .metrics_address = "",
                                      .host_cache_bytes = 64ULL << 20,
                                      .slab_bytes = 1ULL << 20,
                                      .max_block_bytes = 1ULL << 20});
      ASSERT_OK(s);
      members.push_back("127.0.0.1:" + std::to_string((*s)->grpc_port()));
      servers_.push_back(std::move(s).value());
    }
    auto c = client::Client::Connect({.members = members, .rpc_timeout = absl::Milliseconds(1500)});
    ASSERT_OK(c);
    client_ = std::move(c).value();
  }

  // 3 layers, d_model 128, 4 query heads over 2 KV heads of 32, vocab 512 (ModelConfig's defaults);
  // 16-token pages, 32-token blocks.
  static WorkerOptions Options(Codec codec) {
    WorkerOptions options;
    options.page_size = 16;
    options.block_tokens = kB;
    options.num_pages = 64;
    options.codec = codec;
    options.quant_group_size = 32;
    return options;
  }

  void MakeWorkers(Codec codec) {
    auto cached = ReferenceWorker::Create(Options(codec), client_.get());
    ASSERT_OK(cached);
    cached_ = std::move(cached).value();
    auto plain = ReferenceWorker::Create(Options(codec), nullptr);  // full recompute, same weights
    ASSERT_OK(plain);
    plain_ = std::move(plain).value();
  }

  std::vector<std::unique_ptr<server::Server>> servers_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<ReferenceWorker> cached_;
  std::unique_ptr<ReferenceWorker> plain_;
};

class ReferenceWorkerTest : public ReferenceWorkerFixture, public ::testing::WithParamInterface<Param> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartCluster(GetParam().servers));
    ASSERT_NO_FATAL_FAILURE(MakeWorkers(GetParam().codec));
  }
};

TEST_P(ReferenceWorkerTest, LogitsWithFetchedKvMatchFullRecompute) {
  const Codec codec = GetParam().codec;
  const uint32_t vocab = static_cast<uint32_t>(cached_->options().model.vocab_size);
  const auto& stats = client_->stats();
  EXPECT_EQ(cached_->ns().layout.codec, codec);
  EXPECT_EQ(cached_->ns().layout.block_tokens, kB);

  const std::vector<uint32_t> base = Tokens(1, 4 * kB + 8, vocab);  // 4 full blocks + 8 tokens
  std::vector<Case> cases = {
      {"cold: nothing cached yet", base, 0, 0},
      {"shares B-1 tokens", Diverging(base, kB - 1, 25, 11, vocab), 0, 0},
      {"shares B tokens", Diverging(base, kB, 25, 12, vocab), 1, kB},
      {"shares B+1 tokens", Diverging(base, kB + 1, 25, 13, vocab), 1, kB},
      {"shares 2B tokens", Diverging(base, 2 * kB, 25, 14, vocab), 2, 2 * kB},
      {"shares 3B+5 tokens", Diverging(base, 3 * kB + 5, 40, 15, vocab), 3, 3 * kB},
      {"cached but for its last token (3B+1)", Diverging(base, 3 * kB, 1, 16, vocab), 3, 3 * kB},
      {"entirely cached, 2B tokens (last one recomputed)", {base.begin(), base.begin() + 2 * kB}, 2, 2 * kB - 1},
      {"repeat of the first prompt", base, 4, 4 * kB},
      {"no cached blocks", Tokens(99, 3 * kB + 7, vocab), 0, 0},
      {"shorter than a block", Tokens(98, 10, vocab), 0, 0},
  };
  // Second generation: extends the "3B+5" prompt, whose block 3 that prompt computed over fetched KV
  // and stored, so all four leading blocks are now cached.
  std::vector<uint32_t> extended = cases[5].prompt;
  const auto more = Tokens(17, 30, vocab);
  extended.insert(extended.end(), more.begin(), more.end());
  cases.push_back({"extends the 3B+5 prompt (4B+45)", extended, 4, 4 * kB});

  if (GetParam().servers > 1) {  // the blocks really are spread over the members
    auto fps = ChainFingerprints(cached_->ns(), base);
    ASSERT_OK(fps);
    std::set<uint32_t> owners;
    for (const auto& fp : *fps) owners.insert(client_->ring().Primary(fp));
    EXPECT_GE(owners.size(), 2u) << "the 4 blocks of the base prompt all map to one member";
  }

  uint64_t want_total_fetched = 0;
  double worst_ratio = 0.0;
  bool some_quantized_logits_differ = false;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const uint64_t hit_before = stats.retrieve_hit_blocks.load();
    const uint64_t prefix_before = stats.prefix_hit_blocks.load();
    auto ref = plain_->Serve(c.prompt);
    ASSERT_OK(ref);
    auto got = cached_->Serve(c.prompt);
    ASSERT_OK(got);

    EXPECT_EQ(ref->fetched_blocks, 0u);
    EXPECT_EQ(ref->computed_from, 0u);
    EXPECT_EQ(got->lookup_hit_blocks, c.want_fetched_blocks);
    EXPECT_EQ(got->fetched_blocks, c.want_fetched_blocks);
    EXPECT_EQ(got->computed_from, c.want_computed_from);
    EXPECT_EQ(got->put_blocks, got->full_blocks - got->fetched_blocks);
    EXPECT_EQ(got->stored_blocks, got->put_blocks);
    // The client's counters show exactly the fetched blocks.
    EXPECT_EQ(stats.retrieve_hit_blocks.load() - hit_before, c.want_fetched_blocks);
    EXPECT_EQ(stats.prefix_hit_blocks.load() - prefix_before, c.want_fetched_blocks);
    want_total_fetched += c.want_fetched_blocks;

    ASSERT_EQ(got->logits.size(), static_cast<size_t>(vocab));
    ASSERT_EQ(ref->logits.size(), got->logits.size());
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t v = 0; v < ref->logits.size(); ++v) {
      ASSERT_TRUE(std::isfinite(got->logits[v]));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(got->logits[v]) - ref->logits[v]));
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref->logits[v])));
    }
    ASSERT_GT(max_ref, 0.0);
    const bool bitwise_equal =
        std::memcmp(got->logits.data(), ref->logits.data(), ref->logits.size() * sizeof(float)) == 0;
    if (codec == Codec::kNone || c.want_fetched_blocks == 0) {
      // Nothing lossy on the path: the same bits.
      EXPECT_TRUE(bitwise_equal) << "max |dlogit| " << max_diff;
    } else {
      const double ratio = max_diff / max_ref;
      worst_ratio = std::max(worst_ratio, ratio);
      some_quantized_logits_differ |= !bitwise_equal;
      EXPECT_LE(ratio, LogitBound(codec)) << "max |dlogit| " << max_diff << " of max |logit| " << max_ref;
    }
  }
  EXPECT_EQ(stats.retrieve_hit_blocks.load(), want_total_fetched);
  EXPECT_EQ(stats.retrieve_hit_tokens.load(), want_total_fetched * kB);
  EXPECT_EQ(stats.retrieve_hit_bytes.load(), want_total_fetched * cached_->ns().layout.ShardBytes());
  EXPECT_EQ(stats.misses_from_errors.load(), 0u);
  EXPECT_EQ(stats.checksum_failures.load(), 0u);
  if (codec != Codec::kNone) {
    // The fetched (lossy) KV really is what the logits were computed from.
    EXPECT_TRUE(some_quantized_logits_differ);
    std::printf("[ reference ] %s, %d server(s): worst max|dlogit| / max|logit| = %.5f, bound %.5f\n", CodecName(codec),
                GetParam().servers, worst_ratio, LogitBound(codec));
  }
}

// A plain and a quantized worker on one cluster never read each other's blocks: the codec is part of
// the namespace.
class ReferenceWorkerNamespaceTest : public ReferenceWorkerFixture {};

TEST_F(ReferenceWorkerNamespaceTest, CodecsLiveInSeparateNamespaces) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  ASSERT_NO_FATAL_FAILURE(MakeWorkers(Codec::kNone));
  auto int8 = ReferenceWorker::Create(Options(Codec::kInt8), client_.get());
  ASSERT_OK(int8);
  EXPECT_NE((*int8)->ns().Id(), cached_->ns().Id());
  const auto prompt = Tokens(5, 3 * kB, 512);
  auto first = cached_->Serve(prompt);
  ASSERT_OK(first);
  EXPECT_EQ(first->stored_blocks, 3u);
  auto other = (*int8)->Serve(prompt);
  ASSERT_OK(other);
  EXPECT_EQ(other->lookup_hit_blocks, 0u);
  EXPECT_EQ(other->stored_blocks, 3u);
  auto again = cached_->Serve(prompt);
  ASSERT_OK(again);
  EXPECT_EQ(again->lookup_hit_blocks, 3u);
  EXPECT_EQ(again->fetched_blocks, 3u);
}

INSTANTIATE_TEST_SUITE_P(ServersAndCodecs, ReferenceWorkerTest,
                         ::testing::Values(Param{1, Codec::kNone}, Param{3, Codec::kNone}, Param{1, Codec::kInt8},
                                           Param{3, Codec::kInt8}, Param{1, Codec::kFp8E4m3},
                                           Param{3, Codec::kFp8E4m3}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(CodecName(info.param.codec)) + "_" + std::to_string(info.param.servers) +
                                  "servers";
                         });

}  // namespace
}  // namespace kvtier
