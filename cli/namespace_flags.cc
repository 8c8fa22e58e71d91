#include "namespace_flags.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "replayer.h"

namespace kvtier::cli {

namespace {

// Namespace::Validate()'s error with the flag named instead of the struct field: the message starts
// with "namespace.tenant:" or "layout.head_dim:".
absl::Status NameTheFlag(const absl::Status& s) {
  static const std::pair<const char*, const char*> kFlags[] = {{"namespace.tenant_salt:", "--tenant-salt:"},
                                                               {"namespace.tenant:", "--tenant:"},
                                                               {"namespace.model:", "--model:"},
                                                               {"namespace.revision:", "--revision:"},
                                                               {"layout.num_layers:", "--num-layers:"},
                                                               {"layout.num_kv_heads:", "--kv-heads:"},
                                                               {"layout.head_dim:", "--head-dim:"},
                                                               {"layout.latent_dim:", "--latent-dim:"},
                                                               {"layout.block_tokens:", "--block-tokens:"},
                                                               {"layout.tp_size:", "--tp-size:"},
                                                               {"layout.quant_group_size:", "--group:"}};
  std::string msg(s.message());
  for (const auto& [field, flag] : kFlags) {
    if (absl::StartsWith(msg, field)) {
      msg = absl::StrCat(flag, msg.substr(std::string_view(field).size()));
      break;
    }
  }
  return absl::InvalidArgumentError(msg);
}

}  // namespace

void NamespaceFlags::Register(CLI::App* app, bool with_salt) {
  constexpr const char* kGroup = "Namespace";
  tenant_opt_ = app->add_option("--tenant", tenant, "Tenant of the namespace")->group(kGroup);
  model_opt_ = app->add_option("--model", model, "Model of the namespace")->group(kGroup);
  revision_opt_ = app->add_option("--revision", revision, "Model revision (absent unless given)")->group(kGroup);
  app->add_option("--kind", kind, "Layout kind: standard or mla")->capture_default_str()->group(kGroup);
  app->add_option("--dtype", dtype, "KV dtype: fp16, bf16, fp32, fp8_e4m3")->capture_default_str()->group(kGroup);
  app->add_option("--codec", codec, "Stored codec: none, fp8_e4m3, int8")->capture_default_str()->group(kGroup);
  app->add_option("--num-layers", num_layers, "Model layers")->group(kGroup);
  app->add_option("--kv-heads", kv_heads, "KV heads of the whole model (standard kind)")->group(kGroup);
  app->add_option("--head-dim", head_dim, "Elements per head (standard kind)")->group(kGroup);
  app->add_option("--latent-dim", latent_dim, "Elements per token and layer (mla kind)")->group(kGroup);
  block_tokens_opt_ = app->add_option("--block-tokens", block_tokens,
                                      "Tokens per block (default 16; 512 with --replay-namespace, as trace_replay)")
                          ->group(kGroup);
  app->add_option("--tp-size", tp_size, "Tensor-parallel degree (shards per block)")
      ->capture_default_str()
      ->group(kGroup);
  app->add_option("--group", group, "Values per fp32 scale with a quantized codec")
      ->capture_default_str()
      ->group(kGroup);
  app->add_flag("--replay-namespace", replay,
                "Use bench/trace_replay's namespace (tenant demo, model llama-3.1-8b-scaled, 1 bf16 layer and "
                "KV head sized by --replay-block-bytes and --block-tokens)")
      ->group(kGroup);
  app->add_option("--replay-block-bytes", replay_block_bytes, "trace_replay's --block_bytes")
      ->capture_default_str()
      ->group(kGroup);
  if (with_salt) {
    salt_opt_ = app->add_option("--tenant-salt", tenant_salt,
                                "The tenant's secret fingerprint salt, if it has one (never sent to servers)")
                    ->envname("KVTIER_TENANT_SALT")
                    ->group(kGroup);
  }
}

bool NamespaceFlags::Given() const {
  return replay || (tenant_opt_ != nullptr && tenant_opt_->count() > 0) ||
         (model_opt_ != nullptr && model_opt_->count() > 0);
}

absl::StatusOr<Namespace> NamespaceFlags::Build() const {
  Namespace ns;
  if (replay) {
    const uint32_t tokens = block_tokens_opt_ != nullptr && block_tokens_opt_->count() > 0 ? block_tokens : 512;
    if (tokens == 0) return absl::InvalidArgumentError("--block-tokens: must be > 0");
    auto r = bench::ReplayNamespace({.block_tokens = tokens, .block_bytes = replay_block_bytes});
    if (!r.ok()) {
      // ReplayNamespace's own check is of block_bytes; the rest is Namespace::Validate()'s.
      if (absl::StartsWith(r.status().message(), "block_bytes")) {
        return absl::InvalidArgumentError(absl::StrCat("--replay-block-bytes: ", r.status().message()));
      }
      return NameTheFlag(r.status());
    }
    ns = *r;
    if (!tenant.empty()) ns.tenant = tenant;
    if (!model.empty()) ns.model = model;
  } else {
    ns.tenant = tenant;
    ns.model = model;
    auto k = ParseLayoutKind(kind);
    if (!k.ok()) return absl::InvalidArgumentError(absl::StrCat("--kind: ", k.status().message()));
    auto d = ParseDType(dtype);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--dtype: ", d.status().message()));
    auto c = ParseCodec(codec);
    if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("--codec: ", c.status().message()));
    ns.layout = KvLayout{.kind = *k,
                         .dtype = *d,
                         .codec = *c,
                         .num_layers = num_layers,
                         .num_kv_heads = kv_heads,
                         .head_dim = head_dim,
                         .latent_dim = latent_dim,
                         .block_tokens = block_tokens,
                         .tp_size = tp_size,
                         .quant_group_size = group};
  }
  if (revision_opt_ != nullptr && revision_opt_->count() > 0) ns.revision = revision;
  if (salt_opt_ != nullptr && salt_opt_->count() > 0) ns.tenant_salt = tenant_salt;
  if (absl::Status s = ns.Validate(); !s.ok()) return NameTheFlag(s);
  return ns;
}

absl::StatusOr<std::vector<Namespace>> LoadNamespacesFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON"));
  std::vector<Namespace> out;
  if (j.is_object()) {
    auto ns = NamespaceFromJson(j);
    if (!ns.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ns.status().message()));
    out.push_back(*std::move(ns));
    return out;
  }
  if (!j.is_array()) return absl::InvalidArgumentError(absl::StrCat(path, ": want a namespace or an array of them"));
  for (size_t i = 0; i < j.size(); ++i) {
    auto ns = NamespaceFromJson(j[i]);
    if (!ns.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": [", i, "]: ", ns.status().message()));
    out.push_back(*std::move(ns));
  }
  return out;
}

}  // namespace kvtier::cli
