// The disk tier of BlockStore: recovery and reopen, the probe, spills through the disk writer
// thread, and disk reads with the store's lock released.
#include "kvtier/server/block_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "committed_index.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/log.h"
#include "kvtier/common/status_macros.h"
#include "memory_tier.h"
#include "storage/disk_tier.h"
#include "tenant_ledger.h"

namespace kvtier::server {

DiskTierStatus BlockStore::disk_status() const {
  DiskTierStatus st;
  if (disk_ == nullptr) return st;
  st.state = DiskTierStateName(disk_->state());
  st.reason = disk_->reason();
  st.volume_bytes = disk_->volume_bytes();
  st.free_bytes = disk_->free_bytes();
  st.min_free_bytes = disk_->min_free_bytes();
  st.database_bytes = disk_->database_bytes();
  const DiskErrorCounters& e = disk_->errors();
  st.open_errors = e.open.load(std::memory_order_relaxed);
  st.write_errors = e.write.load(std::memory_order_relaxed);
  st.read_errors = e.read.load(std::memory_order_relaxed);
  st.delete_errors = e.remove.load(std::memory_order_relaxed);
  st.scan_errors = e.scan.load(std::memory_order_relaxed);
  st.background_errors = e.background.load(std::memory_order_relaxed);
  st.recreated = e.recreated.load(std::memory_order_relaxed);
  return st;
}

uint64_t BlockStore::DiskBudget() const {
  // Blob files keep a deleted block's bytes until garbage collection rewrites them, and compactions
  // write their output before they delete their input: the files may take twice the logical bytes.
  const uint64_t limit = disk_->budget_limit();
  return limit > 0 ? std::min(options_.disk_capacity_bytes, limit) : options_.disk_capacity_bytes;
}

void BlockStore::ProbeDisk() {
  if (disk_ == nullptr) return;
  // The probe (statvfs, a flush, a resume or reopen) runs without the store's lock.
  disk_->NoteLogicalBytes(stats_.disk_bytes.load(std::memory_order_relaxed));  // 0 included: all garbage
  const bool reopened = disk_->Probe();
  std::lock_guard lock(mu_);
  // The volume may have been resized: the budget follows it.
  if (const uint64_t budget = DiskBudget(); budget != disk_capacity_.load(std::memory_order_relaxed)) {
    KVTIER_LOG(warn, "disk tier at {}: the disk budget in force is now {} bytes (was {}; the volume is {} bytes)",
               options_.disk_path, budget, disk_capacity_.load(std::memory_order_relaxed), disk_->volume_bytes());
    disk_capacity_.store(budget, std::memory_order_relaxed);
    MakeDiskRoomLocked(0);
  }
  if (reopened) ReconcileDiskLocked();
}

void BlockStore::ReconcileDiskLocked() {
  std::vector<std::pair<BlockKey, DiskBlockMeta>> found;
  if (!disk_->ForEach([&](const BlockKey& k, const DiskBlockMeta& m) { found.push_back({k, m}); }).ok()) return;
  uint64_t added = 0, stale = 0, lost = 0;
  // Blocks the index has on disk that the database no longer holds (it was started empty) are gone.
  absl::flat_hash_set<BlockKey> on_disk;
  on_disk.reserve(found.size());
  for (const auto& [key, meta] : found) on_disk.insert(key);
  std::vector<EntryHandle> gone;
  for (const auto& [key, h] : index_) {
    if (entries_[h].tier == Tier::kDisk && entries_[h].state == State::kCommitted && entries_[h].lease_count == 0 &&
        entries_[h].in_transit == nullptr && !on_disk.contains(key)) {
      gone.push_back(h);
    }
  }
  for (const EntryHandle h : gone) {
    EraseEntryLocked(h);  // its disk delete finds nothing: a tombstone
    ++lost;
  }
  for (const auto& [key, meta] : found) {
    if (auto it = index_.find(key); it != index_.end()) {
      if (entries_[it->second].tier != Tier::kDisk) {
        EnqueueDiskDeleteLocked(key);  // a copy left while the tier could not delete; the block is in memory
        ++stale;
      }
      continue;
    }
    const EntryHandle h = IndexDiskRecordLocked(key, meta);
    if (sink_ != nullptr) sink_->OnStored(EventInfoOf(entries_[h]));
    ++added;
  }
  MakeDiskRoomLocked(0);
  KVTIER_LOG(info, "disk tier at {} reopened: {} blocks on it, {} indexed again, {} stale copies deleted, {} lost",
             options_.disk_path, found.size(), added, stale, lost);
}

EntryHandle BlockStore::IndexDiskRecordLocked(const BlockKey& key, const DiskBlockMeta& meta) {
  const EntryHandle h = NewEntryLocked();
  Entry& e = entries_[h];
  e.key = key;
  e.namespace_id = meta.namespace_id;
  e.tenant_id = meta.tenant_id;
  e.size_bytes = meta.size_bytes;
  e.checksum = meta.checksum;
  e.depth = meta.depth;
  e.access_count = meta.access_count;
  e.block_meta = meta.block_meta;
  e.state = State::kCommitted;
  e.tier = Tier::kDisk;
  e.inserted_ns = e.last_access_ns = absl::ToUnixNanos(clock_->Now());
  index_.emplace(key, h);
  committed_->Insert(key, e.namespace_id, e.tenant_id);
  tenants_->AddStored(e.tenant_id, e.size_bytes);
  disk_policy_->OnInsert(h, AccessOf(e));
  stats_.disk_blocks.fetch_add(1, std::memory_order_relaxed);
  stats_.disk_bytes.fetch_add(meta.size_bytes, std::memory_order_relaxed);
  return h;
}

absl::Status BlockStore::RecoverDiskLocked() {
  std::vector<std::pair<BlockKey, DiskBlockMeta>> found;
  uint64_t bad = 0;
  KVTIER_RETURN_IF_ERROR(disk_->ForEach(
      [&](const BlockKey& k, const DiskBlockMeta& m) {
        found.push_back({k, m});
      },
      &bad));
  stats_.disk_errors.fetch_add(bad, std::memory_order_relaxed);
  // Deeper blocks first, so that the shallow ones (the most shared) end up most recent.
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.second.depth > b.second.depth; });
  for (const auto& [key, meta] : found) {
    if (index_.contains(key)) continue;
    IndexDiskRecordLocked(key, meta);
    stats_.recovered_blocks.fetch_add(1, std::memory_order_relaxed);
  }
  // A smaller budget than last time: drop down to it.
  MakeDiskRoomLocked(0);
  return absl::OkStatus();
}

