// TinyTransformer: a small decoder-only transformer in plain C++ (fp32 weights from a fixed seed) whose
// attention reads and writes a paged KV cache (paged_kv_cache.h) in bf16, as a GPU engine's would.
//
// Determinism contract, which makes "logits with fetched KV == logits with full recompute" hold bit for
// bit: the hidden state of token t depends only on its token id, its position and the cache rows of
// positions <= t, and is computed by the same loops in the same order whether t is the first or the
// hundredth token of a Prefill() call. Each token's K and V are rounded to bf16 and written to the cache
// before any query reads them, and attention reads only the cache (never an fp32 copy), so a row
// restored from kvtier holds exactly the bits a recompute would have written. Reductions run
// sequentially in index order (dot products over head_dim, softmax over positions 0..t in order).
//
// Thread-safety: the model is immutable after Create(); Prefill() may run concurrently on different
// caches. Ownership: Prefill borrows the cache and the spans for the call.
#ifndef KVTIER_REFERENCE_WORKER_TINY_TRANSFORMER_H_
#define KVTIER_REFERENCE_WORKER_TINY_TRANSFORMER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/reference_worker/model_config.h"
#include "kvtier/reference_worker/paged_kv_cache.h"

namespace kvtier::reference_worker {

class TinyTransformer {
 public:
  // Draws every weight from config.seed (a splitmix64 stream, uniform in +-sqrt(3 / fan_in), so each
  // projection keeps unit variance; norm gains are 1). Errors: InvalidArgument (bad config).
  static absl::StatusOr<TinyTransformer> Create(const ModelConfig& config);

  // Computes positions [start, tokens.size()) of one sequence: writes their K and V (bf16) into `cache`
  // at `page_table` and returns the fp32 logits (vocab_size values) of the last position. The cache must
  // already hold positions [0, start) of this same token sequence (computed earlier, or restored from
  // kvtier). page_table covers at least tokens.size() positions.
  // Errors: InvalidArgument (start outside [0, tokens.size()), a token id >= vocab_size, a short page
  // table, or a cache whose shape differs from the model's).
  absl::StatusOr<std::vector<float>> Prefill(std::span<const uint32_t> tokens, int32_t start,
                                             std::span<const int32_t> page_table, PagedKvCache& cache) const;

  const ModelConfig& config() const { return config_; }
  // Multiply-adds of Prefill() over [start, end): a cost figure for the demo binary.
  double PrefillMacs(int64_t start, int64_t end) const;

 private:
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo;  // wq: [d_model][num_heads * head_dim], row-major
    std::vector<float> mlp_norm, w_gate, w_up, w_down;
  };
  explicit TinyTransformer(const ModelConfig& config) : config_(config) {}

  ModelConfig config_;
  std::vector<float> embedding_;  // [vocab_size][d_model]
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  std::vector<float> lm_head_;        // [d_model][vocab_size]
  std::vector<float> rope_inv_freq_;  // head_dim / 2 frequencies
};

}  // namespace kvtier::reference_worker

#endif  // KVTIER_REFERENCE_WORKER_TINY_TRANSFORMER_H_
