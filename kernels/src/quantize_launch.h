// The boundary between quantize_cuda.cc (host C++20) and quantize.cu (nvcc): plain data and cudaError_t
// only. Private to kvtier_kernels.
#ifndef KVTIER_KERNELS_SRC_QUANTIZE_LAUNCH_H_
#define KVTIER_KERNELS_SRC_QUANTIZE_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::kernels::internal {

// All pointers are device-visible. Quantize reads float blocks from `in_blocks` and writes quantized
// blocks to `out_blocks`; dequantize the other way round (quantize.h has both layouts).
struct QuantParams {
  const void* const* in_blocks = nullptr;  // [num_blocks]
  void* const* out_blocks = nullptr;       // [num_blocks]
  int64_t num_elements = 0;                // per block; a multiple of group
  int32_t group = 0;                       // elements per scale
  int32_t num_blocks = 0;
  int32_t bf16 = 0;  // float type: 0 fp16, 1 bf16
  int32_t fp8 = 0;   // codec: 0 int8, 1 fp8 e4m3
};

cudaError_t LaunchQuantize(const QuantParams& params, cudaStream_t stream);
cudaError_t LaunchDequantize(const QuantParams& params, cudaStream_t stream);

}  // namespace kvtier::kernels::internal

#endif  // KVTIER_KERNELS_SRC_QUANTIZE_LAUNCH_H_
