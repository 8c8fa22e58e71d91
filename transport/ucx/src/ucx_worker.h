// UcxContext and UcxWorker: the UCX (ucp) set-up, endpoint handling and progress loop that the block
// server (UcxServer) and the block client (UcxClient, and each of its get lanes) share.
#ifndef KVTIER_UCX_SRC_UCX_WORKER_H_
#define KVTIER_UCX_SRC_UCX_WORKER_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvtier::ucx {

inline constexpr ucp_tag_t kFullTagMask = ~ucp_tag_t{0};

// The IPv4 socket address of "host:port" (kvtier/common/host_port.h ParseHostPort; port >= min_port,
// 0 for a listener). A wildcard host (0.0.0.0, *, [::], ::) is 0.0.0.0. Errors: InvalidArgument (not
// host:port), Unavailable (the host does not resolve to an IPv4 address).
absl::StatusOr<sockaddr_storage> ResolveIpv4(const std::string& host_port, uint32_t min_port);

// One ucp context with the tag, active-message and wakeup features. Shared (shared_ptr) by its workers,
// which keep it alive. Thread-safety: immutable after Create.
class UcxContext {
 public:
  // `transports`: UCX_TLS ("" = UCX's default, from the environment); `transports_key` names the
  // setting in errors. `several_workers`: more than one worker, each on its own thread, will use it.
  // Errors: InvalidArgument (UCX rejects `transports`), Unavailable (UCX could not start).
  static absl::StatusOr<std::shared_ptr<UcxContext>> Create(const std::string& transports, const char* transports_key,
                                                            bool several_workers);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  ucp_context_h get() const { return context_; }

 private:
  UcxContext() = default;
  ucp_context_h context_ = nullptr;
};

// One ucp worker in single-thread mode, with its event fd and an eventfd that wakes its thread from
// another. Every method but Wake() must be called on the worker's own thread (the one that runs Run),
// or before that thread starts and after it stopped.
// Endpoints: all of kvtier's use UCP_ERR_HANDLING_MODE_NONE, because PEER mode turns off shared
// memory's single-copy (cma) rendezvous in UCX 1.13; a server endpoint in PEER mode also does not
// connect to a client in NONE mode. A dead peer is therefore noticed by deadline (see UcxServer and
// UcxClient), or by UCX's error callback where it reports one anyway (a tcp connection that broke).
class UcxWorker {
 public:
  // Progress calls that did nothing before Run's thread sleeps in poll().
  static constexpr int kIdleSpins = 256;

  // Errors: Unavailable.
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(std::shared_ptr<UcxContext> context);
  // Force-closes nothing: the owner closes its endpoints first (CloseEndpoint, DrainCloses). Frees
  // requests of closes still in progress, then the worker.
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h get() const { return worker_; }
  ucp_context_h context() const { return context_->get(); }
  const std::shared_ptr<UcxContext>& shared_context() const { return context_; }

  // Registers `cb` (with `arg`) for active message `id`, whole messages only. Errors: Unavailable.
  absl::Status SetAmHandler(uint16_t id, ucp_am_recv_callback_t cb, void* arg);

  // An endpoint to the listener at `addr` (client side), or for `request` (server side), with
  // `on_error` (may be null) as its error callback. Errors: Unavailable.
  absl::StatusOr<ucp_ep_h> Connect(const sockaddr_storage& addr, ucp_err_handler_cb_t on_error, void* arg);
  absl::StatusOr<ucp_ep_h> Accept(ucp_conn_request_h request, ucp_err_handler_cb_t on_error, void* arg);
  // Force-closes `ep`: UCX completes what it can of its requests with UCS_ERR_CANCELED. The close's own
  // request is kept until ReapCloses or DrainCloses sees it done.
  void CloseEndpoint(ucp_ep_h ep);
  // Frees the requests of closes that completed.
  void ReapCloses();
  // Progresses until every close completed or `until`; then frees the rest.
  void DrainCloses(absl::Time until);
  bool closing() const { return !closing_.empty(); }

  // Sends `payload` on `ep` as an eager active message `id`; the payload lives until it completes.
  // `reply`: with the sender's endpoint, so that the peer knows who sent it (clients do; the server
  // answers on the endpoint it knows). Returns UCS_OK when it was sent or is in flight.
  static ucs_status_t SendEagerAm(ucp_ep_h ep, uint16_t id, std::string payload, bool reply);
  // Whether an AM handler must drop `data` because it came as rendezvous (kvtier sends eager only); such
  // data is released here.
  bool DropRendezvous(void* data, const ucp_am_recv_param_t* param) const;

  // Makes a Run sleeping in poll() return (any thread).
  void Wake();

  // The one progress loop. While `running()`: progresses UCX, then calls `pass(progressed)`, which does
  // the owner's own work and returns whether any was done (a pass with UCX progress counts as work
  // only when `pass` says so). After kIdleSpins passes in a row without work the thread arms the worker
  // and sleeps in poll() until UCX has an event, Wake() is called, or `sleep_limit()` passed.
  template <typename Running, typename Pass, typename SleepLimit>
  void Run(Running&& running, Pass&& pass, SleepLimit&& sleep_limit) {
    int idle = 0;
    while (running()) {
      if (pass(ucp_worker_progress(worker_) != 0)) {
        idle = 0;
        continue;
      }
      if (++idle < kIdleSpins) continue;
      idle = 0;
      Sleep(sleep_limit());
    }
  }

 private:
  explicit UcxWorker(std::shared_ptr<UcxContext> context) : context_(std::move(context)) {}
  // Arms the worker and polls its fd and the wake fd for at most `limit` (nothing when UCX is busy).
  void Sleep(absl::Duration limit);

  std::shared_ptr<UcxContext> context_;
  ucp_worker_h worker_ = nullptr;
  int worker_fd_ = -1;  // owned by the worker
  int wake_fd_ = -1;
  std::vector<void*> closing_;  // ucp_ep_close_nbx requests not yet complete
};

}  // namespace kvtier::ucx

#endif  // KVTIER_UCX_SRC_UCX_WORKER_H_
