// Blocks of an exact size for tests of real servers: a namespace whose shard is exactly N bytes, and
// payloads derived from each block's fingerprint, so that any two clients put the same bytes and any
// mix-up shows.
#ifndef KVTIER_TESTS_TESTING_SIZED_BLOCKS_H_
#define KVTIER_TESTS_TESTING_SIZED_BLOCKS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvtier/common/fingerprint.h"
#include "kvtier/common/namespace.h"

namespace kvtier::testing {

// A namespace of `tenant` and `model` whose one shard is exactly `bytes` long: MLA, fp8, one layer, one
// token per block, tp_size 1.
inline Namespace SizedNamespace(std::string tenant, std::string model, uint32_t bytes) {
  Namespace ns;
  ns.tenant = std::move(tenant);
  ns.model = std::move(model);
  ns.layout = {.kind = LayoutKind::kMla,
               .dtype = DType::kFp8E4m3,
               .num_layers = 1,
               .latent_dim = bytes,
               .block_tokens = 1,
               .tp_size = 1};
  return ns;
}

// `bytes` pseudo-random bytes (xorshift64) seeded by the fingerprint's ring position.
inline std::vector<std::byte> FingerprintPayload(const Fingerprint& fp, size_t bytes) {
  std::vector<std::byte> b(bytes);
  uint64_t x = fp.RingPosition() | 1;
  for (size_t i = 0; i + 8 <= b.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&b[i], &x, 8);
  }
  return b;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_SIZED_BLOCKS_H_
