// The client side of the UCX bulk data plane (docs/architecture.md "UCX data plane"): the block client,
// which client_lib's Client drives.
#ifndef KVTIER_UCX_UCX_CLIENT_H_
#define KVTIER_UCX_UCX_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/common/capability_id.h"

namespace kvtier::ucx {

// One UCX (ucp) context and worker (UcxWorker) with its own progress thread, and endpoints to servers' UCX
// listeners. Callers' threads never touch UCX: they queue commands that the progress thread runs, and
// wait for completions with a deadline. Payloads move as tagged messages straight between the caller's
// buffers and the server's slots (kvtier/ucx/ucx_messages.h): rendezvous, so single-copy over shared
// memory + cma and one stream over tcp.
//
// Error handling: endpoints use UCP_ERR_HANDLING_MODE_NONE (PEER mode would turn off cma's single copy
// in UCX 1.13), so a dead server is noticed by deadline, not by UCX: a transfer that is not complete at
// its deadline has its unmatched receives cancelled and its endpoint force-closed (which completes its
// sends and receives), and is reported with endpoint_failed; the caller then reconnects after a
// backoff. Only after every request of a transfer completed does the call return, so UCX never touches
// a caller's buffer after it; should UCX fail to complete a request even after the force close (not
// seen in tests), the call returns after a further grace period and counts it in abandoned_requests().
// Thread-safety: all methods may be called concurrently.
class UcxClient {
 public:
  using EndpointId = uint64_t;

  // `transports`: UCX_TLS of this context ("" = UCX's default, from the environment). `get_lanes`: how
  // many threads receive the blocks of one Get side by side (see Get); at least 1. They start on the
  // first Get of more than one block.
  // Errors: Unavailable (UCX could not start).
  static absl::StatusOr<std::unique_ptr<UcxClient>> Create(const std::string& transports, int get_lanes = 2);
  ~UcxClient();

  // Connects to the UCX listener at host:port and completes a hello round trip before `deadline`,
  // presenting `ticket` (a session ticket of OpenUcxSession; "" = none). The get lanes' endpoints to
  // that server present the same ticket (or the one of SetTicket). Returns the endpoint and the node id
  // the server reported. Errors: PermissionDenied (the server refused the hello: no, unknown or expired
  // ticket; the message says which), Unavailable, DeadlineExceeded.
  struct Connection {
    EndpointId endpoint = 0;
    std::string node_id;
    bool takes_leases = false;  // the server answers Lease on this endpoint
    bool takes_puts = false;    // the server answers Allocate and Commit on this endpoint
    bool commits_puts = false;  // the server takes PutAndCommit's commit on this endpoint
  };
  absl::StatusOr<Connection> Connect(const std::string& host_port, absl::Time deadline, const std::string& ticket = "");
  // Replaces the ticket that new get-lane endpoints to the server of `endpoint` present (a renewed
  // session); endpoints already open stay authenticated. Unknown ids, or endpoints opened without a
  // ticket, are ignored. Thread-safe.
  void SetTicket(EndpointId endpoint, const std::string& ticket);
  // Force-closes an endpoint (transfers on it fail). Unknown ids are ignored.
  void Close(EndpointId endpoint);

  enum class ItemStatus : uint8_t { kOk, kUnavailable, kError };
  struct TransferResult {
    std::vector<ItemStatus> items;  // per item: kUnavailable = the server could not send or store it
    bool endpoint_failed = false;   // an error or the deadline: the endpoint is no longer trusted
    bool on_lanes = false;          // Get: the blocks went to the get lanes (a server on this node)
  };

