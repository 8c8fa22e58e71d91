// TLS, mutual TLS and bearer tokens on the gRPC channels of every kvtier client (client_lib, kvtierctl,
// the event subscriber, benches). Private to kvtier's own targets, like the rest of kvtier_wire.
#ifndef KVTIER_WIRE_CHANNEL_SECURITY_H_
#define KVTIER_WIRE_CHANNEL_SECURITY_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace kvtier::wire {

// How a client reaches servers (docs/config.md "Client options"). Every field defaults to off.
struct ChannelSecurity {
  // PEM CA certificate(s) that sign the servers' certificates. Set: TLS; empty (default): plaintext.
  std::string ca_file;
  // PEM client certificate and its key, for mutual TLS; both or neither. Need ca_file.
  std::string cert_file;
  std::string key_file;
  // The name the servers' certificates are checked against instead of the host of each address
  // (e.g. "kvtier.kvtier.svc" when members are dialled by IP). Default "": the address's host.
  std::string server_name;
  // Sent as `authorization: Bearer <auth_token>` on every call; "" (default) sends none. Over
  // plaintext the token crosses the network in the clear: use it with TLS outside tests.
  std::string auth_token;

  bool tls() const { return !ca_file.empty(); }
  // Errors: InvalidArgument naming the field (`prefix` + field name, e.g. "tls_cert_file").
  absl::Status Validate(const std::string& prefix = "") const;
};

// Channel credentials for `security`, its files read now. Errors: InvalidArgument (bad combination, a
// file without PEM), NotFound (a file cannot be read); each names the field.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const ChannelSecurity& security,
                                                                                 const std::string& prefix = "");

// A channel to `address` with `credentials` and `args` (server_name applied), which adds the bearer
// token of `security` to every call's metadata. Thread-safe; the channel is shared by its stubs.
std::shared_ptr<grpc::Channel> CreateSecureChannel(const std::string& address,
                                                   const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                                   grpc::ChannelArguments args, const ChannelSecurity& security);

}  // namespace kvtier::wire

#endif  // KVTIER_WIRE_CHANNEL_SECURITY_H_
