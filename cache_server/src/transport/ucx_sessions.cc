#include "transport/ucx_sessions.h"

#include <sys/random.h>

#include <cerrno>

#include "absl/container/flat_hash_map.h"

namespace kvtier::server {

absl::StatusOr<std::string> UcxSessions::Open(const Principal& who) {
  std::string ticket(kTicketBytes, '\0');
  size_t got = 0;
  while (got < ticket.size()) {
    const ssize_t n = getrandom(ticket.data() + got, ticket.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError("getrandom failed: no ticket");
    got += static_cast<size_t>(n);
  }
  const absl::Time now = absl::Now();
  std::lock_guard<std::mutex> lock(mu_);
  if (tickets_.size() >= kMaxTickets / 2)
    absl::erase_if(tickets_, [&](const auto& e) { return e.second.expires <= now; });
  if (tickets_.size() >= kMaxTickets) {
    return absl::ResourceExhaustedError("too many live UCX sessions; retry after some expire (ucx.session_ttl)");
  }
  tickets_[ticket] = Entry{.who = who, .expires = now + ttl_};
  return ticket;
}

std::optional<Principal> UcxSessions::Find(std::string_view ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tickets_.find(std::string(ticket));
  if (it == tickets_.end() || it->second.expires <= absl::Now()) return std::nullopt;
  return it->second.who;
}

}  // namespace kvtier::server
