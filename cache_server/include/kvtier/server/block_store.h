// BlockStore: the block index, host-memory tier, eviction, leases and two-phase puts of one server.
#ifndef KVTIER_SERVER_BLOCK_STORE_H_
#define KVTIER_SERVER_BLOCK_STORE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/capability_id.h"
#include "kvtier/common/clock.h"
#include "kvtier/common/counters.h"
#include "kvtier/server/block_event_sink.h"
#include "kvtier/server/capability_table.h"
#include "kvtier/server/device_tier_memory.h"
#include "kvtier/server/eviction_policy.h"
#include "kvtier/server/request_history.h"
#include "kvtier/server/slab_allocator.h"
#include "kvtier/server/timed_mutex.h"

namespace kvtier::server {

class CommittedIndex;  // src/committed_index.h
class MemoryTier;      // src/memory_tier.h
class TenantLedger;    // src/tenant_ledger.h
class DiskTier;        // src/storage/disk_tier.h
struct DiskBlockMeta;  // src/storage/disk_tier.h

struct BlockStoreOptions {
  uint64_t capacity_bytes = 1ULL << 30;  // Default: 1 GiB of host memory for blocks.
  // Default: 64 MiB. The largest block accepted is this (or capacity_bytes when smaller) rounded down to
  // the 64-byte slot alignment: SlabAllocator::LargestBlockBytes, BlockStore::max_block_bytes().
  uint64_t slab_bytes = 64ULL << 20;
  std::string eviction_policy = "lru";  // See NewEvictionPolicy() and EvictionPolicyNames().
  double frequency_weight = 0.3;        // "weighted" policy only (EvictionPolicyOptions)
  double recency_weight = 0.7;
  absl::Duration default_lease_ttl = absl::Seconds(10);  // Read leases when the caller names none.
  absl::Duration max_lease_ttl = absl::Seconds(60);      // Longer requests are capped to this.
  absl::Duration reservation_ttl = absl::Seconds(30);    // Uncommitted slots return after this.
  // The most of the host tier one tenant's leases may pin: bytes (logical sizes) of that tenant's host
  // blocks held by at least one lease, as a share of capacity_bytes; a tenant with a quota may pin at
  // most the lesser of that and its quota. A lease on a host block past the bound is refused: the block
  // is answered absent (and counted in stats().lease_refusals_pinned and the result's refused_pinned),
  // so one tenant's readers cannot pin the tier against every other tenant's puts. The bound applies
  // while another tenant holds blocks in the store or was refused space (nothing evictable) within the
  // last max_lease_ttl: a tenant alone on a server leases freely. A tenant over its bound when it starts
  // to apply takes no lease at all, not even on blocks it holds, until its leases expire (within
  // max_lease_ttl) bring it under. A leased disk block
  // pins no host slot and moves up to host memory only within the bound (else it is read into the
  // lease's own buffer); HBM blocks are not counted (puts land in host memory). A
  // tenant with nothing pinned may always lease one block, so that a bound below a block never stops its
  // reads. In (0, 1]; default 0.5.
  double tenant_pinned_share = 0.5;
  // The most bytes all leases together may hold in buffers of their own: disk blocks read for a lease
  // without moving up to host memory (promote_on_hit off, or past the tenant's pinned bound) and host
  // copies of HBM blocks. A block that would take them past it is answered absent (counted in
  // stats().lease_refusals_buffer); so the server's block memory is at most capacity_bytes plus this.
  // 0: max(capacity_bytes / 8, 64 MiB, one largest block).
  uint64_t lease_buffer_bytes = 0;
  Clock* clock = nullptr;  // Default (null): Clock::Real(). Not owned.
  // Disk tier (RocksDB). Empty path: no disk tier, host evictions drop blocks.
  std::string disk_path;
  uint64_t disk_capacity_bytes = 0;  // budget on logical block bytes; > 0 when disk_path is set
  // The disk tier stops spilling while its volume has less than this free, and resumes at 1.5x this.
  // 0: max(4 x RocksDB's write buffer, min(volume / 8, 1 GiB)). See docs/config.md, "The disk budget".
  uint64_t disk_min_free_bytes = 0;
  std::string disk_info_log_dir;  // RocksDB's info log: "" = into the server's log; else a directory
  // Write buffers older than this are flushed by ProbeDisk() (spills skip the WAL; see DiskTierOptions).
  absl::Duration disk_flush_interval = absl::Seconds(5);
  bool promote_on_hit = true;  // a read of a disk block moves it back to host memory
  // Disk admission: a host eviction writes its block to disk only if the block was requested at least
  // this many times: the put that stored it, each read hit, each put answered already present, and
  // what it was requested before an earlier drop (remembered for the last 2 x stored-blocks drops, by
  // key hash). The others are dropped (stats().disk_admission_refused). A flash drive's wear is
  // a cost: 2 cuts disk writes 3-5x on the traces of bench/policy_sim/README.md, and costs hit ratio
  // where a block seen once returns (a conversation's next turn). 0 or 1: every eviction spills.
  uint32_t disk_admit_min_requests = 0;
  // For tests of a stalled disk: DiskTierOptions::before_io_for_test (called before each disk read,
  // write and delete with "read", "write" or "delete"; it may block). Null: none.
  std::function<void(const char* op)> disk_before_io_for_test;
  // The most bytes of host blocks on their way to disk: a host eviction copies the block out of its slot
  // (freeing the slot at once) and the store's disk writer thread writes the copy to RocksDB without the
  // store's lock. An eviction that would take the copies past this drops the block instead (counted in
  // stats().disk_spill_dropped_busy): the disk is slower than the puts. So the server's block memory is
  // at most capacity_bytes + lease_buffer_bytes + this. 0: max(capacity_bytes / 8, 64 MiB, one largest
  // block). An Allocate whose evictions would spill past it first waits (at most 500 ms, the store's
  // lock released) for the writer to catch up.
  uint64_t spill_buffer_bytes = 0;
  // Shards of the committed-block index that Lookup without a lease reads: each its own lock, so such
  // lookups of different blocks neither serialize on one lock nor wait for the store's lock (held by
  // puts, evictions and leases). Default 64; 0 is taken as 1.
  uint32_t index_shards = 64;
  // HBM tier above host memory: its device memory (shared so a transport may keep it alive); null = no
  // HBM tier. Slots are carved from it by slab_bytes, like the host tier's.
  std::shared_ptr<DeviceTierMemory> hbm_memory;
  // A read hit on a host block moves it up to the HBM tier (the HBM tier holds the blocks that are read;
  // puts land in host memory, which both data paths write without staging).
  bool hbm_promote_on_hit = true;
  // Per-tenant byte quotas: tenant id (TenantId()) -> the most bytes of that tenant's blocks (reserved or
  // committed, in every tier, counted by their logical size) the store keeps. A tenant absent from the
  // map has no quota. An Allocate that would take a tenant past its quota first drops that tenant's own
  // least recently used unleased blocks (coldest tier first: disk, host, then HBM; never another
  // tenant's); when none is left to drop the key is refused (kNoSpace, stats().rejections_quota).
  // Default: empty (no quotas).
  absl::flat_hash_map<uint64_t, uint64_t> tenant_quota_bytes;

