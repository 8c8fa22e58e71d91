// A namespace: the scope within which two requests may share KV (DESIGN.md §1).
#ifndef KVTIER_COMMON_NAMESPACE_H_
#define KVTIER_COMMON_NAMESPACE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "kvtier/common/kv_layout.h"

namespace kvtier {

// Tenant, model, model revision and KV layout. Blocks are shared only within one namespace: KV of one
// model, revision, dtype, TP degree or codec is wrong for any other. A plain value type.
struct Namespace {
  std::string tenant;                   // required, 1..255 bytes
  std::string model;                    // required, 1..255 bytes (e.g. "meta-llama/Llama-3.1-8B")
  std::optional<std::string> revision;  // absent != empty; at most 255 bytes
  KvLayout layout;
  // Secret per-tenant salt mixed into every fingerprint so that one tenant cannot probe another's
  // prefixes. Never sent to servers. Absent != empty; at most 255 bytes.
  std::optional<std::string> tenant_salt;

  // OK when the strings are in range and the layout is valid. Errors: InvalidArgument naming the field.
  absl::Status Validate() const;

  // The canonical byte encoding that starts every fingerprint chain (docs/fingerprints.md gives the
  // byte layout). It covers every field except tenant_salt, which the chain appends separately.
  std::string CanonicalBytes() const;

  // A 64-bit id of the namespace: the first 8 bytes, little-endian, of SHA-256(CanonicalBytes()).
  // Servers key per-namespace state on it; equal namespaces have equal ids on every machine.
  uint64_t Id() const;

  friend bool operator==(const Namespace&, const Namespace&) = default;
};

}  // namespace kvtier

#endif  // KVTIER_COMMON_NAMESPACE_H_
