// ClientOptions::transport parsed once (Connect): the only place the option's string is compared.
#ifndef KVTIER_CLIENT_SRC_CLIENT_TRANSPORT_MODE_H_
#define KVTIER_CLIENT_SRC_CLIENT_TRANSPORT_MODE_H_

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace kvtier::client {

// How a client moves block bytes (client.h, ClientOptions::transport).
enum class TransportMode {
  kAuto,  // "auto": UCX where a member offers it and its endpoint is up, else gRPC
  kGrpc,  // "grpc": gRPC only
  kUcx,   // "ucx": UCX only; a member without a UCX endpoint serves errors
};

// "auto", "grpc" or "ucx" as a TransportMode. Errors: InvalidArgument naming the field and the value.
absl::StatusOr<TransportMode> ParseTransport(absl::string_view transport);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_TRANSPORT_MODE_H_
