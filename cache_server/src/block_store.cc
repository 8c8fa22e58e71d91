#include "kvtier/server/block_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/log.h"
#include "kvtier/common/status_macros.h"
#include "storage/disk_tier.h"

namespace kvtier::server {

absl::Status BlockStoreOptions::Validate() const {
  if (capacity_bytes == 0) return absl::InvalidArgumentError("capacity_bytes: must be > 0");
  if (slab_bytes == 0) return absl::InvalidArgumentError("slab_bytes: must be > 0");
  if (default_lease_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_lease_ttl: must be > 0");
  }
  if (max_lease_ttl < default_lease_ttl) {
    return absl::InvalidArgumentError("max_lease_ttl: must be >= default_lease_ttl");
  }
  if (reservation_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("reservation_ttl: must be > 0");
  }
  if (!(tenant_pinned_share > 0 && tenant_pinned_share <= 1)) {
    return absl::InvalidArgumentError("tenant_pinned_share: must be in (0, 1]");
  }
  if (!disk_path.empty() && disk_capacity_bytes == 0) {
    return absl::InvalidArgumentError("disk_capacity_bytes: must be > 0 when disk_path is set");
  }
  return absl::OkStatus();
}

uint64_t TenantId(const std::string& tenant) { return BlockChecksum(tenant.data(), tenant.size()); }

BlockStore::BlockStore(const BlockStoreOptions& options)
    : options_(options), clock_(options.clock != nullptr ? options.clock : Clock::Real()) {}

BlockStore::~BlockStore() {
  if (!disk_writer_.joinable()) return;
  {
    std::lock_guard<std::mutex> q(disk_queue_mu_);
    disk_writer_stop_ = true;
  }
  disk_queue_cv_.notify_all();
  disk_writer_.join();  // it runs what is queued first, so the disk holds what the index said
}

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kHbm:
      return "hbm";
    case Tier::kHost:
      return "host";
    case Tier::kDisk:
      return "disk";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Create(const BlockStoreOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto store = std::unique_ptr<BlockStore>(new BlockStore(options));
  auto alloc = SlabAllocator::Create({.capacity_bytes = options.capacity_bytes, .slab_bytes = options.slab_bytes});
  if (!alloc.ok()) return alloc.status();
  store->allocator_ = std::move(alloc).value();
  const EvictionPolicyOptions policy_options{.frequency_weight = options.frequency_weight,
                                             .recency_weight = options.recency_weight};
  auto policy = NewEvictionPolicy(options.eviction_policy, policy_options);
  if (!policy.ok()) return policy.status();
  store->policy_ = std::move(policy).value();
  auto disk_policy = NewEvictionPolicy(options.eviction_policy, policy_options);
  if (!disk_policy.ok()) return disk_policy.status();
  store->disk_policy_ = std::move(disk_policy).value();
  if (options.hbm_memory != nullptr) {
    auto hbm_alloc =
        SlabAllocator::Create({.capacity_bytes = options.hbm_memory->size_bytes(),
                               .slab_bytes = std::min(options.slab_bytes, options.hbm_memory->size_bytes()),
                               .map_region = false});
    if (!hbm_alloc.ok()) return hbm_alloc.status();
    store->hbm_allocator_ = std::move(hbm_alloc).value();
    auto hbm_policy = NewEvictionPolicy(options.eviction_policy, policy_options);
    if (!hbm_policy.ok()) return hbm_policy.status();
    store->hbm_policy_ = std::move(hbm_policy).value();
    store->hbm_memory_ = options.hbm_memory;
  }
  if (!options.disk_path.empty()) {
    // Never fails: a volume that is full or broken leaves the tier degraded or off, and ProbeDisk()
    // brings it back.
    store->disk_ = DiskTier::OpenOrDegrade({.path = options.disk_path,
                                            .min_free_bytes = options.disk_min_free_bytes,
                                            .info_log_dir = options.disk_info_log_dir,
                                            .flush_interval = absl::ToChronoMilliseconds(options.disk_flush_interval),
                                            .before_io_for_test = options.disk_before_io_for_test});
    store->disk_capacity_ = store->DiskBudget();
    if (store->disk_capacity_ < options.disk_capacity_bytes) {
      KVTIER_LOG(warn,
                 "disk tier at {}: disk_tier.capacity_bytes {} is more than the volume allows ({} bytes, half of "
                 "its {} bytes less the {} bytes floor); using {}",
                 options.disk_path, options.disk_capacity_bytes, store->disk_capacity_.load(),
                 store->disk_->volume_bytes(), store->disk_->min_free_bytes(), store->disk_capacity_.load());
    }
    if (store->disk_->state() != DiskTierState::kOff) {
      std::lock_guard<std::mutex> lock(store->mu_);
      if (absl::Status s = store->RecoverDiskLocked(); !s.ok()) {
        KVTIER_LOG(err, "disk tier at {}: recovering its blocks failed: {}; serving from memory", options.disk_path,
                   std::string(s.message()));
      }
    }
    store->disk_writer_ = std::thread([s = store.get()] { s->DiskWriterLoop(); });
  }
  return store;
}

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
  std::lock_guard<std::mutex> lock(mu_);
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
  tenant_bytes_[e.tenant_id] += e.size_bytes;
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

uint64_t BlockStore::capacity_bytes() const { return allocator_->capacity_bytes(); }

uint64_t BlockStore::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_->used_bytes();
}

absl::Duration BlockStore::ClampLease(absl::Duration ttl) const {
  if (ttl <= absl::ZeroDuration()) ttl = options_.default_lease_ttl;
  return std::min(ttl, options_.max_lease_ttl);
}

EntryHandle BlockStore::NewEntryLocked() {
  if (!free_entries_.empty()) {
    const EntryHandle h = free_entries_.back();
    free_entries_.pop_back();
    return h;
  }
  entries_.emplace_back();
  return static_cast<EntryHandle>(entries_.size() - 1);
}

void BlockStore::EraseEntryLocked(EntryHandle h) {
  Entry& e = entries_[h];
  if (sink_ != nullptr && !sink_muted_ && e.state == State::kCommitted) sink_->OnRemoved(EventInfoOf(e));
  if (e.tier == Tier::kHbm) {
    hbm_policy_->OnErase(h);
    stats_.hbm_blocks.fetch_sub(1, std::memory_order_relaxed);
    stats_.hbm_bytes.fetch_sub(hbm_allocator_->SlotBytesOf(e.slot), std::memory_order_relaxed);
    hbm_allocator_->Free(e.slot);
  } else if (e.tier == Tier::kHost) {
    if (e.state == State::kCommitted) {
      policy_->OnErase(h);
      stats_.stored_blocks.fetch_sub(1, std::memory_order_relaxed);
    }
    stats_.stored_bytes.fetch_sub(allocator_->SlotBytesOf(e.slot), std::memory_order_relaxed);
    allocator_->Free(e.slot);
  } else {
    disk_policy_->OnErase(h);
    EnqueueDiskDeleteLocked(e.key);  // behind its write, when that is still queued (the writer then skips it)
    stats_.disk_blocks.fetch_sub(1, std::memory_order_relaxed);
    stats_.disk_bytes.fetch_sub(e.size_bytes, std::memory_order_relaxed);
  }
  if (auto t = tenant_bytes_.find(e.tenant_id); t != tenant_bytes_.end()) {
    t->second -= std::min(t->second, e.size_bytes);
    if (t->second == 0) tenant_bytes_.erase(t);
  }
  index_.erase(e.key);
  e = Entry{};
  free_entries_.push_back(h);
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
    EraseEntryLocked(*victim);
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
             : std::max({options_.capacity_bytes / 8, uint64_t{64} << 20, allocator_->max_block_bytes()});
}

