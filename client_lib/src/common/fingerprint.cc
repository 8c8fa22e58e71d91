#include "kvtier/common/fingerprint.h"

// The low-level SHA-256 interface (see Sha256Digest) is deprecated in OpenSSL 3.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "encoding.h"
#include "kvtier/common/status_macros.h"

namespace kvtier {
namespace internal {

void Sha256Digest(const void* data, size_t size, uint8_t* out) {
  // The same assembly as EVP's default provider (SHA-NI where the CPU has it), deprecated in OpenSSL 3
  // only as an interface. Not the one-shot SHA256(), which OpenSSL 3 routes through a fetch per call.
  SHA256_CTX ctx;
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, data, size);
  SHA256_Final(out, &ctx);
}

}  // namespace internal

namespace {

using internal::AppendOptionalString;
using internal::AppendString;
using internal::AppendU32;
using internal::AppendU64;
using internal::AppendU8;

constexpr size_t kMaxKeyBytes = 255;

absl::Status ValidateExtraKeys(const ExtraKeys& extra) {
  if (extra.lora.has_value()) {
    const size_t n = extra.lora->adapter_id.size();
    if (n == 0 || n > kMaxKeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("extra.lora.adapter_id: must be 1..", kMaxKeyBytes, " bytes, got ", n));
    }
  }
  for (size_t k = 0; k < extra.multimodal.size(); ++k) {
    const MultimodalInput& in = extra.multimodal[k];
    if (in.content_hash.empty() || in.content_hash.size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat("extra.multimodal[", k, "].content_hash: must be 1..",
                                                     kMaxKeyBytes, " bytes, got ", in.content_hash.size()));
    }
    if (in.length_tokens == 0) {
      return absl::InvalidArgumentError(absl::StrCat("extra.multimodal[", k, "].length_tokens: must be > 0"));
    }
    if (uint64_t{in.offset_tokens} + in.length_tokens > uint64_t{std::numeric_limits<uint32_t>::max()} + 1) {
      return absl::InvalidArgumentError(absl::StrCat("extra.multimodal[", k, "]: offset_tokens (", in.offset_tokens,
                                                     ") + length_tokens (", in.length_tokens,
                                                     ") must be at most 2^32"));
    }
  }
  if (extra.cache_salt.has_value() && extra.cache_salt->size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError("extra.cache_salt: must be shorter than 2^32 bytes");
  }
  return absl::OkStatus();
}

void AppendTokens(std::span<const uint32_t> tokens, std::string* out) {
  if constexpr (std::endian::native == std::endian::little) {
    out->append(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
  } else {
    for (uint32_t t : tokens) AppendU32(t, out);
  }
}

// extra(block) of docs/fingerprints.md: the keys of tokens [block * block_tokens, (block + 1) *
// block_tokens).
void AppendExtra(const ExtraKeys& extra, size_t block, uint64_t block_tokens, std::string* out) {
  if (extra.lora.has_value()) {
    AppendU8(1, out);
    AppendString(extra.lora->adapter_id, out);
    AppendU64(extra.lora->version, out);
  } else {
    AppendU8(0, out);
  }
  const uint64_t begin = block * block_tokens;
  const uint64_t end = begin + block_tokens;
  const size_t count_at = out->size();
  AppendU32(0, out);  // the count, patched below
  uint32_t count = 0;
  for (const MultimodalInput& in : extra.multimodal) {
    const uint64_t in_begin = in.offset_tokens;
    const uint64_t in_end = in_begin + in.length_tokens;
    if (in_begin >= end || in_end <= begin) continue;
    ++count;
    AppendString(in.content_hash, out);
    AppendU32(in.offset_tokens, out);
    AppendU32(in.length_tokens, out);
  }
  for (int b = 0; b < 4; ++b) (*out)[count_at + b] = static_cast<char>(count >> (8 * b));
  if (block == 0) AppendOptionalString(extra.cache_salt, out);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string Fingerprint::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(2 * bytes.size(), '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    hex[2 * i] = kDigits[bytes[i] >> 4];
    hex[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return hex;
}

absl::StatusOr<Fingerprint> Fingerprint::FromHex(const std::string& hex) {
  Fingerprint fp;
  if (hex.size() != 2 * fp.bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fingerprint hex must be ", 2 * fp.bytes.size(), " characters, got ", hex.size()));
  }
  for (size_t i = 0; i < fp.bytes.size(); ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      const size_t at = hi < 0 ? 2 * i : 2 * i + 1;
      return absl::InvalidArgumentError(absl::StrCat("fingerprint hex has a non-hex character at ", at));
    }
    fp.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return fp;
}

uint64_t Fingerprint::RingPosition() const { return internal::LoadU64Le(bytes.data()); }

absl::StatusOr<std::vector<Fingerprint>> ChainFingerprints(const Namespace& ns, std::span<const uint32_t> tokens,
                                                           const ExtraKeys& extra) {
  KVTIER_RETURN_IF_ERROR(ns.Validate());
  KVTIER_RETURN_IF_ERROR(ValidateExtraKeys(extra));
  const uint64_t block_tokens = ns.layout.block_tokens;
  const size_t num_blocks = tokens.size() / block_tokens;
  std::vector<Fingerprint> fps(num_blocks);
  if (num_blocks == 0) return fps;

  // One input buffer for the whole chain: after block 0 has sized it, the loop allocates nothing
  // (unless a block overlaps more multimodal inputs than any before it).
  std::string input;
  input.reserve(1024 + 4 * block_tokens);  // canonical bytes and salt take < 1 KiB
  // Without multimodal inputs, extra(block) is the same bytes for every block after the first: those
  // blocks' inputs differ only in the previous digest and the tokens, which are written in place.
  const bool same_extra = extra.multimodal.empty() && std::endian::native == std::endian::little;
  for (size_t i = 0; i < num_blocks; ++i) {
    if (same_extra && i > 0) {
      if (i == 1) {
        input.assign(fps[0].bytes.size() + 4 * block_tokens, '\0');
        AppendExtra(extra, i, block_tokens, &input);
      }
      char* const at = input.data();
      std::memcpy(at, fps[i - 1].bytes.data(), fps[i - 1].bytes.size());
      std::memcpy(at + fps[i - 1].bytes.size(), tokens.data() + i * block_tokens, 4 * block_tokens);
      internal::Sha256Digest(input.data(), input.size(), fps[i].bytes.data());
      continue;
    }
    input.clear();
    if (i == 0) {
      internal::AppendCanonicalBytes(ns, &input);
      AppendOptionalString(ns.tenant_salt, &input);
    } else {
      input.append(reinterpret_cast<const char*>(fps[i - 1].bytes.data()), fps[i - 1].bytes.size());
    }
    AppendTokens(tokens.subspan(i * block_tokens, block_tokens), &input);
    AppendExtra(extra, i, block_tokens, &input);
    internal::Sha256Digest(input.data(), input.size(), fps[i].bytes.data());
  }
  return fps;
}

}  // namespace kvtier
