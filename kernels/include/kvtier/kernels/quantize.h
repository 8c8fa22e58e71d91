// quantize / dequantize: whole kvtier blocks of fp16 or bf16 <-> fp8 e4m3 or int8, with one fp32 scale
// per group of quant_group_size contiguous elements along head_dim (latent_dim for MLA). Used to store
// blocks at half the bytes; the block layout is DESIGN.md §1's.
//
// Layouts (block_shape.h gives the element order; N = block.NumElements(), G = quant_group_size):
//   float block:     N elements of float_type (2 bytes each, little-endian), the plain block layout.
//   quantized block: N one-byte codes in the same order (int8 two's complement, or fp8 e4m3 as in
//                    numeric.h), then N / G fp32 scales (little-endian), i.e.
//                    kStandard: [num_layers][2 (K, V)][block_tokens][num_kv_heads][head_dim / G]
//                    kMla:      [num_layers][block_tokens][latent_dim / G]
//                    Scale s covers elements [s * G, (s + 1) * G). QuantizedBlockBytes() = N + 4 N / G.
//
// The codec, per group of values x_i (all arithmetic fp32, round to nearest even; Q = 127 for int8,
// 448 for fp8 e4m3):
//   amax  = max |x_i| (NaN ignored)
//   scale = 0 when amax == 0 (all codes then encode zero), else max(amax / Q, 2^-126)
//   inv   = 1 / scale (0 when scale == 0)
//   int8: code_i = rint(clamp(x_i * inv, -127, 127))          (-128 is never produced)
//   fp8:  code_i = e4m3(clamp(x_i * inv, -448, 448))          (numeric.h, FloatToFp8E4m3)
//   dequantize: x^_i = float_type(decode(code_i) * scale)
// CPU and CUDA do exactly these operations, so they produce the same bytes (the CUDA tests compare
// bit for bit).
//
// Error bound, for finite inputs, with x~ = decode(code) * scale before the final rounding to float_type:
//   int8:         |x - x~| <= scale / 2 * (1 + 2^-13)          (scale = max|x| / 127 of the group)
//   fp8 e4m3:     |x - x~| <= max(2^-4 |x|, 2^-10 scale) * (1 + 2^-13)
//                 i.e. relative error <= 2^-4 (3 mantissa bits, round to nearest) while |x| >= 2^-6
//                 scale (e4m3's normal range, amax / 28672), and an absolute 2^-10 scale (half of e4m3's
//                 smallest subnormal, 2^-9, times the scale) for smaller values of the group, which
//                 lose precision or underflow to zero.
//   The (1 + 2^-13) covers fp32 rounding in x * inv and decode * scale. Dequantizing into float_type
//   then adds at most half an ulp of float_type at x^: 2^-11 |x^| for fp16 (2^-25 in fp16's subnormal
//   range), 2^-8 |x^| for bf16. The scale floor 2^-126 only matters for bf16 groups with amax below
//   ~1.5e-36; the bounds hold with the stored scale. Infinities and NaN give unspecified codes (no
//   crash, nothing out of bounds).
//
// Units, ownership, thread-safety, errors: as in gather_scatter.h. Blocks are borrowed for the call
// (CPU) or until the kernel has finished (CUDA); input and output blocks must not overlap. Any
// alignment works; the CUDA kernels use 16-byte float and 8-byte code accesses when the float blocks
// are 16-byte aligned, the quantized blocks 8-byte aligned, and G is 8, 16, 32, 64, 128 or 256
// (dequantize: any multiple of 8); otherwise a slower generic path.
// Errors: kKernelInvalidArgument for a bad spec (e.g. G not dividing head_dim) or a null pointer;
// kKernelNoCuda / cudaError_t from ...Cuda calls.
#ifndef KVTIER_KERNELS_QUANTIZE_H_
#define KVTIER_KERNELS_QUANTIZE_H_

#include <cstdint>

#include "kvtier/kernels/block_shape.h"
#include "kvtier/kernels/cuda_launch_options.h"
#include "kvtier/kernels/kernel_status.h"

namespace kvtier::kernels {

enum class FloatType : int32_t { kFp16 = 0, kBf16 = 1 };
enum class QuantCodec : int32_t { kFp8E4m3 = 0, kInt8 = 1 };

struct QuantSpec {
  BlockShape block;
  FloatType float_type = FloatType::kBf16;
  QuantCodec codec = QuantCodec::kFp8E4m3;
  int32_t quant_group_size = 64;  // elements per fp32 scale; > 0, divides block.InnerDim()

  // OK when block is valid and quant_group_size divides its InnerDim(). Errors: kKernelInvalidArgument
  // ("quant_group_size 48 does not divide head_dim 128").
  KernelStatus Validate() const;
  int64_t NumGroups() const { return block.NumElements() / quant_group_size; }
  // Bytes of a float block: NumElements() * 2.
  int64_t FloatBlockBytes() const { return block.NumElements() * 2; }
  // Offset of the scales in a quantized block: NumElements() (one byte per code).
  int64_t ScalesOffsetBytes() const { return block.NumElements(); }
  // Bytes of a quantized block: NumElements() + 4 * NumGroups().
  int64_t QuantizedBlockBytes() const { return block.NumElements() + 4 * NumGroups(); }
};

// For b in [0, num_blocks): float_blocks[b] (FloatBlockBytes()) -> quantized_blocks[b]
// (QuantizedBlockBytes()). Host memory. num_blocks == 0 does nothing.
KernelStatus QuantizeCpu(const QuantSpec& spec, const void* const* float_blocks, int32_t num_blocks,
                         void* const* quantized_blocks);
// The inverse: quantized_blocks[b] -> float_blocks[b].
KernelStatus DequantizeCpu(const QuantSpec& spec, const void* const* quantized_blocks, int32_t num_blocks,
                           void* const* float_blocks);

// The same on the GPU, one launch for all blocks. Blocks are device memory (or mapped pinned host
// memory); the pointer arrays are host or device memory as options.tables_on_device says.
KernelStatus QuantizeCuda(const QuantSpec& spec, const void* const* float_blocks, int32_t num_blocks,
                          void* const* quantized_blocks, const CudaLaunchOptions& options = {});
KernelStatus DequantizeCuda(const QuantSpec& spec, const void* const* quantized_blocks, int32_t num_blocks,
                            void* const* float_blocks, const CudaLaunchOptions& options = {});

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_QUANTIZE_H_
