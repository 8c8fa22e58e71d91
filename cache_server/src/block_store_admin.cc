// Administration of BlockStore (list, inspect, evict, verify), its KV event sink, and test hooks.
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

namespace kvtier::server {

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
  std::lock_guard lock(mu_);
  uint64_t h = cursor;
  for (; h < entries_.size() && out.size() < limit; ++h) {
    if (Matches(entries_[h], filter)) out.push_back(InfoOf(entries_[h]));
  }
  while (h < entries_.size() && !Matches(entries_[h], filter)) ++h;
  return {std::move(out), h < entries_.size() ? h : 0};
}

std::optional<BlockStore::BlockInfo> BlockStore::Inspect(const BlockKey& key) const {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end() || entries_[it->second].state != State::kCommitted) return std::nullopt;
  return InfoOf(entries_[it->second]);
}

std::pair<uint64_t, uint64_t> BlockStore::Evict(const BlockFilter& filter) {
  uint64_t evicted = 0, leased = 0;
  std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
    for (const Entry& e : entries_) {
      if (e.state == State::kCommitted) keys.push_back(e.key);
    }
  }
  std::vector<std::byte> buffer;
  for (const BlockKey& key : keys) {
    std::unique_lock lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end() || entries_[it->second].state != State::kCommitted) continue;  // gone meanwhile
    const EntryHandle h = it->second;
    bool ok = true;
    const Tier tier = entries_[h].tier;
    if (tier == Tier::kHost) {
      ok = BlockChecksum(host_->allocator().Data(entries_[h].slot), entries_[h].size_bytes) == entries_[h].checksum;
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

void BlockStore::SetDraining(bool draining) { draining_.store(draining, std::memory_order_relaxed); }

void BlockStore::SetEventSink(BlockEventSink* sink) {
  std::lock_guard lock(mu_);
  sink_ = sink;
  RestateToSinkLocked();
}

std::vector<EventBlockInfo> BlockStore::SnapshotForEvents(const std::function<void()>& at_cut) const {
  std::vector<EventBlockInfo> out;
  std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end() || entries_[it->second].state != State::kCommitted) return std::nullopt;
  return entries_[it->second].tier;
}

absl::Status BlockStore::CorruptBlockForTest(const BlockKey& key, uint64_t offset) {
  WaitForDiskWrites();  // a disk block's record exists once its write ran
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end() || entries_[it->second].state != State::kCommitted) {
    return absl::NotFoundError("block is not stored");
  }
  const Entry& e = entries_[it->second];
  if (offset >= e.size_bytes) return absl::InvalidArgumentError("offset past the block");
  if (e.tier == Tier::kDisk) return disk_->CorruptForTest(key, offset);
  if (e.tier == Tier::kHbm) {
    std::byte b;
    const uint64_t at = hbm_->allocator().Offset(e.slot) + offset;
    if (absl::Status s = hbm_memory_->CopyOut(at, {&b, 1}); !s.ok()) return s;
    b ^= std::byte{0x5a};
    return hbm_memory_->CopyIn(at, {&b, 1});
  }
  host_->allocator().Data(e.slot)[offset] ^= std::byte{0x5a};
  return absl::OkStatus();
}

}  // namespace kvtier::server
