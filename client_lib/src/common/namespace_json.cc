#include "kvtier/common/namespace_json.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtier/common/kv_layout.h"

namespace kvtier {

absl::StatusOr<Namespace> NamespaceFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("a namespace is a JSON object");
  auto str = [&](const nlohmann::json& o, const char* key, std::string* out) -> absl::Status {
    if (!o.contains(key)) return absl::OkStatus();
    if (!o[key].is_string()) return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be a string"));
    *out = o[key].get<std::string>();
    return absl::OkStatus();
  };
  auto u32 = [&](const nlohmann::json& o, const char* key, uint32_t* out) -> absl::Status {
    if (!o.contains(key)) return absl::OkStatus();
    if (!o[key].is_number_unsigned() || o[key].get<uint64_t>() > UINT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("\"layout.", key, "\" must be a uint32"));
    }
    *out = o[key].get<uint32_t>();
    return absl::OkStatus();
  };
  for (const auto& [key, value] : j.items()) {
    if (key != "tenant" && key != "model" && key != "revision" && key != "layout" && key != "tenant_salt") {
      return absl::InvalidArgumentError(absl::StrCat("unknown key \"", key, "\""));
    }
  }
  Namespace ns;
  if (absl::Status s = str(j, "tenant", &ns.tenant); !s.ok()) return s;
  if (absl::Status s = str(j, "model", &ns.model); !s.ok()) return s;
  if (j.contains("revision")) {
    std::string r;
    if (absl::Status s = str(j, "revision", &r); !s.ok()) return s;
    ns.revision = r;
  }
  if (j.contains("tenant_salt")) {
    std::string salt;
    if (absl::Status s = str(j, "tenant_salt", &salt); !s.ok()) return s;
    ns.tenant_salt = salt;
  }
  if (!j.contains("layout") || !j["layout"].is_object()) {
    return absl::InvalidArgumentError("\"layout\" (an object) is required");
  }
  const nlohmann::json& l = j["layout"];
  std::string kind = "standard", dtype = "bf16", codec = "none";
  for (const auto& [key, value] : l.items()) {
    static const char* kKeys[] = {"kind",     "dtype",      "codec",        "num_layers", "num_kv_heads",
                                  "head_dim", "latent_dim", "block_tokens", "tp_size",    "quant_group_size"};
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown key \"layout.", key, "\""));
    }
  }
  for (auto [key, out] : {std::pair{"kind", &kind}, std::pair{"dtype", &dtype}, std::pair{"codec", &codec}}) {
    if (absl::Status s = str(l, key, out); !s.ok()) return s;
  }
  auto k = ParseLayoutKind(kind);
  if (!k.ok()) return k.status();
  auto d = ParseDType(dtype);
  if (!d.ok()) return d.status();
  auto c = ParseCodec(codec);
  if (!c.ok()) return c.status();
  ns.layout.kind = *k;
  ns.layout.dtype = *d;
  ns.layout.codec = *c;
  for (auto [key, out] :
       {std::pair{"num_layers", &ns.layout.num_layers}, std::pair{"num_kv_heads", &ns.layout.num_kv_heads},
        std::pair{"head_dim", &ns.layout.head_dim}, std::pair{"latent_dim", &ns.layout.latent_dim},
        std::pair{"block_tokens", &ns.layout.block_tokens}, std::pair{"tp_size", &ns.layout.tp_size},
        std::pair{"quant_group_size", &ns.layout.quant_group_size}}) {
    if (absl::Status s = u32(l, key, out); !s.ok()) return s;
  }
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  return ns;
}

nlohmann::json NamespaceToJson(const Namespace& ns, bool with_salt) {
  const KvLayout& l = ns.layout;
  nlohmann::json j = {{"tenant", ns.tenant}, {"model", ns.model}};
  if (ns.revision) j["revision"] = *ns.revision;
  if (with_salt && ns.tenant_salt) j["tenant_salt"] = *ns.tenant_salt;
  j["layout"] = {{"kind", LayoutKindName(l.kind)}, {"dtype", DTypeName(l.dtype)},
                 {"codec", CodecName(l.codec)},    {"num_layers", l.num_layers},
                 {"num_kv_heads", l.num_kv_heads}, {"head_dim", l.head_dim},
                 {"latent_dim", l.latent_dim},     {"block_tokens", l.block_tokens},
                 {"tp_size", l.tp_size},           {"quant_group_size", l.quant_group_size}};
  return j;
}

}  // namespace kvtier