void BlockStore::DemoteOrDropLocked(EntryHandle h) {
  Entry& e = entries_[h];
  if (disk_ == nullptr) {
    EraseEntryLocked(h);
    return;
  }
  // A full or failing disk (as last seen: the writer's Put checks the volume's room): the block is
  // dropped, as without a disk tier (the tier logs why).
  if (disk_->state() != DiskTierState::kOk) {
    stats_.disk_spill_refused.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                     "disk tier at {} is {} ({}): host evictions drop blocks instead of spilling them",
                     options_.disk_path, DiskTierStateName(disk_->state()), disk_->reason());
    EraseEntryLocked(h);
    return;
  }
  // The disk writer is behind: the puts outrun the disk, which could not keep this block anyway.
  if (spill_bytes_ + e.size_bytes > SpillBufferBound()) {
    stats_.disk_spill_dropped_busy.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                     "disk tier at {}: {} bytes wait for the disk writer (disk_tier.spill_buffer_bytes); host "
                     "evictions drop blocks until it catches up",
                     options_.disk_path, spill_bytes_);
    EraseEntryLocked(h);
    return;
  }
  if (e.size_bytes > disk_capacity_ || !MakeDiskRoomLocked(e.size_bytes)) {
    EraseEntryLocked(h);
    return;
  }
  auto copy = std::make_shared<std::vector<std::byte>>(e.size_bytes);
  std::memcpy(copy->data(), allocator_->Data(e.slot), e.size_bytes);
  // The checksum is verified whenever a block moves between tiers, so memory corruption never reaches disk.
  if (BlockChecksum(copy->data(), copy->size()) != e.checksum) {
    stats_.checksum_failures.fetch_add(1, std::memory_order_relaxed);
    EraseEntryLocked(h);
    return;
  }
  policy_->OnErase(h);
  stats_.stored_blocks.fetch_sub(1, std::memory_order_relaxed);
  stats_.stored_bytes.fetch_sub(allocator_->SlotBytesOf(e.slot), std::memory_order_relaxed);
  allocator_->Free(e.slot);
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
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(op.key);
    if (it == index_.end() || entries_[it->second].in_transit != op.bytes) {
      done();  // dropped or moved back up meanwhile: nothing to write
      return;
    }
  }
  disk_->NoteLogicalBytes(stats_.disk_bytes.load(std::memory_order_relaxed));
  const absl::Status put = disk_->Put(op.key, *op.meta, *op.bytes);
  std::lock_guard<std::mutex> lock(mu_);
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
             : std::max({options_.capacity_bytes / 8, uint64_t{64} << 20, allocator_->max_block_bytes()});
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
  policy_->OnInsert(h, AccessOf(e));
  stats_.stored_blocks.fetch_add(1, std::memory_order_relaxed);
  stats_.stored_bytes.fetch_add(allocator_->SlotBytesOf(slot), std::memory_order_relaxed);
  stats_.promotions.fetch_add(1, std::memory_order_relaxed);
}

