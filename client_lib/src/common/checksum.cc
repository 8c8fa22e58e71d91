#include "kvtier/common/checksum.h"

#include <xxh3.h>

namespace kvtier {

uint64_t BlockChecksum(const void* data, size_t size_bytes) {
  // XXH3 never reads `data` when the size is 0, but a null pointer is not promised to be accepted.
  static constexpr char kEmpty[1] = {0};
  return XXH3_64bits(size_bytes == 0 ? kEmpty : data, size_bytes);
}

}  // namespace kvtier
