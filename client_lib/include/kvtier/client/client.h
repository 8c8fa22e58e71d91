// Client: what an inference worker links to find, fetch and store KV blocks in a kvtier cluster.
#ifndef KVTIER_CLIENT_CLIENT_H_
#define KVTIER_CLIENT_CLIENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/client/device_buffer.h"
#include "kvtier/common/block_meta.h"
#include "kvtier/common/counters.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/hash_ring.h"
#include "kvtier/common/namespace.h"

namespace kvtier::client {

// Membership (docs/architecture.md "Membership"): the static list `members`, the addresses the DNS name
// `members_dns` resolves to, or both (their union; an address in both counts once). At least one is
// required. Every member is health-checked (grpc.health.v1); the ring holds the members that reported a
// node id and are not ejected.
struct ClientOptions {
  // Static membership: "host:port" (the member reports its node id when the client connects) or
  // "node_id=host:port" (id given; the member need not be up at connect time). Static members stay
  // members for the client's lifetime (health checks may take them out of the ring for a while).
  std::vector<std::string> members;
  // DNS membership: "NAME:PORT", e.g. "kvtier-headless.kvtier.svc.cluster.local:7400" (a Kubernetes
  // headless Service, docs/deploy.md). Each A or AAAA record is a member at PORT (A records carry no
  // port, so all members of one name share it). Re-resolved every dns_refresh_interval: new addresses
  // are asked their node id and join the ring; addresses gone from the answer leave it. "" = none.
  std::string members_dns;
  // DNS servers to ask for members_dns: "" = the system's (/etc/resolv.conf, after /etc/hosts), else a
  // comma-separated list of "IP", "IP:PORT" or "[IPv6]:PORT" (e.g. "127.0.0.1:5353"), asked directly
  // with c-ares, any port; NAME is then fully qualified (no search domains) and /etc/hosts is not read.
  // Default "".
  std::string dns_server;
  // How often members_dns is resolved again. Default 5 s.
  absl::Duration dns_refresh_interval = absl::Seconds(5);
  // Deadline of one resolution (every retry included). A resolution that fails (no answer in time, a
  // server error) changes nothing; an answer that the name has no record removes every DNS member.
  // Default 2 s.
  absl::Duration dns_timeout = absl::Seconds(2);
  // Health checks: every member is asked grpc.health.v1 Check("") this often, with this deadline. A
  // member that fails (not SERVING, an RPC error or no answer in time) unhealthy_threshold checks in a
  // row is ejected from the ring; it returns after healthy_threshold passing checks in a row (asked its
  // node id again first, since a restarted server may report another). An ejected member's blocks map
  // to the next members clockwise (misses at first, never errors). So a dead member leaves the ring
  // within about unhealthy_threshold x health_check_interval + health_check_timeout.
  // The ring is never emptied: an ejection that would leave no member in the ring waits.
  // Defaults: every 1 s, 1 s deadline, ejected after 3 failures, back after 2 passes.
  absl::Duration health_check_interval = absl::Seconds(1);
  absl::Duration health_check_timeout = absl::Seconds(1);
  uint32_t unhealthy_threshold = 3;
  uint32_t healthy_threshold = 2;
  uint32_t virtual_nodes = HashRing::kDefaultVirtualNodes;  // ring points per member (DESIGN.md §2)
  // Deadline of every call and RPC; a slower owner is a miss. LookupPrefix and Get return within
  // rpc_timeout of their start: their RPCs get it less a reserve (2%, between 2 and 20 ms) for
  // assembling the result. Default 2 s.
  absl::Duration rpc_timeout = absl::Seconds(2);
  absl::Duration connect_timeout = absl::Seconds(5);  // deadline of the node-id query at Connect
  uint64_t max_message_bytes = 80ULL << 20;           // gRPC message limit; must match the servers'
  uint64_t stream_chunk_bytes = 1ULL << 20;           // bytes per streamed write message
  uint32_t max_blocks_per_request = 4096;             // larger batches are split per owner
  // Blocks per put batch to one owner (DESIGN.md §8's transfer batch size). Batches to one owner start
  // in order, two at a time (the next one reserved and sent while the last one commits), so a put
  // larger than an owner's free memory streams through it. Default 64.
  uint32_t put_batch_blocks = 64;
  // Blocks of a namespace whose shard is larger are refused up front (InvalidArgument), before any RPC.
  // Default 64 MiB, the servers' default limits.max_block_bytes.
  uint64_t max_block_bytes = 64ULL << 20;
  // Data path of block bytes (docs/architecture.md "UCX data plane"): "auto" (UCX when the member
  // advertises it and this client can connect, else gRPC bytes), "grpc", or "ucx" (UCX only: blocks of
  // a member without a working UCX endpoint are misses from error / kError). Control stays on gRPC.
  std::string transport = "auto";
  std::string ucx_transports;  // UCX_TLS of this client's UCX context; "" = UCX's default (the environment)
  // After a UCX endpoint failed (error or missed deadline), the next call at least this much later
  // reconnects; calls meanwhile use gRPC bytes ("auto") or fail ("ucx"). Default 1 s.
  absl::Duration ucx_reconnect_backoff = absl::Seconds(1);
  // Threads that receive the blocks of one UCX get from a member on this node side by side, each with its
  // own UCX worker and endpoint per member, checking each block's checksum right after it landed, while
  // it is in that core's cache (docs/architecture.md "UCX data plane"). Default 2: the copies (cma, done
  // by the receiver's kernel) and the checks of a batch then run on two cores. At least 1, at most 64.
  int ucx_get_lanes = 2;

