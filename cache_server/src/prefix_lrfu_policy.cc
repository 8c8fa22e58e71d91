// prefix_lrfu: frequency with exponential recency decay (LRFU) over prompt-start times, so that chains
// are evicted tail first, with a history of evicted blocks and a half-life that follows the workload's
// reuse gaps. The contract, and the reasons for each constant, are at NewPrefixLrfuPolicy() in
// kvtier/server/eviction_policy.h; bench/policy_sim/README.md has the measurements.
#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "kvtier/server/eviction_policy.h"

namespace kvtier::server {
namespace {

constexpr double kGapMultiple = 3.5;        // half-life = kGapMultiple x median reuse gap ...
constexpr double kFadeExponent = 8;         // ... x 1 / (1 + (residence / that)^kFadeExponent)
constexpr double kMaxCrf = 4;               // the value used for ordering saturates here
constexpr double kHistoryPerResident = 32;  // remembered evicted blocks per resident block
constexpr size_t kMinHistory = 2048;        // ... but at least this many
constexpr double kInitialHalfLife_s = 60;   // until the first reuse gaps are measured
constexpr double kMinHalfLife_s = 0.01;
constexpr double kMaxHalfLife_s = 1e6;
constexpr uint64_t kMinTouchesPerUpdate = 4096;  // the half-life is revisited this often (or per resident count)
constexpr int kGapSampleShift = 4;               // the gap estimator follows 1 / 2^kGapSampleShift of the blocks
constexpr size_t kMaxGapSamples = 65536;         // ... at most this many at a time
constexpr double kGapWindow = 65536;             // gap samples per halving of the histogram

// Whether a block (by key hash, or by handle when no hash is given) is one the gap estimator follows.
bool Sampled(uint64_t x) { return ((x * 0x9e3779b97f4a7c15ULL) >> (64 - kGapSampleShift)) == 0; }

// The combined recency-frequency (CRF) of a block as of time t_s: each access adds 1, and the sum
// halves every half-life.
struct Crf {
  double value = 0;
  double t_s = 0;
};

// Entries (dense ids) in eviction order. An entry's value at time `now` is
// min(value, kMaxCrf) x 2^(-(now - t) / half_life); its order key log2(min(value, kMaxCrf)) + t / half_life
// orders entries as their values at any common time, so a key changes only when its entry is touched.
// Ties go to the deeper block first (a chain loses its tail before its head), then the older touch.
class LrfuOrder {
 public:
  explicit LrfuOrder(double half_life_s) : half_life_s_(half_life_s) {}

  double half_life_s() const { return half_life_s_; }
  size_t size() const { return order_.size(); }
  bool Contains(uint32_t id) const { return id < entries_.size() && entries_[id].live; }
  double LastTouch_s(uint32_t id) const { return entries_[id].crf.t_s; }

  // Adds `id` (absent) with its remembered CRF (value 0 when none), then counts this touch.
  void Insert(uint32_t id, double now_s, uint32_t depth, Crf prior) {
    if (id >= entries_.size()) entries_.resize(std::max<size_t>(id + 1, entries_.size() * 2));
    entries_[id].live = true;
    entries_[id].crf = prior;
    Touch(id, now_s, depth);
  }
  void Access(uint32_t id, double now_s, uint32_t depth) {
    order_.erase(KeyOf(id));
    Touch(id, now_s, depth);
  }
  // Removes `id` (present) and returns its CRF, for the history.
  Crf Erase(uint32_t id) {
    order_.erase(KeyOf(id));
    entries_[id].live = false;
    return entries_[id].crf;
  }
  std::optional<uint32_t> FirstEligible(absl::FunctionRef<bool(EntryHandle)> eligible) const {
    for (const Key& k : order_) {
      if (eligible(std::get<3>(k))) return std::get<3>(k);
    }
    return std::nullopt;
  }
  // Re-keys every entry for a new half-life: O(n log n), and rare (see PrefixLrfuPolicy::Observe).
  void SetHalfLife(double half_life_s) {
    half_life_s_ = half_life_s;
    std::vector<Key> keys(order_.begin(), order_.end());
    order_.clear();
    for (Key& k : keys) {
      Entry& e = entries_[std::get<3>(k)];
      e.key = OrderKey(e.crf);
      std::get<0>(k) = e.key;
    }
    order_.insert(keys.begin(), keys.end());
  }

 private:
  // (order key, inverted depth, touch sequence, id): the first is the victim.
  using Key = std::tuple<double, uint32_t, uint64_t, uint32_t>;
  struct Entry {
    Crf crf;
    double key = 0;
    uint64_t seq = 0;
    uint32_t inv_depth = 0;
    bool live = false;
  };

