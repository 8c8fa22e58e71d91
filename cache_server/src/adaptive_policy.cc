// adaptive: two experts, recency by prompt (tail first) and prefix_lrfu, and the one to follow chosen
// by miniature caches of sampled keys that run each expert alone. The contract
// is at NewAdaptivePolicy() in kvtier/server/eviction_policy.h; bench/policy_sim/README.md has the
// measurements and what else was tried.
#include <algorithm>
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

constexpr double kScoreWindow = 16384;   // sampled touches per halving of the shadows' hit counts
constexpr double kSwitchMargin = 0.02;   // the other expert must lead by 2% ...
constexpr double kSwitchMinHits = 8;     // ... and 8 hits to take over
constexpr uint64_t kDecisionEvery = 32;  // sampled touches between two decisions
// A tier whose blocks leave, other than as victims, at least once per 256 inserts (counts that halve
// every kTierWindow inserts, from 1,024 inserts on) is a lower tier: it receives the victims of the
// tier above and gives its hits back to it as promotions. It follows recency.
constexpr double kLowerTierLeaveShare = 1.0 / 256;
constexpr double kLowerTierMinInserts = 1024;
constexpr double kTierWindow = 65536;

// Recency by prompt: the victim is the entry whose prompt started least recently, where an entry's
// start is the touch counter at its last touch minus its depth (so the blocks of one prompt are equally
// recent); ties go to the deeper block. Chains are consumed from the tail.
class PromptRecencyPolicy final : public EvictionPolicy {
 public:
  void OnInsert(EntryHandle h, const BlockAccess& access) override {
    if (h >= entries_.size()) entries_.resize(std::max<size_t>(h + 1, entries_.size() * 2));
    if (entries_[h].live) order_.erase(KeyOf(h));
    Touch(h, access);
  }
  void OnAccess(EntryHandle h, const BlockAccess& access) override {
    if (h >= entries_.size() || !entries_[h].live) return;
    order_.erase(KeyOf(h));
    Touch(h, access);
  }
  void OnErase(EntryHandle h) override {
    if (h >= entries_.size() || !entries_[h].live) return;
    order_.erase(KeyOf(h));
    entries_[h].live = false;
  }
  std::optional<EntryHandle> PickVictim(absl::FunctionRef<bool(EntryHandle)> eligible) override {
    for (const Key& k : order_) {
      if (eligible(std::get<2>(k))) return std::get<2>(k);
    }
    return std::nullopt;
  }
  const char* name() const override { return "prompt_recency"; }

 private:
  using Key = std::tuple<int64_t, uint32_t, EntryHandle>;  // (start, inverted depth, handle)
  struct Entry {
    int64_t start = 0;
    uint32_t inv_depth = 0;
    bool live = false;
  };
  Key KeyOf(EntryHandle h) const { return {entries_[h].start, entries_[h].inv_depth, h}; }
  void Touch(EntryHandle h, const BlockAccess& access) {
    Entry& e = entries_[h];
    e.start = static_cast<int64_t>(++clock_) - access.depth;
    e.inv_depth = std::numeric_limits<uint32_t>::max() - access.depth;
    e.live = true;
    order_.insert(KeyOf(h));
  }

  std::vector<Entry> entries_;
  absl::btree_set<Key> order_;
  uint64_t clock_ = 0;
};

// Whether the shadows follow a block: 1 / 2^kShadowShift of the key hashes (a mix independent of
// prefix_lrfu's own sampling).
constexpr int kShadowShift = 3;
bool ShadowSampled(uint64_t key_hash) {
  return key_hash != 0 && ((key_hash * 0xd6e8feb86659fd93ULL) >> (64 - kShadowShift)) == 0;
}

// A miniature cache of the sampled blocks run by one expert alone (SHARDS-style spatial sampling): it
// holds at most `capacity` blocks and counts its hits, which estimate the hits the whole cache would
// have under that expert alone.
class Shadow {
 public:
  explicit Shadow(std::unique_ptr<EvictionPolicy> policy) : policy_(std::move(policy)) {}

  // A touch of a sampled block (insert or access in the real tier). Returns whether it was a hit.
  bool Touch(const BlockAccess& access, size_t capacity) {
    if (auto it = handle_of_.find(access.key_hash); it != handle_of_.end()) {
      policy_->OnAccess(it->second, access);
      return true;
    }
    while (handle_of_.size() >= std::max<size_t>(capacity, 1)) {
      const std::optional<EntryHandle> victim = policy_->PickVictim([](EntryHandle) { return true; });
      if (!victim.has_value()) break;
      Drop(*victim);
    }
    EntryHandle h;
    if (free_.empty()) {
      h = static_cast<EntryHandle>(key_of_.size());
      key_of_.push_back(access.key_hash);
    } else {
      h = free_.back();
      free_.pop_back();
      key_of_[h] = access.key_hash;
    }
    handle_of_[access.key_hash] = h;
    policy_->OnInsert(h, access);
    return false;
  }
  // The block left the real tier other than as a victim (a promotion, a delete): a hit if the shadow
  // held it, and it leaves the shadow too.
  bool Leave(uint64_t key_hash) {
    auto it = handle_of_.find(key_hash);
    if (it == handle_of_.end()) return false;
    Drop(it->second);
    return true;
  }

