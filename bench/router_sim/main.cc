// router_sim: routes each request of a trace to one of N simulated inference workers, each with its own
// LRU prefix cache, and compares routing rules by block hit ratio and load balance. See bench/README.md.
//
// Hit accounting follows ../shared/data/README.md exactly, per worker: a request's hit is the count of
// its leading blocks present in its worker's cache before it is served; after it, its blocks are
// touched (or inserted, evicting the least recently touched block) in order, first to last. The block
// hit ratio is the sum of hits over the sum of blocks. With one worker this is the reference LRU.
//
// Load is the blocks routed to a worker so far (prefill work); max/mean is over workers at the end.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <xxhash.h>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kvtier/common/similarity.h"
#include "trace.h"

ABSL_FLAG(std::string, trace, "", "a Mooncake JSONL file, or a kv-cache-tester directory (required)");
ABSL_FLAG(uint64_t, limit, 0, "replay only the first N requests (0 = all)");
ABSL_FLAG(uint64_t, sessions, 0, "kv-cache-tester: take only the first N sessions (0 = all)");
ABSL_FLAG(uint32_t, workers, 4, "simulated workers");
ABSL_FLAG(uint64_t, capacity_blocks, 1953, "LRU capacity of each worker, in blocks");
ABSL_FLAG(std::string, routers, "random,round_robin,prefix4,prefix4_bounded,affinity_stateless,affinity",
          "comma-separated routers to compare");
ABSL_FLAG(double, threshold, 0.85, "affinity: Jaccard threshold of the LSH banding");
ABSL_FLAG(uint32_t, num_hashes, 128, "affinity: MinHash signature length");
ABSL_FLAG(uint32_t, shingle_size, 1, "affinity: hash ids per shingle (1: ids are prefix-chained already)");
ABSL_FLAG(double, load_bound, 1.25,
          "bounded routers: a worker whose load would exceed this x the mean is skipped for the next on the ring");
ABSL_FLAG(uint32_t, prefix_blocks, 4, "prefix4 routers: blocks hashed");
ABSL_FLAG(uint64_t, seed, 1, "random router's seed");
ABSL_FLAG(bool, json, false, "print one JSON object per router instead of the table");

namespace {

using kvtier::bench::SimTrace;

// One worker's LRU over dense block ids: an intrusive doubly linked list in arrays sized to the trace.
class LruCache {
 public:
  LruCache(size_t num_blocks, uint64_t capacity)
      : capacity_(capacity), prev_(num_blocks, kNone), next_(num_blocks, kNone), present_(num_blocks, false) {}

  bool Contains(uint32_t b) const { return present_[b]; }

  // Touches `b` (most recently used), inserting it and evicting the least recently used when full.
  void Touch(uint32_t b) {
    if (present_[b]) {
      Unlink(b);
    } else {
      if (size_ >= capacity_) {
        const uint32_t victim = tail_;
        Unlink(victim);
        present_[victim] = false;
        --size_;
      }
      present_[b] = true;
      ++size_;
    }
    PushFront(b);
  }

 private:
  static constexpr uint32_t kNone = ~uint32_t{0};
  void Unlink(uint32_t b) {
    if (prev_[b] != kNone)
      next_[prev_[b]] = next_[b];
    else
      head_ = next_[b];
    if (next_[b] != kNone)
      prev_[next_[b]] = prev_[b];
    else
      tail_ = prev_[b];
    prev_[b] = next_[b] = kNone;
  }
  void PushFront(uint32_t b) {
    prev_[b] = kNone;
    next_[b] = head_;
    if (head_ != kNone) prev_[head_] = b;
    head_ = b;
    if (tail_ == kNone) tail_ = b;
  }

  uint64_t capacity_;
  uint64_t size_ = 0;
  uint32_t head_ = kNone;
  uint32_t tail_ = kNone;
  std::vector<uint32_t> prev_, next_;
  std::vector<bool> present_;
};

uint64_t HashU64s(const uint64_t* values, size_t n, uint64_t seed) {
  std::vector<unsigned char> buf(8 * n);
  for (size_t i = 0; i < n; ++i) {
    for (int k = 0; k < 8; ++k) buf[8 * i + k] = static_cast<unsigned char>(values[i] >> (8 * k));
  }
  return XXH3_64bits_withSeed(buf.data(), buf.size(), seed);
}

// Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): each worker has
// `points` ring positions; a key goes to the first worker clockwise from its position whose load,
// with this request added, stays within bound x the mean load (with this request added). At least one
// worker is at or below the mean, so with bound >= 1 a worker always fits.
class BoundedRing {
 public:
  BoundedRing(uint32_t workers, uint32_t points, double bound) : bound_(bound) {
    for (uint32_t w = 0; w < workers; ++w) {
      for (uint32_t i = 0; i < points; ++i) {
        const uint64_t v[2] = {w, i};
        ring_.push_back({HashU64s(v, 2, 0x72696e67), w});
      }
    }
    std::sort(ring_.begin(), ring_.end());
  }

