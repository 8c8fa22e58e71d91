// The key of one stored block: its fingerprint and the TP shard (rank) it holds.
#ifndef KVTIER_COMMON_BLOCK_KEY_H_
#define KVTIER_COMMON_BLOCK_KEY_H_

#include <cstdint>
#include <utility>

#include "kvtier/common/fingerprint.h"

namespace kvtier {

// tp_rank is not part of the fingerprint, so all ranks of a TP group share one chain; each rank's
// shard is stored under (fingerprint, shard). A plain value type, hashable with absl.
struct BlockKey {
  Fingerprint fingerprint;
  uint32_t shard = 0;  // tp_rank, < layout.tp_size

  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine(std::move(h), k.fingerprint, k.shard);
  }
};

}  // namespace kvtier

#endif  // KVTIER_COMMON_BLOCK_KEY_H_