 private:
  void Drop(EntryHandle h) {
    policy_->OnErase(h);
    handle_of_.erase(key_of_[h]);
    free_.push_back(h);
  }

  std::unique_ptr<EvictionPolicy> policy_;
  absl::flat_hash_map<uint64_t, EntryHandle> handle_of_;
  std::vector<uint64_t> key_of_;  // by shadow handle
  std::vector<EntryHandle> free_;
};

class AdaptivePolicy final : public EvictionPolicy {
 public:
  AdaptivePolicy() : shadows_{Shadow(std::make_unique<PromptRecencyPolicy>()), Shadow(NewPrefixLrfuPolicy())} {
    experts_[kRecency] = std::make_unique<PromptRecencyPolicy>();
    experts_[kFrequency] = NewPrefixLrfuPolicy();
  }

  void OnInsert(EntryHandle h, const BlockAccess& access) override {
    last_pick_.reset();
    if (h >= key_hash_.size()) key_hash_.resize(std::max<size_t>(h + 1, key_hash_.size() * 2), 0);
    if (!Resident(h)) ++resident_;
    key_hash_[h] = access.key_hash;
    live_[h] = true;
    peak_resident_ = std::max(peak_resident_, resident_);
    if (++inserts_ >= kTierWindow) {
      inserts_ /= 2;
      leaves_ /= 2;
    }
    Observe(access);
    for (auto& e : experts_) e->OnInsert(h, access);
  }
  void OnAccess(EntryHandle h, const BlockAccess& access) override {
    last_pick_.reset();
    if (!Resident(h)) return;
    Observe(access);
    for (auto& e : experts_) e->OnAccess(h, access);
  }
  void OnErase(EntryHandle h) override {
    if (!Resident(h)) {
      last_pick_.reset();
      return;
    }
    const bool victim = last_pick_.has_value() && *last_pick_ == h;
    last_pick_.reset();
    if (!victim) leaves_ += 1;
    if (!victim && ShadowSampled(key_hash_[h])) {
      for (int e : {kRecency, kFrequency}) Score(e, shadows_[e].Leave(key_hash_[h]));
    }
    live_[h] = false;
    --resident_;
    for (auto& e : experts_) e->OnErase(h);
  }
  std::optional<EntryHandle> PickVictim(absl::FunctionRef<bool(EntryHandle)> eligible) override {
    const bool lower_tier = inserts_ >= kLowerTierMinInserts && leaves_ >= kLowerTierLeaveShare * inserts_;
    last_pick_ = experts_[lower_tier ? kRecency : expert_]->PickVictim(eligible);
    return last_pick_;
  }
  const char* name() const override { return "adaptive"; }

 private:
  enum { kRecency = 0, kFrequency = 1 };

  bool Resident(EntryHandle h) {
    if (h >= live_.size()) live_.resize(std::max<size_t>(h + 1, live_.size() * 2), false);
    return live_[h];
  }
  void Observe(const BlockAccess& access) {
    if (!ShadowSampled(access.key_hash)) return;
    const size_t capacity = peak_resident_ >> kShadowShift;
    for (int e : {kRecency, kFrequency}) Score(e, shadows_[e].Touch(access, capacity));
    if (++since_decision_ < kDecisionEvery) return;
    since_decision_ = 0;
    const int other = 1 - expert_;
    if (score_[other] > score_[expert_] * (1 + kSwitchMargin) + kSwitchMinHits) {
      expert_ = other;
    }
  }
  // Hit counts that halve every kScoreWindow sampled touches.
  void Score(int expert, bool hit) {
    if (hit) score_[expert] += 1;
    if (expert == kFrequency && ++since_halving_ >= kScoreWindow) {
      since_halving_ = 0;
      score_[0] /= 2;
      score_[1] /= 2;
    }
  }

  std::unique_ptr<EvictionPolicy> experts_[2];
  Shadow shadows_[2];
  double score_[2] = {0, 0};
  int expert_ = kFrequency;
  std::optional<EntryHandle> last_pick_;  // the latest PickVictim's answer
  std::vector<uint64_t> key_hash_;        // by handle
  std::vector<bool> live_;                // by handle
  size_t resident_ = 0;
  size_t peak_resident_ = 0;
  uint64_t since_decision_ = 0;
  uint64_t since_halving_ = 0;
  double inserts_ = 0;
  double leaves_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewAdaptivePolicy() { return std::make_unique<AdaptivePolicy>(); }

}  // namespace kvtier::server
