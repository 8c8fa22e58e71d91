// UcxServer::Impl: the block server's state, shared by its two source files: ucx_server.cc (set-up,
// the progress loop, endpoints, hellos and control calls) and ucx_server_transfers.cc (the sends and
// receives of kGet and kPut, their deadlines and completions). Private to the UCX library.
#ifndef KVTIER_UCX_SRC_UCX_SERVER_IMPL_H_
#define KVTIER_UCX_SRC_UCX_SERVER_IMPL_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "kvtier/common/capability_id.h"
#include "kvtier/common/principal.h"
#include "kvtier/ucx/host_block_source.h"
#include "kvtier/ucx/ucx_messages.h"
#include "kvtier/ucx/ucx_pending_connections.h"
#include "kvtier/ucx/ucx_server.h"
#include "ucx_control_calls.h"
#include "ucx_worker.h"

namespace kvtier::ucx {
// The block server's constants.
// Bytes of one get request's sends in flight at once (at least one block); see StartGet.
inline constexpr uint64_t kSendWindowBytes = 8ULL << 20;
inline constexpr absl::Duration kSweepInterval = absl::Milliseconds(100);
// How long a request of a force-closed endpoint may stay uncompleted by UCX before it is abandoned
// (see MaintenanceIfDue); at most transfer_timeout.
inline constexpr absl::Duration kAbandonGrace = absl::Milliseconds(250);
inline constexpr absl::Duration kShutdownDrain = absl::Seconds(2);
// How long a refused endpoint stays open for its kHelloReply (with kRefused) to get out.
inline constexpr absl::Duration kRefusedLinger = absl::Milliseconds(500);
// With tickets required: an endpoint that has not proven one this long after it connected is closed,
// so that peers that connect and stay silent cannot hold endpoints open.
inline constexpr absl::Duration kHelloTimeout = absl::Seconds(10);
// How often the listener's pending connections are swept (PendingConnectionReaper).
inline constexpr absl::Duration kPendingSweepInterval = absl::Seconds(1);
// UCX's async handler slots (UCX_ASYNC_MAX_EVENTS, 1024 by default): one per connection of its
// connection manager. Raised to the descriptor limit, up to this.
inline constexpr uint64_t kMaxAsyncEvents = 65536;

struct UcxServer::Impl {
  using EpId = uint64_t;  // endpoints are named by id: a closed ucp_ep_h's address may be reused

  // One kGet or kPut request of a client.
  struct Batch {
    bool is_put = false;
    // The endpoint's principal (an admin on a server without tickets): the source answers an id of
    // another tenant exactly as an unknown one, so nothing of it is pinned, sent or received.
    Principal who;
    uint64_t request_id = 0;
    CapabilityId id;  // lease id (get) or reservation id (put)
    uint32_t flags = 0;
    EpId ep = 0;              // the client's endpoint
    std::vector<uint8_t> ok;  // per entry
    size_t remaining = 0;     // entries not completed
    // Get only: the blocks to send, the client's first tag, and the send window's state.
    std::vector<uint32_t> indices;
    uint64_t tag_base = 0;
    size_t next = 0;               // next entry to post
    uint64_t in_flight_bytes = 0;  // posted, not completed
    // Put only: the kPutCommit that came while the receives were in flight, run when the last finishes
    // (instead of the kPutDone).
    std::optional<UcxControlCalls::Call> commit;
  };
  // One tagged send or receive of one block.
  struct Op {
    Impl* impl = nullptr;
    Batch* batch = nullptr;
    uint32_t slot = 0;    // entry of the batch
    uint32_t index = 0;   // block index in the lease or reservation
    bool pinned = false;  // false: an empty send / a draining receive (nothing to unpin)
    uint64_t size = 0;
    const std::byte* data = nullptr;  // the pinned slot (receives)
    void* request = nullptr;
    EpId ep = 0;  // the endpoint it runs on (receives: the batch's client)
    absl::Time start;
    // Past this it is cancelled or its endpoint force-closed: start + transfer_timeout, or sooner the
    // expiry of the lease or reservation it pins (a pin must not outlive it: see PinnedBlock).
    absl::Time deadline = absl::InfiniteFuture();
    absl::Time closed = absl::InfiniteFuture();  // when its endpoint was force-closed
    bool cancel_requested = false;
    bool abandoned = false;  // accounted for and unpinned; UCX still owns the request
  };

