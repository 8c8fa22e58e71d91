#include "kvtier/common/namespace.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "encoding.h"
#include "kvtier/common/status_macros.h"

namespace kvtier {
namespace {

constexpr size_t kMaxStringBytes = 255;

absl::Status CheckLength(const char* field, const std::string& value, size_t min_bytes) {
  if (value.size() < min_bytes || value.size() > kMaxStringBytes) {
    return absl::InvalidArgumentError(absl::StrCat("namespace.", field, ": must be ", min_bytes, "..", kMaxStringBytes,
                                                   " bytes, got ", value.size()));
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

// The byte layout is specified in docs/fingerprints.md; tests/fingerprint/golden_vectors.py is an
// independent implementation of it. Change neither without bumping kFingerprintSchemeVersion.
void AppendCanonicalBytes(const Namespace& ns, std::string* out) {
  const KvLayout& l = ns.layout;
  const bool mla = l.kind == LayoutKind::kMla;
  AppendU8(kFingerprintSchemeVersion, out);
  AppendU8(kHashAlgorithmSha256, out);
  AppendString(ns.tenant, out);
  AppendString(ns.model, out);
  AppendOptionalString(ns.revision, out);
  AppendU8(static_cast<uint8_t>(l.kind), out);
  AppendU8(static_cast<uint8_t>(l.dtype), out);
  AppendU8(static_cast<uint8_t>(l.codec), out);
  AppendU32(l.num_layers, out);
  // Fields that do not shape the stored block are written as 0, so that (for example) two plain bf16
  // layouts that differ only in an unused quant_group_size share KV.
  AppendU32(mla ? 0 : l.num_kv_heads, out);
  AppendU32(mla ? 0 : l.head_dim, out);
  AppendU32(mla ? l.latent_dim : 0, out);
  AppendU32(l.block_tokens, out);
  AppendU32(l.tp_size, out);
  AppendU32(l.codec == Codec::kNone ? 0 : l.quant_group_size, out);
}

}  // namespace internal

absl::Status Namespace::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckLength("tenant", tenant, 1));
  KVTIER_RETURN_IF_ERROR(CheckLength("model", model, 1));
  if (revision.has_value()) KVTIER_RETURN_IF_ERROR(CheckLength("revision", *revision, 0));
  if (tenant_salt.has_value()) KVTIER_RETURN_IF_ERROR(CheckLength("tenant_salt", *tenant_salt, 0));
  return layout.Validate();
}

std::string Namespace::CanonicalBytes() const {
  std::string out;
  internal::AppendCanonicalBytes(*this, &out);
  return out;
}

uint64_t Namespace::Id() const {
  const std::string bytes = CanonicalBytes();
  uint8_t digest[internal::kSha256Bytes];
  internal::Sha256Digest(bytes.data(), bytes.size(), digest);
  return internal::LoadU64Le(digest);
}

}  // namespace kvtier
