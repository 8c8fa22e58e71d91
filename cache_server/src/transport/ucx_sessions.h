// UCX session tickets: how an endpoint of the UCX bulk plane proves that it holds a credential of the
// gRPC plane (docs/architecture.md "Security", kvtier/ucx/ucx_messages.h kHello).
#ifndef KVTIER_SERVER_SRC_TRANSPORT_UCX_SESSIONS_H_
#define KVTIER_SERVER_SRC_TRANSPORT_UCX_SESSIONS_H_

#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "auth.h"

namespace kvtier::server {

// Tickets handed out by the OpenUcxSession RPC to an authenticated caller: 32 bytes from the kernel's
// CSPRNG (getrandom), each bound to the caller's Principal and valid for `ttl` after it was opened.
// A ticket is a bearer secret over the UCX plane, as a token is over gRPC.
// Thread-safety: all methods may be called concurrently (one mutex; Open and Find are O(1) amortized,
// expired tickets are dropped by Open).
class UcxSessions {
 public:
  static constexpr size_t kTicketBytes = 32;
  // The most live tickets; Open first drops the expired ones and
  // then refuses (RESOURCE_EXHAUSTED), so a caller opening sessions in a loop cannot grow the table
  // without bound.
  static constexpr size_t kMaxTickets = 1 << 16;

  // `required`: the UCX plane refuses endpoints without a valid ticket (the server has tokens or TLS).
  UcxSessions(absl::Duration ttl, bool required) : ttl_(ttl), required_(required) {}

  bool required() const { return required_; }
  absl::Duration ttl() const { return ttl_; }

  // A new ticket for `who`, valid until now + ttl. Errors: ResourceExhausted (kMaxTickets live),
  // Internal (the kernel gave no random bytes).
  absl::StatusOr<std::string> Open(const Principal& who);
  // The principal of a live ticket; nullopt for an unknown or expired one.
  std::optional<Principal> Find(std::string_view ticket) const;

 private:
  struct Entry {
    Principal who;
    absl::Time expires;
  };
  const absl::Duration ttl_;
  const bool required_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Entry> tickets_;  // guarded by mu_
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_TRANSPORT_UCX_SESSIONS_H_