  // Security of the gRPC channels (docs/config.md "Client options", docs/architecture.md "Security").
  // TLS when tls_ca_file is set: PEM CA certificate(s) that sign the servers' certificates. "" (default):
  // plaintext.
  std::string tls_ca_file;
  // PEM client certificate and key for mutual TLS (servers with tls.require_client_cert); both or
  // neither; need tls_ca_file. Default "".
  std::string tls_cert_file;
  std::string tls_key_file;
  // Name the servers' certificates must carry when it is not the host of the member addresses (e.g.
  // members dialled by IP, certificates issued for "kvtier.kvtier.svc"). Default "": the address's host.
  std::string tls_server_name;
  // Bearer token sent as `authorization: Bearer <token>` on every RPC (servers with `auth`): a worker
  // token of the tenant of every namespace this client uses. Default "": none. Connect reads the TLS
  // files; their errors (NotFound, InvalidArgument) name the field.
  std::string auth_token;

  // ---- Replication (docs/architecture.md "Replication"). The owners of a block are the first
  // R distinct members clockwise on the ring (HashRing::Owners). Put stores a block on its primary
  // owner within the call and on the other owners from a bounded background queue; Get and
  // LookupPrefix ask the primary and fail over to the next owner within the call's rpc_timeout.
  // Replication factor R of every namespace without an entry in replication_overrides; 1..16, and at
  // most the number of members in the ring is used (a ring of 2 members keeps 2 copies at R = 3).
  // Default 1 (no replicas).
  uint32_t replication_factor = 1;
  // Per-namespace R, keyed by (tenant, model) rather than by a Namespace field: Namespace is hashed
  // into fingerprints, and R must be changeable without changing a single block key. The first entry
  // whose tenant equals the namespace's tenant and whose model is equal or "" (every model of that
  // tenant) wins. Default: none.
  struct ReplicationOverride {
    std::string tenant;               // required
    std::string model;                // "" = every model of `tenant`
    uint32_t replication_factor = 1;  // 1..16
  };
  std::vector<ReplicationOverride> replication_overrides;
  // Hot blocks: a block at depth < hot_depth of its prompt's chain (the first blocks of a shared system
  // prompt, read by nearly every request) becomes hot when a Get of this client hits it: a copy is then
  // queued for hot_read_replicas owners beyond its R (the next members clockwise), and later reads start
  // at one of its R + hot_read_replicas owners in turn (round robin per call), falling back to the
  // primary on a miss and to the others on an error, so that one owner is not every request's
  // bottleneck. Shallow blocks that are never read again get no extra copy. Depth is
  // first_block_index + i for Get, and i for LookupPrefix (its chain starts at block 0). This client
  // remembers its 65,536 most recently promoted hot blocks.
  // Defaults: 0 extra replicas (off), depth 4.
  uint32_t hot_read_replicas = 0;
  uint32_t hot_depth = 4;
  // Bytes of replica blocks waiting in the background queue (each block's bytes are copied there,
  // since Put borrows the caller's buffers only for the call). A Put whose replicas do not fit stores
  // its primary copies as usual and counts its replica blocks in replica_put_failures.
  // Default 256 MiB; must be > 0.
  uint64_t replica_queue_bytes = 256ULL << 20;
  // Hinted handoff: replica blocks whose owner is down (not in the ring, RPC error or timeout), and
  // with R >= 2 the blocks whose primary failed within Put, wait in a queue of up to hint_queue_bytes
  // (the oldest are dropped beyond it, counted in hints_dropped), and are delivered when the owner
  // answers again: tried every hint_retry_interval while the owner is in the ring, and at once after
  // any successful replica put to it. 0 bytes = no hints (failed replica puts are dropped).
  // Defaults: 256 MiB, 1 s.
  uint64_t hint_queue_bytes = 256ULL << 20;
  absl::Duration hint_retry_interval = absl::Seconds(1);