  double OrderKey(const Crf& crf) const { return std::log2(std::min(crf.value, kMaxCrf)) + crf.t_s / half_life_s_; }
  Key KeyOf(uint32_t id) const {
    const Entry& e = entries_[id];
    return {e.key, e.inv_depth, e.seq, id};
  }
  void Touch(uint32_t id, double now_s, uint32_t depth) {
    Entry& e = entries_[id];
    const double t = std::max(now_s, e.crf.t_s);  // a clock that steps back counts as no time
    e.crf.value = e.crf.value * std::exp2(-(t - e.crf.t_s) / half_life_s_) + 1;
    e.crf.t_s = t;
    e.key = OrderKey(e.crf);
    e.seq = ++seq_;
    e.inv_depth = std::numeric_limits<uint32_t>::max() - depth;
    order_.insert(KeyOf(id));
  }

  double half_life_s_;
  std::vector<Entry> entries_;  // by id
  absl::btree_set<Key> order_;
  uint64_t seq_ = 0;
};

// The CRFs of blocks that left, by key hash; once there are more than `limit`, the oldest are forgotten.
class History {
 public:
  void Remember(uint64_t key_hash, const Crf& crf, size_t limit) {
    if (key_hash == 0) return;
    ++seq_;
    map_[key_hash] = {.t_s = crf.t_s, .value = static_cast<float>(crf.value), .seq = seq_};
    fifo_.emplace_back(key_hash, seq_);
    while (map_.size() > limit) {
      const auto [key, seq] = fifo_.front();
      fifo_.pop_front();
      if (auto it = map_.find(key); it != map_.end() && it->second.seq == seq) map_.erase(it);
    }
    if (fifo_.size() > 2 * map_.size() + 1024) {  // drop records of keys taken back or re-remembered
      std::deque<std::pair<uint64_t, uint32_t>> live;
      for (const auto& r : fifo_) {
        if (auto it = map_.find(r.first); it != map_.end() && it->second.seq == r.second) live.push_back(r);
      }
      fifo_.swap(live);
    }
  }
  // The remembered CRF of `key_hash`, forgotten as it is returned; value 0 when none.
  Crf Take(uint64_t key_hash) {
    if (key_hash == 0) return {};
    auto it = map_.find(key_hash);
    if (it == map_.end()) return {};
    const Crf crf{.value = it->second.value, .t_s = it->second.t_s};
    map_.erase(it);
    return crf;
  }

 private:
  struct Remembered {
    double t_s;
    float value;
    uint32_t seq;  // which FIFO record is current (wraps harmlessly: records are far fewer than 2^32)
  };
  absl::flat_hash_map<uint64_t, Remembered> map_;
  std::deque<std::pair<uint64_t, uint32_t>> fifo_;
  uint32_t seq_ = 0;
};

// The distribution of reuse gaps (seconds between consecutive touches of one block), as a histogram
// of quarter-octave bins whose counts halve every kGapWindow samples, so that it follows a changing
// workload. Blocks are followed by key hash, on a sample of the keys, for as long as kMaxGapSamples
// allows, so the gaps seen do not depend on how long the cache itself keeps blocks.
class ReuseGapEstimator {
 public:
  // A touch of a block with this (sampled) key hash at `now_s`.
  void Touch(uint64_t key_hash, double now_s) {
    auto [it, inserted] = last_touch_s_.try_emplace(key_hash, now_s);
    if (!inserted) {
      Add(now_s - it->second);
      it->second = now_s;
      return;
    }
    fifo_.push_back(key_hash);
    if (fifo_.size() > kMaxGapSamples) {
      last_touch_s_.erase(fifo_.front());
      fifo_.pop_front();
    }
  }
  // A gap measured by the caller (blocks without a key hash: between two touches while resident).
  void Add(double gap_s) {
    const double l = std::log2(std::max(gap_s, 1e-9));
    const int b = std::clamp(static_cast<int>((l - kMinLog2) * kBinsPerOctave), 0, kBins - 1);
    bins_[b] += 1;
    total_ += 1;
    if (++since_halving_ >= kGapWindow) {
      since_halving_ = 0;
      for (double& c : bins_) c /= 2;
      total_ /= 2;
    }
  }
  // The median gap in seconds (geometric interpolation within its bin); nullopt before any gap.
  std::optional<double> Median() const {
    if (total_ <= 0) return std::nullopt;
    double below = 0;
    for (int b = 0; b < kBins; ++b) {
      if (below + bins_[b] >= total_ / 2) {
        const double frac = bins_[b] > 0 ? (total_ / 2 - below) / bins_[b] : 0.5;
        return std::exp2(kMinLog2 + (b + frac) / kBinsPerOctave);
      }
      below += bins_[b];
    }
    return std::exp2(kMinLog2 + static_cast<double>(kBins) / kBinsPerOctave);
  }

