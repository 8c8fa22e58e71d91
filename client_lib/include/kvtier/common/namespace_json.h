// A Namespace from JSON: what `kvtierctl drain --namespaces-file`, `kvtierctl query` and the servers'
// /query endpoint (docs/query.md) read. Includes nlohmann/json.hpp (header-only; Debian's
// nlohmann-json3-dev), which no other kvtier header needs.
#ifndef KVTIER_COMMON_NAMESPACE_JSON_H_
#define KVTIER_COMMON_NAMESPACE_JSON_H_

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "kvtier/common/namespace.h"

namespace kvtier {

// One namespace from JSON: {"tenant", "model", "revision" (optional), "tenant_salt" (optional),
// "layout": {"kind", "dtype", "codec", "num_layers", "num_kv_heads", "head_dim", "latent_dim",
// "block_tokens", "tp_size", "quant_group_size"}}; layout keys may be left out for KvLayout's defaults.
// `j` is borrowed for the call; thread-safe. Errors: InvalidArgument (an unknown key, a value of the
// wrong type, or what Namespace::Validate() refuses), naming the key.
absl::StatusOr<Namespace> NamespaceFromJson(const nlohmann::json& j);

// The JSON NamespaceFromJson reads back as `ns`: every layout key; "revision" when it has one;
// "tenant_salt" only when `with_salt` and it has one (a secret: callers that print JSON leave it out).
nlohmann::json NamespaceToJson(const Namespace& ns, bool with_salt);

}  // namespace kvtier

#endif  // KVTIER_COMMON_NAMESPACE_JSON_H_