  uint32_t Pick(uint64_t key, const std::vector<uint64_t>& load, uint64_t cost) const {
    uint64_t total = cost;
    for (uint64_t l : load) total += l;
    const double cap = bound_ * static_cast<double>(total) / static_cast<double>(load.size());
    const uint64_t pos = HashU64s(&key, 1, 0x6b6579);
    size_t i = std::lower_bound(ring_.begin(), ring_.end(), std::make_pair(pos, uint32_t{0})) - ring_.begin();
    for (size_t step = 0; step < ring_.size(); ++step, ++i) {
      const uint32_t w = ring_[i % ring_.size()].second;
      if (static_cast<double>(load[w] + cost) <= cap) return w;
    }
    return static_cast<uint32_t>(std::min_element(load.begin(), load.end()) - load.begin());
  }

 private:
  double bound_;
  std::vector<std::pair<uint64_t, uint32_t>> ring_;
};

struct RouterResult {
  std::string router;
  uint64_t hit_blocks = 0;
  uint64_t blocks = 0;
  double max_mean_load = 0;      // blocks routed: busiest worker / mean
  double max_mean_requests = 0;  // requests routed: busiest worker / mean
  uint64_t groups = 0;           // distinct routing keys (0 for keyless routers)
  uint64_t spilled = 0;          // requests a bounded router sent past their key's first worker
  double hit_ratio() const { return blocks == 0 ? 0 : static_cast<double>(hit_blocks) / blocks; }
};

double MaxOverMean(const std::vector<uint64_t>& v) {
  uint64_t total = 0, max = 0;
  for (uint64_t x : v) {
    total += x;
    max = std::max(max, x);
  }
  return total == 0 ? 0 : static_cast<double>(max) * v.size() / static_cast<double>(total);
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "router_sim: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Compares request routers by per-worker LRU hit ratio and load. See bench/README.md.");
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_trace);
  if (path.empty()) return Fail("--trace is required");
  const uint32_t workers = absl::GetFlag(FLAGS_workers);
  const uint64_t capacity = absl::GetFlag(FLAGS_capacity_blocks);
  const double load_bound = absl::GetFlag(FLAGS_load_bound);
  const uint32_t prefix_blocks = absl::GetFlag(FLAGS_prefix_blocks);
  if (workers == 0 || capacity == 0) return Fail("--workers and --capacity_blocks must be positive");
  if (load_bound < 1) return Fail("--load_bound must be >= 1");
  if (prefix_blocks == 0) return Fail("--prefix_blocks must be positive");
  auto hasher = kvtier::MinHasher::Create({.threshold = absl::GetFlag(FLAGS_threshold),
                                           .num_hashes = absl::GetFlag(FLAGS_num_hashes),
                                           .shingle_size = absl::GetFlag(FLAGS_shingle_size)});
  if (!hasher.ok()) return Fail(std::string(hasher.status().message()));
  auto loaded = kvtier::bench::LoadSimTrace(path, absl::GetFlag(FLAGS_limit), absl::GetFlag(FLAGS_sessions));
  if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
  const SimTrace& trace = *loaded;
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    std::printf("trace %s: %zu requests, %zu block accesses, %zu distinct blocks\n", path.c_str(), trace.num_requests(),
                trace.num_accesses(), trace.num_distinct_blocks());
    std::printf(
        "%u workers x %llu blocks LRU; LSH %u bands x %u rows (threshold %.2f, steepest near %.3f); "
        "load bound %.2f x mean\n",
        workers, static_cast<unsigned long long>(capacity), hasher->bands().bands, hasher->bands().rows,
        hasher->options().threshold, hasher->bands().ApproximateThreshold(), load_bound);
    std::printf("%-20s %10s %12s %12s %14s %10s %9s\n", "router", "hit_ratio", "hit_blocks", "max/mean_load",
                "max/mean_reqs", "groups", "spilled");
  }

  // Items of request r: its hash ids (the loaders' dense ids map one-to-one onto them within a trace).
  auto items_of = [&](size_t r) {
    std::vector<uint64_t> items;
    for (uint64_t i = trace.offsets[r]; i < trace.offsets[r + 1]; ++i)
      items.push_back(trace.block_keys[trace.blocks[i]]);
    return items;
  };

  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_routers), ',', absl::SkipWhitespace())) {
    const std::string router(name);
    if (router != "random" && router != "round_robin" && router != "prefix4" && router != "prefix4_bounded" &&
        router != "affinity" && router != "affinity_stateless") {
      return Fail(absl::StrCat("unknown router \"", router, "\""));
    }
    std::vector<LruCache> caches;
    for (uint32_t w = 0; w < workers; ++w) caches.emplace_back(trace.num_distinct_blocks(), capacity);
    std::vector<uint64_t> load(workers, 0), requests(workers, 0);
    std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
    BoundedRing ring(workers, 64, load_bound);
    kvtier::SimilarityIndex index;
    absl::flat_hash_set<uint64_t> keys;
    RouterResult res{.router = router};
    for (size_t r = 0; r < trace.num_requests(); ++r) {
      const uint64_t first = trace.offsets[r], end = trace.offsets[r + 1];
      const uint64_t n = end - first;
      uint32_t w = 0;
      if (router == "random") {
        w = static_cast<uint32_t>(rng() % workers);
      } else if (router == "round_robin") {
        w = static_cast<uint32_t>(r % workers);
      } else {
        uint64_t key = 0;
        if (router == "prefix4" || router == "prefix4_bounded") {
          std::vector<uint64_t> ids = items_of(r);
          ids.resize(std::min<size_t>(ids.size(), prefix_blocks));
          key = HashU64s(ids.data(), ids.size(), 0x70726566);
        } else if (router == "affinity_stateless") {
          key = hasher->AffinityKey(items_of(r));
        } else {
          key = index.Assign(hasher->BandKeysOf(items_of(r)));
        }
        keys.insert(key);
        if (router == "prefix4") {
          w = static_cast<uint32_t>(key % workers);
        } else {
          w = ring.Pick(key, load, n);
          if (w != ring.Pick(key, std::vector<uint64_t>(workers, 0), 0)) ++res.spilled;
        }
      }
      LruCache& cache = caches[w];
      uint64_t hit = 0;
      while (first + hit < end && cache.Contains(trace.blocks[first + hit])) ++hit;
      for (uint64_t i = first; i < end; ++i) cache.Touch(trace.blocks[i]);
      res.hit_blocks += hit;
      res.blocks += n;
      load[w] += n;
      ++requests[w];
    }
    res.max_mean_load = MaxOverMean(load);
    res.max_mean_requests = MaxOverMean(requests);
    res.groups = keys.size();
    if (json) {
      std::printf(
          "{\"router\":\"%s\",\"workers\":%u,\"capacity_blocks\":%llu,\"requests\":%zu,\"hit_ratio\":%.6f,"
          "\"hit_blocks\":%llu,\"blocks\":%llu,\"max_mean_load\":%.4f,\"max_mean_requests\":%.4f,"
          "\"groups\":%llu,\"spilled\":%llu,\"load_bound\":%.3f,\"bands\":%u,\"rows\":%u}\n",
          res.router.c_str(), workers, static_cast<unsigned long long>(capacity), trace.num_requests(), res.hit_ratio(),
          static_cast<unsigned long long>(res.hit_blocks), static_cast<unsigned long long>(res.blocks),
          res.max_mean_load, res.max_mean_requests, static_cast<unsigned long long>(res.groups),
          static_cast<unsigned long long>(res.spilled), load_bound, hasher->bands().bands, hasher->bands().rows);
    } else {
      std::printf("%-20s %10.4f %12llu %12.3f %14.3f %10llu %9llu\n", res.router.c_str(), res.hit_ratio(),
                  static_cast<unsigned long long>(res.hit_blocks), res.max_mean_load, res.max_mean_requests,
                  static_cast<unsigned long long>(res.groups), static_cast<unsigned long long>(res.spilled));
    }
    std::fflush(stdout);
  }
  return 0;
}