  // Errors: InvalidArgument naming the field.
  absl::Status Validate() const;
};

// What the store needs to know of a request's namespace: its id (Namespace::Id()), the tenant it
// belongs to, and the bytes of each block (KvLayout::ShardBytes()).
struct NamespaceRef {
  uint64_t id = 0;
  uint64_t tenant_id = 0;  // TenantId(tenant); entries of another tenant are invisible
  uint64_t block_bytes = 0;
};

// A stable 64-bit id of a tenant name (XXH3-64), the same after a restart. Thread-safe.
uint64_t TenantId(const std::string& tenant);

// Who presents a lease or reservation id to the store: a tenant id (TenantId()) finds only ids that tenant
// obtained; kAnyTenant (an admin, a server without tokens, or a transport whose peers carry no identity)
// finds an id of any tenant. An id of another tenant gets exactly the answer of an unknown id (the same
// status code and message, UnknownLeaseError / UnknownReservationError, or the same silence), so that
// refusals never tell whether an id is live.
using IdHolder = std::optional<uint64_t>;
inline constexpr IdHolder kAnyTenant = std::nullopt;
// The one answer for a lease id that is unknown, released, expired or another tenant's:
// FailedPrecondition "unknown or expired lease".
absl::Status UnknownLeaseError();
// The one answer for a reservation id that is unknown, committed, aborted, expired or another tenant's:
// FailedPrecondition "unknown or expired reservation".
absl::Status UnknownReservationError();

// kHbm: device memory (the HBM tier, when configured); kHost: host memory; kDisk: RocksDB.
enum class Tier : uint8_t { kHost = 0, kDisk = 1, kHbm = 2 };
// "hbm", "host", "disk".
const char* TierName(Tier tier);

enum class AllocateOutcome : uint8_t { kAllocated, kAlreadyPresent, kInProgress, kNoSpace };
enum class CommitOutcome : uint8_t { kCommitted, kChecksumMismatch, kIncomplete, kNotAllocated };

// Counters since creation. Read with relaxed loads; each is monotonic except the gauges noted.
struct BlockStoreStats {
  std::atomic<uint64_t> lookup_requests{0};
  std::atomic<uint64_t> lookup_blocks_hit{0};
  std::atomic<uint64_t> lookup_blocks_miss{0};
  std::atomic<uint64_t> read_blocks{0};
  std::atomic<uint64_t> read_blocks_miss{0};
  std::atomic<uint64_t> read_bytes{0};
  std::atomic<uint64_t> committed_blocks{0};
  std::atomic<uint64_t> committed_bytes{0};
  std::atomic<uint64_t> already_present{0};
  std::atomic<uint64_t> evictions{0};
  std::atomic<uint64_t> rejections_no_space{0};
  std::atomic<uint64_t> rejections_quota{0};  // keys refused because their tenant is at its quota
  std::atomic<uint64_t> quota_evictions{0};   // blocks a tenant at its quota dropped to make room
  // Present blocks answered absent because a lease on them would take their tenant past its pinned bound.
  std::atomic<uint64_t> lease_refusals_pinned{0};
  std::atomic<uint64_t> lease_refusals_buffer{0};  // blocks answered absent: lease buffers at their bound
  std::atomic<uint64_t> lease_buffer_bytes{0};     // bytes leases hold in buffers of their own now
  std::atomic<uint64_t> checksum_failures{0};
  std::atomic<uint64_t> expired_reservations{0};
  std::atomic<uint64_t> expired_leases{0};
  std::atomic<uint64_t> active_leases{0};            // gauge
  std::atomic<uint64_t> active_reservations{0};      // gauge
  std::atomic<uint64_t> stored_blocks{0};            // gauge: committed blocks in host memory
  std::atomic<uint64_t> stored_bytes{0};             // gauge: slot bytes of committed and reserved blocks
  std::atomic<uint64_t> disk_blocks{0};              // gauge: blocks on disk
  std::atomic<uint64_t> disk_bytes{0};               // gauge: logical bytes on disk
  std::atomic<uint64_t> demotions{0};                // host -> disk
  std::atomic<uint64_t> promotions{0};               // disk -> host
  std::atomic<uint64_t> disk_evictions{0};           // dropped from disk
  std::atomic<uint64_t> disk_checksum_failures{0};   // disk reads whose bytes failed: dropped, never served
  std::atomic<uint64_t> disk_errors{0};              // disk I/O errors (the block is dropped or not demoted)
  std::atomic<uint64_t> disk_spill_refused{0};       // host evictions dropped: the disk tier was not writable
  std::atomic<uint64_t> disk_spill_dropped_busy{0};  // host evictions dropped: spill buffers at their bound
  std::atomic<uint64_t> disk_admission_refused{0};   // host evictions dropped: disk_admit_min_requests
  std::atomic<uint64_t> disk_spill_queue_bytes{0};   // gauge: bytes of blocks waiting for the disk writer
  std::atomic<uint64_t> disk_reads{0};               // disk blocks read (without the store's lock)
  std::atomic<uint64_t> recovered_blocks{0};         // found on disk at start
  std::atomic<uint64_t> slab_moves{0};               // slabs emptied and returned to the pool (any size)
  std::atomic<uint64_t> defrag_moved_blocks{0};      // blocks moved between slots by Defragment()
  std::atomic<uint64_t> hbm_blocks{0};               // gauge: committed blocks in the HBM tier
  std::atomic<uint64_t> hbm_bytes{0};                // gauge: slot bytes of the HBM tier in use
  std::atomic<uint64_t> hbm_promotions{0};           // host -> HBM
  std::atomic<uint64_t> hbm_demotions{0};            // HBM -> host
  std::atomic<uint64_t> hbm_errors{0};               // device copies that failed (the block is dropped or not moved)

