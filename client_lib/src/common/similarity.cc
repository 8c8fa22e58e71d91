#include "kvtier/common/similarity.h"

#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

constexpr uint64_t kPrime = (uint64_t{1} << 61) - 1;  // Mersenne prime 2^61 - 1
constexpr uint64_t kEmptyValue = std::numeric_limits<uint64_t>::max();
constexpr uint32_t kMaxHashes = 4096;
constexpr uint32_t kMaxShingle = 64;

uint64_t ModPrime(uint64_t x) {
  x = (x & kPrime) + (x >> 61);
  return x >= kPrime ? x - kPrime : x;
}

// (a * x) mod p for a, x < p.
uint64_t MulModPrime(uint64_t a, uint64_t x) {
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * x;
  const uint64_t lo = static_cast<uint64_t>(product) & kPrime;
  const uint64_t hi = static_cast<uint64_t>(product >> 61);
  return ModPrime(lo + hi);
}

void PutLe64(uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

void PutLe32(uint32_t v, unsigned char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t NonZero(uint64_t key) { return key == 0 ? 1 : key; }

// Coefficient `tag` ('a' or 'b') of hash function i: XXH3-64(le64(seed) || le32(i) || tag) mod p.
uint64_t Coefficient(uint64_t seed, uint32_t i, unsigned char tag) {
  unsigned char buf[13];
  PutLe64(seed, buf);
  PutLe32(i, buf + 8);
  buf[12] = tag;
  return ModPrime(XXH3_64bits(buf, sizeof(buf)));
}

// integral of f over [lo, hi] by the midpoint rule.
template <typename F>
double Integrate(F f, double lo, double hi) {
  constexpr int kSteps = 256;
  const double step = (hi - lo) / kSteps;
  double sum = 0;
  for (int i = 0; i < kSteps; ++i) sum += f(lo + (i + 0.5) * step);
  return sum * step;
}

}  // namespace

absl::Status SimilarityOptions::Validate() const {
  if (!(threshold > 0 && threshold < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("similarity.threshold: ", threshold, " is not in (0, 1)"));
  }
  if (num_hashes == 0 || num_hashes > kMaxHashes) {
    return absl::InvalidArgumentError(
        absl::StrCat("similarity.num_hashes: ", num_hashes, " is not in [1, ", kMaxHashes, "]"));
  }
  if (shingle_size == 0 || shingle_size > kMaxShingle) {
    return absl::InvalidArgumentError(
        absl::StrCat("similarity.shingle_size: ", shingle_size, " is not in [1, ", kMaxShingle, "]"));
  }
  return absl::OkStatus();
}

double LshBands::CollisionProbability(double s) const {
  if (bands == 0 || rows == 0) return 0;
  return 1.0 - std::pow(1.0 - std::pow(s, rows), bands);
}

double LshBands::ApproximateThreshold() const {
  if (bands == 0 || rows == 0) return 1;
  return std::pow(1.0 / bands, 1.0 / rows);
}

absl::StatusOr<LshBands> ChooseLshBands(double threshold, uint32_t num_hashes) {
  const absl::Status valid = SimilarityOptions{.threshold = threshold, .num_hashes = num_hashes}.Validate();
  if (!valid.ok()) return valid;
  LshBands best{.bands = 1, .rows = 1};
  double best_error = std::numeric_limits<double>::infinity();
  for (uint32_t b = 1; b <= num_hashes; ++b) {
    for (uint32_t r = 1; b * r <= num_hashes; ++r) {
      const LshBands candidate{.bands = b, .rows = r};
      const double false_positive =
          Integrate([&](double s) { return candidate.CollisionProbability(s); }, 0.0, threshold);
      const double false_negative =
          Integrate([&](double s) { return 1.0 - candidate.CollisionProbability(s); }, threshold, 1.0);
      const double error = false_positive + false_negative;
      if (error < best_error) {
        best_error = error;
        best = candidate;
      }
    }
  }
  return best;
}

std::vector<uint64_t> ItemsFromFingerprints(std::span<const Fingerprint> fps) {
  std::vector<uint64_t> items;
  items.reserve(fps.size());
  for (const Fingerprint& fp : fps) items.push_back(fp.RingPosition());
  return items;
}

std::vector<uint64_t> ItemsFromTokens(std::span<const uint32_t> tokens) {
  return std::vector<uint64_t>(tokens.begin(), tokens.end());
}

absl::StatusOr<MinHasher> MinHasher::Create(const SimilarityOptions& options) {
  const absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  auto bands = ChooseLshBands(options.threshold, options.num_hashes);
  if (!bands.ok()) return bands.status();
  MinHasher h;
  h.options_ = options;
  h.bands_ = *bands;
  h.a_.resize(options.num_hashes);
  h.b_.resize(options.num_hashes);
  for (uint32_t i = 0; i < options.num_hashes; ++i) {
    const uint64_t a = Coefficient(options.seed, i, 'a');
    h.a_[i] = a == 0 ? 1 : a;
    h.b_[i] = Coefficient(options.seed, i, 'b');
  }
  return h;
}

void MinHasher::ShingleHashes(std::span<const uint64_t> items, std::vector<uint64_t>* out) const {
  out->clear();
  if (items.empty()) return;
  const size_t k = std::min<size_t>(options_.shingle_size, items.size());
  std::vector<unsigned char> bytes(items.size() * 8);
  for (size_t i = 0; i < items.size(); ++i) PutLe64(items[i], bytes.data() + 8 * i);
  out->reserve(items.size() - k + 1);
  for (size_t start = 0; start + k <= items.size(); ++start) {
    out->push_back(ModPrime(XXH3_64bits_withSeed(bytes.data() + 8 * start, 8 * k, options_.seed)));
  }
  // Equal shingles give equal minima: deduplicating only saves work.
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
}

std::vector<uint64_t> MinHasher::SignaturePrefix(std::span<const uint64_t> items, uint32_t count) const {
  std::vector<uint64_t> shingles;
  ShingleHashes(items, &shingles);
  std::vector<uint64_t> signature(count, kEmptyValue);
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t m = kEmptyValue;
    const uint64_t a = a_[i];
    const uint64_t b = b_[i];
    for (uint64_t x : shingles) m = std::min(m, ModPrime(MulModPrime(a, x) + b));
    signature[i] = m;
  }
  return signature;
}

