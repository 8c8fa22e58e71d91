// gather/scatter kernel: one launch copies every (block, layer, K|V, page) run. A CTA of 256 threads is
// split into slots of kThreads / slots threads (a warp or more); each slot copies one run at a time,
// grid-striding over runs, with the widest vector (16, 8, 4, 2 or 1 bytes) that the run's two
// addresses and length allow, and four loads in flight per thread.
#include <cuda_runtime.h>

#include "gather_scatter_launch.h"

namespace kvtier::kernels::internal {
namespace {

constexpr int kThreads = 256;

template <typename V>
__device__ __forceinline__ void CopyRun(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                                        int64_t bytes, int lane, int width) {
  const V* s = reinterpret_cast<const V*>(src);
  V* d = reinterpret_cast<V*>(dst);
  const int64_t n = bytes / static_cast<int64_t>(sizeof(V));
  int64_t i = lane;
  for (; i + 3 * width < n; i += 4 * width) {
    const V a = s[i];
    const V b = s[i + width];
    const V c = s[i + 2 * width];
    const V e = s[i + 3 * width];
    d[i] = a;
    d[i + width] = b;
    d[i + 2 * width] = c;
    d[i + 3 * width] = e;
  }
  for (; i < n; i += width) d[i] = s[i];
}

__global__ void __launch_bounds__(kThreads) PagedCopyKernel(PagedCopyParams p, int slot_threads) {
  const int slots = kThreads / slot_threads;
  const int slot = threadIdx.x / slot_threads;
  const int lane = threadIdx.x % slot_threads;
  const int64_t runs = static_cast<int64_t>(p.num_blocks) * p.num_layers * p.num_kv * p.pages_per_block;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * slots;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * slots + slot; r < runs; r += stride) {
    int64_t rest = r;
    const int32_t page_in_block = static_cast<int32_t>(rest % p.pages_per_block);
    rest /= p.pages_per_block;
    const int32_t kv = static_cast<int32_t>(rest % p.num_kv);
    rest /= p.num_kv;
    const int32_t layer = static_cast<int32_t>(rest % p.num_layers);
    const int32_t block = static_cast<int32_t>(rest / p.num_layers);

    const int32_t page = p.block_table[static_cast<int64_t>(block) * p.pages_per_block + page_in_block];
    unsigned char* cache = static_cast<unsigned char*>(p.layer_caches[layer]);
    unsigned char* blk = static_cast<unsigned char*>(p.blocks[block]);
    if (page < 0 || page >= p.num_pages || cache == nullptr || blk == nullptr) continue;

    const int64_t cache_off =
        (p.kv_first ? static_cast<int64_t>(kv) * p.num_pages + page : static_cast<int64_t>(page) * p.num_kv + kv) *
        p.page_bytes;
    const int64_t block_off =
        ((static_cast<int64_t>(layer) * p.num_kv + kv) * p.pages_per_block + page_in_block) * p.page_bytes;
    const unsigned char* src = p.gather ? cache + cache_off : blk + block_off;
    unsigned char* dst = p.gather ? blk + block_off : cache + cache_off;

    const uint64_t align =
        reinterpret_cast<uint64_t>(src) | reinterpret_cast<uint64_t>(dst) | static_cast<uint64_t>(p.page_bytes);
    if ((align & 15) == 0) {
      CopyRun<uint4>(src, dst, p.page_bytes, lane, slot_threads);
    } else if ((align & 7) == 0) {
      CopyRun<uint2>(src, dst, p.page_bytes, lane, slot_threads);
    } else if ((align & 3) == 0) {
      CopyRun<unsigned int>(src, dst, p.page_bytes, lane, slot_threads);
    } else if ((align & 1) == 0) {
      CopyRun<unsigned short>(src, dst, p.page_bytes, lane, slot_threads);
    } else {
      CopyRun<unsigned char>(src, dst, p.page_bytes, lane, slot_threads);
    }
  }
}

}  // namespace

cudaError_t LaunchPagedCopy(const PagedCopyParams& params, cudaStream_t stream) {
  const int64_t runs =
      static_cast<int64_t>(params.num_blocks) * params.num_layers * params.num_kv * params.pages_per_block;
  if (runs == 0) return cudaSuccess;
  // Threads per run: about eight 16-byte vectors each, from a warp up to the whole CTA.
  const int64_t vectors = (params.page_bytes + 15) / 16;
  int slot_threads = 32;
  while (slot_threads < kThreads && static_cast<int64_t>(slot_threads) * 8 < vectors) slot_threads *= 2;
  const int slots = kThreads / slot_threads;
  const int64_t ctas = (runs + slots - 1) / slots;
  const unsigned int grid = static_cast<unsigned int>(ctas < (int64_t{1} << 24) ? ctas : (int64_t{1} << 24));
  PagedCopyKernel<<<grid, kThreads, 0, stream>>>(params, slot_threads);
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::internal
