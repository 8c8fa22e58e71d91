// Server: one kvtier cache server (gRPC cache and admin services, grpc.health.v1, /metrics).
#ifndef KVTIER_SERVER_SERVER_H_
#define KVTIER_SERVER_SERVER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kvtier/common/block_key.h"
#include "kvtier/server/server_options.h"

namespace kvtier::server {

class BlockStore;

// Owns the block store, the gRPC server and the metrics exposer. Start() returns once the ports are
// bound and serving. Thread-safety: all methods may be called from any thread; Shutdown() is idempotent.
class Server {
 public:
  // Validates `options`, reserves the host tier, binds the ports and starts serving.
  // Errors: InvalidArgument (bad options, a TLS file or token file without PEM / a bad entry), NotFound (a TLS
  // or token file cannot be read), Unavailable (a port could not be bound), ResourceExhausted.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();  // Shutdown(), then frees memory.

  // Stops accepting RPCs, cancels in-flight ones after a short grace period and waits for them.
  void Shutdown();
  // Blocks until Shutdown() has been called and completed.
  void Wait();

  int grpc_port() const;     // the bound gRPC port
  int metrics_port() const;  // the bound /metrics port, 0 when disabled
  int ucx_port() const;      // the bound UCX listener port, 0 without ucx_listen_address
  int health_port() const;   // the bound plain grpc.health.v1 port, 0 without health_address
  const ServerOptions& options() const;
  // The store, for tests and in-process tools. Owned by the server.
  BlockStore& store_for_test();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SERVER_H_
