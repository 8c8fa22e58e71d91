#include "kvtier/nccl/nccl_channel.h"

#include "absl/strings/str_cat.h"

namespace kvtier::nccl {

const char* ChannelStateName(ChannelState s) {
  switch (s) {
    case ChannelState::kIdle:
      return "idle";
    case ChannelState::kInitializing:
      return "initializing";
    case ChannelState::kReady:
      return "ready";
    case ChannelState::kAborted:
      return "aborted";
    case ChannelState::kClosed:
      return "closed";
  }
  return "unknown";
}

NcclChannel::NcclChannel(NcclApi& api, const NcclChannelOptions& options) : api_(api), options_(options) {}

NcclChannel::~NcclChannel() { Close(); }

absl::Status NcclChannel::StartInit(const NcclUniqueId& id, int nranks, int rank, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != ChannelState::kIdle) {
    return absl::FailedPreconditionError(absl::StrCat("channel is ", ChannelStateName(state_), ", not idle"));
  }
  device_ = device;
  absl::StatusOr<CommHandle> comm = api_.CommInitRank(id, nranks, rank, device);
  if (!comm.ok()) {
    state_ = ChannelState::kAborted;
    abort_reason_ = std::string(comm.status().message());
    return comm.status();
  }
  comm_ = *comm;
  state_ = ChannelState::kInitializing;
  return absl::OkStatus();
}

absl::Status NcclChannel::WaitReady(absl::Time deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  return WaitReadyLocked(deadline);
}

absl::Status NcclChannel::WaitReadyLocked(absl::Time deadline) {
  if (state_ == ChannelState::kReady) return absl::OkStatus();
  if (state_ != ChannelState::kInitializing) {
    return absl::FailedPreconditionError(
        absl::StrCat("channel is ", ChannelStateName(state_), abort_reason_.empty() ? "" : ": ", abort_reason_));
  }
  while (true) {
    absl::StatusOr<bool> ready = api_.Poll(comm_);
    if (!ready.ok()) return AbortLocked(ready.status());
    if (*ready) break;
    if (cancelled_.load()) return AbortLocked(absl::AbortedError("cancelled while initializing"));
    if (options_.clock->Now() >= deadline) {
      return AbortLocked(absl::DeadlineExceededError("communicator not ready by the deadline (peer missing?)"));
    }
    options_.sleep(options_.poll_interval);
  }
  if (event_ == nullptr) {
    absl::StatusOr<EventHandle> ev = api_.CreateEvent(device_);
    if (!ev.ok()) return AbortLocked(absl::UnavailableError(ev.status().message()));
    event_ = *ev;
  }
  state_ = ChannelState::kReady;
  return absl::OkStatus();
}

absl::Status NcclChannel::Transfer(TransferKind kind, std::span<const DeviceSpan> buffers, int peer, void* stream,
                                   absl::Time deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = WaitReadyLocked(deadline); !s.ok()) return s;
  if (buffers.empty()) return absl::OkStatus();
  const char* what = kind == TransferKind::kSend ? "send" : "receive";
  if (absl::Status s = api_.GroupTransfer(comm_, kind, buffers, peer, stream); !s.ok()) {
    return AbortLocked(absl::UnavailableError(absl::StrCat(what, ": ", s.message())));
  }
  // A non-blocking communicator may still be enqueueing the group: wait for that, then for the
  // operations themselves on the stream, watching for asynchronous errors all along.
  bool enqueued = false;
  while (true) {
    absl::StatusOr<bool> ready = api_.Poll(comm_);
    if (!ready.ok()) return AbortLocked(absl::UnavailableError(absl::StrCat(what, ": ", ready.status().message())));
    if (*ready && !enqueued) {
      if (absl::Status s = api_.RecordEvent(event_, stream); !s.ok()) {
        return AbortLocked(absl::UnavailableError(absl::StrCat(what, ": ", s.message())));
      }
      enqueued = true;
    }
    if (enqueued) {
      absl::StatusOr<bool> done = api_.EventDone(event_);
      if (!done.ok()) return AbortLocked(absl::UnavailableError(absl::StrCat(what, ": ", done.status().message())));
      if (*done) return absl::OkStatus();
    }
    if (cancelled_.load()) return AbortLocked(absl::AbortedError(absl::StrCat(what, " cancelled")));
    if (options_.clock->Now() >= deadline) {
      return AbortLocked(
          absl::DeadlineExceededError(absl::StrCat(what, " of ", buffers.size(), " blocks to/from rank ", peer,
                                                   " not complete by the deadline (peer dead or not posting?)")));
    }
    options_.sleep(options_.poll_interval);
  }
}

absl::Status NcclChannel::AbortLocked(absl::Status why) {
  if (comm_ != nullptr) {
    api_.Abort(comm_);
    comm_ = nullptr;
  }
  if (event_ != nullptr) {
    api_.DestroyEvent(event_);
    event_ = nullptr;
  }
  state_ = ChannelState::kAborted;
  abort_reason_ = std::string(why.message());
  return why;
}

void NcclChannel::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == ChannelState::kAborted || state_ == ChannelState::kClosed) return;
  (void)AbortLocked(absl::AbortedError("aborted by its owner"));
}

void NcclChannel::Cancel() { cancelled_.store(true); }

void NcclChannel::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  CloseLocked();
}

void NcclChannel::CloseLocked() {
  if (state_ == ChannelState::kInitializing) {
    (void)AbortLocked(absl::AbortedError("closed while initializing"));
    return;
  }
  if (state_ != ChannelState::kReady) return;
  if (event_ != nullptr) {
    api_.DestroyEvent(event_);
    event_ = nullptr;
  }
  const absl::Time deadline = options_.clock->Now() + options_.finalize_timeout;
  if (absl::Status s = api_.Finalize(comm_); !s.ok()) {
    (void)AbortLocked(s);
    return;
  }
  while (true) {
    absl::StatusOr<bool> ready = api_.Poll(comm_);
    if (!ready.ok()) {
      (void)AbortLocked(ready.status());
      return;
    }
    if (*ready) break;
    if (options_.clock->Now() >= deadline) {
      (void)AbortLocked(absl::DeadlineExceededError("finalize not complete by the deadline"));
      return;
    }
    options_.sleep(options_.poll_interval);
  }
  api_.Destroy(comm_);
  comm_ = nullptr;
  state_ = ChannelState::kClosed;
}

ChannelState NcclChannel::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

int NcclChannel::device() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_;
}

std::string NcclChannel::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_reason_;
}

}  // namespace kvtier::nccl
