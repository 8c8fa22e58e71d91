// Fixed-size slots carved from large slabs of one pre-reserved memory region (the host tier).
#ifndef KVTIER_SERVER_SLAB_ALLOCATOR_H_
#define KVTIER_SERVER_SLAB_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace kvtier::server {

// The default slot alignment: a cache line. Every tier's allocator uses it.
inline constexpr uint64_t kSlotAlignmentBytes = 64;

struct SlabAllocatorOptions {
  uint64_t capacity_bytes = 1ULL << 30;  // Default: 1 GiB. Total bytes of the region; > 0.
  uint64_t slab_bytes = 64ULL << 20;     // Default: 64 MiB. Unit handed to a size class; > 0.
  // Slot sizes are block sizes rounded up to this many bytes (a power of two). Default: 64 (a cache line).
  uint64_t slot_alignment_bytes = kSlotAlignmentBytes;
  // True: the allocator maps its own host region and Data() points into it. False: it only hands out
  // offsets (Offset()) into a region someone else owns, e.g. device memory for the HBM tier; Data()
  // and Region() must not be used then.
  bool map_region = true;
};

// Where a block lives: slab number and slot number within that slab's size class.
struct SlotRef {
  uint32_t slab = 0;
  uint32_t index = 0;
  friend bool operator==(const SlotRef&, const SlotRef&) = default;
};

// Carves one region of `capacity_bytes` (mmap'ed once, touched lazily) into slabs of `slab_bytes`; the
// last slab may be shorter. A slab belongs to one size class (slot size) while any of its slots is in
// use and returns to the free pool when its last slot is freed. No allocation per block.
// Capacity: slots never extend past the region, so used_bytes() <= capacity_bytes() always.
// Thread-safety: none; the caller (BlockStore) serialises access. Data() pointers stay valid for the
// allocator's lifetime; what they hold is the caller's business.
class SlabAllocator {
 public:
  static constexpr uint64_t kMaxCapacityBytes = 1ULL << 47;  // 128 TiB: the x86-64 user address space
  static constexpr uint64_t kMaxSlabs = 1ULL << 20;          // slab records (about 100 bytes each) at most

  // Errors: InvalidArgument (zero sizes, capacity_bytes above kMaxCapacityBytes, more than kMaxSlabs
  // slabs, alignment not a power of two), ResourceExhausted (mmap failed).
  static absl::StatusOr<std::unique_ptr<SlabAllocator>> Create(const SlabAllocatorOptions& options);
  ~SlabAllocator();
  SlabAllocator(const SlabAllocator&) = delete;
  SlabAllocator& operator=(const SlabAllocator&) = delete;

  // The largest block an allocator of these options can ever hold: its slot (the block rounded up to
  // slot_alignment_bytes) must fit in the longest slab, min(slab_bytes, capacity_bytes). 0 when not even
  // one aligned slot fits. Pure; for checking a configuration before anything is mapped.
  static uint64_t LargestBlockBytes(const SlabAllocatorOptions& options);

  // The slot size used for blocks of `block_bytes` (rounded up to the slot alignment).
  uint64_t SlotBytes(uint64_t block_bytes) const;
  // LargestBlockBytes() of this allocator's options: Allocate of anything larger always fails.
  uint64_t max_block_bytes() const { return max_block_bytes_; }
  // A free slot of SlotBytes(block_bytes), or nullopt when no slab of that class has a free slot and no
  // free slab (of enough length) remains, and at once when block_bytes is 0 or above max_block_bytes()
  // (it could not fit even an empty allocator).
  std::optional<SlotRef> Allocate(uint64_t block_bytes);
  // Returns `slot` (from Allocate, not yet freed) to its slab.
  void Free(SlotRef slot);
  // Start of `slot`'s bytes (SlotBytes() of its class long). Only with map_region.
  std::byte* Data(SlotRef slot) const;
  // Offset of `slot`'s first byte from the start of the region.
  uint64_t Offset(SlotRef slot) const;
  // Slot bytes of the class that `slot` belongs to.
  uint64_t SlotBytesOf(SlotRef slot) const;
  // True when freeing `slot` would return its whole slab to the free pool (it is the slab's last used slot).
  bool IsLastInSlab(SlotRef slot) const;

  // Defragmentation. The slot sizes that own at least one slab now.
  std::vector<uint64_t> SlotClasses() const;
  // The slab of class `slot_bytes` with the fewest used slots, when the other slabs of that class have
  // enough free slots to take all of them (so moving its blocks frees it); else nullopt.
  std::optional<uint32_t> EvacuationCandidate(uint64_t slot_bytes) const;
  // While set, Allocate never hands out a slot of `slab`; its last Free still returns it to the pool.
  void SetEvacuating(uint32_t slab, bool evacuating);
  bool IsFreeSlab(uint32_t slab) const { return slabs_[slab].slot_bytes == 0; }

  // The whole region (capacity_bytes() long); fixed for the allocator's lifetime.
  std::span<std::byte> Region() const { return {base_, capacity_bytes_}; }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t slab_bytes() const { return slab_bytes_; }
  uint64_t used_bytes() const { return used_bytes_; }  // slot bytes of allocated slots
  uint32_t num_slabs() const { return static_cast<uint32_t>(slabs_.size()); }
  uint32_t free_slabs() const { return static_cast<uint32_t>(free_slabs_.size()); }

 private:
  struct Slab {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t slot_bytes = 0;  // 0 while free
    uint32_t num_slots = 0;
    uint32_t used = 0;
    std::vector<uint32_t> free_slots;  // stack
    bool in_partial_list = false;
    bool evacuating = false;  // no new allocations; its blocks are being moved out
  };
  struct SizeClass {
    std::vector<uint32_t> partial;  // slabs with free slots (may hold stale entries; checked on pop)
  };
  SlabAllocator() = default;

  std::byte* base_ = nullptr;
  uint64_t capacity_bytes_ = 0;
  uint64_t slab_bytes_ = 0;
  uint64_t alignment_ = 64;
  uint64_t max_block_bytes_ = 0;
  uint64_t used_bytes_ = 0;
  std::vector<Slab> slabs_;
  std::vector<uint32_t> free_slabs_;  // stack; full-length slabs first to be taken, the short last slab last
  absl::flat_hash_map<uint64_t, SizeClass> classes_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SLAB_ALLOCATOR_H_
