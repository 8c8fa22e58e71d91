// Similarity groups (DESIGN.md §7): MinHash signatures over shingles of a prompt's tokens or block
// fingerprints, LSH banding, and a 64-bit affinity key that routers and servers group requests by.
//
// KV reuse stays exact-prefix only; a group is a routing and reporting hint, never a reason to serve a
// block. A short shared system prompt before long different bodies is not "similar" by MinHash (the
// bodies dominate the shingle sets); the exact-prefix index handles that case.
//
// Inputs. A sequence of 64-bit items: token ids (widened from uint32), the first 8 bytes of each block
// fingerprint (ItemsFromFingerprints), or trace hash ids. A shingle is `shingle_size` consecutive items;
// a sequence of n >= k items has n - k + 1 shingles, a shorter non-empty one has a single shingle of
// all its items. Similarity is the Jaccard index of the two shingle sets. Fingerprints are prefix
// chained (each names its whole prefix), so shingle_size 1 suits them; raw tokens want 4-16.
//
// MinHash. Each shingle is hashed to x = XXH3-64(le64(item_0) || ... || le64(item_{k-1}), seed). Hash
// function i (0 <= i < num_hashes) is h_i(x) = (a_i * (x mod p) + b_i) mod p with p = 2^61 - 1 and
// a_i in [1, p), b_i in [0, p) derived from XXH3-64 of (seed, i); signature[i] = min over shingles of
// h_i. For two sets of Jaccard index s, P(signature[i] equal) = s (up to the 2^-61 hash collisions).
//
// LSH banding. The signature is cut into b bands of r rows (b * r <= num_hashes; the rest unused).
// Band j's key is XXH3-64(le32(j) || le64 of its r values, seed). Two sets share band j with
// probability s^r, and share at least one band with probability
//     P(s) = 1 - (1 - s^r)^b,
// an S-curve whose steepest point is near t = (1/b)^(1/r). ChooseLshBands picks (b, r) for a
// threshold t as datasketch does: among every b * r <= num_hashes, the pair minimising the false
// positive area integral_0^t P(s) ds plus the false negative area integral_t^1 (1 - P(s)) ds (equal
// weights). Default: t = 0.85 over 128 hashes.
//
// Affinity key. AffinityKey() is the key of band 0: a stateless 64-bit group id, equal for two sets
// with probability s^r (one band; a single stateless key cannot do better than one band). A router
// that keeps state gets the full S-curve from SimilarityIndex, which joins a request to the group of
// any band it shares with a recent request and names a new group after its founder's band-0 key, so
// the two ids agree for a group's first member.
//
// Determinism: no process-local seed or pointer enters any hash, and items are hashed as little-endian
// bytes, so the same input and options give the same signature, band keys and affinity key in every
// process, on every machine, after every restart. Different `seed`s give independent families.
#ifndef KVTIER_COMMON_SIMILARITY_H_
#define KVTIER_COMMON_SIMILARITY_H_

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/common/fingerprint.h"

namespace kvtier {

// Every field has a default. Validate() names the first bad field.
struct SimilarityOptions {
  double threshold = 0.85;    // Jaccard index at which LSH groups requests; in (0, 1)
  uint32_t num_hashes = 128;  // MinHash signature length; 1..4096 (cost: one multiply per shingle each)
  uint32_t shingle_size = 1;  // items per shingle; 1..64 (1 for fingerprints and hash ids)
  uint64_t seed = 0;          // hash family; every party that compares keys must use the same one

  // Errors: InvalidArgument naming the field ("similarity.threshold: 1.5 is not in (0, 1)").
  absl::Status Validate() const;
};

// An LSH banding: `bands` bands of `rows` rows each.
struct LshBands {
  uint32_t bands = 0;
  uint32_t rows = 0;

  // P(s) = 1 - (1 - s^rows)^bands: the probability that two sets of Jaccard index `s` (in [0, 1])
  // share at least one band.
  double CollisionProbability(double s) const;
  // (1/bands)^(1/rows): about where P(s) is steepest (P there is ~1 - 1/e for large bands).
  double ApproximateThreshold() const;
};

// The (b, r) with b * r <= num_hashes minimising the false positive plus false negative area around
// `threshold` (see the file comment). Deterministic. Errors: InvalidArgument (threshold not in (0, 1),
// num_hashes 0 or above 4096).
absl::StatusOr<LshBands> ChooseLshBands(double threshold, uint32_t num_hashes);

// Item sequence of a prompt's fingerprints: fps[i].RingPosition() (first 8 bytes, little-endian).
std::vector<uint64_t> ItemsFromFingerprints(std::span<const Fingerprint> fps);
// Item sequence of a prompt's tokens (each widened to 64 bits).
std::vector<uint64_t> ItemsFromTokens(std::span<const uint32_t> tokens);

// Computes signatures, band keys and affinity keys for one SimilarityOptions.
// Thread-safety: immutable after Create(); any number of threads may call its const methods.
// Units: every key is an opaque 64-bit value; 0 is never returned as a key (it is remapped to 1), so
// callers may use 0 for "no key".
class MinHasher {
 public:
  // Errors: InvalidArgument (options.Validate()).
  static absl::StatusOr<MinHasher> Create(const SimilarityOptions& options = {});