  // Which tiers the store has: samples of an absent tier are left out (ForEach).
  struct Tiers {
    bool hbm = false;
    bool disk = false;
  };
  // Calls `visit` once per sample of every counter above (Prometheus names, help and kind; each field
  // appears in exactly one sample), leaving out the HBM samples without tiers.hbm and the disk tier's
  // gauges, reads and spill drops without tiers.disk. /metrics, GetStats and kvtierctl stats iterate it.
  // Add a field here and to ForEach (block_store_stats.cc); the unit test counts the fields.
  // Thread-safety: may run concurrently with the store's updates (relaxed loads).
  void ForEach(const CounterVisitor& visit, Tiers tiers) const;
};

// The disk tier as an operator sees it (BlockStore::disk_status()).
struct DiskTierStatus {
  std::string state;            // "ok", "degraded-full", "read-only", "off" (docs/config.md, "Disk tier states")
  std::string reason;           // why it is not "ok"; "" when it is
  uint64_t volume_bytes = 0;    // size of the disk directory's volume at start (0: unknown)
  uint64_t free_bytes = 0;      // free on that volume at the last check
  uint64_t min_free_bytes = 0;  // the floor under which nothing is written
  uint64_t database_bytes = 0;  // RocksDB's files (SST, blob, WAL), as its SstFileManager counts them
  // I/O errors by operation (also logged with the operation and path, rate limited).
  uint64_t open_errors = 0, write_errors = 0, read_errors = 0, delete_errors = 0, scan_errors = 0;
  uint64_t background_errors = 0;  // RocksDB's own flushes and compactions that failed
  uint64_t recreated = 0;          // times the database was found unusable for want of room and started empty

  // Calls `visit` once per sample: the state (one gauge per state, 1 for the current one), the
  // numbers above and the errors by operation (`reason` is text, not a sample).
  void ForEach(const CounterVisitor& visit) const;
};

// Per-block answer of AcquireRead.
struct ReadBlockInfo {
  bool present = false;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;  // XXH3-64 verified at commit
};

// The index maps BlockKey to an entry with the namespace and tenant, tier, slot, size, checksum, lease
// count and state. Tiers, each with its own policy instance, exclusive of each other: HBM (device
// memory, when hbm_memory is set), host memory (slots), then disk (RocksDB) when configured. Puts land in
// host memory. Evicting an HBM block demotes it to host, evicting a host block demotes it to disk, the
// disk evicts and drops. A read hit on a host block moves it up to HBM (hbm_promote_on_hit); a read of a
// disk block verifies its checksum (a failing block is dropped and counted, never served) and, with
// promote_on_hit, moves it back to host memory. Every move between tiers verifies the checksum of the
// bytes that arrived; a read served from HBM copies the block to host memory for the lease and verifies
// it there. Disk blocks survive a restart (recovered in Create).
// Disk I/O never runs under the store's lock: a block on its way to disk is copied out of its host slot
// and written by the store's disk writer thread (one thread, so disk writes and deletes run in the order
// they were decided; reads of a block still on its way are served from that copy), and a read of a disk
// block pins the block, releases the lock for the read, and takes it again to move the block up. A disk tier that is
// full or failing (DiskTierStatus) never fails the store: host evictions then drop instead of spilling, reads of disk
// blocks that cannot be read are misses, and ProbeDisk() brings the tier back. A block becomes visible only after
// Commit verified its checksum; a leased block is never evicted or reused; a reservation that is not committed within
// reservation_ttl returns its slots. Capacity: slots come from a SlabAllocator of capacity_bytes, so usage never
// exceeds it; when no unleased block can be evicted, Allocate reports kNoSpace for that key (a rejection). Payload
// copies (Write, CopyOut) and checksums run outside the lock; the slot is pinned meanwhile, so expiry never frees
// memory under a copy. Lease and reservation ids are CapabilityId::Random() (128 bits from a CSPRNG), never sequential
// and never reused, and are bound to the tenant of the blocks they name (IdHolder). Thread-safety: all public methods
// may be called concurrently.
class BlockStore {
 public:
  // Errors: InvalidArgument (bad options), ResourceExhausted (region could not be reserved).
  static absl::StatusOr<std::unique_ptr<BlockStore>> Create(const BlockStoreOptions& options);
  ~BlockStore();

  // For each key: committed in `ns` (same namespace id and tenant)? Takes no lease unless lease_ttl > 0
  // (capped at max_lease_ttl), in which case the present blocks are leased under the returned id (null when
  // none were present). Does not count as an access. Without a lease it reads only the sharded committed
  // index (BlockStoreOptions::index_shards), taking the store's lock only to expire leases and
  // reservations that are due (at most every 10 ms over all lookups).
  // A present block that would take its tenant past its pinned-bytes bound (tenant_pinned_share) is
  // answered absent when lease_ttl > 0, and counted in refused_pinned.
  struct LookupResult {
    std::vector<bool> present;
    CapabilityId lease_id;
    absl::Duration lease_ttl;
    uint32_t refused_pinned = 0;  // present blocks answered absent: their tenant is at its pinned bound
  };
  LookupResult Lookup(const NamespaceRef& ns, std::span<const BlockKey> keys, absl::Duration lease_ttl);