  // Errors: InvalidArgument naming the field.
  absl::Status Validate() const;
};

// Health of a member as this client's checks see it.
enum class MemberHealth : uint8_t {
  kUnknown,  // not checked yet
  kHealthy,  // the last check passed (or failed fewer than unhealthy_threshold times in a row)
  kEjected,  // failed unhealthy_threshold checks in a row: out of the ring until it passes again
};

// What a member is, as this client sees it.
struct MemberInfo {
  std::string node_id;    // ring key; empty when the member never answered
  std::string address;    // host:port
  bool from_dns = false;  // true: found through members_dns (and leaves when its record goes)
  // false: the id is unknown, the member is ejected, or another member reports the same id first.
  bool in_ring = false;
  MemberHealth health = MemberHealth::kUnknown;
  uint32_t consecutive_failures = 0;  // failed health checks in a row (0 after a pass)
  std::string last_health_error;      // why the last failed check failed; "" when it passed
  // Data path of this member's block bytes into host buffers now: "ucx" (endpoint up), "grpc", or "none"
  // (transport "ucx" and no working endpoint). Device buffers may take NCCL (Client::GetIntoDevice).
  std::string transport = "grpc";
};

// One sample of a server's counters, as its admin GetStats RPC answers it: the list its /metrics serves
// (docs/architecture.md "Counters"), every component's counters included.
struct ServerCounter {
  std::string name;  // as /metrics writes the sample: the family, then its labels in braces
  uint64_t value = 0;
  CounterKind kind = CounterKind::kCounter;
};

// What one member answered to Client::ServerStats.
struct MemberStats {
  std::string address;  // host:port, as in members()
  std::string node_id;  // the id the member answered with; when it failed, the id known from before ("" if none)
  // OK, or why this member gave no counters: Unavailable or DeadlineExceeded (down, slow), Unauthenticated,
  // PermissionDenied (GetStats is an admin RPC: a worker token is refused).
  absl::Status status;
  std::vector<ServerCounter> counters;  // every sample, in the server's order; empty unless status is OK
};

// Outcome of one block of a Get.
enum class GetResult : uint8_t {
  kHit,               // the bytes arrived and matched their checksum
  kMiss,              // the owner does not hold the block
  kMissFromError,     // the owner failed, timed out or was unreachable: counted as a miss from error
  kChecksumMismatch,  // bytes arrived but did not match the checksum: discarded, counted, never returned
};

// Outcome of one block of a Put.
enum class PutResult : uint8_t {
  kStored,          // committed by this call
  kAlreadyPresent,  // the owner had it (its recency was refreshed)
  kInProgress,      // another writer is storing it now
  kNoSpace,         // the owner had nothing evictable (RESOURCE_EXHAUSTED there)
  kError,           // the owner failed, timed out or was unreachable (counted)
};

// Result of a longest-prefix lookup.
struct LookupResult {
  uint32_t prefix_blocks = 0;       // leading blocks present (on every shard); tokens = this x block_tokens
  std::vector<bool> present;        // per block
  uint32_t blocks_from_errors = 0;  // blocks whose owner could not answer (counted as misses)
};

// Options of one Put beyond its blocks.
struct PutOptions {
  // The index of fingerprints[0] in its prompt's chain (see Client::Put).
  uint32_t first_block_index = 0;
  // Empty, or one per fingerprint: the engine's metadata of each block (its own block hash, token ids,
  // LoRA id; kvtier/common/block_meta.h), borrowed for the call. The owners keep it with the blocks and
  // publish it in KV events, so that routers see kvtier's blocks in the engine's terms
  // (docs/events.md). A block whose parent_hash is empty gets the previous block's hash as its parent
  // (parent_hash below for the first). Replica copies are stored with the same metadata. Whether or not
  // it is given, the client sets each block's BlockMeta::parent_fingerprint (when the caller left it
  // unset) to the previous fingerprint of the call, and the first block's to parent_fingerprint below.
  std::span<const BlockMeta> block_meta;
  // The engine hash of the block before fingerprints[0] (when first_block_index > 0); empty: none.
  EngineBlockHash parent_hash;
  // kvtier's fingerprint of the block before fingerprints[0] (when first_block_index > 0); nullopt: not
  // known (that block's events then carry no parent fingerprint).
  std::optional<Fingerprint> parent_fingerprint;
};

// Monotonic counters of this client (DESIGN.md §5 hit accounting). Each block is counted once per call,
// whatever the number of owners asked, so hit <= asked always holds.
struct ClientStats {
  std::atomic<uint64_t> lookups{0};            // LookupPrefix calls
  std::atomic<uint64_t> lookup_blocks{0};      // blocks asked of LookupPrefix
  std::atomic<uint64_t> prefix_hit_blocks{0};  // blocks in the returned leading runs
  std::atomic<uint64_t> prefix_hit_tokens{0};
  std::atomic<uint64_t> get_blocks{0};           // blocks asked of Get
  std::atomic<uint64_t> retrieve_hit_blocks{0};  // blocks that arrived intact
  std::atomic<uint64_t> retrieve_hit_tokens{0};
  std::atomic<uint64_t> retrieve_hit_bytes{0};
  std::atomic<uint64_t> put_blocks{0};  // blocks asked of Put
  std::atomic<uint64_t> put_stored_blocks{0};
  std::atomic<uint64_t> put_stored_bytes{0};
  std::atomic<uint64_t> put_rejected_blocks{0};    // kNoSpace
  std::atomic<uint64_t> misses_from_errors{0};     // blocks turned into misses because an owner failed
  std::atomic<uint64_t> rpc_errors{0};             // RPCs that failed (each may cover many blocks)
  std::atomic<uint64_t> checksum_failures{0};      // blocks whose bytes failed verification
  std::atomic<uint64_t> ucx_get_blocks{0};         // blocks that arrived intact over UCX
  std::atomic<uint64_t> ucx_lane_get_blocks{0};    // of those, blocks the get lanes received (ucx_get_lanes)
  std::atomic<uint64_t> ucx_leases{0};             // read leases taken over UCX (kLease)
  std::atomic<uint64_t> ucx_put_blocks{0};         // blocks whose bytes the server took over UCX
  std::atomic<uint64_t> ucx_endpoint_failures{0};  // UCX endpoints dropped after an error or a missed deadline
  std::atomic<uint64_t> ucx_connects{0};           // UCX endpoints established (the first and reconnects)
  std::atomic<uint64_t> ring_changes{0};           // rings swapped in after Connect (members joined or left)
  std::atomic<uint64_t> dns_resolutions{0};        // members_dns resolutions that answered (records or none)
  std::atomic<uint64_t> dns_failures{0};           // resolutions that failed (the members were kept)
  std::atomic<uint64_t> health_check_failures{0};  // failed health checks, all members
  std::atomic<uint64_t> members_ejected{0};        // ejections (a member ejected twice counts twice)
  // Replication, in blocks (one block on one replica owner counts once per owner).
  std::atomic<uint64_t> replica_puts{0};  // replica blocks an owner stored (or already had)
  // Replica blocks not stored by an attempt: queue full, owner down or failing, no space there. Those
  // of a down owner are then hinted (hints_queued) when the hint queue is enabled.
  std::atomic<uint64_t> replica_put_failures{0};
  // Replica blocks put in the hinted-handoff queue: their owner was down, or had the block reserved and
  // not yet committed (asked again later).
  std::atomic<uint64_t> hints_queued{0};
  std::atomic<uint64_t> hints_delivered{0};  // hinted blocks an owner later stored (or had)
  std::atomic<uint64_t> hints_dropped{0};    // hinted blocks dropped (oldest first) over hint_queue_bytes
  // Blocks of Get (hits) and LookupPrefix (present) found on an owner other than the first one asked:
  // fail-over after an error, or a hot block's fall-back after a miss.
  std::atomic<uint64_t> replica_read_blocks{0};
  std::atomic<uint64_t> ucx_allocates{0};    // put reservations taken over UCX (kAllocate)
  std::atomic<uint64_t> ucx_commits{0};      // put commits over UCX (kCommit, or kPutCommit on the last message)
  std::atomic<uint64_t> nccl_get_blocks{0};  // blocks that arrived over NCCL into the caller's device buffers

