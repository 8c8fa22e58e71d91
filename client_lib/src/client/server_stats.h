// Client::ServerStats: every member's admin GetStats counters, asked all at once.
#ifndef KVTIER_CLIENT_SRC_CLIENT_SERVER_STATS_H_
#define KVTIER_CLIENT_SRC_CLIENT_SERVER_STATS_H_

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "client/membership.h"
#include "kvtier/client/client.h"

namespace kvtier::client {

// One GetStats per member of `members`, all in flight at once, each with `timeout` as its deadline;
// waits for every answer. Entry i is members[i]'s: its counters, or the RPC's error (wire::FromGrpc).
// Thread-safe (the members' stubs are); blocks up to `timeout`.
std::vector<MemberStats> AskServerStats(const std::vector<std::shared_ptr<Member>>& members, absl::Duration timeout);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_SERVER_STATS_H_
