#include "query/query_handler.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "auth.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/namespace_json.h"
#include "kvtier/server/block_store.h"
#include "query/engine_hash_index.h"

namespace kvtier::server {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // answers keep the documented key order

constexpr std::array<Tier, 3> kTiers = {Tier::kHbm, Tier::kHost, Tier::kDisk};
constexpr size_t kMaxQueryBlocks = 1 << 16;  // blocks one request may ask about

HttpReply Error(int status, std::string message) {
  return HttpReply{.status = status, .body = OrderedJson{{"error", std::move(message)}}.dump()};
}

int HttpStatusOf(const grpc::Status& s) { return s.error_code() == grpc::StatusCode::PERMISSION_DENIED ? 403 : 401; }

// One queried block: the tier of each of its shards (nullopt: absent).
struct QueriedBlock {
  std::string fingerprint;  // hex; "" when no block carries the hash
  OrderedJson hash;         // /query_by_hash: the hash as asked
  std::vector<std::optional<Tier>> shards;
  bool present() const {
    return !shards.empty() && std::all_of(shards.begin(), shards.end(), [](const auto& t) { return t.has_value(); });
  }
  bool all_in(Tier tier) const {
    return present() && std::all_of(shards.begin(), shards.end(), [tier](const auto& t) { return *t == tier; });
  }
  OrderedJson TierJson() const {  // "host", or "host+disk" when its shards are on both; null when not present
    if (!present()) return nullptr;
    std::vector<std::string> names;
    for (Tier tier : kTiers) {
      if (std::any_of(shards.begin(), shards.end(), [tier](const auto& t) { return *t == tier; }))
        names.push_back(TierName(tier));
    }
    return absl::StrJoin(names, "+");
  }
};

// The answer for `blocks`, each of `block_tokens` tokens.
OrderedJson Answer(const std::string& node_id, uint64_t block_tokens, const std::vector<QueriedBlock>& blocks) {
  auto prefix = [&](auto&& pred) {
    size_t n = 0;
    while (n < blocks.size() && pred(blocks[n])) ++n;
    return OrderedJson{{"blocks", n}, {"tokens", uint64_t{n} * block_tokens}};
  };
  OrderedJson tiers = OrderedJson::object();
  for (Tier tier : kTiers) tiers[TierName(tier)] = prefix([tier](const QueriedBlock& b) { return b.all_in(tier); });
  OrderedJson detail = OrderedJson::array();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const QueriedBlock& b = blocks[i];
    OrderedJson shards = OrderedJson::array();
    for (const auto& t : b.shards) shards.push_back(t ? OrderedJson(TierName(*t)) : OrderedJson(nullptr));
    OrderedJson one = {{"index", i}, {"fingerprint", b.fingerprint}, {"tier", b.TierJson()}, {"shards", shards}};
    if (!b.hash.is_null()) one["block_hash"] = b.hash;
    detail.push_back(std::move(one));
  }
  return OrderedJson{{"node_id", node_id},
                     {"block_tokens", block_tokens},
                     {"queried_blocks", blocks.size()},
                     {"longest_matched", prefix([](const QueriedBlock& b) { return b.present(); })},
                     {"tiers", tiers},
                     {"blocks", detail}};
}

// Parses the body as a JSON object with only `allowed` keys.
absl::StatusOr<Json> ParseObject(std::string_view body, std::initializer_list<const char*> allowed) {
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (std::none_of(allowed.begin(), allowed.end(), [&key](const char* a) { return key == a; })) {
      return absl::InvalidArgumentError(absl::StrCat("unknown field \"", key, "\""));
    }
  }
  return j;
}

}  // namespace

bool QueryHandler::Serves(std::string_view path) { return path == "/query" || path == "/query_by_hash"; }

HttpReply QueryHandler::Handle(std::string_view method, std::string_view path, const std::string* authorization,
                               std::string_view body) const {
  if (!Serves(path)) return Error(404, absl::StrCat("no endpoint ", std::string(path)));
  if (grpc::Status s = auth_.AuthorizeAdminHeader(authorization); !s.ok()) {
    return Error(HttpStatusOf(s), s.error_message());
  }
  if (method != "POST") return Error(405, absl::StrCat(std::string(path), " takes POST with a JSON body"));
  return path == "/query" ? QueryTokens(body) : QueryHashes(body);
}