 private:
  static constexpr int kBinsPerOctave = 4;
  static constexpr int kMinLog2 = -10;               // ~1 ms: shorter gaps land in the first bin
  static constexpr int kBins = 30 * kBinsPerOctave;  // up to 2^20 s (12 days)

  absl::flat_hash_map<uint64_t, double> last_touch_s_;
  std::deque<uint64_t> fifo_;
  std::array<double, kBins> bins_{};
  double total_ = 0;
  double since_halving_ = 0;
};

class PrefixLrfuPolicy final : public EvictionPolicy {
 public:
  PrefixLrfuPolicy() : order_(kInitialHalfLife_s) {}

  void OnInsert(EntryHandle h, const BlockAccess& access) override {
    if (order_.Contains(h)) order_.Erase(h);
    if (h >= key_hash_.size()) key_hash_.resize(std::max<size_t>(h + 1, key_hash_.size() * 2), 0);
    key_hash_[h] = access.key_hash;
    const double now = Seconds(access);
    order_.Insert(h, now, access.depth, history_.Take(access.key_hash));
    ++inserts_;
    Observe(h, access, now, /*resident_before=*/false);
  }
  void OnAccess(EntryHandle h, const BlockAccess& access) override {
    if (!order_.Contains(h)) return;
    const double now = Seconds(access);
    Observe(h, access, now, /*resident_before=*/true);
    order_.Access(h, now, access.depth);
  }
  void OnErase(EntryHandle h) override {
    if (!order_.Contains(h)) return;
    const size_t limit = std::max(kMinHistory, static_cast<size_t>(kHistoryPerResident * order_.size()));
    history_.Remember(key_hash_[h], order_.Erase(h), limit);
  }
  std::optional<EntryHandle> PickVictim(absl::FunctionRef<bool(EntryHandle)> eligible) override {
    return order_.FirstEligible(eligible);
  }
  const char* name() const override { return "prefix_lrfu"; }

 private:
  // Seconds since the first access this policy saw (keeps order keys small).
  double Seconds(const BlockAccess& access) {
    if (!started_) {
      start_ns_ = access.now_ns;
      started_ = true;
    }
    return static_cast<double>(access.now_ns - start_ns_) * 1e-9;
  }
  // Feeds the gap estimator and, every so often, moves the half-life (see the header).
  void Observe(EntryHandle h, const BlockAccess& access, double now_s, bool resident_before) {
    if (access.key_hash != 0) {
      if (Sampled(access.key_hash)) gaps_.Touch(access.key_hash, now_s);
    } else if (resident_before && Sampled(h)) {
      gaps_.Add(now_s - order_.LastTouch_s(h));
    }
    if (++touches_ < std::max<uint64_t>(kMinTouchesPerUpdate, order_.size())) return;
    touches_ = 0;
    // The insert rate, for the mean residence time (Little's law: resident blocks / insert rate).
    if (now_s > last_update_s_) {
      const double rate = static_cast<double>(inserts_) / (now_s - last_update_s_);
      insert_rate_ = insert_rate_ > 0 ? 0.5 * insert_rate_ + 0.5 * rate : rate;
      last_update_s_ = now_s;
      inserts_ = 0;
    }
    if (const std::optional<double> median = gaps_.Median(); median.has_value()) {
      // Frequency pays when blocks must outlive the cache's residence time to be reused; once blocks
      // stay longer than the half-life anyway, it only keeps dead ones: fade to recency (LRU by prompt).
      const double base = kGapMultiple * *median;
      const double residence = insert_rate_ > 0 ? static_cast<double>(order_.size()) / insert_rate_ : 0;
      const double f = 1 / (1 + std::pow(residence / base, kFadeExponent));
      const double half_life = std::clamp(base * f, kMinHalfLife_s, kMaxHalfLife_s);
      // Re-keying costs O(n log n): only for a change of more than ~7%.
      if (std::abs(std::log2(half_life / order_.half_life_s())) > 0.1) order_.SetHalfLife(half_life);
    }
  }

  LrfuOrder order_;
  History history_;
  ReuseGapEstimator gaps_;
  std::vector<uint64_t> key_hash_;  // by handle
  uint64_t touches_ = 0;
  uint64_t inserts_ = 0;
  double insert_rate_ = 0;
  double last_update_s_ = 0;
  int64_t start_ns_ = 0;
  bool started_ = false;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewPrefixLrfuPolicy() { return std::make_unique<PrefixLrfuPolicy>(); }

}  // namespace kvtier::server
