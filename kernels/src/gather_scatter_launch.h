// The boundary between gather_scatter_cuda.cc (host C++20) and gather_scatter.cu (nvcc): plain data and
// cudaError_t only. Private to kvtier_kernels.
#ifndef KVTIER_KERNELS_SRC_GATHER_SCATTER_LAUNCH_H_
#define KVTIER_KERNELS_SRC_GATHER_SCATTER_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::kernels::internal {

// All pointers are device-visible. One "run" is PageBytes() contiguous bytes on both sides: the
// (block, layer, kv, page_in_block) piece of gather_scatter.h.
struct PagedCopyParams {
  void* const* layer_caches = nullptr;   // [num_layers] engine tensors
  void* const* blocks = nullptr;         // [num_blocks] kvtier blocks
  const int32_t* block_table = nullptr;  // [num_blocks * pages_per_block] page ids
  int64_t page_bytes = 0;                // bytes per run
  int32_t num_blocks = 0;
  int32_t num_layers = 0;
  int32_t num_kv = 0;  // 2 (K, V) or 1 (MLA)
  int32_t pages_per_block = 0;
  int32_t num_pages = 0;  // page ids outside [0, num_pages) are skipped
  int32_t kv_first = 0;   // 1: engine [num_kv][num_pages][page]; 0: [num_pages][num_kv][page]
  int32_t gather = 1;     // 1: cache -> blocks; 0: blocks -> cache
};

// Queues one kernel over every run on `stream`; returns the launch error (cudaGetLastError).
cudaError_t LaunchPagedCopy(const PagedCopyParams& params, cudaStream_t stream);

}  // namespace kvtier::kernels::internal

#endif  // KVTIER_KERNELS_SRC_GATHER_SCATTER_LAUNCH_H_