  // Calls `visit` once per counter above, in declaration order: CounterInfo.name is the field's name,
  // help its one-line meaning, kind kCounter, no labels (the list is KVTIER_CLIENT_STATS_COUNTERS of
  // kvtier/client/field_lists.h; a field missing from it fails the build). The C API
  // (kvtier_client_stats_foreach) and the Python module (Client.stats()) iterate it.
  // Thread-safety: may run while the client counts (relaxed loads).
  void ForEach(const CounterVisitor& visit) const;
};

// Talks to every member over gRPC (one channel each, reused), places blocks with a HashRing of the
// members' node ids, and sends one batched RPC per owner in parallel. Block bytes go over UCX where
// options.transport allows (one endpoint per member, created once and reused; one UCX worker with its
// own progress thread per client), else over gRPC streams. A dead or slow owner becomes misses
// within rpc_timeout, never a hang or an error of the call; each such block is counted in
// misses_from_errors and reported per block.
//
// Errors: which answers of a member are per-block outcomes and which fail the call.
//  - Per block (the call returns OK): present or absent (kHit / kMiss, LookupResult::present),
//    checksum failures (kChecksumMismatch), already stored, being stored by another writer or no room
//    (kAlreadyPresent, kInProgress, kNoSpace), and every failure of the member to answer: unreachable,
//    dead, restarting, past the deadline, Unavailable, Cancelled, ResourceExhausted, Aborted, an
//    expired lease or reservation (kMissFromError / kError, LookupResult::blocks_from_errors). Asking
//    again later, or another owner, may succeed.
//  - The call's error: a member's refusal of the request itself, which no retry and no other member
//    would answer otherwise: InvalidArgument (e.g. a block above that member's
//    limits.max_block_bytes, which may be lower than this client's max_block_bytes, or a layout it
//    does not take), PermissionDenied (the token's tenant is not the namespace's) and Unauthenticated
//    (no token, or one the member does not know). The status carries the member's code and its
//    message, after the member and the RPC: "member node-1 (10.0.0.1:7400) refused Allocate:
//    namespace.layout: a block is 2097152 bytes, this server accepts at most 1048576". It is the
//    same over gRPC and UCX. When owners answer one call differently, the call still fails with the
//    first refusal; what other owners did stays done (a Put's blocks they stored stay stored and
//    counted). Replica puts in the background have no caller: a refused one is counted in
//    replica_put_failures and logged. With replication (ClientOptions::replication_factor), such a
// block is first asked of its other owners within the same rpc_timeout, and Put copies blocks to them
// from a background thread (one per client that replicates).
// Membership changes (DNS records, health ejections) are applied by one background thread per client,
// which builds a new ring and swaps it in atomically: a call uses the ring it started with throughout,
// so a change never makes a call fail; blocks whose owner changed are simply misses on the new owner.
// Thread-safety: all methods may be called concurrently from many threads.
class Client {
 public:
  // Resolves members_dns (when set), connects to the members and learns the node ids they report, then
  // starts the background refresher (DNS and health checks). Members that give no id and do not answer
  // within connect_timeout stay out of the ring until they answer a later health check (see members()).
  // Errors: InvalidArgument (bad options; two static members report one node id), Unavailable (no
  // member could be placed on the ring, e.g. members_dns did not resolve and there is no static member).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // Stops the refresher, waiting for its current round (at most dns_timeout + 2 x health_check_timeout).
  // No call may be in flight.
  ~Client();

