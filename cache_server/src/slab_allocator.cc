#include "kvtier/server/slab_allocator.h"

#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvtier::server {

absl::StatusOr<std::unique_ptr<SlabAllocator>> SlabAllocator::Create(const SlabAllocatorOptions& options) {
  if (options.capacity_bytes == 0) return absl::InvalidArgumentError("capacity_bytes: must be > 0");
  if (options.slab_bytes == 0) return absl::InvalidArgumentError("slab_bytes: must be > 0");
  const uint64_t a = options.slot_alignment_bytes;
  if (a == 0 || (a & (a - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("slot_alignment_bytes: must be a power of two, got ", a));
  }
  if (options.capacity_bytes > kMaxCapacityBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity_bytes: ", options.capacity_bytes, " is above the 128 TiB a process can map"));
  }
  const uint64_t num_slabs =
      options.capacity_bytes / options.slab_bytes + (options.capacity_bytes % options.slab_bytes != 0 ? 1 : 0);
  if (num_slabs > kMaxSlabs) {
    return absl::InvalidArgumentError(absl::StrCat("slab_bytes: ", options.slab_bytes, " cuts capacity_bytes (",
                                                   options.capacity_bytes, ") into ", num_slabs, " slabs; at most ",
                                                   kMaxSlabs));
  }
  // Reserve address space only: pages are touched (and counted as resident) as blocks are written.
  void* p = nullptr;
  if (options.map_region) {
    // Aligned to 2 MiB and marked for transparent huge pages, so that a transport that pins the pages it
    // copies (cma's process_vm_readv, an RDMA registration) walks one page per 2 MiB instead of 512.
    // Where THP is off the advice is ignored.
    constexpr uint64_t kHuge = 2ULL << 20;
    const uint64_t reserved = options.capacity_bytes + kHuge;
    void* raw = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("mmap of ", options.capacity_bytes, " bytes failed"));
    }
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kHuge - 1) & ~(kHuge - 1);
    if (aligned > start) munmap(raw, aligned - start);
    const uintptr_t end = aligned + options.capacity_bytes;
    if (start + reserved > end) munmap(reinterpret_cast<void*>(end), start + reserved - end);
    p = reinterpret_cast<void*>(aligned);
    (void)madvise(p, options.capacity_bytes, MADV_HUGEPAGE);
  }
  auto alloc = std::unique_ptr<SlabAllocator>(new SlabAllocator());
  alloc->base_ = static_cast<std::byte*>(p);
  alloc->capacity_bytes_ = options.capacity_bytes;
  alloc->slab_bytes_ = options.slab_bytes;
  alloc->alignment_ = a;
  alloc->max_block_bytes_ = LargestBlockBytes(options);
  alloc->slabs_.resize(num_slabs);
  for (uint64_t i = 0; i < num_slabs; ++i) {
    Slab& s = alloc->slabs_[i];
    s.offset = i * options.slab_bytes;
    s.length = std::min(options.slab_bytes, options.capacity_bytes - s.offset);
  }
  // A stack: the short last slab at the bottom, so full-length slabs are handed out first.
  for (uint64_t i = num_slabs; i-- > 0;) alloc->free_slabs_.push_back(static_cast<uint32_t>(i));
  return alloc;
}

SlabAllocator::~SlabAllocator() {
  if (base_ != nullptr) munmap(base_, capacity_bytes_);
}

uint64_t SlabAllocator::LargestBlockBytes(const SlabAllocatorOptions& options) {
  const uint64_t a = options.slot_alignment_bytes;
  if (a == 0 || (a & (a - 1)) != 0) return 0;
  return std::min(options.slab_bytes, options.capacity_bytes) & ~(a - 1);
}

uint64_t SlabAllocator::SlotBytes(uint64_t block_bytes) const {
  return (block_bytes + alignment_ - 1) & ~(alignment_ - 1);
}

