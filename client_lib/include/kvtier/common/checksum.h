// Block checksums: XXH3-64 (xxHash 0.8) over a block's bytes, seed 0.
#ifndef KVTIER_COMMON_CHECKSUM_H_
#define KVTIER_COMMON_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace kvtier {

// XXH3-64 of `size_bytes` bytes at `data` (borrowed for the call; may be null when size is 0).
// The same value on every machine and in every process. Thread-safe.
uint64_t BlockChecksum(const void* data, size_t size_bytes);

}  // namespace kvtier

#endif  // KVTIER_COMMON_CHECKSUM_H_