  // Phase 1 of a put: per key, reserve a slot of ns.block_bytes (evicting unleased blocks as needed),
  // or report it already present (an access), in progress (another reservation holds it) or no space.
  // `depths` is empty or gives each key's index in its prompt's chain (for prefix-aware eviction).
  // `block_meta` is empty or gives each key's engine metadata (kvtier/common/block_meta.h; copied): an
  // allocated key keeps it for as long as its block lives, in every tier and on disk across restarts, and
  // events carry it (EventBlockInfo::block_meta). A key already present keeps the metadata it has.
  // Errors: InvalidArgument (block_bytes is 0 or above max_block_bytes(), so that it could not fit even an
  // empty tier: nothing is evicted for it; depths or block_meta of the wrong length; block_meta past its
  // limits, ValidateBlockMeta: nothing is allocated).
  struct AllocateResult {
    // Null when no key was allocated. Its tag prefix (CapabilityId::tag_prefix()) differs from that of every
    // other live reservation of the store, so UCX put tags (kvtier/ucx/ucx_messages.h PutTag) never collide.
    CapabilityId reservation_id;
    std::vector<AllocateOutcome> outcomes;
    absl::Duration ttl;
  };
  absl::StatusOr<AllocateResult> Allocate(const NamespaceRef& ns, std::span<const BlockKey> keys,
                                          std::span<const uint32_t> depths = {},
                                          std::span<const BlockMeta> block_meta = {});

  // Copies `data` (borrowed for the call) to bytes [offset, offset + size) of the block at `index` of the
  // reservation. Chunks of one block must arrive in order (offset == bytes written so far). `holder`: see
  // IdHolder. Errors: UnknownReservationError (unknown, expired, committed or `holder` is another tenant),
  // InvalidArgument (index not allocated, out-of-order offset, past the block's end).
  absl::Status Write(const CapabilityId& reservation_id, uint32_t index, uint64_t offset,
                     std::span<const std::byte> data, IdHolder holder = kAnyTenant);

  // Phase 2: per key of the reservation, verify that all bytes were written and that their XXH3-64
  // equals checksums[i]; matching blocks become visible, others free their slots. Ends the reservation.
  // Errors: UnknownReservationError (unknown, expired, or `holder` is another tenant), InvalidArgument
  // (checksums.size() is not the number of keys), FailedPrecondition (writes still in flight).
  absl::StatusOr<std::vector<CommitOutcome>> Commit(const CapabilityId& reservation_id,
                                                    std::span<const uint64_t> checksums, IdHolder holder = kAnyTenant);

  // Ends a reservation and frees its slots. Unknown ids, and ids of a tenant other than `holder`, are
  // ignored alike (it may have expired).
  void Abort(const CapabilityId& reservation_id, IdHolder holder = kAnyTenant);

  // Leases the present keys for lease_ttl (0: default_lease_ttl; capped at max_lease_ttl) and counts an
  // access to each. Returns the lease id (null when none was present) and per-key info.
  // A present block that would take its tenant past its pinned-bytes bound (tenant_pinned_share) is
  // answered absent and counted in refused_pinned.
  struct ReadLease {
    CapabilityId lease_id;
    std::vector<ReadBlockInfo> blocks;
    uint32_t refused_pinned = 0;  // present blocks answered absent: their tenant is at its pinned bound
  };
  ReadLease AcquireRead(const NamespaceRef& ns, std::span<const BlockKey> keys, absl::Duration lease_ttl);

  // Copies bytes [offset, offset + dst.size()) of the block at `index` of lease `lease_id` into `dst`.
  // Errors: UnknownLeaseError (lease unknown, released or expired), InvalidArgument (index not present
  // in the lease, range past the block's end).
  absl::Status CopyOut(const CapabilityId& lease_id, uint32_t index, uint64_t offset, std::span<std::byte> dst);

  // Releases the leases of `lease_ids` that `holder` holds (IdHolder); returns how many were live. Unknown
  // ids and another tenant's are skipped alike (that lease stays).
  uint32_t Release(std::span<const CapabilityId> lease_ids, IdHolder holder = kAnyTenant);

  // The tenant id of the blocks of live reservation `reservation_id`, or nullopt when it is unknown,
  // committed, aborted or expired. For tests and operators: the RPC layer passes the caller's IdHolder.
  std::optional<uint64_t> ReservationTenant(const CapabilityId& reservation_id) const;
  // The tenant id of the blocks of live lease `lease_id`, or nullopt when it is unknown, released or
  // expired.
  std::optional<uint64_t> LeaseTenant(const CapabilityId& lease_id) const;
  // Whether the UCX put tags of `reservation_id` (its tag_prefix()) are free of every live reservation
  // other than `reservation_id` itself. A transport that cannot pin a kPut's id drains the sender's
  // message with a zero-byte receive on that tag only when this holds, so that a kPut with a wrong id
  // never takes a message meant for another reservation's slot.
  bool PutTagFreeFor(const CapabilityId& reservation_id) const;
  // Bytes of tenant `tenant_id`'s blocks now: reserved and committed, every tier, logical sizes (what
  // tenant_quota_bytes limits). 0 for an unknown tenant.
  uint64_t TenantBytes(uint64_t tenant_id) const;
  // Bytes (logical sizes) of tenant `tenant_id`'s host-memory blocks that at least one lease holds now,
  // and the most its leases may pin (tenant_pinned_share of capacity_bytes, or its quota when lower).
  uint64_t TenantPinnedBytes(uint64_t tenant_id) const;
  uint64_t TenantPinnedBound(uint64_t tenant_id) const;

