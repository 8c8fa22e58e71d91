// BlockStore: creation, the index and its entries, lookups, two-phase puts and read leases.
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
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      committed_(std::make_unique<CommittedIndex>(options.index_shards)),
      tenants_(std::make_unique<TenantLedger>(
          options.tenant_quota_bytes,
          static_cast<uint64_t>(options.tenant_pinned_share * static_cast<double>(options.capacity_bytes)))) {}

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
  const EvictionPolicyOptions policy_options{.frequency_weight = options.frequency_weight,
                                             .recency_weight = options.recency_weight};
  auto policy = NewEvictionPolicy(options.eviction_policy, policy_options);
  if (!policy.ok()) return policy.status();
  store->host_ = std::make_unique<MemoryTier>(std::move(alloc).value(), std::move(policy).value(),
                                              store->stats_.stored_blocks, store->stats_.stored_bytes);
  auto disk_policy = NewEvictionPolicy(options.eviction_policy, policy_options);
  if (!disk_policy.ok()) return disk_policy.status();
  store->disk_policy_ = std::move(disk_policy).value();
  if (options.hbm_memory != nullptr) {
    auto hbm_alloc =
        SlabAllocator::Create({.capacity_bytes = options.hbm_memory->size_bytes(),
                               .slab_bytes = std::min(options.slab_bytes, options.hbm_memory->size_bytes()),
                               .map_region = false});
    if (!hbm_alloc.ok()) return hbm_alloc.status();
    auto hbm_policy = NewEvictionPolicy(options.eviction_policy, policy_options);
    if (!hbm_policy.ok()) return hbm_policy.status();
    store->hbm_ = std::make_unique<MemoryTier>(std::move(hbm_alloc).value(), std::move(hbm_policy).value(),
                                               store->stats_.hbm_blocks, store->stats_.hbm_bytes);
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
      std::lock_guard lock(store->mu_);
      if (absl::Status s = store->RecoverDiskLocked(); !s.ok()) {
        KVTIER_LOG(err, "disk tier at {}: recovering its blocks failed: {}; serving from memory", options.disk_path,
                   std::string(s.message()));
      }
    }
    store->disk_writer_ = std::thread([s = store.get()] { s->DiskWriterLoop(); });
  }
  return store;
}

uint64_t BlockStore::capacity_bytes() const { return host_->allocator().capacity_bytes(); }

uint64_t BlockStore::used_bytes() const {
  std::lock_guard lock(mu_);
  return host_->allocator().used_bytes();
}

uint64_t BlockStore::max_block_bytes() const { return host_->allocator().max_block_bytes(); }

uint64_t BlockStore::hbm_capacity_bytes() const { return hbm_ != nullptr ? hbm_->allocator().capacity_bytes() : 0; }

const char* BlockStore::eviction_policy_name() const { return host_->policy().name(); }

EvictionPolicy& BlockStore::PolicyOf(const Entry& e) {
  return e.tier == Tier::kHost ? host_->policy() : e.tier == Tier::kDisk ? *disk_policy_ : hbm_->policy();
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
    hbm_->Erase(h);
    hbm_->Free(e.slot);
  } else if (e.tier == Tier::kHost) {
    if (e.state == State::kCommitted) host_->Erase(h);
    host_->Free(e.slot);
  } else {
    disk_policy_->OnErase(h);
    EnqueueDiskDeleteLocked(e.key);  // behind its write, when that is still queued (the writer then skips it)
    stats_.disk_blocks.fetch_sub(1, std::memory_order_relaxed);
    stats_.disk_bytes.fetch_sub(e.size_bytes, std::memory_order_relaxed);
  }
  tenants_->RemoveStored(e.tenant_id, e.size_bytes);
  if (e.state == State::kCommitted) committed_->Erase(e.key);
  index_.erase(e.key);
  e = Entry{};
  free_entries_.push_back(h);
}

