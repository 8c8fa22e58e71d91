// The KV layout of a namespace: what one stored block holds and how many bytes it takes.
#ifndef KVTIER_COMMON_KV_LAYOUT_H_
#define KVTIER_COMMON_KV_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier {

// Standard attention keeps K and V per KV head; MLA (DeepSeek-style) keeps one latent vector per token.
enum class LayoutKind : uint8_t { kStandard = 1, kMla = 2 };

// Element type of the engine's KV cache.
enum class DType : uint8_t { kFp16 = 1, kBf16 = 2, kFp32 = 3, kFp8E4m3 = 4 };

// How kvtier stores the elements: as they are, or quantized with one fp32 scale per group of
// `quant_group_size` values. Part of the layout, so quantized and plain blocks never mix.
enum class Codec : uint8_t { kNone = 0, kFp8E4m3 = 1, kInt8 = 2 };

// One TP shard's K and V for `block_tokens` tokens of every layer (DESIGN.md §1), row-major:
//   [num_layers][2 (K,V)][block_tokens][num_kv_heads / tp_size][head_dim] of the stored element type
//   (dtype when codec is kNone, else 1 byte), then, for a quantized codec, fp32 scales
//   [num_layers][2][block_tokens][num_kv_heads / tp_size][head_dim / quant_group_size].
// MLA kind: [num_layers][block_tokens][latent_dim] (latent is shared by all ranks, so tp_size does not
// divide it), with scales [num_layers][block_tokens][latent_dim / quant_group_size] when quantized.
// A plain value type; copy freely.
struct KvLayout {
  LayoutKind kind = LayoutKind::kStandard;
  DType dtype = DType::kBf16;
  Codec codec = Codec::kNone;
  uint32_t num_layers = 0;         // model layers; > 0
  uint32_t num_kv_heads = 0;       // KV heads of the whole model (standard kind); divisible by tp_size
  uint32_t head_dim = 0;           // elements per head (standard kind)
  uint32_t latent_dim = 0;         // elements per token and layer (MLA kind)
  uint32_t block_tokens = 16;      // tokens per block; > 0
  uint32_t tp_size = 1;            // tensor-parallel degree; a block is stored as tp_size shards
  uint32_t quant_group_size = 64;  // values per fp32 scale when codec != kNone; divides head_dim/latent_dim

  // OK when every field is in range and the shard fits in 2^40 bytes. Errors: InvalidArgument naming the
  // first bad field ("layout.head_dim: must be > 0").
  absl::Status Validate() const;
  // Bytes of one shard of one block (see the layout above). Meaningful only when Validate() is OK.
  uint64_t ShardBytes() const;
  // Short human form, e.g. "standard/bf16/none L32 H8x128 B16 tp1 g64".
  std::string DebugString() const;

  friend bool operator==(const KvLayout&, const KvLayout&) = default;
};

// Bytes per element of `dtype` (fp16/bf16: 2, fp32: 4, fp8: 1).
uint32_t DTypeBytes(DType dtype);
// Canonical lower-case names ("bf16", "fp8_e4m3", "int8", "none", "standard", "mla") and their parsers.
// Parsers return InvalidArgument listing the accepted names.
const char* DTypeName(DType dtype);
const char* CodecName(Codec codec);
const char* LayoutKindName(LayoutKind kind);
absl::StatusOr<DType> ParseDType(const std::string& name);
absl::StatusOr<Codec> ParseCodec(const std::string& name);
absl::StatusOr<LayoutKind> ParseLayoutKind(const std::string& name);

}  // namespace kvtier

#endif  // KVTIER_COMMON_KV_LAYOUT_H_