  // --- Zero-copy transfers (the UCX data plane, cache_server/src/transport/) ---
  // A transport moves a block's bytes straight between its slot and the network instead of copying them
  // through CopyOut/Write. The pin rules are those of CopyOut and Write: a pinned lease or reservation
  // that is released, aborted or expires is only marked dead and ends at its last unpin, so a slot is
  // never freed or reused while a transfer may still touch it.

  // The host tier's memory: one region, fixed for the store's lifetime, holding every host slot. A
  // transport registers it once (ucp_mem_map).
  std::span<std::byte> HostRegion() const;

  // Where a pinned block's bytes are; valid until the matching unpin.
  struct PinnedBlock {
    std::byte* data = nullptr;
    uint64_t size_bytes = 0;
    // Time left, at the pin, before the lease or reservation expires. A transport must not let a
    // transfer hold the pin much past it (the pin keeps an expired lease's blocks and an expired
    // reservation's keys from everyone else): UcxServer cancels or force-closes what is still in
    // flight then.
    absl::Duration expires_in;
  };

  // Pins lease `lease_id` for one send of the block at `index`: returns its host slot, or the lease's own
  // buffer for a disk block that was not promoted. The bytes stay valid and unchanged until Unpin.
  // Errors: UnknownLeaseError (lease unknown, released, expired, or `holder` is another tenant),
  // InvalidArgument (index not held).
  absl::StatusOr<PinnedBlock> PinForSend(const CapabilityId& lease_id, uint32_t index, IdHolder holder = kAnyTenant);
  // Ends one successful PinForSend(lease_id, index); the caller no longer touches the bytes. Ends the
  // lease if it was released or expired meanwhile.
  void Unpin(const CapabilityId& lease_id, uint32_t index);

  // Pins reservation `reservation_id` for one receive of the whole block at `index` straight into its
  // reserved slot (size_bytes = the block's size). Write() to that block is refused until FinishReceive.
  // Errors: UnknownReservationError (unknown, expired, committed, or `holder` is another tenant),
  // FailedPrecondition (the block is already being received or has bytes written), InvalidArgument (index
  // not allocated).
  absl::StatusOr<PinnedBlock> PinForReceive(const CapabilityId& reservation_id, uint32_t index,
                                            IdHolder holder = kAnyTenant);
  // Ends one successful PinForReceive. With ok and bytes == the block's size the block counts as fully
  // written (Commit then verifies its checksum); otherwise it stays unwritten (Commit: kIncomplete).
  // `checksum`, when given, is the XXH3-64 the caller computed over the slot's bytes after they landed
  // (while they were still in cache); Commit compares against it instead of hashing the slot again.
  // The slot cannot change in between: Write() to a received block is refused.
  // Ends the reservation if it was aborted or expired meanwhile.
  void FinishReceive(const CapabilityId& reservation_id, uint32_t index, uint64_t bytes, bool ok,
                     std::optional<uint64_t> checksum = std::nullopt);

  // --- Device-to-device transfers (the NCCL transport, transport/nccl/) ---

  // A block pinned in the HBM tier: its device address and size, valid until the lease ends.
  struct DeviceBlock {
    void* device_data = nullptr;
    uint64_t size_bytes = 0;
  };
  struct HbmLease {
    CapabilityId lease_id;                           // null when no block was placed in HBM
    std::vector<std::optional<DeviceBlock>> blocks;  // per key; nullopt: absent, or not placeable in HBM
    uint32_t refused_pinned = 0;  // present blocks answered absent: their tenant is at its pinned bound
  };
  // Leases the present blocks of `keys` that are, or can be brought, in the HBM tier (host and disk
  // blocks move up, as on a read hit, whatever hbm_promote_on_hit says), and counts an access to each.
  // Release the lease with Release(); until then the blocks are neither evicted nor moved, as with
  // AcquireRead. Blocks whose device memory has no device address (not CUDA memory) are nullopt.
  // Errors: FailedPrecondition (no HBM tier).
  absl::StatusOr<HbmLease> AcquireHbmRead(const NamespaceRef& ns, std::span<const BlockKey> keys,
                                          absl::Duration lease_ttl);

  // Expires reservations and leases past their deadline (every other call also does so lazily).
  void ExpireNow();

  // Returns once every disk write and delete decided before the call has run (the disk writer's queue
  // is empty). For tests, and for callers that want the disk to hold what the index says (a restart).
  // No-op without a disk tier. Thread-safe; never call it while holding a lock the store takes.
  void WaitForDiskWrites();

  // ---- Administration (kvtierctl ls / inspect / evict / verify / drain) ----

  // One committed block as an operator sees it.
  struct BlockInfo {
    BlockKey key;
    uint64_t namespace_id = 0;
    uint64_t tenant_id = 0;
    Tier tier = Tier::kHost;
    uint64_t size_bytes = 0;
    uint64_t checksum = 0;
    uint32_t depth = 0;         // index in its prompt's chain, as the writer reported it
    uint32_t access_count = 0;  // the put plus every read hit and repeated put
    uint32_t lease_count = 0;
    absl::Time inserted;  // when it was committed (or recovered from disk)
    absl::Time last_access;
  };
  // Which blocks an admin call applies to; unset fields match everything.
  struct BlockFilter {
    std::optional<uint64_t> namespace_id;
    std::optional<uint64_t> tenant_id;
    std::optional<Tier> tier;
  };
  // Committed blocks matching `filter`, at most `limit`, starting at `cursor` (0 for the first page).
  // Returns the page and the cursor of the next page (0 when there is none). Pages are stable while
  // nothing is inserted or erased; otherwise a block may show twice or not at all, never a wrong one.
  std::pair<std::vector<BlockInfo>, uint64_t> ListBlocks(const BlockFilter& filter, uint64_t cursor,
                                                         size_t limit) const;
  // The block stored under `key` (committed), if any.
  std::optional<BlockInfo> Inspect(const BlockKey& key) const;
  // Drops matching unleased blocks from every tier. Returns (evicted, skipped because leased).
  std::pair<uint64_t, uint64_t> Evict(const BlockFilter& filter);
  // Drops one block unless leased. Returns true when it was dropped.
  bool EvictKey(const BlockKey& key);
  // Re-reads every committed block (host and disk) and checks its checksum; a failing block is dropped
  // and counted. Calls `progress(done, total)` every 256 blocks. Returns (checked, corrupt) and the keys
  // of the corrupt ones. Takes the lock per block, so serving goes on meanwhile.
  struct VerifyResult {
    uint64_t checked = 0;
    uint64_t corrupt = 0;
    std::vector<BlockKey> corrupt_keys;
  };
  VerifyResult Verify(const std::function<void(uint64_t, uint64_t)>& progress = nullptr);
  // Compacts the host tier: for each slot size, when the blocks of its emptiest slab fit in the free
  // slots of its other slabs, moves them there (checksum re-verified) and returns the slab to the free
  // pool, where any block size can take it. Slabs holding a leased or reserved block are left alone.
  // Runs on an interval (ServerOptions::defrag_interval) and on demand. Returns (blocks moved, slabs
  // freed); freed slabs also count in stats().slab_moves.
  std::pair<uint64_t, uint64_t> Defragment();