void BlockStore::LoadDiskBlocks(std::unique_lock<std::mutex>& lock, std::vector<EntryHandle>& leased,
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
      const uint64_t slot_bytes = allocator_->SlotBytes(size);
      slot = allocator_->Allocate(size);
      while (!slot.has_value() && EvictOneLocked(slot_bytes)) slot = allocator_->Allocate(size);
    }
    Entry& e = entries_[h];
    if (e.in_transit != nullptr) {  // not written yet: its bytes are here, verified when they were copied
      if (slot.has_value()) {
        std::byte* dst = allocator_->Data(*slot);
        std::memcpy(dst, e.in_transit->data(), size);
        if (BlockChecksum(dst, size) == e.checksum) {
          SwitchDiskToHostLocked(h, *slot);
          continue;
        }
        allocator_->Free(*slot);
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
      r.dst = allocator_->Data(*slot);
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
    if (r.slot.has_value()) allocator_->Free(*r.slot);
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

bool BlockStore::ReadHbmLocked(const Entry& e, std::vector<std::byte>* out) {
  out->resize(e.size_bytes);
  if (!hbm_memory_->CopyOut(hbm_allocator_->Offset(e.slot), *out).ok()) {
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
  auto victim = hbm_policy_->PickVictim([&](EntryHandle h) {
    const Entry& e = entries_[h];
    if (e.lease_count > 0) return false;
    return hbm_allocator_->SlotBytesOf(e.slot) == slot_bytes || hbm_allocator_->IsLastInSlab(e.slot);
  });
  if (!victim.has_value()) return false;
  DemoteFromHbmLocked(*victim);
  return true;
}

bool BlockStore::PromoteToHbmLocked(EntryHandle h) {
  Entry& e = entries_[h];
  if (e.size_bytes > hbm_allocator_->max_block_bytes()) return false;  // could never fit: evict nothing
  const uint64_t slot_bytes = hbm_allocator_->SlotBytes(e.size_bytes);
  std::optional<SlotRef> slot = hbm_allocator_->Allocate(e.size_bytes);
  while (!slot.has_value() && EvictOneHbmLocked(slot_bytes)) slot = hbm_allocator_->Allocate(e.size_bytes);
  if (!slot.has_value()) return false;
  const std::span<const std::byte> bytes(allocator_->Data(e.slot), e.size_bytes);
  // Verified before the move (host memory) and again whenever the block is read back from HBM.
  if (BlockChecksum(bytes.data(), bytes.size()) != e.checksum) {
    stats_.checksum_failures.fetch_add(1, std::memory_order_relaxed);
    hbm_allocator_->Free(*slot);
    return false;
  }
  if (!hbm_memory_->CopyIn(hbm_allocator_->Offset(*slot), bytes).ok()) {
    stats_.hbm_errors.fetch_add(1, std::memory_order_relaxed);
    hbm_allocator_->Free(*slot);
    return false;
  }
  SwitchMemoryTierLocked(h, *slot);
  stats_.hbm_promotions.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void BlockStore::DemoteFromHbmLocked(EntryHandle h) {
  Entry& e = entries_[h];
  const uint64_t slot_bytes = allocator_->SlotBytes(e.size_bytes);
  std::optional<SlotRef> slot = allocator_->Allocate(e.size_bytes);
  while (!slot.has_value() && EvictOneLocked(slot_bytes)) slot = allocator_->Allocate(e.size_bytes);
  if (!slot.has_value()) {
    EraseEntryLocked(h);
    return;
  }
  const std::span<std::byte> dst(allocator_->Data(*slot), e.size_bytes);
  const bool copied = hbm_memory_->CopyOut(hbm_allocator_->Offset(e.slot), dst).ok();
  if (!copied || BlockChecksum(dst.data(), dst.size()) != e.checksum) {
    (copied ? stats_.checksum_failures : stats_.hbm_errors).fetch_add(1, std::memory_order_relaxed);
    allocator_->Free(*slot);
    EraseEntryLocked(h);
    return;
  }
  SwitchMemoryTierLocked(h, *slot);
  stats_.hbm_demotions.fetch_add(1, std::memory_order_relaxed);
}

void BlockStore::SwitchMemoryTierLocked(EntryHandle h, SlotRef slot) {
  struct MemoryTier {
    EvictionPolicy& policy;
    SlabAllocator& allocator;
    std::atomic<uint64_t>& blocks;
    std::atomic<uint64_t>& bytes;
  };
  MemoryTier host{*policy_, *allocator_, stats_.stored_blocks, stats_.stored_bytes};
  MemoryTier hbm{*hbm_policy_, *hbm_allocator_, stats_.hbm_blocks, stats_.hbm_bytes};
  Entry& e = entries_[h];
  const Tier from = e.tier;
  MemoryTier& old_tier = from == Tier::kHbm ? hbm : host;
  MemoryTier& new_tier = from == Tier::kHbm ? host : hbm;
  old_tier.policy.OnErase(h);
  old_tier.blocks.fetch_sub(1, std::memory_order_relaxed);
  old_tier.bytes.fetch_sub(old_tier.allocator.SlotBytesOf(e.slot), std::memory_order_relaxed);
  old_tier.allocator.Free(e.slot);
  e.slot = slot;
  SetTierLocked(h, from == Tier::kHbm ? Tier::kHost : Tier::kHbm);
  if (sink_ != nullptr) sink_->OnMoved(EventInfoOf(e), from);
  new_tier.policy.OnInsert(h, AccessOf(e));
  new_tier.blocks.fetch_add(1, std::memory_order_relaxed);
  new_tier.bytes.fetch_add(new_tier.allocator.SlotBytesOf(slot), std::memory_order_relaxed);
}

bool BlockStore::EvictOneLocked(uint64_t slot_bytes) {
  // Prefer a victim of the same slot size (its slot is reused directly), or one whose eviction empties
  // its slab, which then serves any size class.
  auto victim = policy_->PickVictim([&](EntryHandle h) {
    const Entry& e = entries_[h];
    if (e.lease_count > 0) return false;
    return allocator_->SlotBytesOf(e.slot) == slot_bytes || allocator_->IsLastInSlab(e.slot);
  });
  if (victim.has_value()) {
    DemoteOrDropLocked(*victim);
    stats_.evictions.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // The size mix changed: empty the slab of the best unleased victim of another class, if nothing in
  // that slab is leased or being written. A scan of the index, so only on this rare path.
  std::vector<uint32_t> refused_slabs;
  for (int attempt = 0; attempt < 8; ++attempt) {
    auto other = policy_->PickVictim([&](EntryHandle h) {
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

absl::Status UnknownLeaseError() { return absl::FailedPreconditionError("unknown or expired lease"); }
absl::Status UnknownReservationError() { return absl::FailedPreconditionError("unknown or expired reservation"); }

BlockStore::Lease* BlockStore::FindLeaseLocked(const CapabilityId& id, IdHolder holder) {
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.dead) return nullptr;
  if (holder.has_value() && *holder != it->second.tenant_id) return nullptr;  // answered as unknown
  return &it->second;
}

BlockStore::Reservation* BlockStore::FindReservationLocked(const CapabilityId& id, IdHolder holder) {
  auto it = reservations_.find(id);
  if (it == reservations_.end() || it->second.dead) return nullptr;
  if (holder.has_value() && *holder != it->second.tenant_id) return nullptr;  // answered as unknown
  return &it->second;
}

void BlockStore::EraseReservationLocked(absl::flat_hash_map<CapabilityId, Reservation>::iterator it) {
  reservation_tag_prefixes_.erase(it->first.tag_prefix());
  reservations_.erase(it);
}

CapabilityId BlockStore::NewLeaseLocked(std::vector<EntryHandle> entries, absl::Duration ttl, bool counted) {
  CapabilityId id = CapabilityId::Random();
  while (leases_.contains(id)) id = CapabilityId::Random();  // 2^-128 per live lease: never in practice
  uint64_t tenant_id = 0;
  for (EntryHandle h : entries) {
    if (h != kNoEntry) {
      tenant_id = entries_[h].tenant_id;  // one namespace per lease, so one tenant
      break;
    }
  }
  if (!counted) {
    for (EntryHandle h : entries) {
      if (h != kNoEntry) PinEntryLocked(h);
    }
  }
  const absl::Time expiry = clock_->Now() + ttl;
  leases_.emplace(id, Lease{.entries = std::move(entries), .expiry = expiry, .tenant_id = tenant_id});
  lease_deadlines_.emplace(expiry, id);
  stats_.active_leases.fetch_add(1, std::memory_order_relaxed);
  return id;
}

void BlockStore::EndLeaseLocked(const CapabilityId& lease_id, Lease& lease) {
  if (lease.pins > 0) {  // a copy is in flight: the last unpin ends it
    lease.dead = true;
    return;
  }
  for (EntryHandle h : lease.entries) {
    if (h != kNoEntry) UnpinEntryLocked(h);
  }
  lease_buffer_used_ -= std::min(lease_buffer_used_, lease.owned_bytes);
  stats_.lease_buffer_bytes.store(lease_buffer_used_, std::memory_order_relaxed);
  stats_.active_leases.fetch_sub(1, std::memory_order_relaxed);
  leases_.erase(lease_id);
}

void BlockStore::EndReservationLocked(Reservation& r) {
  for (EntryHandle h : r.entries) {
    if (h != kNoEntry && entries_[h].state == State::kReserved) EraseEntryLocked(h);
  }
  stats_.active_reservations.fetch_sub(1, std::memory_order_relaxed);
}

void BlockStore::ExpireLocked(absl::Time now) {
  while (!lease_deadlines_.empty() && lease_deadlines_.top().first <= now) {
    const CapabilityId id = lease_deadlines_.top().second;
    lease_deadlines_.pop();
    auto it = leases_.find(id);
    if (it == leases_.end() || it->second.dead) continue;
    stats_.expired_leases.fetch_add(1, std::memory_order_relaxed);
    EndLeaseLocked(id, it->second);
  }
  while (!reservation_deadlines_.empty() && reservation_deadlines_.top().first <= now) {
    const CapabilityId id = reservation_deadlines_.top().second;
    reservation_deadlines_.pop();
    auto it = reservations_.find(id);
    if (it == reservations_.end() || it->second.dead) continue;
    stats_.expired_reservations.fetch_add(1, std::memory_order_relaxed);
    if (it->second.pins > 0) {
      it->second.dead = true;  // freed when the in-flight write unpins
      continue;
    }
    EndReservationLocked(it->second);
    EraseReservationLocked(it);
  }
}

void BlockStore::ExpireNow() {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(clock_->Now());
}

BlockStore::LookupResult BlockStore::Lookup(const NamespaceRef& ns, std::span<const BlockKey> keys,
                                            absl::Duration lease_ttl) {
  LookupResult result;
  result.present.resize(keys.size(), false);
  std::vector<EntryHandle> leased;
  const bool want_lease = lease_ttl > absl::ZeroDuration();
  uint64_t hits = 0;
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(clock_->Now());
  if (want_lease) leased.assign(keys.size(), kNoEntry);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = index_.find(keys[i]);
    if (it == index_.end()) continue;
    const Entry& e = entries_[it->second];
    if (e.state != State::kCommitted || e.namespace_id != ns.id || e.tenant_id != ns.tenant_id) continue;
    if (want_lease) {
      if (!MayPinLocked(it->second)) {
        ++result.refused_pinned;  // answered absent: the caller recomputes it rather than pin past the bound
        continue;
      }
      leased[i] = it->second;
      PinEntryLocked(it->second);
    }
    result.present[i] = true;
    ++hits;
  }
  stats_.lease_refusals_pinned.fetch_add(result.refused_pinned, std::memory_order_relaxed);
  stats_.lookup_requests.fetch_add(1, std::memory_order_relaxed);
  stats_.lookup_blocks_hit.fetch_add(hits, std::memory_order_relaxed);
  stats_.lookup_blocks_miss.fetch_add(keys.size() - hits, std::memory_order_relaxed);
  if (want_lease && hits > 0) {
    result.lease_ttl = ClampLease(lease_ttl);
    result.lease_id = NewLeaseLocked(std::move(leased), result.lease_ttl, /*counted=*/true);
  }
  return result;
}

BlockStore::BlockInfo BlockStore::InfoOf(const Entry& e) const {
  return BlockInfo{.key = e.key,
                   .namespace_id = e.namespace_id,
                   .tenant_id = e.tenant_id,
                   .tier = e.tier,
                   .size_bytes = e.size_bytes,
                   .checksum = e.checksum,
                   .depth = e.depth,
                   .access_count = e.access_count,
                   .lease_count = e.lease_count,
                   .inserted = absl::FromUnixNanos(e.inserted_ns),
                   .last_access = absl::FromUnixNanos(e.last_access_ns)};
}

bool BlockStore::Matches(const Entry& e, const BlockFilter& f) {
  return e.state == State::kCommitted && (!f.namespace_id || *f.namespace_id == e.namespace_id) &&
         (!f.tenant_id || *f.tenant_id == e.tenant_id) && (!f.tier || *f.tier == e.tier);
}

std::pair<std::vector<BlockStore::BlockInfo>, uint64_t> BlockStore::ListBlocks(const BlockFilter& filter,
                                                                               uint64_t cursor, size_t limit) const {
  std::vector<BlockInfo> out;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t h = cursor;
  for (; h < entries_.size() && out.size() < limit; ++h) {
    if (Matches(entries_[h], filter)) out.push_back(InfoOf(entries_[h]));
  }
  while (h < entries_.size() && !Matches(entries_[h], filter)) ++h;
  return {std::move(out), h < entries_.size() ? h : 0};
}

std::optional<BlockStore::BlockInfo> BlockStore::Inspect(const BlockKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end() || entries_[it->second].state != State::kCommitted) return std::nullopt;
  return InfoOf(entries_[it->second]);
}

std::pair<uint64_t, uint64_t> BlockStore::Evict(const BlockFilter& filter) {
  uint64_t evicted = 0, leased = 0;
  std::lock_guard<std::mutex> lock(mu_);
  // Everything: one AllBlocksCleared (and the leased survivors restated) rather than a removal per block.
  sink_muted_ = !filter.namespace_id && !filter.tenant_id && !filter.tier;
  for (EntryHandle h = 0; h < entries_.size(); ++h) {
    const Entry& e = entries_[h];
    if (!Matches(e, filter)) continue;
    if (e.lease_count > 0) {
      ++leased;
      continue;
    }
    EraseEntryLocked(h);
    ++evicted;
  }
  if (sink_muted_) {
    sink_muted_ = false;
    RestateToSinkLocked();
  }
  return {evicted, leased};
}

bool BlockStore::EvictKey(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  const Entry& e = entries_[it->second];
  if (e.state != State::kCommitted || e.lease_count > 0) return false;
  EraseEntryLocked(it->second);
  return true;
}

BlockStore::VerifyResult BlockStore::Verify(const std::function<void(uint64_t, uint64_t)>& progress) {
  VerifyResult result;
  std::vector<BlockKey> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_) {
      if (e.state == State::kCommitted) keys.push_back(e.key);
    }
  }
  std::vector<std::byte> buffer;
  for (const BlockKey& key : keys) {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end() || entries_[it->second].state != State::kCommitted) continue;  // gone meanwhile
    const EntryHandle h = it->second;
    bool ok = true;
    const Tier tier = entries_[h].tier;
    if (tier == Tier::kHost) {
      ok = BlockChecksum(allocator_->Data(entries_[h].slot), entries_[h].size_bytes) == entries_[h].checksum;
    } else if (tier == Tier::kHbm) {
      ok = ReadHbmLocked(entries_[h], &buffer);
    } else if (const auto& copy = entries_[h].in_transit; copy != nullptr) {
      ok = BlockChecksum(copy->data(), copy->size()) == entries_[h].checksum;  // not on disk yet
    } else {
      // Read without the lock; the pin keeps the block on disk meanwhile.
      const DiskBlockMeta meta = DiskMetaOf(entries_[h]);
      PinEntryLocked(h);
      lock.unlock();
      buffer.resize(meta.size_bytes);
      const absl::Status got = disk_->Get(key, meta, buffer);
      lock.lock();
      UnpinEntryLocked(h);
      if (absl::IsUnavailable(got)) continue;         // the disk tier is off: nothing to check now
      if (entries_[h].tier != Tier::kDisk) continue;  // moved up meanwhile, verified as it moved
      ok = got.ok();
    }
    ++result.checked;
    if (!ok) {
      ++result.corrupt;
      result.corrupt_keys.push_back(key);
      // ReadHbmLocked counted its own failure.
      if (tier != Tier::kHbm) {
        (tier == Tier::kHost ? stats_.checksum_failures : stats_.disk_checksum_failures)
            .fetch_add(1, std::memory_order_relaxed);
      }
      // A leased one is already in a reader's hands; the reader's own checksum check rejects it.
      if (entries_[h].lease_count == 0) EraseEntryLocked(h);
    }
    if (progress && result.checked % 256 == 0) progress(result.checked, keys.size());
  }
  if (progress) progress(result.checked, keys.size());
  return result;
}

std::pair<uint64_t, uint64_t> BlockStore::Defragment() {
  uint64_t moved = 0, freed = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (const uint64_t slot_bytes : allocator_->SlotClasses()) {
    const std::optional<uint32_t> slab = allocator_->EvacuationCandidate(slot_bytes);
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
    allocator_->SetEvacuating(*slab, true);
    for (EntryHandle h : in_slab) {
      Entry& e = entries_[h];
      std::optional<SlotRef> to = allocator_->Allocate(e.size_bytes);
      if (!to.has_value()) break;  // cannot happen: the candidate's blocks fit; leave the rest in place
      std::memcpy(allocator_->Data(*to), allocator_->Data(e.slot), e.size_bytes);
      if (BlockChecksum(allocator_->Data(*to), e.size_bytes) != e.checksum) {
        allocator_->Free(*to);
        stats_.checksum_failures.fetch_add(1, std::memory_order_relaxed);
        EraseEntryLocked(h);  // corrupt in memory: dropped, never served
        continue;
      }
      allocator_->Free(e.slot);
      e.slot = *to;
      ++moved;
    }
    allocator_->SetEvacuating(*slab, false);
    if (allocator_->IsFreeSlab(*slab)) {
      ++freed;
      stats_.slab_moves.fetch_add(1, std::memory_order_relaxed);
    }
  }
  stats_.defrag_moved_blocks.fetch_add(moved, std::memory_order_relaxed);
  return {moved, freed};
}

void BlockStore::SetDraining(bool draining) { draining_.store(draining, std::memory_order_relaxed); }

BlockAccess BlockStore::AccessOf(const Entry& e) const {
  // A stable per-block hash for policies that remember evicted blocks: the fingerprint's ring position
  // mixed with the shard, never 0.
  const uint64_t key_hash = (e.key.fingerprint.RingPosition() ^ (uint64_t{e.key.shard} * 0x9e3779b97f4a7c15ULL)) | 1;
  return BlockAccess{.depth = e.depth,
                     .namespace_id = e.namespace_id,
                     .size_bytes = e.size_bytes,
                     .now_ns = absl::ToUnixNanos(clock_->Now()),
                     .key_hash = key_hash};
}

absl::StatusOr<BlockStore::AllocateResult> BlockStore::Allocate(const NamespaceRef& ns, std::span<const BlockKey> keys,
                                                                std::span<const uint32_t> depths,
                                                                std::span<const BlockMeta> block_meta) {
  if (!depths.empty() && depths.size() != keys.size()) {
    return absl::InvalidArgumentError(absl::StrCat(depths.size(), " depths for ", keys.size(), " keys"));
  }
  if (!block_meta.empty() && block_meta.size() != keys.size()) {
    return absl::InvalidArgumentError(absl::StrCat("block_meta: ", block_meta.size(), " for ", keys.size(), " keys"));
  }
  for (size_t i = 0; i < block_meta.size(); ++i) {
    KVTIER_RETURN_IF_ERROR(ValidateBlockMeta(block_meta[i], absl::StrCat("block_meta[", i, "]")));
  }
  // A block whose slot could not fit even an empty tier is refused before anything is evicted for it.
  if (ns.block_bytes == 0 || ns.block_bytes > allocator_->max_block_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block is ", ns.block_bytes, " bytes; this server accepts 1..", allocator_->max_block_bytes()));
  }
  AllocateResult result;
  result.outcomes.resize(keys.size(), AllocateOutcome::kNoSpace);
  result.ttl = options_.reservation_ttl;
  const uint64_t slot_bytes = allocator_->SlotBytes(ns.block_bytes);
  std::unique_lock<std::mutex> lock(mu_);
  if (disk_ != nullptr && spill_bytes_ > 0 && allocator_->capacity_bytes() - allocator_->used_bytes() < keys.size() * slot_bytes) {
    // The blocks this put evicts will spill: when the disk writer is behind, wait a little for it
    // (the lock released) rather than drop them. Past kSpillWait they are dropped
    // (disk_spill_dropped_busy).
    const uint64_t bound = SpillBufferBound();
    const uint64_t want = std::min<uint64_t>(keys.size() * ns.block_bytes, bound / 2);
    spill_done_cv_.wait_for(lock, kSpillWait, [&] { return spill_bytes_ + want <= bound; });
  }
  const absl::Time now = clock_->Now();
  ExpireLocked(now);
  Reservation r;
  r.entries.assign(keys.size(), kNoEntry);
  r.written.assign(keys.size(), 0);
  r.receiving.assign(keys.size(), 0);
  r.received_checksum.assign(keys.size(), std::nullopt);
  bool any = false;
  uint64_t rejected = 0;
  // A fresh id whose UCX tag prefix no live reservation has (about 2^-39 per live reservation to redraw).
  CapabilityId reservation_id = CapabilityId::Random();
  while (reservations_.contains(reservation_id) || reservation_tag_prefixes_.contains(reservation_id.tag_prefix())) {
    reservation_id = CapabilityId::Random();
  }
  r.tenant_id = ns.tenant_id;
  const auto quota = options_.tenant_quota_bytes.find(ns.tenant_id);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = index_.find(keys[i]);
    if (it != index_.end()) {
      Entry& e = entries_[it->second];
      if (e.state == State::kCommitted && e.namespace_id == ns.id && e.tenant_id == ns.tenant_id) {
        result.outcomes[i] = AllocateOutcome::kAlreadyPresent;
        ++e.access_count;
        e.last_access_ns = absl::ToUnixNanos(now);
        PolicyOf(e).OnAccess(it->second, AccessOf(e));
        stats_.already_present.fetch_add(1, std::memory_order_relaxed);
      } else {
        // Reserved by another writer, or (a fingerprint collision across namespaces, which SHA-256 makes
        // practically impossible) held by another namespace: either way not ours to write.
        result.outcomes[i] = AllocateOutcome::kInProgress;
      }
      continue;
    }
    if (draining_.load(std::memory_order_relaxed)) {
      ++rejected;
      continue;  // kNoSpace: a draining server takes no new blocks
    }
    if (quota != options_.tenant_quota_bytes.end() &&
        !MakeQuotaRoomLocked(ns.tenant_id, quota->second, ns.block_bytes)) {
      stats_.rejections_quota.fetch_add(1, std::memory_order_relaxed);
      continue;  // kNoSpace: the tenant is at its quota and has nothing left to drop
    }
    std::optional<SlotRef> slot = allocator_->Allocate(ns.block_bytes);
    while (!slot.has_value() && EvictOneLocked(slot_bytes)) slot = allocator_->Allocate(ns.block_bytes);
    if (!slot.has_value()) {
      ++rejected;
      // Nothing evictable: from now on, for max_lease_ttl, every other tenant's leases are bounded, so
      // that leases cannot keep this tenant out (BoundAppliesLocked).
      refused_tenant_ = ns.tenant_id;
      refused_until_ = now + options_.max_lease_ttl;
      continue;  // kNoSpace
    }
    const EntryHandle h = NewEntryLocked();
    Entry& e = entries_[h];
    e.key = keys[i];
    e.namespace_id = ns.id;
    e.tenant_id = ns.tenant_id;
    e.size_bytes = ns.block_bytes;
    e.slot = *slot;
    e.state = State::kReserved;
    e.reservation_id = reservation_id;
    e.depth = depths.empty() ? 0 : depths[i];
    if (!block_meta.empty() && !block_meta[i].empty()) e.block_meta = std::make_shared<const BlockMeta>(block_meta[i]);
    index_.emplace(keys[i], h);
    tenant_bytes_[ns.tenant_id] += ns.block_bytes;
    stats_.stored_bytes.fetch_add(allocator_->SlotBytesOf(*slot), std::memory_order_relaxed);
    r.entries[i] = h;
    result.outcomes[i] = AllocateOutcome::kAllocated;
    any = true;
  }
  stats_.rejections_no_space.fetch_add(rejected, std::memory_order_relaxed);
  if (any) {
    r.expiry = now + options_.reservation_ttl;
    reservations_.emplace(reservation_id, std::move(r));
    reservation_tag_prefixes_.emplace(reservation_id.tag_prefix(), reservation_id);
    reservation_deadlines_.emplace(now + options_.reservation_ttl, reservation_id);
    stats_.active_reservations.fetch_add(1, std::memory_order_relaxed);
    result.reservation_id = reservation_id;
  }
  return result;
}

absl::Status BlockStore::Write(const CapabilityId& reservation_id, uint32_t index, uint64_t offset,
                               std::span<const std::byte> data, IdHolder holder) {
  std::byte* dst = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ExpireLocked(clock_->Now());
    Reservation* found = FindReservationLocked(reservation_id, holder);
    if (found == nullptr) return UnknownReservationError();
    Reservation& r = *found;
    if (index >= r.entries.size() || r.entries[index] == kNoEntry) {
      return absl::InvalidArgumentError(absl::StrCat("block ", index, " was not allocated in the reservation"));
    }
    const Entry& e = entries_[r.entries[index]];
    if (r.receiving[index] != 0) {
      return absl::FailedPreconditionError(absl::StrCat("block ", index, " is being received by another transfer"));
    }
    if (offset != r.written[index]) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", index, ": chunk at offset ", offset, ", expected ", r.written[index]));
    }
    if (data.size() > e.size_bytes - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", index, ": ", offset + data.size(), " bytes written, block is ", e.size_bytes));
    }
    dst = allocator_->Data(e.slot) + offset;
    r.written[index] += data.size();
    ++r.pins;
  }
  if (!data.empty()) std::memcpy(dst, data.data(), data.size());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(reservation_id);
  Reservation& r = it->second;  // pinned, so still present
  if (--r.pins == 0 && r.dead) {
    EndReservationLocked(r);
    EraseReservationLocked(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CommitOutcome>> BlockStore::Commit(const CapabilityId& reservation_id,
                                                              std::span<const uint64_t> checksums, IdHolder holder) {
  std::vector<std::pair<const std::byte*, uint64_t>> blocks;  // (data, size) of complete blocks
  std::vector<CommitOutcome> outcomes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ExpireLocked(clock_->Now());
    Reservation* found = FindReservationLocked(reservation_id, holder);
    if (found == nullptr) return UnknownReservationError();
    Reservation& r = *found;
    if (checksums.size() != r.entries.size()) {
      return absl::InvalidArgumentError(absl::StrCat(checksums.size(), " checksums for ", r.entries.size(), " keys"));
    }
    if (r.pins > 0) return absl::FailedPreconditionError("writes to the reservation are still in flight");
    outcomes.resize(r.entries.size(), CommitOutcome::kNotAllocated);
    blocks.resize(r.entries.size(), {nullptr, 0});
    for (size_t i = 0; i < r.entries.size(); ++i) {
      if (r.entries[i] == kNoEntry) continue;
      const Entry& e = entries_[r.entries[i]];
      if (r.written[i] != e.size_bytes) {
        outcomes[i] = CommitOutcome::kIncomplete;
        continue;
      }
      if (r.received_checksum[i].has_value()) continue;  // hashed as it landed (FinishReceive)
      blocks[i] = {allocator_->Data(e.slot), e.size_bytes};
    }
    ++r.pins;       // hashing runs unlocked; the pin keeps the slots
    r.dead = true;  // no further writes; expiry leaves it to us
  }
  std::vector<uint64_t> actual(blocks.size(), 0);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].first != nullptr) actual[i] = BlockChecksum(blocks[i].first, blocks[i].second);
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(reservation_id);
  Reservation& r = it->second;
  for (size_t i = 0; i < r.entries.size(); ++i) {
    if (r.received_checksum[i].has_value()) actual[i] = *r.received_checksum[i];
  }
  uint64_t failures = 0;
  for (size_t i = 0; i < r.entries.size(); ++i) {
    const EntryHandle h = r.entries[i];
    if (h == kNoEntry) continue;
    if (outcomes[i] == CommitOutcome::kIncomplete) {
      EraseEntryLocked(h);
      continue;
    }
    if (actual[i] != checksums[i]) {
      outcomes[i] = CommitOutcome::kChecksumMismatch;
      ++failures;
      EraseEntryLocked(h);
      continue;
    }
    Entry& e = entries_[h];
    e.state = State::kCommitted;
    e.inserted_ns = e.last_access_ns = absl::ToUnixNanos(clock_->Now());
    e.checksum = actual[i];
    e.reservation_id = CapabilityId();
    e.access_count = 1;
    policy_->OnInsert(h, AccessOf(e));
    outcomes[i] = CommitOutcome::kCommitted;
    if (sink_ != nullptr) sink_->OnStored(EventInfoOf(e));
    stats_.stored_blocks.fetch_add(1, std::memory_order_relaxed);
    stats_.committed_blocks.fetch_add(1, std::memory_order_relaxed);
    stats_.committed_bytes.fetch_add(e.size_bytes, std::memory_order_relaxed);
  }
  stats_.checksum_failures.fetch_add(failures, std::memory_order_relaxed);
  stats_.active_reservations.fetch_sub(1, std::memory_order_relaxed);
  EraseReservationLocked(it);
  return outcomes;
}

