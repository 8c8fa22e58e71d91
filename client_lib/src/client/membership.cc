#include "client/membership.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "kvtier/client/dns_resolver.h"
#include "kvtier/wire/wire.h"

namespace kvtier::client {

void Membership::SetMembers(std::vector<std::shared_ptr<Member>> members) {
  std::lock_guard<std::mutex> lock(members_mu_);
  members_ = std::move(members);
}

std::shared_ptr<const RingView> Membership::View() const {
  std::lock_guard<std::mutex> lock(view_mu_);
  return view_;
}

std::vector<std::shared_ptr<Member>> Membership::Members() const {
  std::lock_guard<std::mutex> lock(members_mu_);
  return members_;
}

uint64_t Membership::ring_version() const {
  std::lock_guard<std::mutex> lock(view_mu_);
  return ring_version_;
}

void Membership::Start() {
  refresher_ = std::thread([this] { RefreshLoop(); });
}

void Membership::Stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (refresher_.joinable()) refresher_.join();
}

void Membership::Clear() {
  {
    std::lock_guard<std::mutex> lock(view_mu_);
    view_.reset();
  }
  std::lock_guard<std::mutex> lock(members_mu_);
  members_.clear();
}

std::shared_ptr<Member> Membership::NewMember(const std::string& address, const std::string& configured_id,
                                              bool from_dns) const {
  return std::make_shared<Member>(address, configured_id, from_dns, channel_args_, credentials_, security_);
}

// Asks each of `ms` its node id (GetInfo), all at once; records the ids that come back.
void Membership::AskNodeIds(const std::vector<Member*>& ms, absl::Duration timeout, bool wait_for_ready) {
  std::vector<v1::GetInfoRequest> reqs(ms.size());
  std::vector<v1::GetInfoResponse> resps(ms.size());
  const std::vector<grpc::Status> statuses =
      RunAll(ms.size(), timeout, wait_for_ready, [&](size_t i, grpc::ClientContext* ctx, auto done) {
        ms[i]->admin->async()->GetInfo(ctx, &reqs[i], &resps[i], std::move(done));
      });
  for (size_t i = 0; i < ms.size(); ++i) {
    if (!statuses[i].ok() || resps[i].node_id().empty()) continue;
    std::lock_guard<std::mutex> lock(ms[i]->mu);
    ms[i]->node_id = resps[i].node_id();
  }
}

// Resolves members_dns and applies the answer: new addresses become members (asked their node id),
// addresses gone from the answer leave. A failed resolution changes nothing.
void Membership::RefreshDns() {
  auto resolved = ResolveMembers(options_.members_dns, options_.dns_server, options_.dns_timeout);
  std::vector<std::string> addresses;
  if (resolved.ok()) {
    addresses = std::move(resolved).value();
  } else if (resolved.status().code() != absl::StatusCode::kNotFound) {
    stats_.dns_failures.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  stats_.dns_resolutions.fetch_add(1, std::memory_order_relaxed);
  const absl::flat_hash_set<std::string> wanted(addresses.begin(), addresses.end());
  absl::flat_hash_set<std::string> known;
  for (const auto& m : Members()) known.insert(m->address);
  std::vector<std::shared_ptr<Member>> added;
  for (const std::string& a : addresses) {
    if (known.insert(a).second) added.push_back(NewMember(a, "", /*from_dns=*/true));
  }
  std::vector<Member*> ask;
  for (const auto& m : added) ask.push_back(m.get());
  // No wait_for_ready: a member still starting is asked again by the health checks.
  AskNodeIds(ask, options_.health_check_timeout, /*wait_for_ready=*/false);
  std::lock_guard<std::mutex> lock(members_mu_);
  std::erase_if(members_,
                [&](const std::shared_ptr<Member>& m) { return m->from_dns && !wanted.contains(m->address); });
  members_.insert(members_.end(), added.begin(), added.end());
}

// One round of grpc.health.v1 checks of every member, at once; updates each member's health and asks
// the node id of members that pass and need it (unknown, or returning from ejection).
void Membership::CheckHealth() {
  const std::vector<std::shared_ptr<Member>> ms = Members();
  std::vector<grpc::health::v1::HealthCheckRequest> reqs(ms.size());
  std::vector<grpc::health::v1::HealthCheckResponse> resps(ms.size());
  const std::vector<grpc::Status> statuses =
      RunAll(ms.size(), options_.health_check_timeout, /*wait_for_ready=*/false,
             [&](size_t i, grpc::ClientContext* ctx, auto done) {
               ms[i]->health_stub->async()->Check(ctx, &reqs[i], &resps[i], std::move(done));
             });
  std::vector<Member*> ask;        // passed, and the node id is needed before it may be in the ring
  std::vector<Member*> returning;  // ejected members that passed healthy_threshold checks
  for (size_t i = 0; i < ms.size(); ++i) {
    Member& m = *ms[i];
    const bool pass = statuses[i].ok() && resps[i].status() == grpc::health::v1::HealthCheckResponse::SERVING;
    std::lock_guard<std::mutex> lock(m.mu);
    if (pass) {
      m.failures = 0;
      ++m.passes;
      m.last_error.clear();
      if (m.health == MemberHealth::kEjected) {
        if (m.passes >= options_.healthy_threshold) {
          returning.push_back(&m);
          if (m.configured_id.empty()) ask.push_back(&m);  // a restarted server may report another id
        }
      } else {
        m.health = MemberHealth::kHealthy;
        if (m.node_id.empty()) ask.push_back(&m);
      }
      continue;
    }
    stats_.health_check_failures.fetch_add(1, std::memory_order_relaxed);
    m.passes = 0;
    ++m.failures;
    m.last_error =
        statuses[i].ok()
            ? absl::StrCat("status ", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resps[i].status()))
            : wire::FromGrpc(statuses[i]).ToString();
    if (m.health != MemberHealth::kEjected && m.failures >= options_.unhealthy_threshold) {
      m.health = MemberHealth::kEjected;
      stats_.members_ejected.fetch_add(1, std::memory_order_relaxed);
    } else if (m.health == MemberHealth::kUnknown) {
      m.health = MemberHealth::kHealthy;  // in the ring until it reaches the threshold
    }
  }
  if (!ask.empty()) {
    // Forget the old id of a returning member first: if it does not answer now it stays out.
    for (Member* m : ask) {
      std::lock_guard<std::mutex> lock(m->mu);
      if (m->health == MemberHealth::kEjected) m->node_id.clear();
    }
    AskNodeIds(ask, options_.health_check_timeout, /*wait_for_ready=*/false);
  }
  for (Member* m : returning) {
    std::lock_guard<std::mutex> lock(m->mu);
    if (!m->node_id.empty()) m->health = MemberHealth::kHealthy;
  }
}

