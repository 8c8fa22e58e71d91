#include "kvtier/server/eviction_policy.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvtier::server {
namespace {

constexpr EntryHandle kNil = 0xffffffffu;

// Doubly linked list threaded through per-handle arrays: head_ is the most recently used.
class LruPolicy final : public EvictionPolicy {
 public:
  void OnInsert(EntryHandle h, const BlockAccess&) override {
    Grow(h);
    if (linked_[h]) Unlink(h);
    PushFront(h);
  }
  void OnAccess(EntryHandle h, const BlockAccess&) override {
    if (h >= linked_.size() || !linked_[h]) return;
    Unlink(h);
    PushFront(h);
  }
  void OnErase(EntryHandle h) override {
    if (h < linked_.size() && linked_[h]) Unlink(h);
  }
  std::optional<EntryHandle> PickVictim(absl::FunctionRef<bool(EntryHandle)> eligible) override {
    for (EntryHandle h = tail_; h != kNil; h = prev_[h]) {
      if (eligible(h)) return h;
    }
    return std::nullopt;
  }
  const char* name() const override { return "lru"; }

 private:
  void Grow(EntryHandle h) {
    if (h >= linked_.size()) {
      const size_t n = std::max<size_t>(h + 1, linked_.size() * 2);
      prev_.resize(n, kNil);
      next_.resize(n, kNil);
      linked_.resize(n, false);
    }
  }
  void PushFront(EntryHandle h) {
    prev_[h] = kNil;
    next_[h] = head_;
    if (head_ != kNil) prev_[head_] = h;
    head_ = h;
    if (tail_ == kNil) tail_ = h;
    linked_[h] = true;
  }
  void Unlink(EntryHandle h) {
    if (prev_[h] != kNil)
      next_[prev_[h]] = next_[h];
    else
      head_ = next_[h];
    if (next_[h] != kNil)
      prev_[next_[h]] = prev_[h];
    else
      tail_ = prev_[h];
    prev_[h] = next_[h] = kNil;
    linked_[h] = false;
  }

  std::vector<EntryHandle> prev_, next_;
  std::vector<bool> linked_;
  EntryHandle head_ = kNil;
  EntryHandle tail_ = kNil;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewLruPolicy() { return std::make_unique<LruPolicy>(); }

absl::Status EvictionPolicyOptions::Validate() const {
  for (auto [field, w] : {std::pair<const char*, double>{"frequency_weight", frequency_weight},
                          std::pair<const char*, double>{"recency_weight", recency_weight}}) {
    if (!std::isfinite(w) || w < 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, " is ", w, "; it must be finite and >= 0"));
    }
  }
  if (frequency_weight + recency_weight <= 0) {
    return absl::InvalidArgumentError("frequency_weight and recency_weight are both 0; one must be > 0");
  }
  return absl::OkStatus();
}

std::vector<std::string> EvictionPolicyNames() { return {"lru", "weighted", "prefix_lrfu", "adaptive"}; }

absl::StatusOr<std::unique_ptr<EvictionPolicy>> NewEvictionPolicy(const std::string& name) {
  return NewEvictionPolicy(name, EvictionPolicyOptions{});
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> NewEvictionPolicy(const std::string& name,
                                                                  const EvictionPolicyOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (name == "lru") return NewLruPolicy();
  if (name == "weighted") return NewWeightedPolicy(options);
  if (name == "prefix_lrfu") return NewPrefixLrfuPolicy();
  if (name == "adaptive") return NewAdaptivePolicy();
  return absl::InvalidArgumentError(
      absl::StrCat("eviction policy \"", name, "\" is unknown; known: ", absl::StrJoin(EvictionPolicyNames(), ", ")));
}

}  // namespace kvtier::server
