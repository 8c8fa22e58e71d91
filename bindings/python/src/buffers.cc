#include "buffers.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier::python {
namespace {

bool HostAddressable(int32_t device_type) {
  switch (device_type) {
    case dlpack::kCpu:
    case dlpack::kCudaHost:
    case dlpack::kRocmHost:
    case dlpack::kCudaManaged:
      return true;
    default:
      return false;
  }
}

std::string DeviceName(int32_t device_type) {
  switch (device_type) {
    case dlpack::kCuda:
      return "CUDA";
    case dlpack::kRocm:
      return "ROCm";
    default:
      return absl::StrCat("DLPack device type ", device_type);
  }
}

[[noreturn]] void ThrowDeviceMemory(const std::string& what, int32_t device_type) {
  throw py::value_error(absl::StrCat(what, ": is in ", DeviceName(device_type),
                                     " memory; kvtier get/put take host memory (CPU, pinned or managed). "
                                     "Copy it to a (pinned) CPU buffer first"));
}

// Calls `obj.__dlpack__()` after checking __dlpack_device__; returns the capsule.
py::object DlpackCapsule(py::handle obj, const std::string& what) {
  if (py::hasattr(obj, "__dlpack_device__")) {
    py::tuple dev = obj.attr("__dlpack_device__")();
    const auto device_type = dev[0].cast<int32_t>();
    if (!HostAddressable(device_type)) ThrowDeviceMemory(what, device_type);
  }
  return obj.attr("__dlpack__")();
}

}  // namespace

BorrowedBuffer BorrowedBuffer::Acquire(py::handle obj, bool writable, const std::string& what) {
  BorrowedBuffer b;
  if (PyObject_CheckBuffer(obj.ptr())) {
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    auto view = std::make_unique<Py_buffer>();
    if (PyObject_GetBuffer(obj.ptr(), view.get(), flags) != 0) {
      py::error_already_set e;
      throw py::buffer_error(
          absl::StrCat(what, ": ", e.what(),
                       writable ? " (get needs writable, C-contiguous memory)" : " (put needs C-contiguous memory)"));
    }
    b.view_ = std::move(view);
    b.data_ = static_cast<std::byte*>(b.view_->buf);
    b.size_bytes_ = static_cast<uint64_t>(b.view_->len);
    return b;
  }

  py::object capsule;
  if (PyCapsule_CheckExact(obj.ptr())) {
    capsule = py::reinterpret_borrow<py::object>(obj);
  } else if (py::hasattr(obj, "__dlpack__")) {
    capsule = DlpackCapsule(obj, what);
  } else {
    throw py::type_error(absl::StrCat(what, ": ", std::string(py::str(py::type::handle_of(obj).attr("__name__"))),
                                      " supports neither the buffer protocol nor DLPack (__dlpack__)"));
  }
  if (!PyCapsule_IsValid(capsule.ptr(), dlpack::kCapsuleName)) {
    throw py::value_error(absl::StrCat(what, ": not an unused \"dltensor\" DLPack capsule"));
  }
  auto* managed = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), dlpack::kCapsuleName));
  if (managed == nullptr) throw py::error_already_set();
  // Take ownership as the protocol says: rename, and call the deleter when done.
  if (PyCapsule_SetName(capsule.ptr(), dlpack::kUsedCapsuleName) != 0) throw py::error_already_set();
  b.managed_ = managed;  // from here on the destructor releases it, whatever is thrown below

  const dlpack::Tensor& t = managed->dl_tensor;
  if (!HostAddressable(t.device.device_type)) ThrowDeviceMemory(what, t.device.device_type);
  if (t.dtype.bits % 8 != 0 || t.dtype.lanes == 0) {
    throw py::value_error(absl::StrCat(what, ": DLPack dtype of ", int{t.dtype.bits}, " bits x ", t.dtype.lanes,
                                       " lanes is not whole bytes"));
  }
  const uint64_t item_bytes = uint64_t{t.dtype.bits} / 8 * t.dtype.lanes;
  uint64_t elements = 1;
  for (int32_t d = 0; d < t.ndim; ++d) elements *= static_cast<uint64_t>(t.shape[d]);
  if (t.strides != nullptr && elements > 0) {
    int64_t expected = 1;  // compact row-major strides, ignoring dimensions of extent 1
    for (int32_t d = t.ndim - 1; d >= 0; --d) {
      if (t.shape[d] != 1 && t.strides[d] != expected) {
        throw py::buffer_error(absl::StrCat(what, ": DLPack tensor is not C-contiguous (dimension ", d, " has stride ",
                                            t.strides[d], ", want ", expected,
                                            "); pass a contiguous tensor (.contiguous())"));
      }
      expected *= t.shape[d];
    }
  }
  b.data_ = static_cast<std::byte*>(t.data) + t.byte_offset;
  b.size_bytes_ = elements * item_bytes;
  return b;
}

BorrowedBuffer::BorrowedBuffer(BorrowedBuffer&& other) noexcept
    : data_(other.data_),
      size_bytes_(other.size_bytes_),
      view_(std::move(other.view_)),
      managed_(std::exchange(other.managed_, nullptr)) {}

BorrowedBuffer::~BorrowedBuffer() {
  if (view_ != nullptr) PyBuffer_Release(view_.get());
  if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
}

BlockBuffers AcquireBlocks(py::handle buffers, size_t n, uint64_t block_bytes, bool writable) {
  BlockBuffers out;
  out.blocks.reserve(n);
  if (py::isinstance<py::list>(buffers) || py::isinstance<py::tuple>(buffers)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(buffers);
    if (seq.size() != n) {
      throw py::value_error(absl::StrCat("buffers: ", seq.size(), " buffers for ", n, " fingerprints"));
    }
    out.borrowed.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const std::string what = absl::StrCat("buffers[", i, "]");
      BorrowedBuffer b = BorrowedBuffer::Acquire(seq[i], writable, what);
      if (b.size_bytes() != block_bytes) {
        throw py::value_error(absl::StrCat(what, ": is ", b.size_bytes(), " bytes, want ", block_bytes,
                                           " (the namespace's block_bytes)"));
      }
      out.blocks.emplace_back(b.data(), block_bytes);
      out.borrowed.push_back(std::move(b));
    }
    return out;
  }
  BorrowedBuffer b = BorrowedBuffer::Acquire(buffers, writable, "buffers");
  uint64_t want_bytes;  // a product that wrapped could equal a small buffer's size
  if (__builtin_mul_overflow(uint64_t{n}, block_bytes, &want_bytes)) {
    throw py::value_error(absl::StrCat("buffers: ", n, " blocks x ", block_bytes, " bytes is over 2^64 bytes"));
  }
  if (b.size_bytes() != want_bytes) {
    throw py::value_error(absl::StrCat("buffers: is ", b.size_bytes(), " bytes, want ", n, " blocks x ", block_bytes,
                                       " bytes = ", want_bytes,
                                       " (pass one [n, ...] array for all blocks, or a list of n buffers)"));
  }
  for (size_t i = 0; i < n; ++i) out.blocks.emplace_back(b.data() + i * block_bytes, block_bytes);
  out.borrowed.push_back(std::move(b));
  return out;
}

}  // namespace kvtier::python