// Builds the ring the members call for (known node id, not ejected; the first member reporting an id
// has it) and swaps it in when it differs from the current one. Returns false, changing nothing, when
// no member qualifies.
bool Membership::RebuildRing(bool force) {
  std::vector<std::string> ids;
  std::vector<std::shared_ptr<Member>> owners;
  absl::flat_hash_set<std::string> seen;
  for (const auto& m : Members()) {
    std::string id;
    {
      std::lock_guard<std::mutex> lock(m->mu);
      if (m->node_id.empty() || m->health == MemberHealth::kEjected) continue;
      id = m->node_id;
    }
    if (!seen.insert(id).second) continue;
    ids.push_back(std::move(id));
    owners.push_back(m);
  }
  if (ids.empty()) return false;
  const std::shared_ptr<const RingView> current = View();
  if (!force && current != nullptr && current->owners.size() == owners.size()) {
    absl::flat_hash_map<std::string, const Member*> now;
    for (size_t r = 0; r < current->owners.size(); ++r) now[current->ring.node_ids()[r]] = current->owners[r].get();
    bool same = true;
    for (size_t r = 0; r < owners.size() && same; ++r) {
      auto it = now.find(ids[r]);
      same = it != now.end() && it->second == owners[r].get();
    }
    if (same) return true;
  }
  auto ring = HashRing::Create(ids, options_.virtual_nodes);
  if (!ring.ok()) return false;  // not reached: ids are distinct and non-empty
  auto next = std::make_shared<const RingView>(RingView{std::move(ring).value(), std::move(owners)});
  std::lock_guard<std::mutex> lock(view_mu_);
  if (view_ != nullptr) {
    ++ring_version_;
    stats_.ring_changes.fetch_add(1, std::memory_order_relaxed);
  }
  view_ = std::move(next);
  return true;
}

void Membership::RefreshLoop() {
  absl::Time next_dns =
      options_.members_dns.empty() ? absl::InfiniteFuture() : absl::Now() + options_.dns_refresh_interval;
  absl::Time next_health = absl::Now() + options_.health_check_interval;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(stop_mu_);
      if (stop_cv_.wait_until(lock, absl::ToChronoTime(std::min(next_dns, next_health)),
                              [this] { return stopping_; })) {
        return;
      }
    }
    const absl::Time now = absl::Now();
    if (now >= next_dns) {
      RefreshDns();
      next_dns = absl::Now() + options_.dns_refresh_interval;
    }
    if (now >= next_health) {
      CheckHealth();
      next_health = absl::Now() + options_.health_check_interval;
    }
    (void)RebuildRing(/*force=*/false);
  }
}

}  // namespace kvtier::client