  // How many leading blocks of `fingerprints` (a ChainFingerprints chain of `ns`) the cluster holds, on
  // every TP shard of ns.layout. One batched existence query per owner, in parallel; takes no lease.
  // Errors: InvalidArgument (invalid namespace, a block above max_block_bytes), or a member's refusal
  // of the request with its code (InvalidArgument, PermissionDenied, Unauthenticated; see the class
  // comment).
  absl::StatusOr<LookupResult> LookupPrefix(const Namespace& ns, std::span<const Fingerprint> fingerprints);

  // Fetches shard `shard` of each block into `buffers[i]` (caller-owned host memory, borrowed for the
  // call, each exactly ns.layout.ShardBytes() long). Only kHit buffers hold valid bytes afterwards.
  // `first_block_index` is the depth of fingerprints[0] in its prompt's chain (hot blocks, see
  // ClientOptions::hot_read_replicas). With replication, a block its first owner cannot serve (error,
  // timeout, checksum mismatch) is asked of the next owner within the same rpc_timeout.
  // Errors: InvalidArgument (sizes or counts disagree, shard >= tp_size, a block above
  // max_block_bytes), or a member's refusal of the request with its code (InvalidArgument,
  // PermissionDenied, Unauthenticated; see the class comment): then no buffer holds valid bytes.
  absl::StatusOr<std::vector<GetResult>> Get(const Namespace& ns, std::span<const Fingerprint> fingerprints,
                                             uint32_t shard, std::span<const std::span<std::byte>> buffers,
                                             uint32_t first_block_index = 0);

