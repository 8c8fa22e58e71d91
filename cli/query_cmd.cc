// kvtierctl query: what each member's index query endpoint (/query or /query_by_hash, docs/query.md)
// answers for a prompt, and the answers merged per node. Each member is asked about every block, so a
// block found on a member other than its ring owner (a replica, or a copy left after a ring change)
// counts too; for the blocks their owners hold, the result is what `kvtierctl lookup` reports.
#include <civetweb.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "ctl_common.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/namespace_json.h"

namespace kvtier::cli {
namespace {

// One member's answer.
struct NodeAnswer {
  std::string error;  // "" when it answered 200
  Json reply;         // the endpoint's JSON
};

// POSTs `body` to http://host:port`path` with the bearer token; the JSON reply, or an error.
NodeAnswer Post(const std::string& host, int port, const std::string& path, const std::string& body,
                const std::string& token, absl::Duration timeout) {
  char ebuf[256] = {0};
  mg_connection* conn = mg_connect_client(host.c_str(), port, 0, ebuf, sizeof(ebuf));
  if (conn == nullptr) return {.error = absl::StrCat("cannot connect to ", host, ":", port, ": ", ebuf)};
  std::string head =
      absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: ", host, ":", port,
                   "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n");
  if (!token.empty()) absl::StrAppend(&head, "Authorization: Bearer ", token, "\r\n");
  head += "\r\n";
  NodeAnswer out;
  if (mg_write(conn, head.data(), head.size()) <= 0 || mg_write(conn, body.data(), body.size()) < 0) {
    out.error = absl::StrCat("cannot send to ", host, ":", port);
  } else if (mg_get_response(conn, ebuf, sizeof(ebuf), static_cast<int>(absl::ToInt64Milliseconds(timeout))) < 0) {
    out.error = absl::StrCat("no answer from ", host, ":", port, ": ", ebuf);
  } else {
    const mg_response_info* ri = mg_get_response_info(conn);
    std::string text;
    char buf[8192];
    for (int n; (n = mg_read(conn, buf, sizeof(buf))) > 0;) text.append(buf, static_cast<size_t>(n));
    Json j = Json::parse(text, nullptr, false);
    if (ri->status_code != 200) {
      out.error = absl::StrCat("HTTP ", ri->status_code, ": ",
                               j.is_object() && j.contains("error") ? j["error"].get<std::string>() : text);
    } else if (!j.is_object() || !j.contains("blocks") || !j["blocks"].is_array()) {
      out.error = absl::StrCat("not a query answer: ", text.substr(0, 200));
    } else {
      out.reply = std::move(j);
    }
  }
  mg_close_connection(conn);
  return out;
}

std::string HostOf(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

}  // namespace

int RunQuery(const CtlOptions& options, const QueryOptions& query) {
  std::string path, body;
  std::vector<Fingerprint> fps;  // token queries: to name each block's ring owner
  if (query.block_hashes.empty()) {
    auto chain = ChainFingerprints(query.ns, query.tokens);
    if (!chain.ok()) {
      std::cerr << "kvtierctl: " << chain.status().message() << "\n";
      return kExitUsage;
    }
    fps = *std::move(chain);
    path = "/query";
    body = nlohmann::json{{"namespace", NamespaceToJson(query.ns, /*with_salt=*/true)}, {"token_ids", query.tokens}}
               .dump();
  } else {
    path = "/query_by_hash";
    nlohmann::json hashes = nlohmann::json::array();
    for (const std::string& h : query.block_hashes) {
      uint64_t u = 0;
      int64_t i = 0;
      if (absl::SimpleAtoi(h, &u)) {
        hashes.push_back(u);
      } else if (absl::SimpleAtoi(h, &i)) {
        hashes.push_back(i);
      } else {
        hashes.push_back(h);  // hex bytes; the server checks them
      }
    }
    body =
        nlohmann::json{{"block_hashes", hashes}, {"block_size", query.block_size}, {"tp_size", query.tp_size}}.dump();
  }

  mg_init_library(0);
  const std::vector<Endpoint> endpoints = Connect(options.members, options);
  const ClusterView view = ClusterView::Collect(endpoints, options);
  std::vector<NodeAnswer> answers(endpoints.size());
  for (size_t m = 0; m < endpoints.size(); ++m) {
    const MemberView& mv = view.members()[m];
    if (!mv.answered()) {
      answers[m].error = DescribeFailure(mv.info_status);
    } else if (mv.info.http_port() == 0) {
      answers[m].error = "serves no query endpoint (metrics_address is empty)";
    } else {
      answers[m] = Post(HostOf(mv.address), static_cast<int>(mv.info.http_port()), path, body,
                        options.security.auth_token, options.rpc_timeout);
    }
  }

  // Merge: block i is present when some member holds all its shards; it is credited to its ring owner
  // when the owner holds it (as lookup does), else to the first member holding it.
  size_t num_blocks = fps.size();
  if (!query.block_hashes.empty()) num_blocks = query.block_hashes.size();
  struct Holder {
    size_t member;
    Json block;  // the member's entry for it
  };
  std::vector<std::vector<Holder>> holders(num_blocks);
  for (size_t m = 0; m < answers.size(); ++m) {
    if (!answers[m].error.empty()) continue;
    const Json& blocks = answers[m].reply["blocks"];
    for (size_t i = 0; i < std::min(num_blocks, blocks.size()); ++i) {
      if (!blocks[i]["tier"].is_null()) holders[i].push_back({m, blocks[i]});
    }
  }
  auto credited = [&](size_t i) -> const Holder* {
    if (holders[i].empty()) return nullptr;
    std::optional<size_t> owner;
    if (view.ring()) {
      if (i < fps.size()) {
        owner = view.PrimaryOwner(fps[i]);
      } else if (auto fp = Fingerprint::FromHex(holders[i].front().block["fingerprint"].get<std::string>()); fp.ok()) {
        owner = view.PrimaryOwner(*fp);
      }
    }
    for (const Holder& h : holders[i]) {
      if (owner && h.member == *owner) return &h;
    }
    return &holders[i].front();
  };
  const uint64_t block_tokens = query.block_hashes.empty() ? query.ns.layout.block_tokens : query.block_size;
  size_t prefix = 0;
  while (prefix < num_blocks && !holders[prefix].empty()) ++prefix;
  uint64_t prefix_tokens = uint64_t{prefix} * block_tokens;
  if (query.input_length) prefix_tokens = std::min<uint64_t>(prefix_tokens, *query.input_length);
  size_t present = 0;
  for (const auto& h : holders) present += h.empty() ? 0 : 1;
  std::map<std::pair<std::string, std::string>, uint64_t> by_node;  // shard-blocks of the prefix
  for (size_t i = 0; i < prefix; ++i) {
    const Holder* h = credited(i);
    for (const Json& shard : h->block["shards"]) ++by_node[{view.Name(h->member), shard.get<std::string>()}];
  }
  bool failed = false;
  for (const NodeAnswer& a : answers) failed |= !a.error.empty();

  if (options.json) {
    Json nodes = Json::array();
    for (size_t m = 0; m < answers.size(); ++m) {
      Json n = {{"node_id", view.Name(m)}, {"address", endpoints[m].address}};
      if (answers[m].error.empty()) {
        n["longest_matched"] = answers[m].reply["longest_matched"];
        n["tiers"] = answers[m].reply["tiers"];
        n["error"] = nullptr;
      } else {
        n["error"] = answers[m].error;
      }
      nodes.push_back(std::move(n));
    }
    Json by = Json::array();
    for (const auto& [key, count] : by_node)
      by.push_back({{"node_id", key.first}, {"tier", key.second}, {"blocks", count}});
    Json detail = Json::array();
    for (size_t i = 0; i < num_blocks; ++i) {
      Json hs = Json::array();
      for (const Holder& h : holders[i]) hs.push_back({{"node_id", view.Name(h.member)}, {"tier", h.block["tier"]}});
      const Holder* c = credited(i);
      detail.push_back({{"index", i},
                        {"fingerprint", i < fps.size() ? Json(fps[i].Hex())
                                        : c != nullptr ? Json(c->block["fingerprint"])
                                                       : Json(nullptr)},
                        {"present", c != nullptr},
                        {"in_prefix", i < prefix},
                        {"node_id", c != nullptr ? Json(view.Name(c->member)) : Json(nullptr)},
                        {"tier", c != nullptr ? Json(c->block["tier"]) : Json(nullptr)},
                        {"holders", hs}});
    }
    std::cout << DumpJson({{"endpoint", path},
                           {"blocks", num_blocks},
                           {"prefix_blocks", prefix},
                           {"prefix_tokens", prefix_tokens},
                           {"present_blocks", present},
                           {"by_node", by},
                           {"nodes", nodes},
                           {"block_detail", detail}})
              << "\n";
  } else {
    std::cout << "cached prefix: " << prefix << " of " << num_blocks << " blocks (" << prefix_tokens << " tokens)";
    if (present > prefix) std::cout << "; " << present - prefix << " more present after the first miss";
    std::cout << "\n\n";
    Table per({"NODE", "LONGEST", "HBM", "HOST", "DISK", "ERROR"}, {false, true, true, true, true, false});
    for (size_t m = 0; m < answers.size(); ++m) {
      if (!answers[m].error.empty()) {
        per.AddRow({view.Name(m), "-", "-", "-", "-", answers[m].error});
        continue;
      }
      const Json& r = answers[m].reply;
      auto blocks = [](const Json& j) { return absl::StrCat(j["blocks"].get<uint64_t>()); };
      per.AddRow({view.Name(m), blocks(r["longest_matched"]), blocks(r["tiers"]["hbm"]), blocks(r["tiers"]["host"]),
                  blocks(r["tiers"]["disk"]), ""});
    }
    per.Print(std::cout);
    if (!by_node.empty()) {
      std::cout << "\n";
      Table table({"NODE", "TIER", "BLOCKS"}, {false, false, true});
      for (const auto& [key, count] : by_node) table.AddRow({key.first, key.second, absl::StrCat(count)});
      table.Print(std::cout);
    }
  }
  return failed ? kExitUnreachable : kExitOk;
}

}  // namespace kvtier::cli