  // num_hashes() values; element i is min over shingles of h_i. `items` is borrowed for the call. An
  // empty sequence has no shingles and the all-ones signature (every empty input shares its keys).
  std::vector<uint64_t> Signature(std::span<const uint64_t> items) const;
  // bands().bands keys, band j from signature[j*r .. (j+1)*r). `signature` must have num_hashes()
  // values (a shorter one is an invariant violation: asserted in debug builds, padded with all-ones).
  std::vector<uint64_t> BandKeys(std::span<const uint64_t> signature) const;
  // BandKeys(Signature(items)).
  std::vector<uint64_t> BandKeysOf(std::span<const uint64_t> items) const;
  // The stateless affinity key: band 0's key. Costs num_hashes multiplies per shingle; only band 0's
  // r hash functions are evaluated.
  uint64_t AffinityKey(std::span<const uint64_t> items) const;

  const SimilarityOptions& options() const { return options_; }
  const LshBands& bands() const { return bands_; }
  uint32_t num_hashes() const { return options_.num_hashes; }

 private:
  MinHasher() = default;
  void ShingleHashes(std::span<const uint64_t> items, std::vector<uint64_t>* out) const;
  std::vector<uint64_t> SignaturePrefix(std::span<const uint64_t> items, uint32_t count) const;
  // Key of band `band` over values[0..rows) (missing values count as all-ones).
  uint64_t BandKey(uint32_t band, std::span<const uint64_t> values) const;

  SimilarityOptions options_;
  LshBands bands_;
  std::vector<uint64_t> a_;  // h_i multipliers, in [1, p)
  std::vector<uint64_t> b_;  // h_i offsets, in [0, p)
};

// The group key Client::LookupPrefix sends with every lookup (LookupRequest.group_key): the affinity
// key of ItemsFromFingerprints of the first kGroupKeyBlocks fingerprints under the default
// SimilarityOptions, so every client and server agrees on it. The cap bounds its cost on long prompts
// (16 hashes per block: about 20 us for 256 blocks, against about 0.6 ms for a 128K-token prompt of
// 8,192 blocks); prompts that agree on their first 256 blocks are one group anyway.
// Never 0 (0 means "no group" on the wire). Thread-safe; `fps` is borrowed for the call.
inline constexpr size_t kGroupKeyBlocks = 256;
uint64_t PromptGroupKey(std::span<const Fingerprint> fps);

// A bounded LSH table that assigns group ids: a request joins the group recorded for the first of its
// band keys (in band order) already in the table; with none, it founds a group named by its band-0 key.
// Then every band key of the request is recorded (or refreshed) under the request's group, so
// follow-ups that drift from the founder still join through an intermediate request.
// Capacity: two generations of at most `capacity_keys` / 2 band keys each. When the current one is
// full it becomes the old one (the previous old one is dropped), and a hit in the old one moves the key
// to the current one: an approximate LRU in O(1) per key, never above `capacity_keys` keys.
// Determinism: the same sequence of Assign calls gives the same ids in every process.
// Thread-safety: all methods may be called concurrently (one std::mutex).
class SimilarityIndex {
 public:
  // `capacity_keys` >= 2 (smaller values are raised to 2).
  explicit SimilarityIndex(size_t capacity_keys = 1 << 20);

  // The group of a request with these band keys (MinHasher::BandKeys); 0 for an empty span.
  uint64_t Assign(std::span<const uint64_t> band_keys);
  // Band keys held now (both generations).
  size_t size() const;

 private:
  // A key is (band index, band key): equal keys in different bands are different keys.
  using Table = absl::flat_hash_map<std::pair<uint32_t, uint64_t>, uint64_t>;
  void RecordLocked(uint32_t band, uint64_t key, uint64_t group);

  const size_t generation_keys_;
  mutable std::mutex mu_;
  Table current_;  // guarded by mu_
  Table old_;      // guarded by mu_
};

}  // namespace kvtier

#endif  // KVTIER_COMMON_SIMILARITY_H_
