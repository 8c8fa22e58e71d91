// The few DLPack ABI types the module consumes (DLPack 0.x "dltensor" capsules, the form numpy and
// PyTorch return from __dlpack__() when no max_version is asked for). Declared here rather than taken
// from a dlpack package because Debian 12 ships none; the layout is DLPack's stable C ABI.
#ifndef KVTIER_BINDINGS_PYTHON_DLPACK_ABI_H_
#define KVTIER_BINDINGS_PYTHON_DLPACK_ABI_H_

#include <cstdint>

namespace kvtier::python::dlpack {

// DLDeviceType values the module distinguishes.
enum DeviceType : int32_t {
  kCpu = 1,
  kCuda = 2,
  kCudaHost = 3,  // pinned host memory: host-addressable
  kRocm = 10,
  kRocmHost = 11,     // pinned host memory: host-addressable
  kCudaManaged = 13,  // unified memory: host-addressable
};

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; nullptr means compact row-major
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

// Capsule names of the protocol: a consumer renames the capsule it takes to kUsedCapsuleName and then
// owns the tensor (it must call deleter).
inline constexpr const char* kCapsuleName = "dltensor";
inline constexpr const char* kUsedCapsuleName = "used_dltensor";

}  // namespace kvtier::python::dlpack

#endif  // KVTIER_BINDINGS_PYTHON_DLPACK_ABI_H_