  // While draining, Allocate answers kNoSpace for every new key (reads go on), so that an operator can
  // move hot blocks elsewhere before the server stops.
  void SetDraining(bool draining);
  bool draining() const { return draining_.load(std::memory_order_relaxed); }

  // ---- KV events (docs/events.md) ----

  // Attaches `sink` (not owned; it must outlive the store or be detached with nullptr first). Under the
  // store's lock, it first receives OnCleared and one OnStored per committed block, so the calls it sees
  // describe the store from an empty set on; every later change follows in order.
  void SetEventSink(BlockEventSink* sink);
  // Every committed block, listed under the store's lock; `at_cut` runs under that same lock, so what it
  // records (the sink's latest sequence number) is consistent with the list: the sink calls made after
  // it, applied to the list, give the store's contents. O(blocks) under the lock.
  std::vector<EventBlockInfo> SnapshotForEvents(const std::function<void()>& at_cut) const;

  const BlockStoreStats& stats() const { return stats_; }
  uint64_t capacity_bytes() const;
  uint64_t used_bytes() const;
  // The largest block Allocate accepts (slab_bytes, or capacity_bytes when smaller, rounded down to the
  // slot alignment).
  uint64_t max_block_bytes() const;
  bool has_disk_tier() const { return disk_ != nullptr; }
  bool has_hbm_tier() const { return hbm_memory_ != nullptr; }
  uint64_t hbm_capacity_bytes() const;
  // "cuda:0 22.0 GiB", or "" without an HBM tier.
  std::string hbm_description() const { return hbm_memory_ != nullptr ? hbm_memory_->Describe() : std::string(); }
  // The disk budget in force: disk_capacity_bytes, at most half of (the volume's size less the floor)
  // (docs/config.md, "The disk budget"), following the volume's size as ProbeDisk() re-reads it; 0
  // without a disk tier. Thread-safe.
  uint64_t disk_capacity_bytes() const { return disk_ != nullptr ? disk_capacity_.load(std::memory_order_relaxed) : 0; }
  // The disk tier's state, volume and per-operation errors; a default (empty) status without a disk
  // tier. Thread-safe.
  DiskTierStatus disk_status() const;
  // Checks the disk tier's volume and leaves a degraded state once it has room again (DB::Resume or a
  // reopen; blocks found on a reopened database are indexed again, stale copies deleted, blocks it no
  // longer holds dropped); a resized volume moves the budget in force (lowered: the disk evicts down to
  // it). The server calls it every disk_tier.probe_interval. No-op without a disk tier. Thread-safe.
  void ProbeDisk();
  const char* eviction_policy_name() const;

  // Overwrites one byte of a committed block in place, bypassing every check. Test builds use it to
  // prove that corrupt blocks are caught by the client's checksum. Errors: NotFound (not stored).
  absl::Status CorruptBlockForTest(const BlockKey& key, uint64_t offset);
  // The tier holding `key`, or nullopt when it is not committed.
  std::optional<Tier> TierOfForTest(const BlockKey& key) const;

 private:
  enum class State : uint8_t { kFree, kReserved, kCommitted };
  struct Entry {
    BlockKey key;
    uint64_t namespace_id = 0;
    uint64_t size_bytes = 0;
    uint64_t checksum = 0;
    CapabilityId reservation_id;  // while kReserved
    uint64_t tenant_id = 0;
    SlotRef slot;  // while tier == kHost (host_) or kHbm (hbm_)
    uint32_t lease_count = 0;
    uint32_t access_count = 0;
    // Requests of the block before it was last dropped, remembered in request_history_ (disk
    // admission only; 0 otherwise).
    uint32_t earlier_requests = 0;
    uint32_t depth = 0;
    std::shared_ptr<const BlockMeta> block_meta;  // null: put without engine metadata
    // tier == kDisk only: the block's bytes while the disk writer has not yet written them (then reads
    // are served from here); null once written.
    std::shared_ptr<const std::vector<std::byte>> in_transit;
    State state = State::kFree;
    Tier tier = Tier::kHost;
    int64_t inserted_ns = 0;
    int64_t last_access_ns = 0;
  };
  struct Lease {
    std::vector<EntryHandle> entries;  // per key index; kNoEntry when absent
    // Per key index: bytes read from disk (when not promoted) or copied from HBM for this lease; null
    // otherwise. Never changed while the lease lives.
    std::vector<std::shared_ptr<const std::vector<std::byte>>> owned;
    uint64_t owned_bytes = 0;  // sum of owned's sizes, counted in lease_buffer_used_
    absl::Time expiry;
    uint64_t tenant_id = 0;  // of its blocks: the tenant that took it
    uint32_t pins = 0;       // copies in flight
    bool dead = false;       // released or expired while pinned: free at unpin
  };
  struct Reservation {
    std::vector<EntryHandle> entries;                        // per key index; kNoEntry when not allocated
    std::vector<uint64_t> written;                           // bytes written per key
    std::vector<uint8_t> receiving;                          // per key: 1 while a PinForReceive transfer is in flight
    std::vector<std::optional<uint64_t>> received_checksum;  // per key: from FinishReceive, if given
    absl::Time expiry;
    uint64_t tenant_id = 0;  // the tenant that allocated it
    uint32_t pins = 0;
    bool dead = false;
  };
  static constexpr EntryHandle kNoEntry = 0xffffffffu;