BlockStore::LookupResult BlockStore::Lookup(const NamespaceRef& ns, std::span<const BlockKey> keys,
                                            absl::Duration lease_ttl) {
  LookupResult result;
  result.present.resize(keys.size(), false);
  std::vector<EntryHandle> leased;
  const bool want_lease = lease_ttl > absl::ZeroDuration();
  uint64_t hits = 0;
  if (!want_lease) {
    // The sharded index answers. The store's lock only to expire what is due, at most every
    // kLookupExpiryInterval over all lookups (other calls expire too): under a steady stream of leases
    // one is nearly always due, and lookups must not queue behind the lock for it.
    const int64_t now = absl::ToUnixNanos(clock_->Now());
    int64_t last = last_lookup_expiry_ns_.load(std::memory_order_relaxed);
    if (now >= next_deadline_ns_.load(std::memory_order_relaxed) && now - last >= kLookupExpiryInterval.count() &&
        last_lookup_expiry_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
      ExpireNow();
    }
    hits = committed_->Find(ns.id, ns.tenant_id, keys, result.present);
    stats_.lookup_requests.fetch_add(1, std::memory_order_relaxed);
    stats_.lookup_blocks_hit.fetch_add(hits, std::memory_order_relaxed);
    stats_.lookup_blocks_miss.fetch_add(keys.size() - hits, std::memory_order_relaxed);
    return result;
  }
  std::lock_guard lock(mu_);
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

uint64_t BlockStore::KeyHashOf(const BlockKey& key) {
  // A stable per-block hash for what remembers dropped blocks (policies' ghosts, request_history_): the
  // fingerprint's ring position mixed with the shard, never 0.
  return (key.fingerprint.RingPosition() ^ (uint64_t{key.shard} * 0x9e3779b97f4a7c15ULL)) | 1;
}

BlockAccess BlockStore::AccessOf(const Entry& e) const {
  return BlockAccess{.depth = e.depth,
                     .namespace_id = e.namespace_id,
                     .size_bytes = e.size_bytes,
                     .now_ns = absl::ToUnixNanos(clock_->Now()),
                     .key_hash = KeyHashOf(e.key)};
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
  SlabAllocator& allocator = host_->allocator();
  if (ns.block_bytes == 0 || ns.block_bytes > allocator.max_block_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block is ", ns.block_bytes, " bytes; this server accepts 1..", allocator.max_block_bytes()));
  }
  AllocateResult result;
  result.outcomes.resize(keys.size(), AllocateOutcome::kNoSpace);
  result.ttl = options_.reservation_ttl;
  const uint64_t slot_bytes = allocator.SlotBytes(ns.block_bytes);
  std::unique_lock lock(mu_);
  if (disk_ != nullptr && spill_bytes_ > 0 &&
      allocator.capacity_bytes() - allocator.used_bytes() < keys.size() * slot_bytes) {
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
  const CapabilityId reservation_id =
      reservations_.NewId([&](const CapabilityId& id) { return reservation_tag_prefixes_.contains(id.tag_prefix()); });
  r.tenant_id = ns.tenant_id;
  const std::optional<uint64_t> quota = tenants_->Quota(ns.tenant_id);
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
    if (quota.has_value() && !MakeQuotaRoomLocked(ns.tenant_id, *quota, ns.block_bytes)) {
      stats_.rejections_quota.fetch_add(1, std::memory_order_relaxed);
      continue;  // kNoSpace: the tenant is at its quota and has nothing left to drop
    }
    std::optional<SlotRef> slot =
        host_->AllocateEvicting(ns.block_bytes, [this](uint64_t bytes) { return EvictOneLocked(bytes); });
    if (!slot.has_value()) {
      ++rejected;
      // Nothing evictable: from now on, for max_lease_ttl, every other tenant's leases are bounded, so
      // that leases cannot keep this tenant out (TenantLedger::BoundApplies).
      tenants_->NoteRefused(ns.tenant_id, now + options_.max_lease_ttl);
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
    tenants_->AddStored(ns.tenant_id, ns.block_bytes);
    r.entries[i] = h;
    result.outcomes[i] = AllocateOutcome::kAllocated;
    any = true;
  }
  stats_.rejections_no_space.fetch_add(rejected, std::memory_order_relaxed);
  if (any) {
    r.expiry = now + options_.reservation_ttl;
    reservations_.Add(reservation_id, std::move(r), now + options_.reservation_ttl);
    reservation_tag_prefixes_.emplace(reservation_id.tag_prefix(), reservation_id);
    NoteDeadlineLocked(now + options_.reservation_ttl);
    stats_.active_reservations.fetch_add(1, std::memory_order_relaxed);
    result.reservation_id = reservation_id;
  }
  return result;
}

absl::Status BlockStore::Write(const CapabilityId& reservation_id, uint32_t index, uint64_t offset,
                               std::span<const std::byte> data, IdHolder holder) {
  std::byte* dst = nullptr;
  {
    std::lock_guard lock(mu_);
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
    dst = host_->allocator().Data(e.slot) + offset;
    r.written[index] += data.size();
    ++r.pins;
  }
  if (!data.empty()) std::memcpy(dst, data.data(), data.size());
  std::lock_guard lock(mu_);
  Reservation& r = *reservations_.Find(reservation_id);  // pinned, so still present
  if (--r.pins == 0 && r.dead) {
    EndReservationLocked(r);
    EraseReservationLocked(reservation_id);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CommitOutcome>> BlockStore::Commit(const CapabilityId& reservation_id,
                                                              std::span<const uint64_t> checksums, IdHolder holder) {
  std::vector<std::pair<const std::byte*, uint64_t>> blocks;  // (data, size) of complete blocks
  std::vector<CommitOutcome> outcomes;
  {
    std::lock_guard lock(mu_);
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
      blocks[i] = {host_->allocator().Data(e.slot), e.size_bytes};
    }
    ++r.pins;       // hashing runs unlocked; the pin keeps the slots
    r.dead = true;  // no further writes; expiry leaves it to us
  }
  std::vector<uint64_t> actual(blocks.size(), 0);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].first != nullptr) actual[i] = BlockChecksum(blocks[i].first, blocks[i].second);
  }
  std::lock_guard lock(mu_);
  Reservation& r = *reservations_.Find(reservation_id);
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
    e.earlier_requests = options_.disk_admit_min_requests > 1 ? request_history_.Take(KeyHashOf(e.key)) : 0;
    committed_->Insert(e.key, e.namespace_id, e.tenant_id);
    host_->Insert(h, AccessOf(e));
    outcomes[i] = CommitOutcome::kCommitted;
    if (sink_ != nullptr) sink_->OnStored(EventInfoOf(e));
    stats_.committed_blocks.fetch_add(1, std::memory_order_relaxed);
    stats_.committed_bytes.fetch_add(e.size_bytes, std::memory_order_relaxed);
  }
  stats_.checksum_failures.fetch_add(failures, std::memory_order_relaxed);
  stats_.active_reservations.fetch_sub(1, std::memory_order_relaxed);
  EraseReservationLocked(reservation_id);
  return outcomes;
}