  // The direct half of a Get into GPU memory. Callers with device buffers use DeviceTransfer::GetToDevice
  // (device_transfer.h), which calls this first and fetches the blocks it leaves through pinned host
  // memory. Each block goes to the first owner its read plan asks (as Get's first attempt); where that
  // member has a data path that writes device memory itself (a member serving NCCL from its HBM tier,
  // docs/gpu.md; with transport "auto" only), the block is received straight into `buffers[i]` (device
  // memory of buffers[i].device, each ShardBytes() long, borrowed until this returns). Returns, per
  // block, whether it arrived in its buffer (true) or is left to the caller's host path (false: its
  // owner has no such path, does not hold it in its device tier, or failed; the buffer's bytes are then
  // undefined). Returns once the arrived bytes are in place on `stream` (a cudaStream_t; nullptr = the
  // device's default stream). Arrived blocks are counted in get_blocks and retrieve_hit_*; the others are not counted
  // here (the host Get that fetches them counts them). They are not re-checksummed (the member verified them on entry
  // to its device tier) and do not make blocks hot. Errors: InvalidArgument (as Get; a buffer whose size_bytes is not
  // ShardBytes()).
  absl::StatusOr<std::vector<bool>> GetIntoDevice(const Namespace& ns, std::span<const Fingerprint> fingerprints,
                                                  uint32_t shard, std::span<const DeviceBuffer> buffers,
                                                  void* stream = nullptr, uint32_t first_block_index = 0);