void BlockStore::Abort(const CapabilityId& reservation_id, IdHolder holder) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FindReservationLocked(reservation_id, holder) == nullptr) return;
  auto it = reservations_.find(reservation_id);
  if (it->second.pins > 0) {
    it->second.dead = true;
    return;
  }
  EndReservationLocked(it->second);
  EraseReservationLocked(it);
}

std::vector<EntryHandle> BlockStore::PinCommittedLocked(const NamespaceRef& ns, std::span<const BlockKey> keys,
                                                        uint32_t* refused_pinned) {
  std::vector<EntryHandle> pinned(keys.size(), kNoEntry);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = index_.find(keys[i]);
    if (it == index_.end()) continue;
    const Entry& e = entries_[it->second];
    if (e.state != State::kCommitted || e.namespace_id != ns.id || e.tenant_id != ns.tenant_id) continue;
    if (!MayPinLocked(it->second)) {
      ++*refused_pinned;
      continue;
    }
    pinned[i] = it->second;
    PinEntryLocked(it->second);
  }
  stats_.lease_refusals_pinned.fetch_add(*refused_pinned, std::memory_order_relaxed);
  return pinned;
}

void BlockStore::AddPinnedLocked(const Entry& e, bool add) {
  if (add) {
    tenant_pinned_bytes_[e.tenant_id] += e.size_bytes;
    return;
  }
  if (auto t = tenant_pinned_bytes_.find(e.tenant_id); t != tenant_pinned_bytes_.end()) {
    t->second -= std::min(t->second, e.size_bytes);
    if (t->second == 0) tenant_pinned_bytes_.erase(t);
  }
}

