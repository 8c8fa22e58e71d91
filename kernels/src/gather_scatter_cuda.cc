// Host wrappers of the gather/scatter kernel: check arguments as the CPU reference does, carry host
// tables to the device, launch once.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "arg_checks.h"
#include "cuda_tables.h"
#include "gather_scatter_launch.h"
#include "kvtier/kernels/device.h"
#include "kvtier/kernels/gather_scatter.h"

namespace kvtier::kernels {
namespace {

KernelStatus PagedCopyCuda(const PagedCacheSpec& spec, void* const* layer_caches, const int32_t* block_table,
                           int32_t num_blocks, void* const* blocks, const CudaLaunchOptions& options, bool gather) {
  KernelStatus s = internal::CheckPagedCopy(spec, layer_caches, block_table, num_blocks, blocks,
                                            /*check_entries=*/!options.tables_on_device,
                                            /*unique_pages=*/!gather);
  if (!s.ok() || num_blocks == 0) return s;
  if (!CudaAvailable()) return internal::NoCudaDevice();
  const cudaStream_t stream = static_cast<cudaStream_t>(options.stream);

  internal::PagedCopyParams p;
  p.page_bytes = spec.PageBytes();
  p.num_blocks = num_blocks;
  p.num_layers = spec.block.num_layers;
  p.num_kv = spec.block.NumKv();
  p.pages_per_block = spec.PagesPerBlock();
  p.num_pages = spec.num_pages;
  p.kv_first = spec.layout == EngineLayout::kKvFirst ? 1 : 0;
  p.gather = gather ? 1 : 0;

  if (options.tables_on_device) {
    p.layer_caches = layer_caches;
    p.blocks = blocks;
    p.block_table = block_table;
    return internal::FromCuda(internal::LaunchPagedCopy(p, stream), "paged copy launch");
  }
  internal::DeviceTables tables(stream);
  const size_t caches_at = tables.Add(layer_caches, sizeof(void*) * spec.block.num_layers);
  const size_t blocks_at = tables.Add(blocks, sizeof(void*) * num_blocks);
  const size_t table_at =
      tables.Add(block_table, sizeof(int32_t) * static_cast<size_t>(num_blocks) * p.pages_per_block);
  s = internal::FromCuda(tables.Upload(), "copying tables to the device");
  if (!s.ok()) return s;
  p.layer_caches = tables.At<void* const>(caches_at);
  p.blocks = tables.At<void* const>(blocks_at);
  p.block_table = tables.At<const int32_t>(table_at);
  return internal::FromCuda(internal::LaunchPagedCopy(p, stream), "paged copy launch");
}

}  // namespace

KernelStatus GatherCuda(const PagedCacheSpec& spec, const void* const* layer_caches, const int32_t* block_table,
                        int32_t num_blocks, void* const* blocks, const CudaLaunchOptions& options) {
  return PagedCopyCuda(spec, const_cast<void* const*>(layer_caches), block_table, num_blocks, blocks, options,
                       /*gather=*/true);
}

KernelStatus ScatterCuda(const PagedCacheSpec& spec, const void* const* blocks, const int32_t* block_table,
                         int32_t num_blocks, void* const* layer_caches, const CudaLaunchOptions& options) {
  return PagedCopyCuda(spec, layer_caches, block_table, num_blocks, const_cast<void* const*>(blocks), options,
                       /*gather=*/false);
}

}  // namespace kvtier::kernels
