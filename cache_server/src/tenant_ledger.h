// TenantLedger: what each tenant holds on one server, against its quota and its pinned bound.
#ifndef KVTIER_SERVER_SRC_TENANT_LEDGER_H_
#define KVTIER_SERVER_SRC_TENANT_LEDGER_H_

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace kvtier::server {

// Per tenant (by TenantId):
//   - stored bytes: the bytes of its blocks in every tier, reserved ones included: what its quota
//     (BlockStoreOptions::tenant_quota_bytes) bounds;
//   - pinned bytes: the bytes of its leased blocks in host memory: what its pinned bound
//     (tenant_pinned_share of the host tier, at most its quota) bounds while other tenants share the
//     server (BoundApplies);
//   - the tenant last refused space, and until when that refusal makes every other tenant's leases
//     bounded (so that leases cannot keep it out).
// A tenant with nothing stored or pinned has no entry.
// Thread-safety: none. BlockStore calls every method with its lock held, except PinnedBound and Quota,
// which read only what the constructor set.
class TenantLedger {
 public:
  // `quotas`: tenant -> bytes; `pinned_bound_bytes`: the bound of a tenant without a smaller quota.
  TenantLedger(absl::flat_hash_map<uint64_t, uint64_t> quotas, uint64_t pinned_bound_bytes)
      : quotas_(std::move(quotas)), pinned_bound_bytes_(pinned_bound_bytes) {}

  void AddStored(uint64_t tenant, uint64_t bytes) { stored_[tenant] += bytes; }
  // Subtracts at most what is counted (never wraps).
  void RemoveStored(uint64_t tenant, uint64_t bytes) { Subtract(stored_, tenant, bytes); }
  uint64_t Stored(uint64_t tenant) const { return Get(stored_, tenant); }

  void AddPinned(uint64_t tenant, uint64_t bytes) { pinned_[tenant] += bytes; }
  void RemovePinned(uint64_t tenant, uint64_t bytes) { Subtract(pinned_, tenant, bytes); }
  uint64_t Pinned(uint64_t tenant) const { return Get(pinned_, tenant); }

  // The tenant's quota in bytes; nullopt: none.
  std::optional<uint64_t> Quota(uint64_t tenant) const {
    const auto q = quotas_.find(tenant);
    return q == quotas_.end() ? std::nullopt : std::optional<uint64_t>(q->second);
  }
  // min(the share's bound, the tenant's quota).
  uint64_t PinnedBound(uint64_t tenant) const {
    const std::optional<uint64_t> quota = Quota(tenant);
    return quota.has_value() ? std::min(pinned_bound_bytes_, *quota) : pinned_bound_bytes_;
  }

  // `tenant` found no room (nothing evictable); until `until` other tenants' leases are bounded.
  void NoteRefused(uint64_t tenant, absl::Time until) {
    refused_tenant_ = tenant;
    refused_until_ = until;
  }
  // Whether `tenant`'s leases are bounded at `now`: another tenant holds blocks here, or another tenant
  // was refused space and `now` is before the refusal's end.
  bool BoundApplies(uint64_t tenant, absl::Time now) const {
    const bool others_hold = stored_.size() > 1 || (stored_.size() == 1 && !stored_.contains(tenant));
    return others_hold || (refused_tenant_ != tenant && now < refused_until_);
  }
  // Whether `tenant` may take one more lease on a host block of `bytes` at `now`; `adds_bytes`: the
  // lease would pin the block newly (its first lease). A tenant with nothing pinned may always lease one
  // block (a bound below a block never stops reads); a tenant over its bound (it pinned the tier while it
  // was alone) takes no lease at all, not even on what it holds, until its leases bring it back under.
  bool MayPin(uint64_t tenant, uint64_t bytes, bool adds_bytes, absl::Time now) const {
    if (!BoundApplies(tenant, now)) return true;
    const uint64_t pinned = Pinned(tenant);
    const uint64_t bound = PinnedBound(tenant);
    if (!adds_bytes) return pinned <= bound;
    return pinned == 0 || pinned + bytes <= bound;
  }

 private:
  static uint64_t Get(const absl::flat_hash_map<uint64_t, uint64_t>& m, uint64_t tenant) {
    const auto it = m.find(tenant);
    return it == m.end() ? 0 : it->second;
  }
  static void Subtract(absl::flat_hash_map<uint64_t, uint64_t>& m, uint64_t tenant, uint64_t bytes) {
    const auto it = m.find(tenant);
    if (it == m.end()) return;
    it->second -= std::min(it->second, bytes);
    if (it->second == 0) m.erase(it);
  }

  const absl::flat_hash_map<uint64_t, uint64_t> quotas_;
  const uint64_t pinned_bound_bytes_;
  absl::flat_hash_map<uint64_t, uint64_t> stored_;
  absl::flat_hash_map<uint64_t, uint64_t> pinned_;
  uint64_t refused_tenant_ = 0;
  absl::Time refused_until_ = absl::InfinitePast();
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_TENANT_LEDGER_H_
