// The namespace flags of `lookup` and `drain` (--tenant, --model, --revision and the KV layout), and
// namespace files (JSON) for `drain --namespaces-file`. Private to cli/.
#ifndef KVTIER_CLI_NAMESPACE_FLAGS_H_
#define KVTIER_CLI_NAMESPACE_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "kvtier/common/namespace.h"
#include "kvtier/common/namespace_json.h"  // NamespaceFromJson, which LoadNamespacesFile reads with

namespace kvtier::cli {

// Defaults are KvLayout's; Build() validates and names the bad flag.
struct NamespaceFlags {
  std::string tenant;
  std::string model;
  std::string revision;           // absent unless --revision is given (absent != empty)
  std::string kind = "standard";  // standard | mla
  std::string dtype = "bf16";     // fp16 | bf16 | fp32 | fp8_e4m3
  std::string codec = "none";     // none | fp8_e4m3 | int8
  uint32_t num_layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t latent_dim = 0;
  uint32_t block_tokens = 16;
  uint32_t tp_size = 1;
  uint32_t group = 64;      // quant_group_size
  std::string tenant_salt;  // lookup only; absent unless given
  // trace_replay's namespace (bench/trace_replay): tenant "demo", model "llama-3.1-8b-scaled", one bf16
  // layer and KV head of head_dim = replay_block_bytes / (4 x block_tokens); --tenant/--model override.
  bool replay = false;
  uint64_t replay_block_bytes = 32768;

  // Adds the flags to `app`; `with_salt` adds --tenant-salt (and $KVTIER_TENANT_SALT).
  void Register(CLI::App* app, bool with_salt);
  // Whether any flag naming a namespace was given (drain: hand off blocks of this namespace too).
  bool Given() const;
  // Errors: InvalidArgument naming the flag (e.g. "--kv-heads: must be > 0").
  absl::StatusOr<Namespace> Build() const;

 private:
  CLI::Option* tenant_opt_ = nullptr;
  CLI::Option* model_opt_ = nullptr;
  CLI::Option* revision_opt_ = nullptr;
  CLI::Option* block_tokens_opt_ = nullptr;
  CLI::Option* salt_opt_ = nullptr;
};

// A file holding one namespace object (NamespaceFromJson) or an array of them. Errors: NotFound, InvalidArgument (with
// the index).
absl::StatusOr<std::vector<Namespace>> LoadNamespacesFile(const std::string& path);

}  // namespace kvtier::cli

#endif  // KVTIER_CLI_NAMESPACE_FLAGS_H_
