// How a ...Cuda kernel entry point is launched. Keeps CUDA types out of public headers: a stream travels
// as void*. A plain value type; copy freely.
#ifndef KVTIER_KERNELS_CUDA_LAUNCH_OPTIONS_H_
#define KVTIER_KERNELS_CUDA_LAUNCH_OPTIONS_H_

namespace kvtier::kernels {

struct CudaLaunchOptions {
  // A cudaStream_t cast to void*. Default: nullptr, the legacy default stream. The kernel runs on the
  // calling thread's current device (cudaSetDevice), which must own the stream.
  void* stream = nullptr;
  // Where the call's tables live: its pointer arrays (layer caches, blocks) and its block table.
  // false (default): host memory. The call copies them to a scratch device buffer on `stream`
  //   (cudaMallocAsync, or cudaMalloc plus a stream synchronize where memory pools are unsupported),
  //   and checks every entry first (page ids in range, no null pointers); the host arrays may be
  //   reused as soon as the call returns. A copy from pageable memory may wait for the stream.
  // true: device memory, read by the kernel as it runs; nothing is copied or checked on the host, so
  //   the call never synchronizes and can be captured in a CUDA graph. The arrays must stay valid and
  //   unchanged until the kernel has finished. An out-of-range page id or a null pointer found by the
  //   kernel skips that piece of work silently (nothing out of bounds is touched), so callers in this
  //   mode must validate their own tables.
  bool tables_on_device = false;
};

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_CUDA_LAUNCH_OPTIONS_H_
