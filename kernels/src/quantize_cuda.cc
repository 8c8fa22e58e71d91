// Host wrappers of the quantize/dequantize kernels: check arguments as the CPU reference does, carry
// host pointer arrays to the device, launch once.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "arg_checks.h"
#include "cuda_tables.h"
#include "kvtier/kernels/device.h"
#include "kvtier/kernels/quantize.h"
#include "quantize_launch.h"

namespace kvtier::kernels {
namespace {

KernelStatus QuantCuda(const QuantSpec& spec, const void* const* in_blocks, int32_t num_blocks, void* const* out_blocks,
                       const CudaLaunchOptions& options, bool quantize) {
  KernelStatus s = internal::CheckQuant(spec, in_blocks, num_blocks, out_blocks,
                                        /*check_entries=*/!options.tables_on_device);
  if (!s.ok() || num_blocks == 0) return s;
  if (!CudaAvailable()) return internal::NoCudaDevice();
  const cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  internal::QuantParams p;
  p.num_elements = spec.block.NumElements();
  p.group = spec.quant_group_size;
  p.num_blocks = num_blocks;
  p.bf16 = spec.float_type == FloatType::kBf16 ? 1 : 0;
  p.fp8 = spec.codec == QuantCodec::kFp8E4m3 ? 1 : 0;
  const char* what = quantize ? "quantize launch" : "dequantize launch";

  if (options.tables_on_device) {
    p.in_blocks = in_blocks;
    p.out_blocks = out_blocks;
    return internal::FromCuda(quantize ? internal::LaunchQuantize(p, stream) : internal::LaunchDequantize(p, stream),
                              what);
  }
  internal::DeviceTables tables(stream);
  const size_t in_at = tables.Add(in_blocks, sizeof(void*) * num_blocks);
  const size_t out_at = tables.Add(out_blocks, sizeof(void*) * num_blocks);
  s = internal::FromCuda(tables.Upload(), "copying tables to the device");
  if (!s.ok()) return s;
  p.in_blocks = tables.At<const void* const>(in_at);
  p.out_blocks = tables.At<void* const>(out_at);
  return internal::FromCuda(quantize ? internal::LaunchQuantize(p, stream) : internal::LaunchDequantize(p, stream),
                            what);
}

}  // namespace

KernelStatus QuantizeCuda(const QuantSpec& spec, const void* const* float_blocks, int32_t num_blocks,
                          void* const* quantized_blocks, const CudaLaunchOptions& options) {
  return QuantCuda(spec, float_blocks, num_blocks, quantized_blocks, options, true);
}

KernelStatus DequantizeCuda(const QuantSpec& spec, const void* const* quantized_blocks, int32_t num_blocks,
                            void* const* float_blocks, const CudaLaunchOptions& options) {
  return QuantCuda(spec, quantized_blocks, num_blocks, float_blocks, options, false);
}

}  // namespace kvtier::kernels