std::vector<uint64_t> MinHasher::Signature(std::span<const uint64_t> items) const {
  return SignaturePrefix(items, options_.num_hashes);
}

std::vector<uint64_t> MinHasher::BandKeys(std::span<const uint64_t> signature) const {
  assert(signature.size() >= static_cast<size_t>(bands_.bands) * bands_.rows);
  std::vector<uint64_t> keys(bands_.bands);
  for (uint32_t j = 0; j < bands_.bands; ++j) {
    const size_t first = static_cast<size_t>(j) * bands_.rows;
    keys[j] = BandKey(j, first < signature.size() ? signature.subspan(first) : std::span<const uint64_t>());
  }
  return keys;
}

uint64_t MinHasher::BandKey(uint32_t band, std::span<const uint64_t> values) const {
  std::vector<unsigned char> buf(4 + 8 * static_cast<size_t>(bands_.rows));
  PutLe32(band, buf.data());
  for (uint32_t r = 0; r < bands_.rows; ++r) {
    PutLe64(r < values.size() ? values[r] : kEmptyValue, buf.data() + 4 + 8 * r);
  }
  return NonZero(XXH3_64bits_withSeed(buf.data(), buf.size(), options_.seed));
}

std::vector<uint64_t> MinHasher::BandKeysOf(std::span<const uint64_t> items) const {
  return BandKeys(Signature(items));
}

uint64_t MinHasher::AffinityKey(std::span<const uint64_t> items) const {
  // Band 0 is rows 0..r-1: only those r hash functions are evaluated.
  return BandKey(0, SignaturePrefix(items, bands_.rows));
}

uint64_t PromptGroupKey(std::span<const Fingerprint> fps) {
  // Built once; the default options always validate.
  static const MinHasher* const kHasher = new MinHasher(*MinHasher::Create());
  return kHasher->AffinityKey(ItemsFromFingerprints(fps.first(std::min(fps.size(), kGroupKeyBlocks))));
}

SimilarityIndex::SimilarityIndex(size_t capacity_keys) : generation_keys_(std::max<size_t>(capacity_keys, 2) / 2) {}

void SimilarityIndex::RecordLocked(uint32_t band, uint64_t key, uint64_t group) {
  const auto k = std::make_pair(band, key);
  auto it = current_.find(k);
  if (it != current_.end()) {
    it->second = group;
    return;
  }
  old_.erase(k);
  if (current_.size() >= generation_keys_) {
    old_ = std::move(current_);
    current_ = Table();
  }
  current_.emplace(k, group);
}

uint64_t SimilarityIndex::Assign(std::span<const uint64_t> band_keys) {
  if (band_keys.empty()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t group = 0;
  for (uint32_t j = 0; j < band_keys.size() && group == 0; ++j) {
    const auto k = std::make_pair(j, band_keys[j]);
    if (auto it = current_.find(k); it != current_.end()) {
      group = it->second;
    } else if (auto old = old_.find(k); old != old_.end()) {
      group = old->second;
    }
  }
  if (group == 0) group = NonZero(band_keys[0]);
  for (uint32_t j = 0; j < band_keys.size(); ++j) RecordLocked(j, band_keys[j], group);
  return group;
}

size_t SimilarityIndex::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_.size() + old_.size();
}

}  // namespace kvtier
