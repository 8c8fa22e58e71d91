// Prefix fingerprints: a SHA-256 chain over the token ids of each block and all blocks before it.
#ifndef KVTIER_COMMON_FINGERPRINT_H_
#define KVTIER_COMMON_FINGERPRINT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/common/namespace.h"

namespace kvtier {

// 32 bytes of SHA-256. Equal fingerprints (in one namespace) mean equal KV. A plain value type.
struct Fingerprint {
  std::array<uint8_t, 32> bytes{};

  // Lower-case hex, 64 characters.
  std::string Hex() const;
  // Parses 64 hex characters (either case). Errors: InvalidArgument.
  static absl::StatusOr<Fingerprint> FromHex(const std::string& hex);
  // The first 8 bytes as a little-endian uint64: the block's position on the ring (DESIGN.md §2).
  uint64_t RingPosition() const;

  friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
  friend auto operator<=>(const Fingerprint&, const Fingerprint&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const Fingerprint& f) {
    return H::combine_contiguous(std::move(h), f.bytes.data(), f.bytes.size());
  }
};

// A LoRA adapter applied to the request: its KV differs from the base model's.
struct LoraKey {
  std::string adapter_id;  // 1..255 bytes
  uint64_t version = 0;    // bump when the adapter's weights change
  friend bool operator==(const LoraKey&, const LoraKey&) = default;
};

// A multimodal input (image, audio) whose embedding occupies prompt positions
// [offset_tokens, offset_tokens + length_tokens). Every block that overlaps it carries its hash.
struct MultimodalInput {
  std::string content_hash;  // bytes identifying the input's content, 1..255 bytes (e.g. a SHA-256)
  uint32_t offset_tokens = 0;
  uint32_t length_tokens = 0;  // > 0
  friend bool operator==(const MultimodalInput&, const MultimodalInput&) = default;
};

// Keys beyond the tokens that change the KV of a request. Absent and empty are distinct.
struct ExtraKeys {
  std::optional<LoraKey> lora;              // hashed into every block
  std::vector<MultimodalInput> multimodal;  // each hashed into the blocks it overlaps
  std::optional<std::string> cache_salt;    // per-request salt; hashed into block 0 only (as vLLM does)
};

// Fingerprints of the full blocks of `tokens` (len / block_tokens of them; a partial last block gets
// none). fp[0] = SHA-256(ns.CanonicalBytes() || salt(ns.tenant_salt) || tokens[0..B) || extra(0)),
// fp[i] = SHA-256(fp[i-1] || tokens[iB..(i+1)B) || extra(i)); tokens are little-endian uint32 and the
// encodings of salt() and extra() are in docs/fingerprints.md. No process-local seed: the same input
// gives the same output everywhere. `tokens` is borrowed for the call. Thread-safe.
// Errors: InvalidArgument (invalid namespace, extra keys out of range).
absl::StatusOr<std::vector<Fingerprint>> ChainFingerprints(const Namespace& ns, std::span<const uint32_t> tokens,
                                                           const ExtraKeys& extra = {});

}  // namespace kvtier

#endif  // KVTIER_COMMON_FINGERPRINT_H_
