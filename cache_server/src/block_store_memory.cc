// The memory tiers of BlockStore: host evictions, moves between host memory and HBM, tenant quota
// room, and defragmentation of the host tier.
#include "kvtier/server/block_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/log.h"
#include "kvtier/common/status_macros.h"
#include "memory_tier.h"
#include "storage/disk_tier.h"
#include "tenant_ledger.h"

namespace kvtier::server {

bool BlockStore::ReadHbmLocked(const Entry& e, std::vector<std::byte>* out) {
  out->resize(e.size_bytes);
  if (!hbm_memory_->CopyOut(hbm_->allocator().Offset(e.slot), *out).ok()) {
    stats_.hbm_errors.fetch_add(1, std::memory_order_relaxed);
    out->clear();
    return false;
  }
  if (BlockChecksum(out->data(), out->size()) != e.checksum) {
    stats_.checksum_failures.fetch_add(1, std::memory_order_relaxed);
    out->clear();
    return false;
  }
  return true;
}

bool BlockStore::EvictOneHbmLocked(uint64_t slot_bytes) {
  auto victim = hbm_->PickVictimFor(
      slot_bytes, [&](EntryHandle h) { return entries_[h].lease_count == 0; },
      [&](EntryHandle h) { return entries_[h].slot; });
  if (!victim.has_value()) return false;
  DemoteFromHbmLocked(*victim);
  return true;
}

bool BlockStore::PromoteToHbmLocked(EntryHandle h) {
  Entry& e = entries_[h];
  if (e.size_bytes > hbm_->allocator().max_block_bytes()) return false;  // could never fit: evict nothing
  std::optional<SlotRef> slot =
      hbm_->AllocateEvicting(e.size_bytes, [this](uint64_t bytes) { return EvictOneHbmLocked(bytes); });
  if (!slot.has_value()) return false;
  const std::span<const std::byte> bytes(host_->allocator().Data(e.slot), e.size_bytes);
  // Verified before the move (host memory) and again whenever the block is read back from HBM.
  if (BlockChecksum(bytes.data(), bytes.size()) != e.checksum) {
    stats_.checksum_failures.fetch_add(1, std::memory_order_relaxed);
    hbm_->Free(*slot);
    return false;
  }
  if (!hbm_memory_->CopyIn(hbm_->allocator().Offset(*slot), bytes).ok()) {
    stats_.hbm_errors.fetch_add(1, std::memory_order_relaxed);
    hbm_->Free(*slot);
    return false;
  }
  SwitchMemoryTierLocked(h, *slot);
  stats_.hbm_promotions.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void BlockStore::DemoteFromHbmLocked(EntryHandle h) {
  Entry& e = entries_[h];
  std::optional<SlotRef> slot =
      host_->AllocateEvicting(e.size_bytes, [this](uint64_t bytes) { return EvictOneLocked(bytes); });
  if (!slot.has_value()) {
    EraseEntryLocked(h);
    return;
  }
  const std::span<std::byte> dst(host_->allocator().Data(*slot), e.size_bytes);
  const bool copied = hbm_memory_->CopyOut(hbm_->allocator().Offset(e.slot), dst).ok();
  if (!copied || BlockChecksum(dst.data(), dst.size()) != e.checksum) {
    (copied ? stats_.checksum_failures : stats_.hbm_errors).fetch_add(1, std::memory_order_relaxed);
    host_->Free(*slot);
    EraseEntryLocked(h);
    return;
  }
  SwitchMemoryTierLocked(h, *slot);
  stats_.hbm_demotions.fetch_add(1, std::memory_order_relaxed);
}

void BlockStore::SwitchMemoryTierLocked(EntryHandle h, SlotRef slot) {
  Entry& e = entries_[h];
  const Tier from = e.tier;
  MemoryTier& old_tier = from == Tier::kHbm ? *hbm_ : *host_;
  MemoryTier& new_tier = from == Tier::kHbm ? *host_ : *hbm_;
  old_tier.Erase(h);
  old_tier.Free(e.slot);
  e.slot = slot;  // allocated (and counted) by new_tier
  SetTierLocked(h, from == Tier::kHbm ? Tier::kHost : Tier::kHbm);
  if (sink_ != nullptr) sink_->OnMoved(EventInfoOf(e), from);
  new_tier.Insert(h, AccessOf(e));
}

bool BlockStore::EvictOneLocked(uint64_t slot_bytes) {
  // Prefer a victim of the same slot size (its slot is reused directly), or one whose eviction empties
  // its slab, which then serves any size class.
  auto victim = host_->PickVictimFor(
      slot_bytes, [&](EntryHandle h) { return entries_[h].lease_count == 0; },
      [&](EntryHandle h) { return entries_[h].slot; });
  if (victim.has_value()) {
    DemoteOrDropLocked(*victim);
    stats_.evictions.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // The size mix changed: empty the slab of the best unleased victim of another class, if nothing in
  // that slab is leased or being written. A scan of the index, so only on this rare path.
  std::vector<uint32_t> refused_slabs;
  for (int attempt = 0; attempt < 8; ++attempt) {
    auto other = host_->policy().PickVictim([&](EntryHandle h) {
      const Entry& e = entries_[h];
      return e.lease_count == 0 &&
             std::find(refused_slabs.begin(), refused_slabs.end(), e.slot.slab) == refused_slabs.end();
    });
    if (!other.has_value()) return false;
    const uint32_t slab = entries_[*other].slot.slab;
    std::vector<EntryHandle> in_slab;
    bool movable = true;
    for (const auto& [key, h] : index_) {
      const Entry& e = entries_[h];
      if (e.tier != Tier::kHost || e.slot.slab != slab) continue;
      if (e.state != State::kCommitted || e.lease_count > 0) {
        movable = false;
        break;
      }
      in_slab.push_back(h);
    }
    if (!movable) {
      refused_slabs.push_back(slab);
      continue;
    }
    for (EntryHandle h : in_slab) DemoteOrDropLocked(h);
    stats_.evictions.fetch_add(in_slab.size(), std::memory_order_relaxed);
    stats_.slab_moves.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  return false;
}

std::pair<uint64_t, uint64_t> BlockStore::Defragment() {
  uint64_t moved = 0, freed = 0;
  std::lock_guard lock(mu_);
  SlabAllocator& allocator = host_->allocator();
  for (const uint64_t slot_bytes : allocator.SlotClasses()) {
    const std::optional<uint32_t> slab = allocator.EvacuationCandidate(slot_bytes);
    if (!slab.has_value()) continue;
    std::vector<EntryHandle> in_slab;
    bool movable = true;
    for (EntryHandle h = 0; h < entries_.size() && movable; ++h) {
      const Entry& e = entries_[h];
      if (e.state == State::kFree || e.tier != Tier::kHost || e.slot.slab != *slab) continue;
      movable = e.state == State::kCommitted && e.lease_count == 0;
      in_slab.push_back(h);
    }
    if (!movable) continue;
    allocator.SetEvacuating(*slab, true);
    for (EntryHandle h : in_slab) {
      Entry& e = entries_[h];
      std::optional<SlotRef> to = host_->Allocate(e.size_bytes);
      if (!to.has_value()) break;  // cannot happen: the candidate's blocks fit; leave the rest in place
      std::memcpy(allocator.Data(*to), allocator.Data(e.slot), e.size_bytes);
      if (BlockChecksum(allocator.Data(*to), e.size_bytes) != e.checksum) {
        host_->Free(*to);
        stats_.checksum_failures.fetch_add(1, std::memory_order_relaxed);
        EraseEntryLocked(h);  // corrupt in memory: dropped, never served
        continue;
      }
      host_->Free(e.slot);
      e.slot = *to;
      ++moved;
    }
    allocator.SetEvacuating(*slab, false);
    if (allocator.IsFreeSlab(*slab)) {
      ++freed;
      stats_.slab_moves.fetch_add(1, std::memory_order_relaxed);
    }
  }
  stats_.defrag_moved_blocks.fetch_add(moved, std::memory_order_relaxed);
  return {moved, freed};
}

bool BlockStore::MakeQuotaRoomLocked(uint64_t tenant_id, uint64_t quota_bytes, uint64_t bytes) {
  if (bytes > quota_bytes) return false;
  auto used = [&] { return tenants_->Stored(tenant_id); };
  auto own_unleased = [&](EntryHandle h) {
    const Entry& e = entries_[h];
    return e.tenant_id == tenant_id && e.state == State::kCommitted && e.lease_count == 0;
  };
  // Dropped, not demoted: a block on disk still counts against the quota.
  EvictionPolicy* tiers[] = {disk_policy_.get(), &host_->policy(), hbm_ != nullptr ? &hbm_->policy() : nullptr};
  for (EvictionPolicy* policy : tiers) {
    while (policy != nullptr && used() + bytes > quota_bytes) {
      auto victim = policy->PickVictim(own_unleased);
      if (!victim.has_value()) break;
      EraseEntryLocked(*victim);
      stats_.quota_evictions.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return used() + bytes <= quota_bytes;
}

}  // namespace kvtier::server
