// NcclChannel: one non-blocking NCCL communicator between a cache server and a worker, and the state
// machine that keeps a dead or stuck peer from hanging anything: every wait polls
// ncclCommGetAsyncError (and a CUDA event for transfers) against a deadline, and a deadline or an
// error aborts the communicator (ncclCommAbort), after which the channel only refuses work until the
// owner bootstraps a new one.
//
//   kIdle --StartInit--> kInitializing --ready--> kReady --Transfer ok--> kReady
//                            |  error/deadline        | error/deadline
//                            v                        v
//                         kAborted <------------------+        Close(): kReady -> kClosed
#ifndef KVTIER_NCCL_NCCL_CHANNEL_H_
#define KVTIER_NCCL_NCCL_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvtier/common/clock.h"
#include "kvtier/nccl/nccl_api.h"

namespace kvtier::nccl {

struct NcclChannelOptions {
  // Sleep between two polls of the communicator or the event. Default 50 us.
  absl::Duration poll_interval = absl::Microseconds(50);
  // Time source of deadlines (not owned; must outlive the channel). Default: the real clock.
  Clock* clock = Clock::Real();
  // Sleeps for the given duration; tests pass one that advances a FakeClock. Default: absl::SleepFor.
  std::function<void(absl::Duration)> sleep = [](absl::Duration d) { absl::SleepFor(d); };
  // Bound on Close()'s finalize; past it the communicator is aborted instead. Default 5 s.
  absl::Duration finalize_timeout = absl::Seconds(5);
};

enum class ChannelState : uint8_t { kIdle, kInitializing, kReady, kAborted, kClosed };
const char* ChannelStateName(ChannelState s);

// Thread-safety: all methods may be called concurrently; they are serialized internally, so transfers
// on one channel are posted in call order (NCCL matches point-to-point operations in order, and both
// ends must post them in the same order). `api` is borrowed and must outlive the channel.
class NcclChannel {
 public:
  NcclChannel(NcclApi& api, const NcclChannelOptions& options = {});
  // Close(): finalizes a ready communicator (bounded by finalize_timeout), aborts an initializing one.
  ~NcclChannel();
  NcclChannel(const NcclChannel&) = delete;
  NcclChannel& operator=(const NcclChannel&) = delete;

  // Starts a non-blocking ncclCommInitRankConfig of rank `rank` of `nranks` on CUDA device `device`;
  // returns without waiting for the peers. Errors: FailedPrecondition (not kIdle), Unavailable (NCCL
  // refused; the channel is kAborted).
  absl::Status StartInit(const NcclUniqueId& id, int nranks, int rank, int device);
  // Waits until the communicator is ready. OK at once when kReady. Errors: DeadlineExceeded (not
  // ready by `deadline`: aborted), Unavailable (NCCL reported an error: aborted), FailedPrecondition
  // (kIdle, kAborted or kClosed).
  absl::Status WaitReady(absl::Time deadline);

  // One grouped send (or receive) of every buffer of `buffers` (device memory of the channel's device,
  // borrowed until this returns) to (from) rank `peer`, in order, on `stream` (a cudaStream_t;
  // nullptr = the default stream); waits until the group has completed on the device. An
  // initializing channel is waited for first (same deadline). Errors: DeadlineExceeded (not complete
  // by `deadline`: the communicator is aborted, which cancels the operations on the stream),
  // Unavailable (NCCL or CUDA failed: aborted), FailedPrecondition (kIdle, kAborted or kClosed).
  absl::Status Transfer(TransferKind kind, std::span<const DeviceSpan> buffers, int peer, void* stream,
                        absl::Time deadline);

  // Aborts the communicator (ncclCommAbort) unless already aborted or closed. Idempotent. A transfer in
  // progress on another thread ends first (at its deadline at the latest): calls are serialized.
  void Abort();
  // Finalizes and destroys a ready communicator; aborts an initializing one. Idempotent.
  void Close();
  // Makes a wait or transfer in progress on another thread, and every later one, abort the
  // communicator at its next poll (Aborted), without waiting for the deadline. Lock-free; for owners
  // that drop a channel whose peer has gone (a reset or shutdown).
  void Cancel();

  ChannelState state() const;
  int device() const;
  // Why the channel was aborted ("" when it was not).
  std::string abort_reason() const;

 private:
  absl::Status WaitReadyLocked(absl::Time deadline);
  absl::Status AbortLocked(absl::Status why);
  void CloseLocked();

  NcclApi& api_;
  const NcclChannelOptions options_;
  mutable std::mutex mu_;
  ChannelState state_ = ChannelState::kIdle;  // guarded by mu_
  CommHandle comm_ = nullptr;                 // guarded by mu_; valid in kInitializing and kReady
  EventHandle event_ = nullptr;               // guarded by mu_; completion marker of transfers
  int device_ = -1;                           // guarded by mu_
  std::string abort_reason_;                  // guarded by mu_
  std::atomic<bool> cancelled_{false};
};

}  // namespace kvtier::nccl

#endif  // KVTIER_NCCL_NCCL_CHANNEL_H_