  UcxServerOptions options;
  HostBlockSource* source = nullptr;

  std::shared_ptr<UcxContext> context;  // outlives `worker` (memh is unmapped after it is destroyed)
  std::unique_ptr<UcxWorker> worker;
  ucp_listener_h listener = nullptr;
  ucp_mem_h memh = nullptr;
  std::byte* region = nullptr;
  uint64_t region_bytes = 0;
  int port = 0;

  std::thread thread;
  std::atomic<bool> stop{false};
  bool shut_down = false;  // touched by the owner's thread only

  // Progress thread only.
  absl::flat_hash_map<EpId, ucp_ep_h> eps;
  absl::flat_hash_map<ucp_ep_h, EpId> ep_ids;
  EpId next_ep = 1;
  absl::flat_hash_set<Op*> inflight;
  absl::flat_hash_set<Op*> abandoned;                  // freed when UCX completes them, or at Destroy
  std::vector<EpId> to_close;                          // endpoints reported failed by UCX
  std::vector<std::pair<Op*, ucs_status_t>> deferred;  // completed when posted; see Track
  absl::Time next_sweep;
  // What an endpoint proved in its hello. With tickets required, only endpoints in `sessions_of` are
  // served; without, every endpoint is served as an admin with put_tag_key 0.
  struct EpSession {
    Principal who;
    uint64_t put_tag_key = 0;
  };
  absl::flat_hash_map<EpId, EpSession> sessions_of;
  std::vector<std::pair<EpId, absl::Time>> refused;   // closed at that time (kRefusedLinger)
  std::vector<std::pair<EpId, absl::Time>> unproven;  // closed at that time unless in sessions_of
  // Connections of the listener UCX never delivered as a connection request; peer_of: ip:port of each
  // endpoint's connection, admitted to the reaper until the endpoint closes.
  std::optional<PendingConnectionReaper> reaper;

  std::optional<UcxControlCalls> calls;  // started after Init
  // Put batches whose receives are in flight, by endpoint and kPut request id (a kPutCommit names one).
  absl::flat_hash_map<std::pair<EpId, uint64_t>, Batch*> put_batches;
  absl::flat_hash_map<EpId, std::string> peer_of;
  absl::Time next_pending_sweep;

  // ---- setup ----

  absl::Status Init();

  // Frees UCX; the progress thread has stopped.
  void Destroy();

  // ---- progress thread ----

  void Run();

  void MaintenanceIfDue();

  // Force-closes endpoint `id` (if still open): UCX completes what it can with UCS_ERR_CANCELED. The
  // receives posted for that client's puts are cancelled too: they belong to the worker, not to the
  // endpoint, so closing it leaves them posted, and nothing else sends on their tags (a client sends a
  // put's blocks on the endpoint of its kPut). A receive already matched (its data partly in) does not
  // cancel; it is abandoned later (MaintenanceIfDue).
  void CloseEp(EpId id);

  // ---- UCX callbacks ----

  static void OnConnRequest(ucp_conn_request_h conn_request, void* arg);

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t);

  // The endpoint an AM came from, or 0 for a rendezvous one (clients send eager only) or an unknown sender.
  static EpId Sender(Impl* self, void* data, const ucp_am_recv_param_t* param);

  bool TicketsRequired() const { return options.tickets_required; }

  // The session of endpoint `ep`, or null when it has not proven a ticket (tickets required): then the
  // AM is dropped and the endpoint closed (outside UCX's callback).
  const EpSession* Admit(EpId ep, const char* what);

