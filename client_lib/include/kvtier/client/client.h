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
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/hash_ring.h"
#include "kvtier/common/namespace.h"

namespace kvtier::client {

struct ClientOptions {
  // Static membership: "host:port" (the member reports its node id when the client connects) or
  // "node_id=host:port" (id given; the member need not be up at connect time). Required, non-empty.
  std::vector<std::string> members;
  uint32_t virtual_nodes = HashRing::kDefaultVirtualNodes;  // ring points per member (DESIGN.md §2)
  absl::Duration rpc_timeout = absl::Seconds(2);        // deadline of every RPC; a slower owner is a miss
  absl::Duration connect_timeout = absl::Seconds(5);    // deadline of the node-id query at Connect
  uint64_t max_message_bytes = 80ULL << 20;             // gRPC message limit; must match the servers'
  uint64_t stream_chunk_bytes = 1ULL << 20;             // bytes per streamed write message
  uint32_t max_blocks_per_request = 4096;               // larger batches are split per owner
  // Blocks per put batch to one owner (DESIGN.md §8's transfer batch size). Batches to one owner run in
  // order, each committed before the next is reserved, so a put larger than an owner's free memory
  // streams through it. Default 64.
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

  // Errors: InvalidArgument naming the field.
  absl::Status Validate() const;
};

// What a member is, as this client sees it.
struct MemberInfo {
  std::string node_id;   // ring key; empty when the member never answered
  std::string address;   // host:port
  bool in_ring = false;  // false: the id is unknown, so no block maps to it
  // Data path of this member's block bytes now: "ucx" (endpoint up), "grpc", or "none" (transport
  // "ucx" and no working endpoint).
  std::string transport = "grpc";
};

// Outcome of one block of a Get.
enum class GetResult : uint8_t {
  kHit,              // the bytes arrived and matched their checksum
  kMiss,             // the owner does not hold the block
  kMissFromError,    // the owner failed, timed out or was unreachable: counted as a miss from error
  kChecksumMismatch, // bytes arrived but did not match the checksum: discarded, counted, never returned
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
  uint32_t prefix_blocks = 0;        // leading blocks present (on every shard); tokens = this x block_tokens
  std::vector<bool> present;         // per block
  uint32_t blocks_from_errors = 0;   // blocks whose owner could not answer (counted as misses)
};

// Monotonic counters of this client (DESIGN.md §5 hit accounting). Each block is counted once per call,
// whatever the number of owners asked, so hit <= asked always holds.
struct ClientStats {
  std::atomic<uint64_t> lookups{0};               // LookupPrefix calls
  std::atomic<uint64_t> lookup_blocks{0};         // blocks asked of LookupPrefix
  std::atomic<uint64_t> prefix_hit_blocks{0};     // blocks in the returned leading runs
  std::atomic<uint64_t> prefix_hit_tokens{0};
  std::atomic<uint64_t> get_blocks{0};            // blocks asked of Get
  std::atomic<uint64_t> retrieve_hit_blocks{0};   // blocks that arrived intact
  std::atomic<uint64_t> retrieve_hit_tokens{0};
  std::atomic<uint64_t> retrieve_hit_bytes{0};
  std::atomic<uint64_t> put_blocks{0};            // blocks asked of Put
  std::atomic<uint64_t> put_stored_blocks{0};
  std::atomic<uint64_t> put_stored_bytes{0};
  std::atomic<uint64_t> put_rejected_blocks{0};   // kNoSpace
  std::atomic<uint64_t> misses_from_errors{0};    // blocks turned into misses because an owner failed
  std::atomic<uint64_t> rpc_errors{0};            // RPCs that failed (each may cover many blocks)
  std::atomic<uint64_t> checksum_failures{0};     // blocks whose bytes failed verification
  std::atomic<uint64_t> ucx_get_blocks{0};        // blocks that arrived intact over UCX
  std::atomic<uint64_t> ucx_put_blocks{0};        // blocks whose bytes the server took over UCX
  std::atomic<uint64_t> ucx_endpoint_failures{0}; // UCX endpoints dropped after an error or a missed deadline
  std::atomic<uint64_t> ucx_connects{0};          // UCX endpoints established (the first and reconnects)
};

// Talks to every member over gRPC (one channel each, reused), places blocks with a HashRing of the
// members' node ids, and sends one batched RPC per owner in parallel. Block bytes go over UCX where
// options.transport allows (one endpoint per member, created once and reused; one UCX worker with its
// own progress thread per client), else over gRPC streams. A dead or slow owner becomes misses
// within rpc_timeout, never a hang or an error of the call; each such block is counted in
// misses_from_errors and reported per block.
// Thread-safety: all methods may be called concurrently from many threads.
class Client {
 public:
  // Connects to the members and learns the node ids they report. Members that give no id and do not
  // answer within connect_timeout stay out of the ring (see members()).
  // Errors: InvalidArgument (bad options), Unavailable (no member could be placed on the ring).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  // How many leading blocks of `fingerprints` (a ChainFingerprints chain of `ns`) the cluster holds, on
  // every TP shard of ns.layout. One batched existence query per owner, in parallel; takes no lease.
  // Errors: InvalidArgument (invalid namespace).
  absl::StatusOr<LookupResult> LookupPrefix(const Namespace& ns, std::span<const Fingerprint> fingerprints);

  // Fetches shard `shard` of each block into `buffers[i]` (caller-owned host memory, borrowed for the
  // call, each exactly ns.layout.ShardBytes() long). Only kHit buffers hold valid bytes afterwards.
  // Errors: InvalidArgument (sizes or counts disagree, shard >= tp_size).
  absl::StatusOr<std::vector<GetResult>> Get(const Namespace& ns, std::span<const Fingerprint> fingerprints,
                                             uint32_t shard, std::span<const std::span<std::byte>> buffers);

  // Stores shard `shard` of each block from `blocks[i]` (borrowed for the call, each ShardBytes() long)
  // with a two-phase put per owner (allocate, write, commit with XXH3-64 checksums).
  // `first_block_index` is the index of fingerprints[0] in its prompt's chain (e.g. the hit length when
  // storing the blocks after a hit); servers give it to prefix-aware eviction policies.
  // Errors: InvalidArgument (sizes or counts disagree, shard >= tp_size).
  absl::StatusOr<std::vector<PutResult>> Put(const Namespace& ns, std::span<const Fingerprint> fingerprints,
                                             uint32_t shard, std::span<const std::span<const std::byte>> blocks,
                                             uint32_t first_block_index = 0);

  const ClientStats& stats() const;
  std::vector<MemberInfo> members() const;
  const HashRing& ring() const;

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

const char* GetResultName(GetResult r);
const char* PutResultName(PutResult r);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_CLIENT_H_