void BlockStore::PinEntryLocked(EntryHandle h) {
  Entry& e = entries_[h];
  if (e.lease_count++ == 0 && e.tier == Tier::kHost) AddPinnedLocked(e, true);
}

uint32_t BlockStore::UnpinEntryLocked(EntryHandle h) {
  Entry& e = entries_[h];
  if (--e.lease_count == 0 && e.tier == Tier::kHost) AddPinnedLocked(e, false);
  return e.lease_count;
}

void BlockStore::SetTierLocked(EntryHandle h, Tier tier) {
  Entry& e = entries_[h];
  if (e.lease_count > 0 && (e.tier == Tier::kHost) != (tier == Tier::kHost)) AddPinnedLocked(e, tier == Tier::kHost);
  e.tier = tier;
}

bool BlockStore::BoundAppliesLocked(uint64_t tenant_id) const {
  // Another tenant holds blocks here, or was refused space lately: leases are what may keep it out.
  const bool others_hold =
      tenant_bytes_.size() > 1 || (tenant_bytes_.size() == 1 && !tenant_bytes_.contains(tenant_id));
  return others_hold || (refused_tenant_ != tenant_id && clock_->Now() < refused_until_);
}

bool BlockStore::MayPinInHostLocked(const Entry& e, bool adds_bytes) const {
  if (!BoundAppliesLocked(e.tenant_id)) return true;
  const auto t = tenant_pinned_bytes_.find(e.tenant_id);
  const uint64_t pinned = t == tenant_pinned_bytes_.end() ? 0 : t->second;
  const uint64_t bound = TenantPinnedBoundLocked(e.tenant_id);
  // A tenant over its bound (it pinned the tier while it was alone) takes no lease at all, not even on
  // what it holds, until its leases expire and bring it back under the bound.
  if (!adds_bytes) return pinned <= bound;
  // A tenant with nothing pinned may always lease one block: a bound below a block never stops reads.
  return pinned == 0 || pinned + e.size_bytes <= bound;
}