  static ucs_status_t OnHello(void* arg, const void*, size_t, void* data, size_t length,
                              const ucp_am_recv_param_t* param);

  static ucs_status_t OnGet(void* arg, const void*, size_t, void* data, size_t length,
                            const ucp_am_recv_param_t* param);

  // A lease without gRPC, as the endpoint's principal.
  static ucs_status_t OnLease(void* arg, const void*, size_t, void* data, size_t length,
                              const ucp_am_recv_param_t* param);

  // The two phases of a put without gRPC, as the endpoint's principal.
  static ucs_status_t OnAllocate(void* arg, const void*, size_t, void* data, size_t length,
                                 const ucp_am_recv_param_t* param);
  static ucs_status_t OnCommit(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param);
  // A commit riding on its put batch (kPutCommit): queued as a kCommit call once the batch's receives
  // finished, answered kPutCommitReply.
  static ucs_status_t OnPutCommit(void* arg, const void*, size_t, void* data, size_t length,
                                  const ucp_am_recv_param_t* param);
  // Queues `call` on the call threads, or answers its refusal (queue full) at once.
  void PushCall(UcxControlCalls::Call call, const char* what);

  // A control call of an authenticated endpoint (kLease, kAllocate, kCommit; `offered`: the hello
  // offers it): a call thread answers it as the endpoint's principal (Answer); the reply (`reply_id`)
  // carries its answer or its refusal's code and message.
  ucs_status_t Call(void* data, size_t length, const ucp_am_recv_param_t* param, const char* what, msg::AmId call,
                    bool offered, msg::AmId reply_id);

  // Progress thread: sends the replies the call threads queued (to endpoints still open).
  void SendCallReplies();

  // A client that split a lease's blocks over several kGet requests (get lanes) is done with it.
  static ucs_status_t OnRelease(void* arg, const void*, size_t, void* data, size_t length,
                                const ucp_am_recv_param_t* param);

  static ucs_status_t OnPut(void* arg, const void*, size_t, void* data, size_t length,
                            const ucp_am_recv_param_t* param);

  static void OnSendDone(void* request, ucs_status_t status, void* user_data);

  static void OnRecvDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);

  // ---- requests ----

  void SendAm(EpId id, uint16_t am_id, std::string payload);

  // `who`: the endpoint's principal; a lease that is unknown to it (or another tenant's) sends every
  // block as an empty message, none is pinned.
  void StartGet(EpId ep, const msg::GetRequest& req, const Principal& who);

  // Posts the batch's next send: its block from its pinned slot, or an empty message when it cannot be
  // pinned (the client then knows it is not coming).
  void PostNextSend(Batch* batch);

  // `put_tag_key`: the endpoint's (SessionPutTag). `who`: the endpoint's principal; a reservation
  // unknown to it (or another tenant's) pins nothing, zero-byte receives on the endpoint's own tags
  // drain its sends, and every entry fails.
  void StartPut(EpId ep, const msg::PutRequest& req, uint64_t put_tag_key, const Principal& who);

  // Records a send/receive just posted: in flight, or completed at once. An immediate completion is
  // handled from the progress loop, never inside the caller's loop over a batch (which it could end).
  void Track(Op* op, ucs_status_ptr_t r);

  void RunDeferred();

  // UCX completed op's request (a callback).
  void Completed(Op* op, ucs_status_t status, uint64_t length);

  // Settles an op whose request UCX never completed (see MaintenanceIfDue).
  void Abandon(Op* op);

  // An op is done: unpin its slot, count it, and advance its batch; frees the op.
  void Complete(Op* op, ucs_status_t status, uint64_t length);

  void Settle(Op* op, ucs_status_t status, uint64_t length);

  void FinishBatch(Batch* batch);
};

}  // namespace kvtier::ucx

#endif  // KVTIER_UCX_SRC_UCX_SERVER_IMPL_H_
