// The server side of the UCX bulk data plane (DESIGN.md §4, docs/architecture.md "UCX data plane"):
// the block server.
#ifndef KVTIER_UCX_UCX_SERVER_H_
#define KVTIER_UCX_UCX_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/common/principal.h"
#include "kvtier/ucx/host_block_source.h"

namespace kvtier::ucx {

struct UcxServerOptions {
  std::string listen_address;  // host:port; port 0 = the kernel picks
  std::string node_id;         // answered to a client's hello
  std::string transports;      // UCX_TLS ("" = UCX's default); must include tcp
  // A send or receive unfinished after this is cancelled and its pin dropped; sooner when the lease
  // or reservation it pins expires first.
  absl::Duration transfer_timeout = absl::Seconds(10);
  // Connections to the listener port that UCX never turned into a connection request are reset after
  // this, and a host's oldest beyond the limit at once (PendingConnectionReaper).
  absl::Duration pending_connection_timeout = absl::Seconds(10);
  uint64_t max_pending_connections_per_host = 64;
  // The control calls the hello reply offers (kTakesLeases: kLease; kTakesPuts: kAllocate and kCommit),
  // answered through the source's Lease, Allocate and Commit. Off: such a call is answered
  // FAILED_PRECONDITION. Default: both on.
  bool offer_leases = true;
  bool offer_puts = true;
  // With offer_puts: the hello reply offers kCommitsPuts too (a kPutCommit commits its put batch once
  // the bytes landed, answered by one reply instead of kPutDone and a kCommit round trip). Off: a
  // kPutCommit is answered FAILED_PRECONDITION and clients commit after kPutDone. Default: on.
  bool offer_put_commit = true;
  // Threads that run the control calls (the store's lock, and the disk behind it, stay off the
  // progress thread). Default: 4.
  int call_threads = 4;
  // With tickets required (the cache server has tokens or TLS), an endpoint is served only after its
  // hello presented a ticket that `find_ticket` knows, and then as its principal. Not required: every
  // endpoint is served as an admin, as every gRPC call is without tokens.
  bool tickets_required = false;
  // The principal of a live session ticket (OpenUcxSession), or nullopt; called on the progress thread.
  // Required with tickets_required.
  std::function<std::optional<Principal>(std::string_view ticket)> find_ticket;
};

// A UCX (ucp) listener and one worker (UcxWorker) with its own progress thread, over a HostBlockSource.
// The source's host region is registered once (ucp_mem_map). Payloads move as tagged messages straight between leased
// or reserved slots and the network (kvtier/ucx/ucx_messages.h): a client's kGet makes the server ucp_tag_send_nbx each
// block from its pinned slot (PinForSend); a kPut makes it post ucp_tag_recv_nbx straight into the reserved slots
// (PinForReceive) and answer kPutDone when every receive finished. Leases, reservations and commits come over gRPC, or
// as kLease, kAllocate and kCommit (the source's Lease, Allocate, Commit).
//
// Protocol choice: tagged rendezvous on every transport. Measured here (TOOLCHAIN.md Part 2), tag_bw is
// ~3.7 GB/s over tcp and ~20 GB/s over shared memory + cma (single-copy: the receiver's kernel copies
// straight from the sender's buffer), while RMA is emulated over tcp (~0.25 GB/s put). One-sided RMA
// with a packed rkey would pay off only on a transport with native RMA (RDMA), which this machine lacks.
//
// Error handling: endpoints use UCP_ERR_HANDLING_MODE_NONE, because PEER mode turns off shared memory's
// single-copy (cma) rendezvous in UCX 1.13. A dead or stuck client is therefore detected by time: a
// send or receive still unfinished at its deadline (transfer_timeout, or the expiry of the lease or
// reservation it pins when that comes first) is cancelled (a receive not yet matched) or its endpoint
// is force-closed, which completes its requests or, for those UCX leaves uncompleted, lets them be
// abandoned shortly after; only then is its slot unpinned. So a writer that dies or stalls mid-put
// holds its keys no longer than its reservation_ttl. An endpoint UCX reports failed anyway (a broken
// tcp connection) is closed at once, its unmatched receives cancelled. A slot is never unpinned while
// UCX may still write it.
//
// Trust (docs/architecture.md "Security"): with tickets required (tokens or TLS on), an endpoint is
// served only after its kHello presented a live ticket of OpenUcxSession, and then as that ticket's
// principal: a kGet or kRelease of another tenant's lease, a kPut into another tenant's reservation or
// a kLease of another tenant's namespace is refused (the check is once per request, not per byte).
// Any other AM before a valid hello drops the message and closes the endpoint; a refused hello is
// answered kRefused and its endpoint closed shortly after. Put tags are keyed per endpoint
// (SessionPutTag), so a peer cannot slip bytes into another endpoint's put by guessing its tag. The
// plane has no encryption: a peer that can read the wire can read payloads and tickets.
// Thread-safety: Start/Shutdown/port from any thread; everything else runs on the progress thread,
// but for the control calls, which run on call_threads threads.
class UcxServer {
 public:
  // Errors: InvalidArgument (bad address), Unavailable (UCX could not start or listen).
  // `source` is borrowed and must outlive the server (Shutdown).
  static absl::StatusOr<std::unique_ptr<UcxServer>> Start(const UcxServerOptions& options, HostBlockSource& source);
  ~UcxServer();  // Shutdown()

  // Closes the listener and every endpoint (force), completes or cancels what is in flight, unpins its
  // slots and frees UCX. Idempotent. Must run before the source is destroyed.
  void Shutdown();

  int port() const;  // the bound listener port

  struct Impl;

 private:
  explicit UcxServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::ucx

#endif  // KVTIER_UCX_UCX_SERVER_H_
