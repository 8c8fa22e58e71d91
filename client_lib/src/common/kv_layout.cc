#include "kvtier/common/kv_layout.h"

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

constexpr uint64_t kMaxShardBytes = uint64_t{1} << 40;
constexpr uint64_t kScaleBytes = 4;  // one fp32 scale per quantization group

// a * b, saturating at UINT64_MAX, so that Validate() can size layouts whose fields are all huge.
uint64_t SatMul(uint64_t a, uint64_t b) {
  uint64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return std::numeric_limits<uint64_t>::max();
  return product;
}

uint64_t SatAdd(uint64_t a, uint64_t b) {
  uint64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return std::numeric_limits<uint64_t>::max();
  return sum;
}

bool IsValid(LayoutKind kind) { return kind == LayoutKind::kStandard || kind == LayoutKind::kMla; }
bool IsValid(DType dtype) {
  return dtype == DType::kFp16 || dtype == DType::kBf16 || dtype == DType::kFp32 || dtype == DType::kFp8E4m3;
}
bool IsValid(Codec codec) { return codec == Codec::kNone || codec == Codec::kFp8E4m3 || codec == Codec::kInt8; }

absl::Status FieldError(const char* field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("layout.", field, ": ", what));
}

// ShardBytes() without overflow: UINT64_MAX when the true size does not fit.
uint64_t SaturatingShardBytes(const KvLayout& l) {
  const bool quantized = l.codec != Codec::kNone;
  const uint64_t element_bytes = quantized ? 1 : DTypeBytes(l.dtype);
  // Values per token and layer, and scales per token and layer when quantized.
  uint64_t values_per_token;
  uint64_t planes;  // K and V (2) for standard attention, one latent for MLA
  if (l.kind == LayoutKind::kMla) {
    values_per_token = l.latent_dim;
    planes = 1;
  } else {
    values_per_token = SatMul(l.tp_size == 0 ? 0 : l.num_kv_heads / l.tp_size, l.head_dim);
    planes = 2;
  }
  const uint64_t rows = SatMul(SatMul(l.num_layers, planes), l.block_tokens);
  uint64_t bytes = SatMul(SatMul(rows, values_per_token), element_bytes);
  if (quantized && l.quant_group_size > 0) {
    // head_dim (or latent_dim) is a multiple of the group size, so values / group counts the groups.
    bytes = SatAdd(bytes, SatMul(SatMul(rows, values_per_token / l.quant_group_size), kScaleBytes));
  }
  return bytes;
}

}  // namespace

absl::Status KvLayout::Validate() const {
  if (!IsValid(kind)) return FieldError("kind", absl::StrCat("unknown value ", static_cast<int>(kind)));
  if (!IsValid(dtype)) return FieldError("dtype", absl::StrCat("unknown value ", static_cast<int>(dtype)));
  if (!IsValid(codec)) return FieldError("codec", absl::StrCat("unknown value ", static_cast<int>(codec)));
  if (num_layers == 0) return FieldError("num_layers", "must be > 0");
  if (block_tokens == 0) return FieldError("block_tokens", "must be > 0");
  if (tp_size == 0) return FieldError("tp_size", "must be > 0");
  uint32_t quantized_dim;  // the dimension quant_group_size must divide
  const char* quantized_dim_name;
  if (kind == LayoutKind::kStandard) {
    if (num_kv_heads == 0) return FieldError("num_kv_heads", "must be > 0");
    if (head_dim == 0) return FieldError("head_dim", "must be > 0");
    if (num_kv_heads % tp_size != 0) {
      return FieldError("num_kv_heads",
                        absl::StrCat("must be divisible by tp_size (", tp_size, "), got ", num_kv_heads));
    }
    quantized_dim = head_dim;
    quantized_dim_name = "head_dim";
  } else {
    if (latent_dim == 0) return FieldError("latent_dim", "must be > 0");
    quantized_dim = latent_dim;
    quantized_dim_name = "latent_dim";
  }
  if (codec != Codec::kNone) {
    if (dtype == DType::kFp8E4m3) {
      return FieldError("codec", absl::StrCat("must be none when dtype is fp8_e4m3, got ", CodecName(codec)));
    }
    if (quant_group_size == 0) return FieldError("quant_group_size", "must be > 0 when codec is not none");
    if (quantized_dim % quant_group_size != 0) {
      return FieldError("quant_group_size", absl::StrCat("must divide ", quantized_dim_name, " (", quantized_dim,
                                                         "), got ", quant_group_size));
    }
  }
  const uint64_t bytes = SaturatingShardBytes(*this);
  if (bytes > kMaxShardBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: one shard of one block is ",
                     bytes == std::numeric_limits<uint64_t>::max() ? std::string("over 2^64") : absl::StrCat(bytes),
                     " bytes, more than the limit of 2^40; lower block_tokens or num_layers"));
  }
  return absl::OkStatus();
}

uint64_t KvLayout::ShardBytes() const { return SaturatingShardBytes(*this); }

std::string KvLayout::DebugString() const {
  std::string shape =
      kind == LayoutKind::kMla ? absl::StrCat("latent", latent_dim) : absl::StrCat("H", num_kv_heads, "x", head_dim);
  return absl::StrCat(LayoutKindName(kind), "/", DTypeName(dtype), "/", CodecName(codec), " L", num_layers, " ", shape,
                      " B", block_tokens, " tp", tp_size, " g", quant_group_size);
}

uint32_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
    case DType::kBf16:
      return 2;
    case DType::kFp32:
      return 4;
    case DType::kFp8E4m3:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
      return "fp16";
    case DType::kBf16:
      return "bf16";
    case DType::kFp32:
      return "fp32";
    case DType::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "unknown";
}

const char* CodecName(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kFp8E4m3:
      return "fp8_e4m3";
    case Codec::kInt8:
      return "int8";
  }
  return "unknown";
}

const char* LayoutKindName(LayoutKind kind) {
  switch (kind) {
    case LayoutKind::kStandard:
      return "standard";
    case LayoutKind::kMla:
      return "mla";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  for (DType d : {DType::kFp16, DType::kBf16, DType::kFp32, DType::kFp8E4m3}) {
    if (name == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\"; want fp16, bf16, fp32 or fp8_e4m3"));
}

absl::StatusOr<Codec> ParseCodec(const std::string& name) {
  for (Codec c : {Codec::kNone, Codec::kFp8E4m3, Codec::kInt8}) {
    if (name == CodecName(c)) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown codec \"", name, "\"; want none, fp8_e4m3 or int8"));
}

absl::StatusOr<LayoutKind> ParseLayoutKind(const std::string& name) {
  for (LayoutKind k : {LayoutKind::kStandard, LayoutKind::kMla}) {
    if (name == LayoutKindName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown layout kind \"", name, "\"; want standard or mla"));
}

}  // namespace kvtier
