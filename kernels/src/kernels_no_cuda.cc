// The ...Cuda entry points of a build without CUDA: arguments are checked as in a CUDA build (so a bad
// call fails the same way everywhere), then every call returns kKernelNoCuda.
#include "arg_checks.h"
#include "kvtier/kernels/gather_scatter.h"
#include "kvtier/kernels/quantize.h"

namespace kvtier::kernels {
namespace {

KernelStatus NoCuda(KernelStatus checked) {
  if (!checked.ok()) return checked;
  return KernelStatus{kKernelNoCuda, "built without CUDA"};
}

}  // namespace

KernelStatus GatherCuda(const PagedCacheSpec& spec, const void* const* layer_caches, const int32_t* block_table,
                        int32_t num_blocks, void* const* blocks, const CudaLaunchOptions& options) {
  return NoCuda(
      internal::CheckPagedCopy(spec, layer_caches, block_table, num_blocks, blocks, !options.tables_on_device, false));
}

KernelStatus ScatterCuda(const PagedCacheSpec& spec, const void* const* blocks, const int32_t* block_table,
                         int32_t num_blocks, void* const* layer_caches, const CudaLaunchOptions& options) {
  return NoCuda(
      internal::CheckPagedCopy(spec, layer_caches, block_table, num_blocks, blocks, !options.tables_on_device, true));
}

KernelStatus QuantizeCuda(const QuantSpec& spec, const void* const* float_blocks, int32_t num_blocks,
                          void* const* quantized_blocks, const CudaLaunchOptions& options) {
  return NoCuda(internal::CheckQuant(spec, float_blocks, num_blocks, quantized_blocks, !options.tables_on_device));
}

KernelStatus DequantizeCuda(const QuantSpec& spec, const void* const* quantized_blocks, int32_t num_blocks,
                            void* const* float_blocks, const CudaLaunchOptions& options) {
  return NoCuda(internal::CheckQuant(spec, quantized_blocks, num_blocks, float_blocks, !options.tables_on_device));
}

}  // namespace kvtier::kernels
