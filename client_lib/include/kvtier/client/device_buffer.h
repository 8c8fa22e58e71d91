// DeviceBuffer: one KV block's bytes in GPU memory, as Client::GetIntoDevice and DeviceTransfer take it.
// No CUDA type appears here: the pointer is a plain device address.
#ifndef KVTIER_CLIENT_DEVICE_BUFFER_H_
#define KVTIER_CLIENT_DEVICE_BUFFER_H_

#include <cstdint>

namespace kvtier::client {

// One block's device memory. Non-owning: the caller allocates it (cudaMalloc or managed memory) and keeps
// it alive until the copies enqueued on the call's stream have run.
struct DeviceBuffer {
  int32_t device = 0;       // CUDA device ordinal that holds `ptr`
  void* ptr = nullptr;      // device address of the block's first byte
  uint64_t size_bytes = 0;  // must equal ns.layout.ShardBytes() of the call
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_DEVICE_BUFFER_H_
