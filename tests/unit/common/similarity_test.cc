#include "kvtier/common/similarity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "testing/status_matchers.h"

namespace kvtier {
namespace {

// Two item sets of `common` shared items and `own` items each of their own: Jaccard common / (common +
// 2 own). Items are random 64-bit values drawn from `rng`, so every pair is a fresh trial.
std::pair<std::vector<uint64_t>, std::vector<uint64_t>> PairWithJaccard(std::mt19937_64& rng, int common, int own) {
  std::vector<uint64_t> a, b;
  for (int i = 0; i < common; ++i) {
    const uint64_t x = rng();
    a.push_back(x);
    b.push_back(x);
  }
  for (int i = 0; i < own; ++i) a.push_back(rng());
  for (int i = 0; i < own; ++i) b.push_back(rng());
  std::shuffle(a.begin(), a.end(), rng);
  std::shuffle(b.begin(), b.end(), rng);
  return {a, b};
}

bool ShareABand(const std::vector<uint64_t>& x, const std::vector<uint64_t>& y) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) return true;
  }
  return false;
}

// Four standard deviations of a binomial proportion over `n` trials, plus 0.01.
double Slack(double p, int n) { return 4.0 * std::sqrt(p * (1 - p) / n) + 0.01; }

std::vector<uint64_t> Iota(uint64_t first, uint64_t count) {
  std::vector<uint64_t> v(count);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(SimilarityTest, DefaultBandsPutTheSteepestPointNearTheThreshold) {
  auto bands = ChooseLshBands(0.85, 128);
  ASSERT_OK(bands.status());
  EXPECT_LE(bands->bands * bands->rows, 128u);
  EXPECT_NEAR(bands->ApproximateThreshold(), 0.85, 0.03);
  EXPECT_GT(bands->CollisionProbability(0.95), 0.95);
  EXPECT_LT(bands->CollisionProbability(0.5), 0.01);
  EXPECT_DOUBLE_EQ(bands->CollisionProbability(1.0), 1.0);
  EXPECT_DOUBLE_EQ(bands->CollisionProbability(0.0), 0.0);
  // A lower threshold gives a curve that is higher everywhere in between.
  auto loose = ChooseLshBands(0.5, 128);
  ASSERT_OK(loose.status());
  EXPECT_GT(loose->CollisionProbability(0.6), bands->CollisionProbability(0.6));
}

TEST(SimilarityTest, InvalidOptionsNameTheField) {
  EXPECT_EQ(MinHasher::Create({.threshold = 1.5}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MinHasher::Create({.threshold = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  auto s = MinHasher::Create({.num_hashes = 0}).status();
  EXPECT_NE(s.message().find("similarity.num_hashes"), absl::string_view::npos) << s;
  s = MinHasher::Create({.shingle_size = 0}).status();
  EXPECT_NE(s.message().find("similarity.shingle_size"), absl::string_view::npos) << s;
}

TEST(SimilarityTest, IdenticalInputsGiveIdenticalKeysInEveryInstance) {
  auto h1 = MinHasher::Create();
  auto h2 = MinHasher::Create();  // as another process would build it
  ASSERT_OK(h1.status());
  ASSERT_OK(h2.status());
  const std::vector<uint64_t> items = Iota(1000, 37);
  EXPECT_EQ(h1->Signature(items), h2->Signature(items));
  EXPECT_EQ(h1->BandKeysOf(items), h2->BandKeysOf(items));
  EXPECT_EQ(h1->AffinityKey(items), h2->AffinityKey(items));
  // The stateless key is band 0's key.
  EXPECT_EQ(h1->AffinityKey(items), h1->BandKeysOf(items)[0]);
  EXPECT_NE(h1->AffinityKey(items), 0u);
  // Order and duplicates do not matter with 1-item shingles (a set).
  std::vector<uint64_t> shuffled = items;
  std::reverse(shuffled.begin(), shuffled.end());
  shuffled.push_back(items[3]);
  EXPECT_EQ(h1->AffinityKey(shuffled), h1->AffinityKey(items));
}

TEST(SimilarityTest, KeysAreFixedAcrossMachinesAndReleases) {
  // The hash family is part of the wire contract (servers aggregate clients' group keys): these values
  // must never change for the default options.
  auto h = MinHasher::Create();
  ASSERT_OK(h.status());
  const std::vector<uint64_t> items = Iota(0, 16);
  EXPECT_EQ(h->AffinityKey(items), h->AffinityKey(Iota(0, 16)));
  EXPECT_EQ(h->AffinityKey(items), 0x0bbecc87a5d0188eULL);  // golden
}

TEST(SimilarityTest, SeedsGiveIndependentFamilies) {
  auto h0 = MinHasher::Create({.seed = 0});
  auto h1 = MinHasher::Create({.seed = 1});
  ASSERT_OK(h0.status());
  ASSERT_OK(h1.status());
  EXPECT_NE(h0->AffinityKey(Iota(5, 20)), h1->AffinityKey(Iota(5, 20)));
}

TEST(SimilarityTest, EmptyInputHasTheAllOnesSignature) {
  auto h = MinHasher::Create();
  ASSERT_OK(h.status());
  const std::vector<uint64_t> sig = h->Signature({});
  ASSERT_EQ(sig.size(), h->num_hashes());
  EXPECT_TRUE(std::all_of(sig.begin(), sig.end(), [](uint64_t v) { return v == ~uint64_t{0}; }));
  EXPECT_EQ(h->AffinityKey({}), h->AffinityKey(std::vector<uint64_t>{}));
  EXPECT_NE(h->AffinityKey({}), 0u);
}

TEST(SimilarityTest, ShinglesMakeOrderMatter) {
  auto h = MinHasher::Create({.shingle_size = 4});
  ASSERT_OK(h.status());
  std::vector<uint64_t> items = Iota(0, 64);
  std::vector<uint64_t> reversed(items.rbegin(), items.rend());
  EXPECT_NE(h->AffinityKey(items), h->AffinityKey(reversed));
  // Fewer items than a shingle: one shingle of all of them, still deterministic.
  EXPECT_EQ(h->AffinityKey(Iota(0, 2)), h->AffinityKey(Iota(0, 2)));
  EXPECT_NE(h->AffinityKey(Iota(0, 2)), h->AffinityKey(Iota(0, 3)));
}

TEST(SimilarityTest, FingerprintAndTokenItems) {
  std::vector<Fingerprint> fps(3);
  fps[1].bytes[0] = 7;
  fps[2].bytes[7] = 1;
  EXPECT_EQ(ItemsFromFingerprints(fps), (std::vector<uint64_t>{0, 7, uint64_t{1} << 56}));
  const std::vector<uint32_t> tokens = {1, 0xffffffffu};
  EXPECT_EQ(ItemsFromTokens(tokens), (std::vector<uint64_t>{1, 0xffffffffu}));
}

// Measures over many random pairs how often two sets of a given Jaccard index share at least one band,
// and how often their stateless affinity keys are equal, against the formulas.
struct Rates {
  double any_band;
  double affinity;
};

Rates MeasureCollisions(const MinHasher& h, int common, int own, int trials, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int any = 0, affinity = 0;
  for (int t = 0; t < trials; ++t) {
    auto [a, b] = PairWithJaccard(rng, common, own);
    const auto ka = h.BandKeysOf(a);
    const auto kb = h.BandKeysOf(b);
    any += ShareABand(ka, kb);
    affinity += h.AffinityKey(a) == h.AffinityKey(b);
  }
  return {static_cast<double>(any) / trials, static_cast<double>(affinity) / trials};
}

TEST(SimilarityTest, PairsWellAboveTheThresholdCollideAsTheFormulaSays) {
  auto h = MinHasher::Create();
  ASSERT_OK(h.status());
  constexpr int kTrials = 400;
  const double s = 190.0 / 200.0;  // 190 common, 5 + 5 of their own
  const Rates rates = MeasureCollisions(*h, 190, 5, kTrials, 1);
  const double p_any = h->bands().CollisionProbability(s);
  const double p_key = std::pow(s, h->bands().rows);
  EXPECT_GE(rates.any_band, p_any - Slack(p_any, kTrials)) << "P(s)=" << p_any;
  EXPECT_GT(rates.any_band, 0.9);
  EXPECT_NEAR(rates.affinity, p_key, Slack(p_key, kTrials)) << "s^r=" << p_key;
}

TEST(SimilarityTest, PairsWellBelowTheThresholdRarelyCollide) {
  auto h = MinHasher::Create();
  ASSERT_OK(h.status());
  constexpr int kTrials = 400;
  const double s = 100.0 / 200.0;  // 100 common, 50 + 50 of their own
  const Rates rates = MeasureCollisions(*h, 100, 50, kTrials, 2);
  const double p_any = h->bands().CollisionProbability(s);
  EXPECT_LE(rates.any_band, p_any + Slack(p_any, kTrials)) << "P(s)=" << p_any;
  EXPECT_LT(rates.any_band, 0.03);
  EXPECT_LT(rates.affinity, 0.03);
}

TEST(SimilarityTest, MeasuredCurveFollowsTheFormulaAroundTheThreshold) {
  auto h = MinHasher::Create();
  ASSERT_OK(h.status());
  constexpr int kTrials = 300;
  // s = 0.75, 0.85, 0.9 with 200-item unions.
  for (auto [common, own] : {std::pair{150, 25}, std::pair{170, 15}, std::pair{180, 10}}) {
    const double s = static_cast<double>(common) / (common + 2 * own);
    const double p = h->bands().CollisionProbability(s);
    const Rates rates = MeasureCollisions(*h, common, own, kTrials, 3 + common);
    EXPECT_NEAR(rates.any_band, p, Slack(p, kTrials)) << "s=" << s;
  }
}

TEST(SimilarityIndexTest, SimilarRequestsJoinTheFoundersGroupAndDissimilarOnesFoundTheirOwn) {
  auto h = MinHasher::Create();
  ASSERT_OK(h.status());
  SimilarityIndex index;
  // a, b, c: a conversation whose window slides by 10 items a turn (J(a,b) = J(b,c) = 0.95, J(a,c) = 0.90).
  const auto a = Iota(0, 400), b = Iota(10, 400), c = Iota(20, 400), other = Iota(100000, 400);
  const uint64_t ga = index.Assign(h->BandKeysOf(a));
  EXPECT_EQ(ga, h->AffinityKey(a));  // a founder's group is its stateless key
  EXPECT_EQ(index.Assign(h->BandKeysOf(b)), ga);
  EXPECT_EQ(index.Assign(h->BandKeysOf(c)), ga);
  const uint64_t go = index.Assign(h->BandKeysOf(other));
  EXPECT_NE(go, ga);
  EXPECT_EQ(go, h->AffinityKey(other));
  EXPECT_EQ(index.Assign(h->BandKeysOf(a)), ga);  // same input, same group
  EXPECT_EQ(index.Assign({}), 0u);
}

TEST(SimilarityIndexTest, NeverHoldsMoreThanItsCapacity) {
  auto h = MinHasher::Create();
  ASSERT_OK(h.status());
  const size_t bands = h->bands().bands;
  SimilarityIndex index(10 * bands);
  for (uint64_t i = 0; i < 100; ++i) {
    index.Assign(h->BandKeysOf(Iota(i * 1000, 20)));
    EXPECT_LE(index.size(), 10 * bands);
  }
  // A request seen in the current generation is still grouped with itself.
  const auto last = Iota(99 * 1000, 20);
  EXPECT_EQ(index.Assign(h->BandKeysOf(last)), h->AffinityKey(last));
}

}  // namespace
}  // namespace kvtier
