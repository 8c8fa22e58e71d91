// Leases, reservations' ids, pins and the tenants' pinned-bytes bounds of BlockStore, and the pins
// of the zero-copy transports.
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

absl::Status UnknownLeaseError() { return absl::FailedPreconditionError("unknown or expired lease"); }
absl::Status UnknownReservationError() { return absl::FailedPreconditionError("unknown or expired reservation"); }

BlockStore::Lease* BlockStore::FindLeaseLocked(const CapabilityId& id, IdHolder holder) {
  Lease* lease = leases_.FindLive(id);
  if (lease == nullptr || (holder.has_value() && *holder != lease->tenant_id)) return nullptr;  // as unknown
  return lease;
}

BlockStore::Reservation* BlockStore::FindReservationLocked(const CapabilityId& id, IdHolder holder) {
  Reservation* r = reservations_.FindLive(id);
  if (r == nullptr || (holder.has_value() && *holder != r->tenant_id)) return nullptr;  // as unknown
  return r;
}

void BlockStore::EraseReservationLocked(const CapabilityId& id) {
  reservation_tag_prefixes_.erase(id.tag_prefix());
  reservations_.Erase(id);
}

CapabilityId BlockStore::NewLeaseLocked(std::vector<EntryHandle> entries, absl::Duration ttl, bool counted) {
  const CapabilityId id = leases_.NewId();
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
  leases_.Add(id, Lease{.entries = std::move(entries), .expiry = expiry, .tenant_id = tenant_id}, expiry);
  NoteDeadlineLocked(expiry);
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
  leases_.Erase(lease_id);
}

void BlockStore::EndReservationLocked(Reservation& r) {
  for (EntryHandle h : r.entries) {
    if (h != kNoEntry && entries_[h].state == State::kReserved) EraseEntryLocked(h);
  }
  stats_.active_reservations.fetch_sub(1, std::memory_order_relaxed);
}

void BlockStore::ExpireLocked(absl::Time now) {
  leases_.ForEachDue(now, [&](const CapabilityId& id, Lease& lease) {
    stats_.expired_leases.fetch_add(1, std::memory_order_relaxed);
    EndLeaseLocked(id, lease);
  });
  reservations_.ForEachDue(now, [&](const CapabilityId& id, Reservation& r) {
    stats_.expired_reservations.fetch_add(1, std::memory_order_relaxed);
    if (r.pins > 0) {
      r.dead = true;  // freed when the in-flight write unpins
      return;
    }
    EndReservationLocked(r);
    EraseReservationLocked(id);
  });
  const absl::Time next = std::min(leases_.NextDeadline(), reservations_.NextDeadline());
  next_deadline_ns_.store(next == absl::InfiniteFuture() ? INT64_MAX : absl::ToUnixNanos(next),
                          std::memory_order_relaxed);
}

void BlockStore::NoteDeadlineLocked(absl::Time deadline) {
  const int64_t ns = absl::ToUnixNanos(deadline);
  if (ns < next_deadline_ns_.load(std::memory_order_relaxed)) next_deadline_ns_.store(ns, std::memory_order_relaxed);
}

void BlockStore::ExpireNow() {
  std::lock_guard lock(mu_);
  ExpireLocked(clock_->Now());
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
    tenants_->AddPinned(e.tenant_id, e.size_bytes);
  } else {
    tenants_->RemovePinned(e.tenant_id, e.size_bytes);
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

bool BlockStore::MayPinInHostLocked(const Entry& e, bool adds_bytes) const {
  return tenants_->MayPin(e.tenant_id, e.size_bytes, adds_bytes, clock_->Now());
}

bool BlockStore::MayPinLocked(EntryHandle h) const {
  const Entry& e = entries_[h];
  // A disk or HBM block pins no host slot (a disk block read for a lease moves up only within the
  // bound, LoadDiskBlocks).
  if (e.tier != Tier::kHost) return true;
  return MayPinInHostLocked(e, /*adds_bytes=*/e.lease_count == 0);
}

uint64_t BlockStore::TenantPinnedBytes(uint64_t tenant_id) const {
  std::lock_guard lock(mu_);
  return tenants_->Pinned(tenant_id);
}

uint64_t BlockStore::TenantPinnedBound(uint64_t tenant_id) const { return tenants_->PinnedBound(tenant_id); }

uint32_t BlockStore::Release(std::span<const CapabilityId> lease_ids, IdHolder holder) {
  uint32_t released = 0;
  std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
  const Reservation* r = reservations_.FindLive(reservation_id);
  if (r == nullptr) return std::nullopt;
  return r->tenant_id;
}

std::optional<uint64_t> BlockStore::LeaseTenant(const CapabilityId& lease_id) const {
  std::lock_guard lock(mu_);
  const Lease* lease = leases_.FindLive(lease_id);
  if (lease == nullptr) return std::nullopt;
  return lease->tenant_id;
}

bool BlockStore::PutTagFreeFor(const CapabilityId& reservation_id) const {
  std::lock_guard lock(mu_);
  auto it = reservation_tag_prefixes_.find(reservation_id.tag_prefix());
  return it == reservation_tag_prefixes_.end() || it->second == reservation_id;
}

uint64_t BlockStore::TenantBytes(uint64_t tenant_id) const {
  std::lock_guard lock(mu_);
  return tenants_->Stored(tenant_id);
}

absl::StatusOr<BlockStore::PinnedBlock> BlockStore::PinForSend(const CapabilityId& lease_id, uint32_t index,
                                                               IdHolder holder) {
  std::lock_guard lock(mu_);
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
    pinned.data = host_->allocator().Data(e.slot);
  } else {
    // A lease taken by Lookup holds a disk or HBM block without a host copy: there are no bytes to send.
    return absl::FailedPreconditionError(
        absl::StrCat("block ", index, " is in the ", TierName(e.tier), " tier; read it with a read lease"));
  }
  ++lease.pins;
  return pinned;
}

void BlockStore::Unpin(const CapabilityId& lease_id, uint32_t /*index*/) {
  std::lock_guard lock(mu_);
  Lease* found = leases_.Find(lease_id);
  if (found == nullptr || found->pins == 0) return;  // not pinned: a caller bug, ignored
  Lease& lease = *found;
  if (--lease.pins == 0 && lease.dead) {
    lease.dead = false;
    EndLeaseLocked(lease_id, lease);
  }
}

absl::StatusOr<BlockStore::PinnedBlock> BlockStore::PinForReceive(const CapabilityId& reservation_id, uint32_t index,
                                                                  IdHolder holder) {
  std::lock_guard lock(mu_);
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
      .data = host_->allocator().Data(e.slot), .size_bytes = e.size_bytes, .expires_in = r.expiry - clock_->Now()};
}

void BlockStore::FinishReceive(const CapabilityId& reservation_id, uint32_t index, uint64_t bytes, bool ok,
                               std::optional<uint64_t> checksum) {
  std::lock_guard lock(mu_);
  Reservation* found = reservations_.Find(reservation_id);
  if (found == nullptr) return;
  Reservation& r = *found;
  if (index >= r.entries.size() || r.receiving[index] == 0 || r.pins == 0) return;  // not pinned: ignored
  r.receiving[index] = 0;
  if (ok && r.entries[index] != kNoEntry && bytes == entries_[r.entries[index]].size_bytes) {
    r.written[index] = bytes;
    r.received_checksum[index] = checksum;
  }
  if (--r.pins == 0 && r.dead) {
    EndReservationLocked(r);
    EraseReservationLocked(reservation_id);
  }
}

}  // namespace kvtier::server
