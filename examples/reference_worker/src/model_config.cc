#include "kvtier/reference_worker/model_config.h"

#include "absl/strings/str_cat.h"
#include "kvtier/common/status_macros.h"

namespace kvtier::reference_worker {

absl::Status ModelConfig::Validate() const {
  auto positive = [](const char* name, int32_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("model.", name, " is ", v, ", want > 0"));
  };
  KVTIER_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  KVTIER_RETURN_IF_ERROR(positive("num_layers", num_layers));
  KVTIER_RETURN_IF_ERROR(positive("d_model", d_model));
  KVTIER_RETURN_IF_ERROR(positive("num_heads", num_heads));
  KVTIER_RETURN_IF_ERROR(positive("num_kv_heads", num_kv_heads));
  KVTIER_RETURN_IF_ERROR(positive("head_dim", head_dim));
  KVTIER_RETURN_IF_ERROR(positive("ffn_dim", ffn_dim));
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.num_heads ", num_heads, " is not a multiple of num_kv_heads ", num_kv_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.head_dim is ", head_dim, ", want even (RoPE)"));
  }
  if (!(rope_theta > 1.0f) || !(rms_eps > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.rope_theta ", rope_theta, " / rms_eps ", rms_eps, ": want > 1 / > 0"));
  }
  return absl::OkStatus();
}

std::string ModelConfig::Revision() const {
  return absl::StrCat("v", vocab_size, "-L", num_layers, "-d", d_model, "-h", num_heads, "-kv", num_kv_heads, "-hd",
                      head_dim, "-f", ffn_dim, "-rope", rope_theta, "-eps", rms_eps, "-seed", seed);
}

absl::StatusOr<Namespace> ModelNamespace(const ModelConfig& config, const std::string& tenant, uint32_t block_tokens,
                                         Codec codec, uint32_t quant_group_size) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  Namespace ns;
  ns.tenant = tenant;
  ns.model = "kvtier-reference-tiny";
  ns.revision = config.Revision();
  ns.layout = {.kind = LayoutKind::kStandard,
               .dtype = DType::kBf16,
               .codec = codec,
               .num_layers = static_cast<uint32_t>(config.num_layers),
               .num_kv_heads = static_cast<uint32_t>(config.num_kv_heads),
               .head_dim = static_cast<uint32_t>(config.head_dim),
               .block_tokens = block_tokens,
               .tp_size = 1,
               .quant_group_size = quant_group_size};
  KVTIER_RETURN_IF_ERROR(ns.Validate());
  return ns;
}

}  // namespace kvtier::reference_worker
