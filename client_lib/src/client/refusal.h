// How a member's refusal of a request differs from its failure to serve it, and the first refusal of
// a call (client.h, "Errors").
#ifndef KVTIER_CLIENT_SRC_CLIENT_REFUSAL_H_
#define KVTIER_CLIENT_SRC_CLIENT_REFUSAL_H_

#include <mutex>

#include "absl/status/status.h"

namespace kvtier::client {

// Whether a member's answer refuses the request itself rather than failing to serve it: a bad
// request (InvalidArgument: a block above the member's limits.max_block_bytes, a layout or key set it
// will not take) or one it will not serve to this caller (PermissionDenied, Unauthenticated). No
// retry and no other member would answer it otherwise, so the call returns it (client.h, "Errors");
// every other failure (Unavailable, DeadlineExceeded, Cancelled, ...) is a dead or slow member and
// becomes per-block misses from error / kError.
inline bool IsRefusal(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kPermissionDenied ||
         code == absl::StatusCode::kUnauthenticated;
}

// The first refusal among a call's RPCs (IsRefusal), recorded by the call's threads.
class CallRefusal {
 public:
  void Record(absl::Status refusal) {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_.ok()) first_ = std::move(refusal);
  }
  bool refused() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !first_.ok();
  }
  absl::Status status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_;
  }

 private:
  mutable std::mutex mu_;
  absl::Status first_;  // guarded by mu_
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_REFUSAL_H_