bool BlockStore::MayPinLocked(EntryHandle h) const {
  const Entry& e = entries_[h];
  // A disk or HBM block pins no host slot (a disk block read for a lease moves up only within the
  // bound, LoadDiskBlocks).
  if (e.tier != Tier::kHost) return true;
  return MayPinInHostLocked(e, /*adds_bytes=*/e.lease_count == 0);
}

uint64_t BlockStore::TenantPinnedBoundLocked(uint64_t tenant_id) const {
  uint64_t bound = static_cast<uint64_t>(options_.tenant_pinned_share * static_cast<double>(options_.capacity_bytes));
  if (const auto q = options_.tenant_quota_bytes.find(tenant_id); q != options_.tenant_quota_bytes.end()) {
    bound = std::min(bound, q->second);
  }
  return bound;
}

uint64_t BlockStore::TenantPinnedBytes(uint64_t tenant_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t = tenant_pinned_bytes_.find(tenant_id);
  return t == tenant_pinned_bytes_.end() ? 0 : t->second;
}

uint64_t BlockStore::TenantPinnedBound(uint64_t tenant_id) const { return TenantPinnedBoundLocked(tenant_id); }

BlockStore::ReadLease BlockStore::AcquireRead(const NamespaceRef& ns, std::span<const BlockKey> keys,
                                              absl::Duration lease_ttl) {
  ReadLease result;
  result.blocks.resize(keys.size());
  std::vector<std::shared_ptr<const std::vector<std::byte>>> owned(keys.size());
  uint64_t hits = 0, bytes = 0, owned_bytes = 0;
  uint32_t refused_buffer = 0;
  std::unique_lock<std::mutex> lock(mu_);
  ExpireLocked(clock_->Now());
  // Pin every present block first, so that promoting one disk block cannot evict another of this read.
  std::vector<EntryHandle> leased = PinCommittedLocked(ns, keys, &result.refused_pinned);
  LoadDiskBlocks(lock, leased, &owned, &owned_bytes, &refused_buffer);
  const uint64_t buffer_bound = LeaseBufferBoundLocked();
  for (size_t i = 0; i < keys.size(); ++i) {
    const EntryHandle h = leased[i];
    if (h == kNoEntry) continue;
    // Only a block no other lease holds moves up: another reader may be reading its host slot.
    if (hbm_memory_ != nullptr && options_.hbm_promote_on_hit && entries_[h].tier == Tier::kHost &&
        entries_[h].lease_count == 1) {
      PromoteToHbmLocked(h);  // best effort: on failure it is served from host memory
    }
    if (entries_[h].tier == Tier::kHbm) {
      // Served from a host copy made for this lease (verified), so transports read host memory.
      if (lease_buffer_used_ + entries_[h].size_bytes > buffer_bound) {
        leased[i] = kNoEntry;  // answered absent: the lease buffers are at their bound
        UnpinEntryLocked(h);
        ++refused_buffer;
        continue;
      }
      auto copy = std::make_shared<std::vector<std::byte>>();
      if (!ReadHbmLocked(entries_[h], copy.get())) {
        leased[i] = kNoEntry;
        if (UnpinEntryLocked(h) == 0) EraseEntryLocked(h);  // bad or unreadable: never served
        continue;
      }
      lease_buffer_used_ += copy->size();
      owned_bytes += copy->size();
      owned[i] = std::move(copy);
    }
    Entry& e = entries_[h];
    result.blocks[i] = {.present = true, .size_bytes = e.size_bytes, .checksum = e.checksum};
    ++e.access_count;
    e.last_access_ns = absl::ToUnixNanos(clock_->Now());
    PolicyOf(e).OnAccess(h, AccessOf(e));
    ++hits;
    bytes += e.size_bytes;
  }
  stats_.read_blocks.fetch_add(hits, std::memory_order_relaxed);
  stats_.read_bytes.fetch_add(bytes, std::memory_order_relaxed);
  stats_.read_blocks_miss.fetch_add(keys.size() - hits, std::memory_order_relaxed);
  if (hits > 0) {
    result.lease_id = NewLeaseLocked(std::move(leased), ClampLease(lease_ttl), /*counted=*/true);
    Lease& lease = leases_[result.lease_id];
    if (owned_bytes > 0) lease.owned = std::move(owned);
    lease.owned_bytes = owned_bytes;  // already counted in lease_buffer_used_
  } else {
    lease_buffer_used_ -= std::min(lease_buffer_used_, owned_bytes);
  }
  stats_.lease_buffer_bytes.store(lease_buffer_used_, std::memory_order_relaxed);
  if (refused_buffer > 0) {
    stats_.lease_refusals_buffer.fetch_add(refused_buffer, std::memory_order_relaxed);
    KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                     "lease buffers at their bound ({} bytes, leases.buffer_bytes): {} disk or HBM blocks answered "
                     "absent; raise the bound, or let disk hits move up (disk_tier.promote_on_hit)",
                     buffer_bound, refused_buffer);
  }
  return result;
}