  explicit BlockStore(const BlockStoreOptions& options);
  EntryHandle NewEntryLocked();
  void EraseEntryLocked(EntryHandle h);  // frees slot, removes from map and policy
  bool EvictOneLocked(uint64_t slot_bytes);
  // Drops unleased committed blocks of `tenant_id` (disk first, then host, then HBM; least recently
  // used first) until `bytes` more fit in its quota. False when they cannot be made to fit.
  bool MakeQuotaRoomLocked(uint64_t tenant_id, uint64_t quota_bytes, uint64_t bytes);
  // Moves a host block to disk (making room there), or drops it when there is no disk or it fails.
  void DemoteOrDropLocked(EntryHandle h);
  // Drops a committed block from every tier, remembering its requests when disk admission is on.
  void DropLocked(EntryHandle h);
  static uint64_t KeyHashOf(const BlockKey& key);
  // Makes room for `bytes` on disk by dropping unleased disk blocks. False when it cannot.
  bool MakeDiskRoomLocked(uint64_t bytes);
  // Counts a failed disk delete as a disk error, unless the tier only could not write at the time.
  void CountDiskDelete(const absl::Status& s);
  // The lease buffer bound in force (BlockStoreOptions::lease_buffer_bytes, or its default).
  uint64_t LeaseBufferBoundLocked() const;
  // The spill buffer bound in force (BlockStoreOptions::spill_buffer_bytes, or its default).
  uint64_t SpillBufferBound() const;
  // The disk tier's record of entry `e` (what a write stores and a read checks against).
  static DiskBlockMeta DiskMetaOf(const Entry& e);
  // Brings the disk blocks among `leased` (entries the caller pinned, one per key) into host memory or
  // into buffers of their own, reading them with `lock` (held on mu_ on entry and on return) released
  // meanwhile. A block moves up to host memory when promote_on_hit and its tenant's pinned bound allow
  // it and a slot can be made free; else, when `owned` (sized like `leased`) is given and the lease
  // buffers have room, its bytes go to (*owned)[i] (added to lease_buffer_used_ and *owned_bytes); else it
  // is unpinned and leased[i] becomes kNoEntry (counted in *refused_buffer when `owned` was given). A
  // block that cannot be read, or fails its checksum, is unpinned, dropped when unleased, never served.
  void LoadDiskBlocks(std::unique_lock<TimedMutex>& lock, std::vector<EntryHandle>& leased,
                      std::vector<std::shared_ptr<const std::vector<std::byte>>>* owned, uint64_t* owned_bytes,
                      uint32_t* refused_buffer);
  // Moves disk entry `h` (its bytes now at `slot` of host memory, verified) up to host memory; the disk
  // copy is deleted by the disk writer.
  void SwitchDiskToHostLocked(EntryHandle h, SlotRef slot);

  // ---- The disk writer: one thread running disk writes and deletes in the order they were queued ----
  struct DiskOp {
    BlockKey key;
    std::shared_ptr<const std::vector<std::byte>> bytes;  // a write of these bytes; null: a delete
    std::shared_ptr<const DiskBlockMeta> meta;            // a write's record
  };
  void EnqueueDiskDeleteLocked(const BlockKey& key);
  void DiskWriterLoop();
  // Runs one queued write (without mu_), then records its outcome on the entry under mu_.
  void RunDiskWrite(const DiskOp& op);
  absl::Status RecoverDiskLocked();
  // Indexes a block found on disk (committed, in the disk tier, counted) and returns its entry.
  EntryHandle IndexDiskRecordLocked(const BlockKey& key, const DiskBlockMeta& meta);
  // After a reopen: indexes records the index lacks, deletes disk copies of blocks now in memory, drops
  // unleased disk entries whose records are gone.
  void ReconcileDiskLocked();
  // min(disk_capacity_bytes option, the volume's budget_limit()). Needs disk_.
  uint64_t DiskBudget() const;
  EvictionPolicy& PolicyOf(const Entry& e);
  // Per key: the handle of its committed entry in `ns` (same namespace and tenant) with its lease count
  // raised, or kNoEntry (absent, or refused: past its tenant's pinned bound, counted in *refused_pinned).
  std::vector<EntryHandle> PinCommittedLocked(const NamespaceRef& ns, std::span<const BlockKey> keys,
                                              uint32_t* refused_pinned);
  // Moves a committed host block up to the HBM tier, making room there. Callers move only a block that
  // no other lease holds (its reader may be reading the host slot). False (the block stays in host
  // memory) when nothing in HBM can be evicted or the copy fails.
  bool PromoteToHbmLocked(EntryHandle h);
  // Moves an HBM block down to host memory (making room there, which may demote to disk), or drops it
  // when there is no room or its bytes fail their checksum.
  void DemoteFromHbmLocked(EntryHandle h);
  // Moves the bookkeeping of block h (in host memory or HBM) to `slot` of the other of the two, whose
  // bytes were copied and verified already: frees the old slot, and moves the block between the tiers'
  // policies, gauges and the event sink.
  void SwitchMemoryTierLocked(EntryHandle h, SlotRef slot);
  // Evicts one unleased HBM block whose slot fits `slot_bytes` (or empties its slab). False when none.
  bool EvictOneHbmLocked(uint64_t slot_bytes);
  // Copies an HBM block to `out` (resized) and verifies its checksum. False on a failed copy or checksum.
  bool ReadHbmLocked(const Entry& e, std::vector<std::byte>* out);
  void ExpireLocked(absl::Time now);
  // Lowers next_deadline_ns_ to `deadline` when earlier. Requires mu_.
  void NoteDeadlineLocked(absl::Time deadline);
  void EndLeaseLocked(const CapabilityId& lease_id, Lease& lease);
  // Erases reservation `id` from reservations_ (and its tag prefix).
  void EraseReservationLocked(const CapabilityId& id);
  // The live lease / reservation `id` as `holder` may see it, or null (unknown, ended, another tenant's).
  Lease* FindLeaseLocked(const CapabilityId& id, IdHolder holder);
  Reservation* FindReservationLocked(const CapabilityId& id, IdHolder holder);
  void EndReservationLocked(Reservation& r);
  absl::Duration ClampLease(absl::Duration ttl) const;
  // `counted`: the entries' lease counts were already raised by the caller.
  CapabilityId NewLeaseLocked(std::vector<EntryHandle> entries, absl::Duration ttl, bool counted = false);
  // Lease counts and tiers go through these, which keep the ledger's pinned bytes (the bytes of a tenant's
  // leased blocks in host memory): the first lease on a host block counts it, the last one to end
  // uncounts it, and a leased block that enters or leaves host memory is counted or uncounted.
  void PinEntryLocked(EntryHandle h);
  uint32_t UnpinEntryLocked(EntryHandle h);  // returns the entry's lease count after
  void SetTierLocked(EntryHandle h, Tier tier);
  void AddPinnedLocked(const Entry& e, bool add);
  // Whether one more lease on entry `h` is allowed by its tenant's pinned bound (a block outside host
  // memory always is), and whether `e` may be (adds_bytes: newly) pinned in host memory.
  bool MayPinLocked(EntryHandle h) const;
  bool MayPinInHostLocked(const Entry& e, bool adds_bytes) const;
  BlockAccess AccessOf(const Entry& e) const;
  BlockInfo InfoOf(const Entry& e) const;
  static bool Matches(const Entry& e, const BlockFilter& f);
  EventBlockInfo EventInfoOf(const Entry& e) const;
  // OnCleared, then OnStored for every committed block (no-op without a sink).
  void RestateToSinkLocked();

