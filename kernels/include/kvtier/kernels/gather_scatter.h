// gather: copies the pages of many blocks, all layers, from an inference engine's paged KV cache into
// contiguous kvtier blocks; scatter: the exact inverse, from blocks back into the engine's pages
// (DESIGN.md §1 and §6). Pure byte copies: no element is converted, so any element type works (fp16,
// bf16, fp8 of the engine's own cache, fp32).
//
// Engine side (one tensor per layer; the caller passes each layer's base pointer), row-major, elements:
//   kKvFirst:   [2 (K, V)][num_pages][page_size][num_kv_heads][head_dim]  vLLM FlashAttention backend
//   kPageFirst: [num_pages][2 (K, V)][page_size][num_kv_heads][head_dim]  vLLM FlashInfer backend
//   kMla:       [num_pages][page_size][latent_dim]                        vLLM/SGLang MLA (DeepSeek)
// Each layer tensor must be contiguous in that order; layers may live anywhere. num_kv_heads is this TP
// rank's heads (what the engine keeps per rank), and equals the block's num_kv_heads.
//
// kvtier side (block_shape.h): block b is one contiguous buffer of BlockBytes() bytes,
//   kStandard: [num_layers][2 (K, V)][block_tokens][num_kv_heads][head_dim]
//   kMla:      [num_layers][block_tokens][latent_dim]
// Token t of block b lives in engine page block_table[b * PagesPerBlock() + t / page_size], at row
// t % page_size of that page. So for every (block, layer, K|V, page) a run of PageBytes() bytes is
// contiguous on both sides; the kernels copy those runs.
//
// Units: sizes are bytes (int64_t, suffix _bytes); counts are elements, tokens, pages or blocks.
// Ownership: every pointer is borrowed for the call only (CPU), or until the kernel has finished
// (CUDA; see cuda_launch_options.h for the tables). Nothing is allocated except the CUDA tables' scratch.
// Thread-safety: calls share no state; concurrent calls are safe when their outputs do not overlap.
// Errors: kKernelInvalidArgument for a bad spec, a null pointer, a page id outside [0, num_pages), or
// (scatter) one page named twice, checked before any byte moves; kKernelNoCuda from a ...Cuda call in
// a build without CUDA or on a machine without a usable device (arguments are checked first); a
// cudaError_t number from a failed CUDA call (message: cudaGetErrorString).
// A CUDA call returns once the work is queued on the stream; errors raised while the kernel runs
// surface at the next synchronizing call on that stream, as with any CUDA launch.
#ifndef KVTIER_KERNELS_GATHER_SCATTER_H_
#define KVTIER_KERNELS_GATHER_SCATTER_H_

#include <cstdint>

#include "kvtier/kernels/block_shape.h"
#include "kvtier/kernels/cuda_launch_options.h"
#include "kvtier/kernels/kernel_status.h"

namespace kvtier::kernels {

enum class EngineLayout : int32_t { kKvFirst = 0, kPageFirst = 1, kMla = 2 };

// Describes one engine's paged cache (per layer) and the blocks kvtier packs it into.
struct PagedCacheSpec {
  BlockShape block;  // kind must be kMla exactly when layout is kMla
  EngineLayout layout = EngineLayout::kKvFirst;
  int32_t num_pages = 0;      // pages per layer in the engine cache; > 0
  int32_t page_size = 0;      // tokens per page; > 0 and divides block.block_tokens
  int32_t element_bytes = 2;  // bytes per element: 1 (fp8), 2 (fp16/bf16) or 4 (fp32)

  // OK when block is valid, layout matches block.kind, page_size divides block_tokens, element_bytes
  // is 1, 2 or 4, and one layer's cache is at most 2^46 bytes. Errors: kKernelInvalidArgument naming
  // the first bad field.
  KernelStatus Validate() const;
  // Engine pages per kvtier block: block.block_tokens / page_size.
  int32_t PagesPerBlock() const { return block.block_tokens / page_size; }
  // Bytes of one page of K, of V, or of the latent (page_size * TokenElements() * element_bytes);
  // the unit the kernels copy.
  int64_t PageBytes() const { return static_cast<int64_t>(page_size) * block.TokenElements() * element_bytes; }
  // Bytes of one layer's engine tensor (num_pages * NumKv() * PageBytes()).
  int64_t LayerBytes() const { return static_cast<int64_t>(num_pages) * block.NumKv() * PageBytes(); }
  // Bytes of one kvtier block (block.NumElements() * element_bytes).
  int64_t BlockBytes() const { return block.NumElements() * element_bytes; }
};

// Copies blocks out of the engine cache. For b in [0, num_blocks): fills blocks[b] (BlockBytes()
// bytes) from the pages block_table[b * PagesPerBlock() .. (b + 1) * PagesPerBlock() - 1] of every
// layer. Pages may repeat and appear in any order. layer_caches has block.num_layers entries, each
// LayerBytes() long; block_table has num_blocks * PagesPerBlock() entries; blocks has num_blocks
// entries. Output blocks must not overlap each other or the cache. num_blocks == 0 does nothing.
// GatherCpu: host memory throughout. Always available.
KernelStatus GatherCpu(const PagedCacheSpec& spec, const void* const* layer_caches, const int32_t* block_table,
                       int32_t num_blocks, void* const* blocks);
// GatherCuda: caches and blocks are device memory or mapped pinned host memory (anything the kernel
// can address through unified addressing, e.g. gathering straight into a pinned host tier); the
// tables are host or device memory as options.tables_on_device says. One launch for all blocks,
// layers and pages; 16-byte loads and stores wherever the pointers and PageBytes() allow.
KernelStatus GatherCuda(const PagedCacheSpec& spec, const void* const* layer_caches, const int32_t* block_table,
                        int32_t num_blocks, void* const* blocks, const CudaLaunchOptions& options = {});

// The inverse of Gather: writes each block's tokens into the engine pages the block table names.
// Every page id must appear at most once in the whole table (two blocks writing one page would race);
// pages not named are left untouched. Same shapes and memory rules as the matching Gather.
KernelStatus ScatterCpu(const PagedCacheSpec& spec, const void* const* blocks, const int32_t* block_table,
                        int32_t num_blocks, void* const* layer_caches);
// With options.tables_on_device the duplicate-page check is the caller's job.
KernelStatus ScatterCuda(const PagedCacheSpec& spec, const void* const* blocks, const int32_t* block_table,
                         int32_t num_blocks, void* const* layer_caches, const CudaLaunchOptions& options = {});

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_GATHER_SCATTER_H_
