// "host:port" addresses as the server listens on them and clients dial them: one parser, so that the
// server's listen addresses, ClientOptions::members and kvtierctl's --members agree on what an address is.
#ifndef KVTIER_COMMON_HOST_PORT_H_
#define KVTIER_COMMON_HOST_PORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvtier {

struct HostPort {
  std::string host;  // as written: a name, an IPv4 address or a bracketed IPv6 address ("[::1]")
  uint32_t port = 0;
};

// Splits `address` at its last colon into a non-empty host and a port of 1 to 5 decimal digits (no
// sign, no blanks) in [min_port, 65535]: min_port 1 for an address to dial, 0 for one to listen on
// (port 0 = the kernel picks). Nothing is resolved. Errors: InvalidArgument naming `address`.
inline absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, uint32_t min_port = 1) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("\"", address, "\" is not host:port (", why, ")"));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("no port");
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  if (host.empty()) return bad("empty host");
  const std::string range = absl::StrCat("port must be ", min_port, "..65535");
  if (port.empty() || port.size() > 5) return bad(range);
  uint32_t p = 0;
  for (char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return bad(range);
    p = p * 10 + static_cast<uint32_t>(c - '0');
  }
  if (p < min_port || p > 65535) return bad(range);
  return HostPort{.host = std::string(host), .port = p};
}

// Whether a listener bound to `host` accepts on every address of its machine (0.0.0.0, [::], ::, or
// ZeroMQ's *): clients then dial it at the host they reach the server at, rather than at `host`.
inline bool IsWildcardHost(absl::string_view host) {
  return host == "0.0.0.0" || host == "*" || host == "[::]" || host == "::";
}

}  // namespace kvtier

#endif  // KVTIER_COMMON_HOST_PORT_H_