std::optional<SlotRef> SlabAllocator::Allocate(uint64_t block_bytes) {
  if (block_bytes == 0 || block_bytes > max_block_bytes_) return std::nullopt;
  const uint64_t slot_bytes = SlotBytes(block_bytes);
  SizeClass& cls = classes_[slot_bytes];
  while (!cls.partial.empty()) {
    const uint32_t id = cls.partial.back();
    Slab& s = slabs_[id];
    if (s.slot_bytes != slot_bytes || s.free_slots.empty() || s.evacuating) {  // stale, full or emptying
      cls.partial.pop_back();
      if (s.evacuating && s.slot_bytes == slot_bytes) s.in_partial_list = false;
      continue;
    }
    const uint32_t index = s.free_slots.back();
    s.free_slots.pop_back();
    ++s.used;
    if (s.free_slots.empty()) {
      cls.partial.pop_back();
      s.in_partial_list = false;
    }
    used_bytes_ += slot_bytes;
    return SlotRef{id, index};
  }
  // Take a free slab long enough for at least one slot. Short slabs that cannot hold one stay free.
  for (size_t k = free_slabs_.size(); k-- > 0;) {
    const uint32_t id = free_slabs_[k];
    Slab& s = slabs_[id];
    if (s.length < slot_bytes) continue;
    free_slabs_.erase(free_slabs_.begin() + static_cast<std::ptrdiff_t>(k));
    s.slot_bytes = slot_bytes;
    s.num_slots = static_cast<uint32_t>(s.length / slot_bytes);
    s.used = 1;
    s.free_slots.clear();
    s.free_slots.reserve(s.num_slots);
    for (uint32_t i = s.num_slots; i-- > 1;) s.free_slots.push_back(i);  // slot 0 is handed out now
    if (!s.free_slots.empty()) {
      cls.partial.push_back(id);
      s.in_partial_list = true;
    }
    used_bytes_ += slot_bytes;
    return SlotRef{id, 0};
  }
  return std::nullopt;
}

void SlabAllocator::Free(SlotRef slot) {
  Slab& s = slabs_[slot.slab];
  used_bytes_ -= s.slot_bytes;
  --s.used;
  if (s.used == 0) {
    // The whole slab returns to the pool; its class may reuse it or another class may take it.
    s.slot_bytes = 0;
    s.num_slots = 0;
    s.free_slots.clear();
    s.free_slots.shrink_to_fit();
    s.in_partial_list = false;  // any entry left in a partial list is stale and skipped
    s.evacuating = false;
    free_slabs_.push_back(slot.slab);
    return;
  }
  s.free_slots.push_back(slot.index);
  if (!s.in_partial_list && !s.evacuating) {
    classes_[s.slot_bytes].partial.push_back(slot.slab);
    s.in_partial_list = true;
  }
}

std::byte* SlabAllocator::Data(SlotRef slot) const { return base_ + Offset(slot); }

uint64_t SlabAllocator::Offset(SlotRef slot) const {
  const Slab& s = slabs_[slot.slab];
  return s.offset + static_cast<uint64_t>(slot.index) * s.slot_bytes;
}

std::vector<uint64_t> SlabAllocator::SlotClasses() const {
  std::vector<uint64_t> out;
  for (const Slab& s : slabs_) {
    if (s.slot_bytes != 0 && std::find(out.begin(), out.end(), s.slot_bytes) == out.end()) out.push_back(s.slot_bytes);
  }
  return out;
}

std::optional<uint32_t> SlabAllocator::EvacuationCandidate(uint64_t slot_bytes) const {
  std::optional<uint32_t> best;
  uint64_t free_total = 0;
  for (uint32_t id = 0; id < slabs_.size(); ++id) {
    const Slab& s = slabs_[id];
    if (s.slot_bytes != slot_bytes || s.evacuating) continue;
    free_total += s.free_slots.size();
    if (!best || s.used < slabs_[*best].used) best = id;
  }
  if (!best) return std::nullopt;
  const Slab& b = slabs_[*best];
  if (free_total - b.free_slots.size() < b.used) return std::nullopt;  // the others cannot take its blocks
  return best;
}

void SlabAllocator::SetEvacuating(uint32_t slab, bool evacuating) {
  Slab& s = slabs_[slab];
  if (s.slot_bytes == 0) return;  // already back in the pool
  s.evacuating = evacuating;
  if (!evacuating && !s.free_slots.empty() && !s.in_partial_list) {
    classes_[s.slot_bytes].partial.push_back(slab);
    s.in_partial_list = true;
  }
}

uint64_t SlabAllocator::SlotBytesOf(SlotRef slot) const { return slabs_[slot.slab].slot_bytes; }

bool SlabAllocator::IsLastInSlab(SlotRef slot) const { return slabs_[slot.slab].used == 1; }

}  // namespace kvtier::server
