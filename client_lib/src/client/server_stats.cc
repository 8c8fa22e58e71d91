#include "client/server_stats.h"

#include <mutex>

#include "kvtier/wire/wire.h"

namespace kvtier::client {

std::vector<MemberStats> AskServerStats(const std::vector<std::shared_ptr<Member>>& members, absl::Duration timeout) {
  std::vector<v1::GetStatsRequest> reqs(members.size());
  std::vector<v1::GetStatsResponse> resps(members.size());
  // No wait_for_ready: a member that is down answers Unavailable at once instead of using up the timeout.
  const std::vector<grpc::Status> statuses =
      RunAll(members.size(), timeout, /*wait_for_ready=*/false, [&](size_t i, grpc::ClientContext* ctx, auto done) {
        members[i]->admin->async()->GetStats(ctx, &reqs[i], &resps[i], std::move(done));
      });
  std::vector<MemberStats> out(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    MemberStats& m = out[i];
    m.address = members[i]->address;
    m.status = wire::FromGrpc(statuses[i]);
    if (!m.status.ok()) {
      std::lock_guard<std::mutex> lock(members[i]->mu);
      m.node_id = members[i]->node_id;
      continue;
    }
    m.node_id = resps[i].node_id();
    m.counters.reserve(resps[i].counters_size());
    for (const v1::CounterSample& c : resps[i].counters()) {
      m.counters.push_back(
          {.name = c.name(),
           .value = c.value(),
           .kind = c.kind() == v1::CounterSample::GAUGE ? CounterKind::kGauge : CounterKind::kCounter});
    }
  }
  return out;
}

}  // namespace kvtier::client