absl::StatusOr<BlockStore::HbmLease> BlockStore::AcquireHbmRead(const NamespaceRef& ns, std::span<const BlockKey> keys,
                                                                absl::Duration lease_ttl) {
  if (hbm_memory_ == nullptr) return absl::FailedPreconditionError("this server has no HBM tier");
  HbmLease result;
  result.blocks.resize(keys.size());
  uint64_t hits = 0, bytes = 0;
  std::unique_lock<std::mutex> lock(mu_);
  ExpireLocked(clock_->Now());
  // Pin first, so that bringing one block up cannot evict another of this request.
  std::vector<EntryHandle> leased = PinCommittedLocked(ns, keys, &result.refused_pinned);
  // Disk blocks move up to host memory (read without the lock), or are left out for the host data path.
  LoadDiskBlocks(lock, leased, nullptr, nullptr, nullptr);
  for (size_t i = 0; i < keys.size(); ++i) {
    const EntryHandle h = leased[i];
    if (h == kNoEntry) continue;
    bool placed = true;
    // A host block another lease holds stays where it is: that reader may be reading its slot.
    if (entries_[h].tier == Tier::kHost) placed = entries_[h].lease_count == 1 && PromoteToHbmLocked(h);
    Entry& e = entries_[h];
    void* address = placed ? hbm_memory_->DeviceAddress(hbm_allocator_->Offset(e.slot)) : nullptr;
    if (address == nullptr) {  // stays where it is, for the host data path
      leased[i] = kNoEntry;
      UnpinEntryLocked(h);
      continue;
    }
    result.blocks[i] = DeviceBlock{.device_data = address, .size_bytes = e.size_bytes};
    ++e.access_count;
    e.last_access_ns = absl::ToUnixNanos(clock_->Now());
    hbm_policy_->OnAccess(h, AccessOf(e));
    ++hits;
    bytes += e.size_bytes;
  }
  stats_.read_blocks.fetch_add(hits, std::memory_order_relaxed);
  stats_.read_bytes.fetch_add(bytes, std::memory_order_relaxed);
  stats_.read_blocks_miss.fetch_add(keys.size() - hits, std::memory_order_relaxed);
  if (hits > 0) result.lease_id = NewLeaseLocked(std::move(leased), ClampLease(lease_ttl), /*counted=*/true);
  return result;
}

absl::Status BlockStore::CopyOut(const CapabilityId& lease_id, uint32_t index, uint64_t offset,
                                 std::span<std::byte> dst) {
  // The copy runs unlocked; the pin keeps the bytes (and defers the lease's end) until Unpin.
  auto pinned = PinForSend(lease_id, index);
  if (!pinned.ok()) return pinned.status();
  absl::Status status = absl::OkStatus();
  if (offset > pinned->size_bytes || dst.size() > pinned->size_bytes - offset) {
    status = absl::InvalidArgumentError(absl::StrCat("range [", offset, ", ", offset + dst.size(),
                                                     ") is past the block's ", pinned->size_bytes, " bytes"));
  } else if (!dst.empty()) {
    std::memcpy(dst.data(), pinned->data + offset, dst.size());
  }
  Unpin(lease_id, index);
  return status;
}

