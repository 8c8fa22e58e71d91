// Private to kvtier_common: the little-endian, length-prefixed encoders behind the canonical namespace
// bytes and the fingerprint chain (docs/fingerprints.md), and the SHA-256 digest.
#ifndef KVTIER_COMMON_SRC_ENCODING_H_
#define KVTIER_COMMON_SRC_ENCODING_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "kvtier/common/namespace.h"

namespace kvtier::internal {

// Scheme version and hash-algorithm id: the first two bytes of every canonical namespace encoding.
inline constexpr uint8_t kFingerprintSchemeVersion = 1;
inline constexpr uint8_t kHashAlgorithmSha256 = 1;

// Presence bytes of optional fields.
inline constexpr char kAbsent = 0x00;
inline constexpr char kPresent = 0x01;

inline void AppendU8(uint8_t v, std::string* out) { out->push_back(static_cast<char>(v)); }

inline void AppendU32(uint32_t v, std::string* out) {
  const char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 24)};
  out->append(b, 4);
}

inline void AppendU64(uint64_t v, std::string* out) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 8);
}

// uint32 LE length, then the bytes. Callers validate that `s` is shorter than 2^32 bytes.
inline void AppendString(const std::string& s, std::string* out) {
  AppendU32(static_cast<uint32_t>(s.size()), out);
  out->append(s);
}

// 0x00 when absent; 0x01 then the string when present (so present-empty is 01 00 00 00 00).
inline void AppendOptionalString(const std::optional<std::string>& s, std::string* out) {
  if (!s.has_value()) {
    out->push_back(kAbsent);
    return;
  }
  out->push_back(kPresent);
  AppendString(*s, out);
}

// The first 8 bytes of `bytes` as a little-endian uint64.
inline uint64_t LoadU64Le(const uint8_t* bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | bytes[i];
  return v;
}

// Appends Namespace::CanonicalBytes() of `ns` to `out`, without a temporary string.
void AppendCanonicalBytes(const Namespace& ns, std::string* out);

inline constexpr size_t kSha256Bytes = 32;

// SHA-256 of `size` bytes at `data` into `out` (kSha256Bytes). OpenSSL's SHA-256 without the EVP
// layer: on the ~100-byte inputs of a fingerprint chain, EVP's per-digest dispatch through the provider
// costs about a third of the time (lookup_bench measures both). Thread-safe; no allocation; no error.
void Sha256Digest(const void* data, size_t size, uint8_t* out);

}  // namespace kvtier::internal

#endif  // KVTIER_COMMON_SRC_ENCODING_H_
