// weighted: operator-weighted recency and frequency. The contract, with the exact normalisation of
// both terms, is at NewWeightedPolicy() in kvtier/server/eviction_policy.h.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/container/btree_set.h"
#include "kvtier/server/eviction_policy.h"

namespace kvtier::server {
namespace {

// Frequency classes: counts 1..15 exactly, then one class per octave ([16, 32), [32, 64), ...).
constexpr int kExactCounts = 16;
constexpr int kNumClasses = kExactCounts + 60;

int ClassOf(uint64_t count) {
  if (count < kExactCounts) return static_cast<int>(count);
  return kExactCounts - 4 + std::bit_width(count) - 1;  // 16 -> 16, 32 -> 17, ...
}
// The count a class stands for in the frequency term: the count itself, or its octave's floor.
double CountOf(int c) { return c < kExactCounts ? c : std::ldexp(1.0, c - (kExactCounts - 4)); }

class WeightedPolicy final : public EvictionPolicy {
 public:
  explicit WeightedPolicy(const EvictionPolicyOptions& options)
      : recency_weight_(options.recency_weight), frequency_weight_(options.frequency_weight) {}

  void OnInsert(EntryHandle h, const BlockAccess& access) override {
    if (h >= entries_.size()) entries_.resize(std::max<size_t>(h + 1, entries_.size() * 2));
    Entry& e = entries_[h];
    if (e.live) Unlink(h);
    e.live = true;
    e.count = 0;
    Touch(h, access);
  }
  void OnAccess(EntryHandle h, const BlockAccess& access) override {
    if (h >= entries_.size() || !entries_[h].live) return;
    Unlink(h);
    Touch(h, access);
  }
  void OnErase(EntryHandle h) override {
    if (h >= entries_.size() || !entries_[h].live) return;
    Unlink(h);
    entries_[h].live = false;
  }

  std::optional<EntryHandle> PickVictim(absl::FunctionRef<bool(EntryHandle)> eligible) override {
    // Normalisers over the resident set: the oldest start time and the highest count class.
    int max_class = 0;
    uint64_t oldest = std::numeric_limits<uint64_t>::max();
    for (int c = 1; c < kNumClasses; ++c) {
      if (classes_[c].empty()) continue;
      max_class = c;
      oldest = std::min(oldest, std::get<0>(*classes_[c].begin()));
    }
    if (max_class == 0) return std::nullopt;
    const double span = static_cast<double>(clock_ - oldest);
    const double log_max = std::log2(1 + CountOf(max_class));
    // Within a class every entry has the same frequency term, so its best candidate is its oldest
    // eligible entry; the victim is the best of those.
    std::optional<EntryHandle> victim;
    double best_score = 0;
    uint32_t best_inv_depth = 0;
    for (int c = 1; c <= max_class; ++c) {
      for (const Key& k : classes_[c]) {
        const EntryHandle h = std::get<2>(k);
        if (!eligible(h)) continue;
        const double recency = span > 0 ? static_cast<double>(std::get<0>(k) - oldest) / span : 1.0;
        const double frequency = std::log2(1 + CountOf(c)) / log_max;
        const double score = recency_weight_ * recency + frequency_weight_ * frequency;
        if (!victim.has_value() || score < best_score || (score == best_score && std::get<1>(k) < best_inv_depth)) {
          victim = h;
          best_score = score;
          best_inv_depth = std::get<1>(k);
        }
        break;
      }
    }
    return victim;
  }
  const char* name() const override { return "weighted"; }

 private:
  // (start time, inverted depth, handle): oldest first, then deepest first.
  using Key = std::tuple<uint64_t, uint32_t, EntryHandle>;
  struct Entry {
    uint64_t start = 0;  // the access clock at which the block's prompt began (see the header)
    uint64_t count = 0;
    uint32_t inv_depth = 0;
    bool live = false;
  };

  void Touch(EntryHandle h, const BlockAccess& access) {
    Entry& e = entries_[h];
    ++clock_;
    e.start = clock_ - std::min<uint64_t>(clock_, access.depth);
    e.inv_depth = std::numeric_limits<uint32_t>::max() - access.depth;
    ++e.count;
    classes_[ClassOf(e.count)].insert({e.start, e.inv_depth, h});
  }
  void Unlink(EntryHandle h) {
    const Entry& e = entries_[h];
    classes_[ClassOf(e.count)].erase({e.start, e.inv_depth, h});
  }

  const double recency_weight_;
  const double frequency_weight_;
  std::vector<Entry> entries_;
  std::array<absl::btree_set<Key>, kNumClasses> classes_;
  uint64_t clock_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewWeightedPolicy(const EvictionPolicyOptions& options) {
  return std::make_unique<WeightedPolicy>(options);
}

}  // namespace kvtier::server
