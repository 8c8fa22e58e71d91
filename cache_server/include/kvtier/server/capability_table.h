// CapabilityTable: the live leases (or reservations) of a BlockStore by id, with their deadlines.
#ifndef KVTIER_SERVER_CAPABILITY_TABLE_H_
#define KVTIER_SERVER_CAPABILITY_TABLE_H_

#include <cstddef>
#include <queue>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "kvtier/common/capability_id.h"

namespace kvtier::server {

// Values of type T (a lease or a reservation, which has a `bool dead`: ended while a transfer still
// pins it, freed by its last unpin) by their random CapabilityId, each added with a deadline. The
// deadlines sit in a min-heap, so that expiry visits only what is due: a value erased before its
// deadline leaves a stale heap item, skipped when it comes up (ids are never reused).
// Thread-safety: none; BlockStore calls every method with its lock held. Pointers returned stay valid
// until the value is erased or another is added.
template <typename T>
class CapabilityTable {
 public:
  // A fresh random id that no value here has and that `taken(id)` does not refuse (e.g. a UCX tag
  // prefix in use). A 128-bit id collides with probability 2^-128 per live value.
  CapabilityId NewId(absl::FunctionRef<bool(const CapabilityId&)> taken) const {
    CapabilityId id = CapabilityId::Random();
    while (values_.contains(id) || taken(id)) id = CapabilityId::Random();
    return id;
  }
  CapabilityId NewId() const {
    return NewId([](const CapabilityId&) { return false; });
  }

  // Adds `value` under `id` (not present), due at `deadline`. Returns it in place.
  T& Add(const CapabilityId& id, T value, absl::Time deadline) {
    deadlines_.emplace(deadline, id);
    return values_.emplace(id, std::move(value)).first->second;
  }
  // The value of `id`, dead or alive; null when absent.
  T* Find(const CapabilityId& id) {
    auto it = values_.find(id);
    return it == values_.end() ? nullptr : &it->second;
  }
  const T* Find(const CapabilityId& id) const {
    auto it = values_.find(id);
    return it == values_.end() ? nullptr : &it->second;
  }
  // As Find, but null for a dead value too.
  T* FindLive(const CapabilityId& id) {
    T* v = Find(id);
    return v == nullptr || v->dead ? nullptr : v;
  }
  const T* FindLive(const CapabilityId& id) const {
    const T* v = Find(id);
    return v == nullptr || v->dead ? nullptr : v;
  }
  bool Contains(const CapabilityId& id) const { return values_.contains(id); }
  void Erase(const CapabilityId& id) { values_.erase(id); }
  size_t size() const { return values_.size(); }

  // Calls due(id, value) for every live value whose deadline is at or before `now`, earliest first,
  // removing each from the heap (not from the table: `due` ends it, and may Erase it).
  template <typename F>
  void ForEachDue(absl::Time now, F&& due) {
    while (!deadlines_.empty() && deadlines_.top().first <= now) {
      const CapabilityId id = deadlines_.top().second;
      deadlines_.pop();
      if (T* v = FindLive(id); v != nullptr) due(id, *v);
    }
  }
  // The earliest deadline in the heap, absl::InfiniteFuture() when none. May be early (a stale item of an
  // erased value), never late.
  absl::Time NextDeadline() const { return deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.top().first; }

 private:
  using Deadline = std::pair<absl::Time, CapabilityId>;
  struct Later {
    bool operator()(const Deadline& a, const Deadline& b) const { return a.first > b.first; }
  };
  absl::flat_hash_map<CapabilityId, T> values_;
  std::priority_queue<Deadline, std::vector<Deadline>, Later> deadlines_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_CAPABILITY_TABLE_H_