uint32_t BlockStore::Release(std::span<const CapabilityId> lease_ids, IdHolder holder) {
  uint32_t released = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (const CapabilityId& id : lease_ids) {
    Lease* lease = FindLeaseLocked(id, holder);
    if (lease == nullptr) continue;
    ++released;
    EndLeaseLocked(id, *lease);
  }
  ExpireLocked(clock_->Now());
  return released;
}

std::optional<uint64_t> BlockStore::ReservationTenant(const CapabilityId& reservation_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end() || it->second.dead) return std::nullopt;
  return it->second.tenant_id;
}

std::optional<uint64_t> BlockStore::LeaseTenant(const CapabilityId& lease_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.dead) return std::nullopt;
  return it->second.tenant_id;
}

bool BlockStore::PutTagFreeFor(const CapabilityId& reservation_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservation_tag_prefixes_.find(reservation_id.tag_prefix());
  return it == reservation_tag_prefixes_.end() || it->second == reservation_id;
}

uint64_t BlockStore::TenantBytes(uint64_t tenant_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenant_bytes_.find(tenant_id);
  return it == tenant_bytes_.end() ? 0 : it->second;
}

bool BlockStore::MakeQuotaRoomLocked(uint64_t tenant_id, uint64_t quota_bytes, uint64_t bytes) {
  if (bytes > quota_bytes) return false;
  auto used = [&] {
    auto it = tenant_bytes_.find(tenant_id);
    return it == tenant_bytes_.end() ? uint64_t{0} : it->second;
  };
  auto own_unleased = [&](EntryHandle h) {
    const Entry& e = entries_[h];
    return e.tenant_id == tenant_id && e.state == State::kCommitted && e.lease_count == 0;
  };
  // Dropped, not demoted: a block on disk still counts against the quota.
  EvictionPolicy* tiers[] = {disk_policy_.get(), policy_.get(), hbm_policy_.get()};
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

std::span<std::byte> BlockStore::HostRegion() const { return allocator_->Region(); }

absl::StatusOr<BlockStore::PinnedBlock> BlockStore::PinForSend(const CapabilityId& lease_id, uint32_t index,
                                                               IdHolder holder) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(clock_->Now());
  Lease* found = FindLeaseLocked(lease_id, holder);
  if (found == nullptr) return UnknownLeaseError();
  Lease& lease = *found;
  if (index >= lease.entries.size() || lease.entries[index] == kNoEntry) {
    return absl::InvalidArgumentError(absl::StrCat("block ", index, " is not held by the lease"));
  }
  const Entry& e = entries_[lease.entries[index]];
  PinnedBlock pinned{.size_bytes = e.size_bytes, .expires_in = lease.expiry - clock_->Now()};
  if (index < lease.owned.size() && lease.owned[index] != nullptr) {
    // Read from disk or copied from HBM for this lease; a send only reads it.
    pinned.data = const_cast<std::byte*>(lease.owned[index]->data());
  } else if (e.tier == Tier::kHost) {
    pinned.data = allocator_->Data(e.slot);
  } else {
    // A lease taken by Lookup holds a disk or HBM block without a host copy: there are no bytes to send.
    return absl::FailedPreconditionError(
        absl::StrCat("block ", index, " is in the ", TierName(e.tier), " tier; read it with a read lease"));
  }
  ++lease.pins;
  return pinned;
}

void BlockStore::Unpin(const CapabilityId& lease_id, uint32_t /*index*/) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.pins == 0) return;  // not pinned: a caller bug, ignored
  Lease& lease = it->second;
  if (--lease.pins == 0 && lease.dead) {
    lease.dead = false;
    EndLeaseLocked(lease_id, lease);
  }
}

absl::StatusOr<BlockStore::PinnedBlock> BlockStore::PinForReceive(const CapabilityId& reservation_id, uint32_t index,
                                                                  IdHolder holder) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(clock_->Now());
  Reservation* found = FindReservationLocked(reservation_id, holder);
  if (found == nullptr) return UnknownReservationError();
  Reservation& r = *found;
  if (index >= r.entries.size() || r.entries[index] == kNoEntry) {
    return absl::InvalidArgumentError(absl::StrCat("block ", index, " was not allocated in the reservation"));
  }
  if (r.receiving[index] != 0 || r.written[index] != 0) {
    return absl::FailedPreconditionError(absl::StrCat("block ", index, " is already being received or written"));
  }
  const Entry& e = entries_[r.entries[index]];
  r.receiving[index] = 1;
  ++r.pins;
  return PinnedBlock{
      .data = allocator_->Data(e.slot), .size_bytes = e.size_bytes, .expires_in = r.expiry - clock_->Now()};
}

void BlockStore::FinishReceive(const CapabilityId& reservation_id, uint32_t index, uint64_t bytes, bool ok,
                               std::optional<uint64_t> checksum) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end()) return;
  Reservation& r = it->second;
  if (index >= r.entries.size() || r.receiving[index] == 0 || r.pins == 0) return;  // not pinned: ignored
  r.receiving[index] = 0;
  if (ok && r.entries[index] != kNoEntry && bytes == entries_[r.entries[index]].size_bytes) {
    r.written[index] = bytes;
    r.received_checksum[index] = checksum;
  }
  if (--r.pins == 0 && r.dead) {
    EndReservationLocked(r);
    EraseReservationLocked(it);
  }
}

void BlockStore::SetEventSink(BlockEventSink* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  sink_ = sink;
  RestateToSinkLocked();
}

std::vector<EventBlockInfo> BlockStore::SnapshotForEvents(const std::function<void()>& at_cut) const {
  std::vector<EventBlockInfo> out;
  std::lock_guard<std::mutex> lock(mu_);
  out.reserve(index_.size());
  for (const Entry& e : entries_) {
    if (e.state == State::kCommitted) out.push_back(EventInfoOf(e));
  }
  if (at_cut) at_cut();
  return out;
}

EventBlockInfo BlockStore::EventInfoOf(const Entry& e) const {
  return EventBlockInfo{.key = e.key,
                        .namespace_id = e.namespace_id,
                        .tenant_id = e.tenant_id,
                        .tier = e.tier,
                        .depth = e.depth,
                        .size_bytes = e.size_bytes,
                        .block_meta = e.block_meta};
}

void BlockStore::RestateToSinkLocked() {
  if (sink_ == nullptr) return;
  sink_->OnCleared();
  for (const Entry& e : entries_) {
    if (e.state == State::kCommitted) sink_->OnStored(EventInfoOf(e));
  }
}

std::optional<Tier> BlockStore::TierOfForTest(const BlockKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end() || entries_[it->second].state != State::kCommitted) return std::nullopt;
  return entries_[it->second].tier;
}

absl::Status BlockStore::CorruptBlockForTest(const BlockKey& key, uint64_t offset) {
  WaitForDiskWrites();  // a disk block's record exists once its write ran
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end() || entries_[it->second].state != State::kCommitted) {
    return absl::NotFoundError("block is not stored");
  }
  const Entry& e = entries_[it->second];
  if (offset >= e.size_bytes) return absl::InvalidArgumentError("offset past the block");
  if (e.tier == Tier::kDisk) return disk_->CorruptForTest(key, offset);
  if (e.tier == Tier::kHbm) {
    std::byte b;
    const uint64_t at = hbm_allocator_->Offset(e.slot) + offset;
    if (absl::Status s = hbm_memory_->CopyOut(at, {&b, 1}); !s.ok()) return s;
    b ^= std::byte{0x5a};
    return hbm_memory_->CopyIn(at, {&b, 1});
  }
  allocator_->Data(e.slot)[offset] ^= std::byte{0x5a};
  return absl::OkStatus();
}

}  // namespace kvtier::server
