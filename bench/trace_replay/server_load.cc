#include "server_load.h"

#include <algorithm>
#include <chrono>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/wire/channel_security.h"

namespace kvtier::bench {

std::vector<ServerLoad> ReadServerLoad(const std::vector<client::MemberInfo>& members,
                                       const client::ClientOptions& options) {
  const wire::ChannelSecurity security{.ca_file = options.tls_ca_file,
                                       .cert_file = options.tls_cert_file,
                                       .key_file = options.tls_key_file,
                                       .server_name = options.tls_server_name,
                                       .auth_token = options.auth_token};
  auto credentials = wire::MakeChannelCredentials(security, "tls_");
  std::vector<ServerLoad> out;
  for (const client::MemberInfo& m : members) {
    ServerLoad load{.node_id = m.node_id, .address = m.address};
    if (credentials.ok()) {
      auto stub = v1::AdminService::NewStub(
          wire::CreateSecureChannel(m.address, *credentials, grpc::ChannelArguments(), security));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1::GetStatsResponse resp;
      if (stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok()) {
        load.ok = true;
        load.lookup_requests = resp.lookup_requests();
        load.lookup_blocks = resp.lookup_blocks_hit() + resp.lookup_blocks_miss();
        load.read_blocks = resp.read_blocks() + resp.read_blocks_miss();
      }
    }
    out.push_back(std::move(load));
  }
  return out;
}

std::vector<ServerLoad> LoadSince(const std::vector<ServerLoad>& before, const std::vector<ServerLoad>& after) {
  absl::flat_hash_map<std::string, const ServerLoad*> by_address;
  for (const ServerLoad& b : before) by_address[b.address] = &b;
  std::vector<ServerLoad> out;
  for (const ServerLoad& a : after) {
    ServerLoad d{.node_id = a.node_id, .address = a.address};
    auto it = by_address.find(a.address);
    if (a.ok && it != by_address.end() && it->second->ok) {
      const ServerLoad& b = *it->second;
      d.ok = true;
      d.lookup_requests = a.lookup_requests - b.lookup_requests;
      d.lookup_blocks = a.lookup_blocks - b.lookup_blocks;
      d.read_blocks = a.read_blocks - b.read_blocks;
    }
    out.push_back(std::move(d));
  }
  return out;
}

double MaxOverMean(const std::vector<ServerLoad>& load, bool requests) {
  double sum = 0, max = 0;
  size_t n = 0;
  for (const ServerLoad& l : load) {
    if (!l.ok) continue;
    const double v = static_cast<double>(requests ? l.lookup_requests : l.blocks());
    sum += v;
    max = std::max(max, v);
    ++n;
  }
  return n == 0 || sum == 0 ? 0 : max / (sum / static_cast<double>(n));
}

std::string ServerLoadJson(const std::vector<ServerLoad>& load) {
  std::string s = "{\"members\": [";
  for (size_t i = 0; i < load.size(); ++i) {
    const ServerLoad& l = load[i];
    absl::StrAppendFormat(&s,
                          "%s{\"node_id\": \"%s\", \"address\": \"%s\", \"ok\": %s, \"lookup_requests\": %d, "
                          "\"lookup_blocks\": %d, \"read_blocks\": %d, \"blocks\": %d}",
                          i == 0 ? "" : ", ", l.node_id, l.address, l.ok ? "true" : "false", l.lookup_requests,
                          l.lookup_blocks, l.read_blocks, l.blocks());
  }
  absl::StrAppendFormat(&s, "], \"max_over_mean_blocks\": %.4f, \"max_over_mean_lookup_requests\": %.4f}",
                        MaxOverMean(load), MaxOverMean(load, /*requests=*/true));
  return s;
}

std::string ServerLoadText(const std::vector<ServerLoad>& load) {
  std::string s;
  for (const ServerLoad& l : load) {
    if (!l.ok) {
      absl::StrAppendFormat(&s, "server %s (%s): no stats\n", l.node_id, l.address);
      continue;
    }
    absl::StrAppendFormat(&s, "server %s (%s): %d lookup requests, %d lookup blocks, %d read blocks\n", l.node_id,
                          l.address, l.lookup_requests, l.lookup_blocks, l.read_blocks);
  }
  absl::StrAppendFormat(&s, "server load max/mean: %.3f (blocks), %.3f (lookup requests)\n", MaxOverMean(load),
                        MaxOverMean(load, /*requests=*/true));
  return s;
}

}  // namespace kvtier::bench
