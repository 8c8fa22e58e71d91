// Times one request of the data or admin plane, whatever carried it (gRPC, UCX): one RAII object per
// request, recorded once when it goes out of scope.
#ifndef KVTIER_SERVER_SRC_RPC_SCOPE_H_
#define KVTIER_SERVER_SRC_RPC_SCOPE_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server_metrics.h"

namespace kvtier::server {

// Started when a request arrives; at scope exit records its duration and status code in
// kvtier_rpc_duration_seconds{method,code} (ServerMetrics::ObserveRpc) and counts an INVALID_ARGUMENT
// answer as a rejected request (ServerMetrics::CountInvalid). The code is the one last passed to
// Return(); a request that leaves without one is recorded as UNKNOWN, so a forgotten path shows in
// the metrics rather than passing for a success. gRPC and absl status codes share their numbers.
//
// Usage: `RpcScope rpc(metrics, "Lookup"); ... return rpc.Return(status);`
// `method` must be a string literal (or outlive the scope). Not thread-safe: one per request, on the
// thread that serves it; `metrics` (thread-safe) must outlive it.
class RpcScope {
 public:
  RpcScope(ServerMetrics& metrics, const char* method) : metrics_(metrics), method_(method), start_(absl::Now()) {}
  RpcScope(const RpcScope&) = delete;
  RpcScope& operator=(const RpcScope&) = delete;
  ~RpcScope() {
    if (code_ == static_cast<int>(absl::StatusCode::kInvalidArgument)) metrics_.CountInvalid();
    metrics_.ObserveRpc(method_, code_, absl::Now() - start_);
  }

  // Records `status` as the request's outcome and hands it back, for `return rpc.Return(s);`.
  grpc::Status Return(grpc::Status status) {
    code_ = static_cast<int>(status.error_code());
    return status;
  }
  absl::Status Return(absl::Status status) {
    code_ = static_cast<int>(status.code());
    return status;
  }

 private:
  ServerMetrics& metrics_;
  const char* method_;
  absl::Time start_;
  int code_ = static_cast<int>(absl::StatusCode::kUnknown);
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_RPC_SCOPE_H_
