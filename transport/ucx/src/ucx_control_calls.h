// UcxControlCalls: the UCX block server's control calls (kLease, kAllocate, kCommit), answered on call
// threads rather than on the progress thread.
#ifndef KVTIER_UCX_SRC_UCX_CONTROL_CALLS_H_
#define KVTIER_UCX_SRC_UCX_CONTROL_CALLS_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/common/principal.h"
#include "kvtier/ucx/host_block_source.h"
#include "kvtier/ucx/ucx_messages.h"

namespace kvtier::ucx {

// Calls take the store's lock, which may wait on the disk (an Allocate that spills, a Lease that
// loads), while the progress thread moves every client's bytes. So the progress thread queues each call
// (Push), a call thread parses its request, has the HostBlockSource answer it as the endpoint's
// principal and queues the encoded reply, and the progress thread sends what TakeReplies returns.
// Thread-safety: Push, TakeReplies and replies_ready from the progress thread, concurrently with the
// call threads; Stop from the owner's thread.
class UcxControlCalls {
 public:
  // Control calls waiting for a call thread, at most; beyond, Push refuses, so that a peer sending calls
  // in a loop cannot grow the queue.
  static constexpr size_t kMaxQueued = 4096;

  struct Call {
    uint64_t endpoint = 0;
    msg::AmId call = msg::kLease;  // kLease, kAllocate or kCommit
    msg::AmId reply_id = msg::kLeaseReply;
    uint64_t request_id = 0;
    Principal who;
    std::string payload;  // the serialized v1 request
  };
  struct Reply {
    uint64_t endpoint = 0;
    uint16_t reply_id = 0;
    std::string bytes;  // an encoded reply (EncodeReply)
  };

  // Starts `threads` (at least 1) call threads over `source` (borrowed, must outlive Stop); `wake` runs
  // on a call thread after each reply it queued (it wakes the progress thread).
  UcxControlCalls(HostBlockSource& source, int threads, std::function<void()> wake);
  ~UcxControlCalls() { Stop(); }

  // Queues `call`; false (nothing queued) when kMaxQueued calls wait.
  bool Push(Call call);
  // Whether replies wait for TakeReplies (cheap: an atomic).
  bool replies_ready() const { return replies_ready_.load(std::memory_order_acquire); }
  std::vector<Reply> TakeReplies();
  // A call in the source finishes first; calls still queued, and their replies, are dropped. Idempotent.
  void Stop();

  // A control call's reply: the answer, or the refusal's code and message.
  static std::string EncodeReply(uint64_t request_id, absl::StatusOr<std::string> answer);

 private:
  void Run();
  // The call's serialized response. Errors: the source's; InvalidArgument for bytes that are no request.
  absl::StatusOr<std::string> Answer(const Call& call);

  HostBlockSource& source_;
  std::function<void()> wake_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Call> calls_;      // guarded by mu_
  std::vector<Reply> replies_;  // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  std::atomic<bool> replies_ready_{false};
  std::vector<std::thread> threads_;
};

}  // namespace kvtier::ucx

#endif  // KVTIER_UCX_SRC_UCX_CONTROL_CALLS_H_