  BlockStoreOptions options_;
  Clock* clock_;
  // Host memory: its slab allocator, policy and gauges (stored_blocks, stored_bytes).
  std::unique_ptr<MemoryTier> host_;
  std::unique_ptr<EvictionPolicy> disk_policy_;   // disk entries
  std::unique_ptr<DiskTier> disk_;                // null without a disk tier
  uint64_t lease_buffer_used_ = 0;                // guarded by mu_; bytes of every Lease::owned
  std::atomic<uint64_t> disk_capacity_{0};        // the budget in force (disk_capacity_bytes()); written under mu_
  std::shared_ptr<DeviceTierMemory> hbm_memory_;  // null without an HBM tier
  // The HBM tier (slots are offsets into hbm_memory_; gauges hbm_blocks, hbm_bytes); null without one.
  std::unique_ptr<MemoryTier> hbm_;
  BlockStoreStats stats_;

  mutable TimedMutex mu_;  // a std::mutex (ThreadSanitizer sees it, HOUSE_STYLE §8) that can time its holds
  // The committed entries of index_, sharded (Lookup without a lease); written under mu_.
  std::unique_ptr<CommittedIndex> committed_;
  // The earliest lease or reservation deadline (unix ns; INT64_MAX: none), so that a lookup without a
  // lease takes mu_ only when one is due. Written under mu_; may be early (a stale heap top), never late.
  std::atomic<int64_t> next_deadline_ns_{INT64_MAX};
  // When a lookup without a lease last expired (unix ns); such lookups expire at most this often.
  std::atomic<int64_t> last_lookup_expiry_ns_{INT64_MIN / 2};
  static constexpr std::chrono::nanoseconds kLookupExpiryInterval = std::chrono::milliseconds(10);
  absl::flat_hash_map<BlockKey, EntryHandle> index_;  // guarded by mu_
  std::vector<Entry> entries_;                        // guarded by mu_
  std::vector<EntryHandle> free_entries_;             // guarded by mu_
  RequestHistory request_history_;                    // guarded by mu_; disk admission only
  CapabilityTable<Lease> leases_;                     // guarded by mu_
  CapabilityTable<Reservation> reservations_;         // guarded by mu_
  // tag_prefix() of every reservation in reservations_ -> its id; guarded by mu_.
  absl::flat_hash_map<uint64_t, CapabilityId> reservation_tag_prefixes_;
  // Each tenant's stored and pinned bytes, quota and pinned bound, the last refusal; guarded by mu_.
  std::unique_ptr<TenantLedger> tenants_;
  BlockEventSink* sink_ = nullptr;  // guarded by mu_; not owned
  bool sink_muted_ = false;         // guarded by mu_; Evict of everything
  std::atomic<bool> draining_{false};
  uint64_t spill_bytes_ = 0;  // guarded by mu_: bytes of every Entry::in_transit the writer has not finished
  // Allocate waits on it (with mu_) while the disk writer is behind; the writer notifies it as it
  // finishes a write. Allocate waits at most kSpillWait.
  std::condition_variable_any spill_done_cv_;
  static constexpr std::chrono::milliseconds kSpillWait{500};

  // Lock order: mu_ before disk_queue_mu_; the writer holds neither while it does disk I/O.
  std::mutex disk_queue_mu_;
  std::condition_variable disk_queue_cv_;  // the writer waits for work on it
  std::condition_variable disk_idle_cv_;   // WaitForDiskWrites waits on it
  std::deque<DiskOp> disk_queue_;          // guarded by disk_queue_mu_
  bool disk_writer_busy_ = false;          // guarded by disk_queue_mu_: an op taken off the queue is running
  bool disk_writer_stop_ = false;          // guarded by disk_queue_mu_
  std::thread disk_writer_;                // runs DiskWriterLoop while there is a disk tier
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_BLOCK_STORE_H_