  // Asks the server to send block `indices[j]` of lease `lease_id` into `buffers[j]` (borrowed until
  // return) and waits until every block arrived or `deadline`. A block counts as kOk only with exactly
  // buffers[j].size() bytes. release: the server releases the lease after its last send (after a Get
  // that failed it may not have: release it over gRPC).
  // on_arrival(j), if set, runs as soon as block j arrived (kOk), while others are still in flight, e.g.
  // to verify its checksum; not for blocks that arrive after the deadline.
  // Lanes: a Get of more than one block from a server on this node (the endpoint has a single-copy
  // rendezvous lane: cma, knem or xpmem) is split over the get lanes, threads that each have their own
  // UCX worker and their own endpoint to the server (connected on first use) and ask for their share
  // with their own kGet. Each lane receives its blocks (over cma the receiver's kernel does the copy, on
  // that lane's thread) and runs on_arrival on each right after, while it is in that core's cache; so
  // the copies and checks of one Get run on several cores, and on_arrival may run for different j at
  // once, on lane threads (it must be thread-safe across j). With release the client then sends the
  // server a kRelease. Any other Get runs on the progress thread and on_arrival on the caller's thread:
  // over tcp the copies are the kernels' socket copies on both sides, and two lanes over loopback tcp
  // made a 2 MiB x 8 get slower on 2 cores (4.15 -> 2.55 GB/s), competing with the server's sender.
  TransferResult Get(EndpointId endpoint, const CapabilityId& lease_id, bool release, std::span<const uint32_t> indices,
                     std::span<const std::span<std::byte>> buffers, absl::Time deadline,
                     const std::function<void(size_t)>& on_arrival = {});

  // Sends `blocks[j]` (borrowed until return) into block `indices[j]` of reservation `reservation_id` and
  // waits for the server's kPutDone (every receive finished) or `deadline`. kOk: the server has all the
  // bytes of that block (Commit still verifies them).
  // meanwhile, if set, runs on the calling thread while the bytes move (e.g. the commit's checksums).
  TransferResult Put(EndpointId endpoint, const CapabilityId& reservation_id, std::span<const uint32_t> indices,
                     std::span<const std::span<const std::byte>> blocks, absl::Time deadline,
                     const std::function<void()>& meanwhile = {});

  // Put and its commit in one exchange (a server that set kCommitsPuts): sends the blocks as Put does,
  // runs `make_commit` on the calling thread while they move (it returns a serialized
  // kvtier.v1.CommitRequest of the reservation, e.g. with the checksums it computed), sends that right
  // after the last send as a kPutCommit, and waits for the server's answer, which comes once every
  // block landed and was checked (no kPutDone, no second round trip), or `deadline`. transfer.items: kOk
  // for a block whose send completed (the commit's results say what was stored). commit: the server's
  // serialized CommitResponse. Errors of commit: as Commit's; FailedPrecondition from a server that
  // takes no kPutCommit. transfer.endpoint_failed is false on a refusal (the server answered).
  struct PutCommitResult {
    TransferResult transfer;
    absl::StatusOr<std::string> commit;
  };
  PutCommitResult PutAndCommit(EndpointId endpoint, const CapabilityId& reservation_id,
                               std::span<const uint32_t> indices, std::span<const std::span<const std::byte>> blocks,
                               absl::Time deadline, const std::function<std::string()>& make_commit);

  // Takes a lease over UCX instead of gRPC: sends `request` (a serialized kvtier.v1.ReadRequest) as a
  // kLease and returns the server's answer (a serialized kvtier.v1.ReadResponse) by `deadline`. Only
  // for a Connection with takes_leases. Errors: the server's own code and message when it refused the
  // request (e.g. InvalidArgument for a block above its limits.max_block_bytes), Unavailable (unknown or
  // failed endpoint, or a refusal from a server that sends no code), DeadlineExceeded (no answer in
  // time: the endpoint is no longer trusted; a lease the server took anyway ends at its expiry).
  absl::StatusOr<std::string> Lease(EndpointId endpoint, std::string request, absl::Time deadline);
  // The two phases of a put over UCX, as Lease is for a get: a serialized kvtier.v1.AllocateRequest
  // (kAllocate) or CommitRequest (kCommit, after the batch's Put returned) in, the server's
  // AllocateResponse or CommitResponse out. Only for a Connection with takes_puts. Errors as Lease's;
  // on DeadlineExceeded a reservation the server took anyway ends at its reservation_ttl, and a commit
  // may or may not have happened (a later put of the same keys finds them present, or reserves them
  // again).
  absl::StatusOr<std::string> Allocate(EndpointId endpoint, std::string request, absl::Time deadline);
  absl::StatusOr<std::string> Commit(EndpointId endpoint, std::string request, absl::Time deadline);

  uint64_t abandoned_requests() const;

  struct Impl;

 private:
  explicit UcxClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::ucx

namespace kvtier::client {
using ucx::UcxClient;  // the name client_lib knows it by
}  // namespace kvtier::client

#endif  // KVTIER_UCX_UCX_CLIENT_H_
