// The shape of one kvtier block as the kernels see it: the KV of `block_tokens` consecutive tokens, all
// layers, one TP shard, in one contiguous buffer (DESIGN.md §1; client_lib's KvLayout describes the
// same bytes and maps onto this). Row-major, in elements:
//   kStandard: [num_layers][2 (K, V)][block_tokens][num_kv_heads][head_dim]
//   kMla:      [num_layers][block_tokens][latent_dim]
// num_kv_heads counts the heads of this TP shard (the whole model's heads / tp_size), which is also
// what the engine keeps per rank. A quantized block appends fp32 scales after the data (quantize.h).
// A plain value type; copy freely.
#ifndef KVTIER_KERNELS_BLOCK_SHAPE_H_
#define KVTIER_KERNELS_BLOCK_SHAPE_H_

#include <cstdint>

#include "kvtier/kernels/kernel_status.h"

namespace kvtier::kernels {

enum class BlockKind : int32_t { kStandard = 0, kMla = 1 };

struct BlockShape {
  BlockKind kind = BlockKind::kStandard;
  int32_t num_layers = 0;    // model layers; > 0
  int32_t block_tokens = 0;  // tokens per block; > 0
  int32_t num_kv_heads = 0;  // KV heads of this TP shard; > 0 for kStandard, ignored for kMla
  int32_t head_dim = 0;      // elements per head; > 0 for kStandard, ignored for kMla
  int32_t latent_dim = 0;    // elements per token and layer; > 0 for kMla, ignored for kStandard

  // OK when the fields above are in range and a block has at most 2^40 elements. Errors:
  // kKernelInvalidArgument naming the first bad field ("block.head_dim is 0, want > 0").
  KernelStatus Validate() const;
  // 2 (K and V) for kStandard, 1 for kMla.
  int32_t NumKv() const { return kind == BlockKind::kMla ? 1 : 2; }
  // Elements per token of one layer and one of K/V: num_kv_heads * head_dim, or latent_dim.
  int64_t TokenElements() const {
    return kind == BlockKind::kMla ? latent_dim : static_cast<int64_t>(num_kv_heads) * head_dim;
  }
  // The innermost dimension, along which quantization groups run: head_dim, or latent_dim.
  int32_t InnerDim() const { return kind == BlockKind::kMla ? latent_dim : head_dim; }
  // Elements in one block: num_layers * NumKv() * block_tokens * TokenElements().
  int64_t NumElements() const { return static_cast<int64_t>(num_layers) * NumKv() * block_tokens * TokenElements(); }
};

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_BLOCK_SHAPE_H_