HttpReply QueryHandler::QueryTokens(std::string_view body) const {
  auto j = ParseObject(body, {"namespace", "token_ids", "cache_salt"});
  if (!j.ok()) return Error(400, std::string(j.status().message()));
  if (!j->contains("namespace")) return Error(400, "\"namespace\" is required");
  auto ns = NamespaceFromJson((*j)["namespace"]);
  if (!ns.ok()) return Error(400, absl::StrCat("namespace: ", ns.status().message()));
  if (!j->contains("token_ids") || !(*j)["token_ids"].is_array()) {
    return Error(400, "\"token_ids\" (an array of uint32) is required");
  }
  const Json& ids = (*j)["token_ids"];
  std::vector<uint32_t> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_unsigned() || ids[i].get<uint64_t>() > UINT32_MAX) {
      return Error(400, absl::StrCat("token_ids[", i, "] must be a uint32"));
    }
    tokens.push_back(ids[i].get<uint32_t>());
  }
  ExtraKeys extra;
  if (j->contains("cache_salt")) {
    if (!(*j)["cache_salt"].is_string()) return Error(400, "\"cache_salt\" must be a string");
    extra.cache_salt = (*j)["cache_salt"].get<std::string>();
  }
  if (tokens.size() / std::max<uint32_t>(ns->layout.block_tokens, 1) > kMaxQueryBlocks) {
    return Error(400, absl::StrCat("at most ", kMaxQueryBlocks, " blocks per query"));
  }
  auto fps = ChainFingerprints(*ns, tokens, extra);
  if (!fps.ok()) return Error(400, std::string(fps.status().message()));
  std::vector<QueriedBlock> blocks(fps->size());
  for (size_t i = 0; i < fps->size(); ++i) {
    blocks[i].fingerprint = (*fps)[i].Hex();
    blocks[i].shards.resize(ns->layout.tp_size);
    for (uint32_t s = 0; s < ns->layout.tp_size; ++s) {
      if (auto info = store_.Inspect(BlockKey{.fingerprint = (*fps)[i], .shard = s}); info.has_value()) {
        blocks[i].shards[s] = info->tier;
      }
    }
  }
  return HttpReply{.status = 200, .body = Answer(node_id_, ns->layout.block_tokens, blocks).dump()};
}

HttpReply QueryHandler::QueryHashes(std::string_view body) const {
  auto j = ParseObject(body, {"block_hashes", "block_size", "tp_size"});
  if (!j.ok()) return Error(400, std::string(j.status().message()));
  if (!j->contains("block_hashes") || !(*j)["block_hashes"].is_array()) {
    return Error(400, "\"block_hashes\" (an array of integers or hex strings) is required");
  }
  auto positive = [&](const char* key, uint64_t fallback, uint64_t* out) -> bool {
    if (!j->contains(key)) {
      *out = fallback;
      return fallback > 0;
    }
    const Json& v = (*j)[key];
    if (!v.is_number_unsigned() || v.get<uint64_t>() == 0 || v.get<uint64_t>() > UINT32_MAX) return false;
    *out = v.get<uint64_t>();
    return true;
  };
  uint64_t block_size = 0, tp_size = 1;
  if (!positive("block_size", 0, &block_size)) return Error(400, "\"block_size\" (tokens per block, > 0) is required");
  if (!positive("tp_size", 1, &tp_size) || tp_size > 4096) return Error(400, "\"tp_size\" must be in [1, 4096]");
  const Json& hashes = (*j)["block_hashes"];
  if (hashes.size() > kMaxQueryBlocks)
    return Error(400, absl::StrCat("at most ", kMaxQueryBlocks, " blocks per query"));
  std::vector<QueriedBlock> blocks(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) {
    const Json& h = hashes[i];
    EngineBlockHash hash;
    if (h.is_number_unsigned()) {
      hash = EngineBlockHash::Uint(h.get<uint64_t>());
    } else if (h.is_number_integer()) {
      hash = EngineBlockHash::Int(h.get<int64_t>());
    } else if (h.is_string()) {
      std::string bytes;
      const std::string hex = h.get<std::string>();
      if (hex.empty() || hex.size() % 2 != 0 || hex.size() > 2 * kMaxEngineHashBytes ||
          !std::all_of(hex.begin(), hex.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); })) {
        return Error(400,
                     absl::StrCat("block_hashes[", i, "]: a string hash is 1..", kMaxEngineHashBytes, " bytes in hex"));
      }
      hash = EngineBlockHash::Bytes(absl::HexStringToBytes(hex));
    } else {
      return Error(400, absl::StrCat("block_hashes[", i, "] must be an integer or a hex string"));
    }
    QueriedBlock& b = blocks[i];
    b.hash = OrderedJson(h);
    b.shards.resize(tp_size);
    for (const BlockKey& key : index_.Find(hash)) {
      if (key.shard >= tp_size) continue;
      if (auto info = store_.Inspect(key); info.has_value()) {
        b.shards[key.shard] = info->tier;
        if (b.fingerprint.empty() || key.shard == 0) b.fingerprint = key.fingerprint.Hex();
      }
    }
  }
  return HttpReply{.status = 200, .body = Answer(node_id_, block_size, blocks).dump()};
}

}  // namespace kvtier::server