  // Stores shard `shard` of each block from `blocks[i]` (borrowed for the call, each ShardBytes() long)
  // with a two-phase put per owner (allocate, write, commit with XXH3-64 checksums).
  // `first_block_index` is the index of fingerprints[0] in its prompt's chain (e.g. the hit length when
  // storing the blocks after a hit); servers give it to prefix-aware eviction policies.
  // With replication the result is the primary owner's; the blocks the primary stored, refused or could
  // not take (kStored, kNoSpace, kError) are copied into the background queue for the other owners
  // (kAlreadyPresent and kInProgress blocks are not: their writer replicated them).
  // Time: owners in parallel, each owner's batches (put_batch_blocks) in order, two in flight at once:
  // the next batch's reservation and bytes overlap the last one's commit. Each step of a batch
  // (Allocate, the transfer, Commit; over UCX to a server that takes it, the transfer and its commit are
  // one step) has its own rpc_timeout, so a batch to a dead or stopped owner costs one to two
  // rpc_timeouts; an owner that fails a whole batch gets no more batches in this call (the rest of its
  // blocks are kError at once, but for the one batch already in flight beside it).
  // Errors: InvalidArgument (sizes or counts disagree, shard >= tp_size, a block above
  // max_block_bytes), or a member's refusal of the request with its code (InvalidArgument, e.g. a
  // block above its limits.max_block_bytes; PermissionDenied; Unauthenticated; see the class comment).
  absl::StatusOr<std::vector<PutResult>> Put(const Namespace& ns, std::span<const Fingerprint> fingerprints,
                                             uint32_t shard, std::span<const std::span<const std::byte>> blocks,
                                             uint32_t first_block_index = 0);
  // As above, with engine block metadata (PutOptions). Errors: as above, and InvalidArgument when
  // block_meta is neither empty nor one per fingerprint, or a block's metadata is past its limits (more
  // than kMaxBlockTokenIds token ids, a bytes hash outside 1..kMaxEngineHashBytes), before any RPC.
  absl::StatusOr<std::vector<PutResult>> Put(const Namespace& ns, std::span<const Fingerprint> fingerprints,
                                             uint32_t shard, std::span<const std::span<const std::byte>> blocks,
                                             const PutOptions& options);

  // Waits until the background replica queue is empty and no replica put is in flight (hinted blocks
  // waiting for their owner do not count), for at most `timeout`. Puts made meanwhile extend the wait.
  // Thread-safe. Errors: DeadlineExceeded (replicas still queued at `timeout`).
  absl::Status FlushReplicas(absl::Duration timeout);

  // Counters, updated concurrently (relaxed atomics).
  const ClientStats& stats() const;
  // Every member now: static ones first, in options order, then DNS ones in the order they were found.
  // A snapshot; members that left through DNS are gone from it.
  std::vector<MemberInfo> members() const;
  // Every member's server counters now (admin GetStats), asked of all members at once, each within
  // `timeout`; one entry per member, in members() order. Never fails as a whole: a member that does not
  // answer has its error in its entry. Blocks the caller up to `timeout`. Thread-safe.
  std::vector<MemberStats> ServerStats(absl::Duration timeout) const;
  // A copy of the ring now (node_ids() are the members in it). Later changes do not affect the copy.
  HashRing ring() const;
  // Incremented each time a new ring is swapped in; 0 after Connect.
  uint64_t ring_version() const;

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

const char* GetResultName(GetResult r);
const char* PutResultName(PutResult r);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_CLIENT_H_