void BlockStore::Abort(const CapabilityId& reservation_id, IdHolder holder) {
  std::lock_guard lock(mu_);
  Reservation* r = FindReservationLocked(reservation_id, holder);
  if (r == nullptr) return;
  if (r->pins > 0) {
    r->dead = true;
    return;
  }
  EndReservationLocked(*r);
  EraseReservationLocked(reservation_id);
}

BlockStore::ReadLease BlockStore::AcquireRead(const NamespaceRef& ns, std::span<const BlockKey> keys,
                                              absl::Duration lease_ttl) {
  ReadLease result;
  result.blocks.resize(keys.size());
  std::vector<std::shared_ptr<const std::vector<std::byte>>> owned(keys.size());
  uint64_t hits = 0, bytes = 0, owned_bytes = 0;
  uint32_t refused_buffer = 0;
  std::unique_lock lock(mu_);
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
    Lease& lease = *leases_.Find(result.lease_id);
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
  std::unique_lock lock(mu_);
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
    void* address = placed ? hbm_memory_->DeviceAddress(hbm_->allocator().Offset(e.slot)) : nullptr;
    if (address == nullptr) {  // stays where it is, for the host data path
      leased[i] = kNoEntry;
      UnpinEntryLocked(h);
      continue;
    }
    result.blocks[i] = DeviceBlock{.device_data = address, .size_bytes = e.size_bytes};
    ++e.access_count;
    e.last_access_ns = absl::ToUnixNanos(clock_->Now());
    hbm_->Access(h, AccessOf(e));
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

std::span<std::byte> BlockStore::HostRegion() const { return host_->allocator().Region(); }

}  // namespace kvtier::server
