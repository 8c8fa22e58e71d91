// The hot-block set of a client (docs/architecture.md "Replication"): shallow blocks this client has
// read (Get hits) and given read replicas, kept for the most recently marked `capacity` of them.
#ifndef KVTIER_CLIENT_SRC_CLIENT_HOT_BLOCKS_H_
#define KVTIER_CLIENT_SRC_CLIENT_HOT_BLOCKS_H_

#include <cstddef>
#include <deque>
#include <mutex>
#include <span>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "kvtier/common/fingerprint.h"

namespace kvtier::client {

// Thread-safety: all methods may be called concurrently.
class HotBlocks {
 public:
  static constexpr size_t kDefaultCapacity = 65536;

  // `capacity` (> 0): most blocks kept; marking one more forgets the oldest marked.
  explicit HotBlocks(size_t capacity = kDefaultCapacity) : capacity_(capacity) {}

  // Marks `fp` hot; false when it already was.
  bool Mark(const Fingerprint& fp);

  // For each of the first `n` of `fps` (n <= fps.size()), whether it is hot; the result is fps.size()
  // long, false past n.
  std::vector<bool> Contains(std::span<const Fingerprint> fps, size_t n) const;

  size_t size() const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  absl::flat_hash_set<Fingerprint> set_;  // guarded by mu_
  std::deque<Fingerprint> order_;         // guarded by mu_; oldest first
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_HOT_BLOCKS_H_
