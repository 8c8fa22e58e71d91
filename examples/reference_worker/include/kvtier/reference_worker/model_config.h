// The shape of the reference worker's tiny decoder-only transformer (tiny_transformer.h), and the kvtier
// namespace its KV belongs to. A plain value type; copy freely.
#ifndef KVTIER_REFERENCE_WORKER_MODEL_CONFIG_H_
#define KVTIER_REFERENCE_WORKER_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/common/kv_layout.h"
#include "kvtier/common/namespace.h"

namespace kvtier::reference_worker {

// A Llama-style block stack: RMSNorm, grouped-query attention with RoPE, SwiGLU MLP, untied LM head.
// Weights are drawn from `seed` (tiny_transformer.h), so two configs that are equal give the same
// model, bit for bit, in every process.
struct ModelConfig {
  int32_t vocab_size = 512;     // token ids are in [0, vocab_size); > 0
  int32_t num_layers = 3;       // > 0
  int32_t d_model = 128;        // residual width; > 0
  int32_t num_heads = 4;        // query heads; a multiple of num_kv_heads
  int32_t num_kv_heads = 2;     // K/V heads (GQA: num_heads / num_kv_heads queries share one)
  int32_t head_dim = 32;        // even (RoPE rotates pairs); > 0
  int32_t ffn_dim = 256;        // SwiGLU hidden width; > 0
  float rope_theta = 10000.0f;  // RoPE base
  float rms_eps = 1e-5f;        // RMSNorm epsilon
  uint64_t seed = 42;           // weight seed

  // Errors: InvalidArgument naming the first bad field.
  absl::Status Validate() const;
  // Short form of every field that changes the weights or the KV, e.g. "v512-L3-d128-h4-kv2-hd32-f256-
  // rope10000-eps1e-05-seed42"; the reference worker uses it as the namespace's model revision, so a
  // different config (different KV) never shares blocks.
  std::string Revision() const;
};

// The kvtier namespace of `config`'s KV under tenant `tenant`: model "kvtier-reference-tiny",
// revision config.Revision(), layout {standard, bf16, codec, num_layers, num_kv_heads, head_dim,
// block_tokens, tp 1, quant_group_size}. The codec is part of the layout, so blocks stored quantized
// live in a different namespace from plain ones. Errors: InvalidArgument (bad config or layout, e.g.
// quant_group_size not dividing head_dim).
absl::StatusOr<Namespace> ModelNamespace(const ModelConfig& config, const std::string& tenant, uint32_t block_tokens,
                                         Codec codec, uint32_t quant_group_size);

}  // namespace kvtier::reference_worker

#endif  // KVTIER_REFERENCE_WORKER_MODEL_CONFIG_H_
