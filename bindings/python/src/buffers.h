// Borrowing caller memory from Python objects for one call: the buffer protocol (numpy, bytearray,
// memoryview, bytes) and DLPack (objects with __dlpack__, such as CPU torch tensors, or raw capsules).
#ifndef KVTIER_BINDINGS_PYTHON_BUFFERS_H_
#define KVTIER_BINDINGS_PYTHON_BUFFERS_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dlpack_abi.h"

namespace kvtier::python {

namespace py = pybind11;

// The contiguous host memory of one Python object, pinned for as long as this value lives.
// Acquire and destroy it with the GIL held; data() may be used without the GIL in between.
// Move-only.
class BorrowedBuffer {
 public:
  // Borrows `obj`'s bytes. Accepted, in this order:
  //  - the buffer protocol, C-contiguous (and writable when `writable`): numpy arrays, bytearray,
  //    memoryview, bytes (read-only);
  //  - DLPack: an object with __dlpack__ (checked first with __dlpack_device__) or a "dltensor"
  //    capsule, on host-addressable memory (CPU, pinned, managed), compact row-major.
  // `what` names the argument in error messages ("buffers[3]").
  // Throws py::buffer_error (not contiguous, read-only), py::value_error (device memory, odd dtype),
  // py::type_error (neither protocol).
  static BorrowedBuffer Acquire(py::handle obj, bool writable, const std::string& what);

  BorrowedBuffer(BorrowedBuffer&& other) noexcept;
  BorrowedBuffer& operator=(BorrowedBuffer&&) = delete;
  BorrowedBuffer(const BorrowedBuffer&) = delete;
  BorrowedBuffer& operator=(const BorrowedBuffer&) = delete;
  ~BorrowedBuffer();

  std::byte* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }

 private:
  BorrowedBuffer() = default;

  std::byte* data_ = nullptr;
  uint64_t size_bytes_ = 0;
  std::unique_ptr<Py_buffer> view_;           // held buffer-protocol view; heap-allocated because some
                                              // exporters point view.shape into the struct itself
  dlpack::ManagedTensor* managed_ = nullptr;  // owned (deleter called) when set
};

// The memory of `n` blocks of `block_bytes` each, taken from either
//  - a list or tuple of n objects, each exactly block_bytes long, or
//  - one object of exactly n * block_bytes bytes (e.g. a numpy array of shape [n, ...]), split evenly.
// Throws py::value_error on a size or count mismatch, naming the offending element and both sizes.
struct BlockBuffers {
  std::vector<BorrowedBuffer> borrowed;
  std::vector<std::span<std::byte>> blocks;  // n entries, in block order
};
BlockBuffers AcquireBlocks(py::handle buffers, size_t n, uint64_t block_bytes, bool writable);

}  // namespace kvtier::python

#endif  // KVTIER_BINDINGS_PYTHON_BUFFERS_H_