void BlockStore::CountDiskDelete(const absl::Status& s) {
  // FailedPrecondition: the tier cannot write now; the record stays and is deleted at its reconcile.
  if (!s.ok() && !absl::IsFailedPrecondition(s) && !absl::IsNotFound(s)) {
    stats_.disk_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

bool BlockStore::MakeDiskRoomLocked(uint64_t bytes) {
  while (stats_.disk_bytes.load(std::memory_order_relaxed) + bytes > disk_capacity_) {
    auto victim = disk_policy_->PickVictim([&](EntryHandle h) { return entries_[h].lease_count == 0; });
    if (!victim.has_value()) return false;
    DropLocked(*victim);
    stats_.disk_evictions.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

DiskBlockMeta BlockStore::DiskMetaOf(const Entry& e) {
  return DiskBlockMeta{.namespace_id = e.namespace_id,
                       .tenant_id = e.tenant_id,
                       .size_bytes = e.size_bytes,
                       .checksum = e.checksum,
                       .depth = e.depth,
                       .access_count = e.access_count,
                       .block_meta = e.block_meta};
}

uint64_t BlockStore::SpillBufferBound() const {
  return options_.spill_buffer_bytes > 0
             ? options_.spill_buffer_bytes
             : std::max({options_.capacity_bytes / 8, uint64_t{64} << 20, host_->allocator().max_block_bytes()});
}

void BlockStore::DropLocked(EntryHandle h) {
  const Entry& e = entries_[h];
  if (options_.disk_admit_min_requests > 1 && e.state == State::kCommitted) {
    const uint64_t requests = uint64_t{e.access_count} + e.earlier_requests;
    request_history_.Remember(KeyHashOf(e.key), static_cast<uint32_t>(std::min<uint64_t>(requests, UINT32_MAX)),
                              2 * index_.size());
  }
  EraseEntryLocked(h);
}

void BlockStore::DemoteOrDropLocked(EntryHandle h) {
  Entry& e = entries_[h];
  if (disk_ == nullptr) {
    EraseEntryLocked(h);
    return;
  }
  // Requested too few times to be worth a disk write (disk_admit_min_requests).
  if (uint64_t{e.access_count} + e.earlier_requests < options_.disk_admit_min_requests) {
    stats_.disk_admission_refused.fetch_add(1, std::memory_order_relaxed);
    DropLocked(h);
    return;
  }
  // A full or failing disk (as last seen: the writer's Put checks the volume's room): the block is
  // dropped, as without a disk tier (the tier logs why).
  if (disk_->state() != DiskTierState::kOk) {
    stats_.disk_spill_refused.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                     "disk tier at {} is {} ({}): host evictions drop blocks instead of spilling them",
                     options_.disk_path, DiskTierStateName(disk_->state()), disk_->reason());
    DropLocked(h);
    return;
  }
  // The disk writer is behind: the puts outrun the disk, which could not keep this block anyway.
  if (spill_bytes_ + e.size_bytes > SpillBufferBound()) {
    stats_.disk_spill_dropped_busy.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                     "disk tier at {}: {} bytes wait for the disk writer (disk_tier.spill_buffer_bytes); host "
                     "evictions drop blocks until it catches up",
                     options_.disk_path, spill_bytes_);
    DropLocked(h);
    return;
  }
  if (e.size_bytes > disk_capacity_ || !MakeDiskRoomLocked(e.size_bytes)) {
    DropLocked(h);
    return;
  }
  auto copy = std::make_shared<std::vector<std::byte>>(e.size_bytes);
  std::memcpy(copy->data(), host_->allocator().Data(e.slot), e.size_bytes);
  // The checksum is verified whenever a block moves between tiers, so memory corruption never reaches disk.
  if (BlockChecksum(copy->data(), copy->size()) != e.checksum) {
    stats_.checksum_failures.fetch_add(1, std::memory_order_relaxed);
    EraseEntryLocked(h);
    return;
  }
  host_->Erase(h);
  host_->Free(e.slot);
  e.slot = SlotRef{};
  SetTierLocked(h, Tier::kDisk);
  if (sink_ != nullptr) sink_->OnMoved(EventInfoOf(e), Tier::kHost);
  disk_policy_->OnInsert(h, AccessOf(e));
  stats_.disk_blocks.fetch_add(1, std::memory_order_relaxed);
  stats_.disk_bytes.fetch_add(e.size_bytes, std::memory_order_relaxed);
  stats_.demotions.fetch_add(1, std::memory_order_relaxed);
  e.in_transit = copy;
  spill_bytes_ += e.size_bytes;
  stats_.disk_spill_queue_bytes.store(spill_bytes_, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> q(disk_queue_mu_);
    disk_queue_.push_back(
        DiskOp{.key = e.key, .bytes = std::move(copy), .meta = std::make_shared<DiskBlockMeta>(DiskMetaOf(e))});
  }
  disk_queue_cv_.notify_one();
}

void BlockStore::EnqueueDiskDeleteLocked(const BlockKey& key) {
  {
    std::lock_guard<std::mutex> q(disk_queue_mu_);
    disk_queue_.push_back(DiskOp{.key = key});
  }
  disk_queue_cv_.notify_one();
}

void BlockStore::DiskWriterLoop() {
  for (;;) {
    DiskOp op;
    {
      std::unique_lock<std::mutex> q(disk_queue_mu_);
      disk_queue_cv_.wait(q, [&] { return disk_writer_stop_ || !disk_queue_.empty(); });
      if (disk_queue_.empty()) return;  // stopping, and everything queued has run
      op = std::move(disk_queue_.front());
      disk_queue_.pop_front();
      disk_writer_busy_ = true;
    }
    if (op.bytes != nullptr) {
      RunDiskWrite(op);
    } else {
      CountDiskDelete(disk_->Delete(op.key));
    }
    op = DiskOp{};  // the copy is freed before anyone is told the queue is empty
    std::lock_guard<std::mutex> q(disk_queue_mu_);
    disk_writer_busy_ = false;
    if (disk_queue_.empty()) disk_idle_cv_.notify_all();
  }
}

void BlockStore::RunDiskWrite(const DiskOp& op) {
  const uint64_t size = op.bytes->size();
  auto done = [&] {  // needs mu_
    spill_bytes_ -= std::min(spill_bytes_, size);
    stats_.disk_spill_queue_bytes.store(spill_bytes_, std::memory_order_relaxed);
    spill_done_cv_.notify_all();
  };
  {
    std::lock_guard lock(mu_);
    auto it = index_.find(op.key);
    if (it == index_.end() || entries_[it->second].in_transit != op.bytes) {
      done();  // dropped or moved back up meanwhile: nothing to write
      return;
    }
  }
  disk_->NoteLogicalBytes(stats_.disk_bytes.load(std::memory_order_relaxed));
  const absl::Status put = disk_->Put(op.key, *op.meta, *op.bytes);
  std::lock_guard lock(mu_);
  done();
  auto it = index_.find(op.key);
  // Dropped or moved up while it was written: its delete is queued behind this write.
  if (it == index_.end() || entries_[it->second].in_transit != op.bytes) return;
  const EntryHandle h = it->second;
  entries_[h].in_transit.reset();  // on disk now: reads go there
  if (put.ok()) return;
  (absl::IsFailedPrecondition(put) ? stats_.disk_spill_refused : stats_.disk_errors)
      .fetch_add(1, std::memory_order_relaxed);
  // Not on disk: dropped (a leased one goes when its read finds nothing, never served).
  if (entries_[h].lease_count == 0) EraseEntryLocked(h);
}

void BlockStore::WaitForDiskWrites() {
  if (disk_ == nullptr) return;
  std::unique_lock<std::mutex> q(disk_queue_mu_);
  disk_idle_cv_.wait(q, [&] { return disk_queue_.empty() && !disk_writer_busy_; });
}

uint64_t BlockStore::LeaseBufferBoundLocked() const {
  return options_.lease_buffer_bytes > 0
             ? options_.lease_buffer_bytes
             : std::max({options_.capacity_bytes / 8, uint64_t{64} << 20, host_->allocator().max_block_bytes()});
}

void BlockStore::SwitchDiskToHostLocked(EntryHandle h, SlotRef slot) {
  Entry& e = entries_[h];
  // Exclusive tiers: the block leaves the disk as it enters host memory.
  disk_policy_->OnErase(h);
  EnqueueDiskDeleteLocked(e.key);
  e.in_transit.reset();  // a write still queued is skipped
  stats_.disk_blocks.fetch_sub(1, std::memory_order_relaxed);
  stats_.disk_bytes.fetch_sub(e.size_bytes, std::memory_order_relaxed);
  e.slot = slot;
  SetTierLocked(h, Tier::kHost);
  if (sink_ != nullptr) sink_->OnMoved(EventInfoOf(e), Tier::kDisk);
  host_->Insert(h, AccessOf(e));  // the slot's bytes were counted when it was allocated
  stats_.promotions.fetch_add(1, std::memory_order_relaxed);
}

void BlockStore::LoadDiskBlocks(std::unique_lock<TimedMutex>& lock, std::vector<EntryHandle>& leased,
                                std::vector<std::shared_ptr<const std::vector<std::byte>>>* owned,
                                uint64_t* owned_bytes, uint32_t* refused_buffer) {
  struct Read {
    size_t index = 0;
    EntryHandle h = kNoEntry;
    BlockKey key;
    DiskBlockMeta meta;
    std::optional<SlotRef> slot;                     // read into this host slot (the block moves up)
    std::shared_ptr<std::vector<std::byte>> buffer;  // else into this buffer of the lease's own
    std::byte* dst = nullptr;
    absl::Status status;
  };
  std::vector<Read> reads;
  const uint64_t buffer_bound = LeaseBufferBoundLocked();
  auto take_buffer = [&](uint64_t bytes) {
    if (owned == nullptr || lease_buffer_used_ + bytes > buffer_bound) return false;
    lease_buffer_used_ += bytes;
    return true;
  };
  auto leave_out = [&](size_t i, bool for_buffer) {
    const EntryHandle h = leased[i];
    leased[i] = kNoEntry;
    UnpinEntryLocked(h);
    if (for_buffer && refused_buffer != nullptr) ++*refused_buffer;
  };
  for (size_t i = 0; i < leased.size(); ++i) {
    const EntryHandle h = leased[i];
    if (h == kNoEntry || entries_[h].tier != Tier::kDisk) continue;
    const uint64_t size = entries_[h].size_bytes;
    // A leased block moves up only within its tenant's pinned bound; past it, it is served from a buffer
    // of the lease's own and stays on disk, where its lease pins no host slot.
    std::optional<SlotRef> slot;
    if (options_.promote_on_hit && MayPinInHostLocked(entries_[h], /*adds_bytes=*/true)) {
      slot = host_->AllocateEvicting(size, [this](uint64_t bytes) { return EvictOneLocked(bytes); });
    }
    Entry& e = entries_[h];
    if (e.in_transit != nullptr) {  // not written yet: its bytes are here, verified when they were copied
      if (slot.has_value()) {
        std::byte* dst = host_->allocator().Data(*slot);
        std::memcpy(dst, e.in_transit->data(), size);
        if (BlockChecksum(dst, size) == e.checksum) {
          SwitchDiskToHostLocked(h, *slot);
          continue;
        }
        host_->Free(*slot);
        stats_.checksum_failures.fetch_add(1, std::memory_order_relaxed);
        leave_out(i, false);
        continue;
      }
      if (!take_buffer(size)) {
        leave_out(i, owned != nullptr);
        continue;
      }
      (*owned)[i] = e.in_transit;
      *owned_bytes += size;
      continue;
    }
    Read r{.index = i, .h = h, .key = e.key, .meta = DiskMetaOf(e), .slot = slot};
    if (slot.has_value()) {
      r.dst = host_->allocator().Data(*slot);
    } else {
      if (!take_buffer(size)) {
        leave_out(i, owned != nullptr);
        continue;
      }
      r.buffer = std::make_shared<std::vector<std::byte>>(size);
      r.dst = r.buffer->data();
    }
    reads.push_back(std::move(r));
  }
  if (reads.empty()) {
    stats_.lease_buffer_bytes.store(lease_buffer_used_, std::memory_order_relaxed);
    return;
  }
  // The entries are pinned (never evicted), their slots and buffers are this call's: read unlocked.
  lock.unlock();
  for (Read& r : reads) r.status = disk_->Get(r.key, r.meta, std::span<std::byte>(r.dst, r.meta.size_bytes));
  stats_.disk_reads.fetch_add(reads.size(), std::memory_order_relaxed);
  lock.lock();
  for (Read& r : reads) {
    const uint64_t size = r.meta.size_bytes;
    // Another reader may have moved it up meanwhile: then it is served from host memory.
    const bool on_disk = entries_[r.h].tier == Tier::kDisk;
    if (r.status.ok() && on_disk) {
      if (r.slot.has_value()) {
        SwitchDiskToHostLocked(r.h, *r.slot);
      } else {
        (*owned)[r.index] = std::move(r.buffer);
        *owned_bytes += size;
      }
      continue;
    }
    if (r.slot.has_value()) host_->Free(*r.slot);
    if (r.buffer != nullptr) lease_buffer_used_ -= std::min(lease_buffer_used_, size);
    if (!on_disk) continue;
    if (r.status.code() == absl::StatusCode::kDataLoss) {
      stats_.disk_checksum_failures.fetch_add(1, std::memory_order_relaxed);
    } else if (!absl::IsUnavailable(r.status)) {  // Unavailable: the tier is off, the block is a miss
      stats_.disk_errors.fetch_add(1, std::memory_order_relaxed);
    }
    leased[r.index] = kNoEntry;
    if (UnpinEntryLocked(r.h) == 0) EraseEntryLocked(r.h);  // bad or unreadable: never served
  }
  stats_.lease_buffer_bytes.store(lease_buffer_used_, std::memory_order_relaxed);
}

}  // namespace kvtier::server
