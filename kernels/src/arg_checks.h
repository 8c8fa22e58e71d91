// Argument checks shared by the CPU references and the CUDA host wrappers, so both reject exactly the
// same inputs with the same messages. Private to kvtier_kernels.
#ifndef KVTIER_KERNELS_SRC_ARG_CHECKS_H_
#define KVTIER_KERNELS_SRC_ARG_CHECKS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "kvtier/kernels/gather_scatter.h"
#include "kvtier/kernels/kernel_status.h"
#include "kvtier/kernels/quantize.h"

namespace kvtier::kernels::internal {

inline KernelStatus InvalidArgument(std::string message) {
  return KernelStatus{kKernelInvalidArgument, std::move(message)};
}

// The spec, num_blocks >= 0, and (when num_blocks > 0) non-null arrays. When `check_entries`, also
// every entry: non-null pointers, page ids in [0, num_pages), and, when `unique_pages`, no page twice.
KernelStatus CheckPagedCopy(const PagedCacheSpec& spec, const void* const* layer_caches, const int32_t* block_table,
                            int32_t num_blocks, const void* const* blocks, bool check_entries, bool unique_pages);

// The spec, num_blocks >= 0, non-null arrays and (when `check_entries`) non-null entries.
KernelStatus CheckQuant(const QuantSpec& spec, const void* const* in_blocks, int32_t num_blocks,
                        const void* const* out_blocks, bool check_entries);

}  // namespace kvtier::kernels::internal

#endif  // KVTIER_KERNELS_SRC_ARG_CHECKS_H_
