#include "trace.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace kvtier::bench {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Numbers keys (scope, id) densely in order of first appearance and records each one's mixed key.
class BlockNumbering {
 public:
  uint32_t Dense(uint64_t scope, uint64_t id, SimTrace& trace) {
    auto [it, inserted] = dense_.try_emplace(std::make_pair(scope, id), static_cast<uint32_t>(trace.block_keys.size()));
    if (inserted) trace.block_keys.push_back(SplitMix64(SplitMix64(scope) ^ id));
    return it->second;
  }

 private:
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint32_t> dense_;
};

}  // namespace

absl::StatusOr<SimTrace> LoadMooncakeSimTrace(const std::string& path, size_t limit) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("trace ", path, " cannot be read"));
  SimTrace trace;
  trace.block_tokens = 512;
  trace.offsets.push_back(0);
  BlockNumbering numbering;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": not a JSON object"));
    }
    auto ts = j.find("timestamp");
    auto ids = j.find("hash_ids");
    if (ts == j.end() || !ts->is_number() || ids == j.end() || !ids->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": needs timestamp and hash_ids"));
    }
    for (const auto& id : *ids) {
      if (!id.is_number_unsigned()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": hash_ids must be non-negative integers"));
      }
      trace.blocks.push_back(numbering.Dense(0, id.get<uint64_t>(), trace));
    }
    trace.offsets.push_back(trace.blocks.size());
    trace.time_ns.push_back(static_cast<int64_t>(ts->get<double>() * 1e6));
    trace.namespace_ids.push_back(0);
    if (limit != 0 && trace.num_requests() >= limit) break;
  }
  return trace;
}

namespace {

struct KvctRequest {
  double time_s;
  uint32_t session;
  uint32_t order;  // position within its session's file, sub-agents flattened in place
  uint32_t namespace_id;
  std::vector<uint64_t> ids;
};

absl::Status FlattenSession(const nlohmann::json& requests, double base_s, uint32_t session, const std::string& file,
                            absl::flat_hash_map<std::string, uint32_t>& models, uint32_t& order,
                            std::vector<KvctRequest>& out) {
  if (!requests.is_array()) return absl::InvalidArgumentError(absl::StrCat(file, ": requests is not an array"));
  for (const auto& r : requests) {
    auto t = r.find("t");
    if (!r.is_object() || t == r.end() || !t->is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": a request without a numeric t"));
    }
    auto type = r.find("type");
    if (type != r.end() && type->is_string() && type->get<std::string>() == "subagent") {
      auto sub = r.find("requests");
      if (sub == r.end()) return absl::InvalidArgumentError(absl::StrCat(file, ": a sub-agent without requests"));
      const absl::Status s = FlattenSession(*sub, base_s + t->get<double>(), session, file, models, order, out);
      if (!s.ok()) return s;
      continue;
    }
    auto ids = r.find("hash_ids");
    if (ids == r.end() || !ids->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": a request without hash_ids"));
    }
    KvctRequest req{
        .time_s = base_s + t->get<double>(), .session = session, .order = order++, .namespace_id = 0, .ids = {}};
    if (auto m = r.find("model"); m != r.end() && m->is_string()) {
      req.namespace_id = models.try_emplace(m->get<std::string>(), static_cast<uint32_t>(models.size())).first->second;
    }
    req.ids.reserve(ids->size());
    for (const auto& id : *ids) {
      if (!id.is_number_unsigned()) {
        return absl::InvalidArgumentError(absl::StrCat(file, ": hash_ids must be non-negative integers"));
      }
      req.ids.push_back(id.get<uint64_t>());
    }
    out.push_back(std::move(req));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SimTrace> LoadKvCacheTesterSimTrace(const std::string& dir, size_t sessions, double session_spacing_s) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json") files.push_back(entry.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat("directory ", dir, " cannot be read: ", ec.message()));
  if (files.empty()) return absl::NotFoundError(absl::StrCat("no *.json session files in ", dir));
  std::sort(files.begin(), files.end());
  if (sessions != 0 && files.size() > sessions) files.resize(sessions);

  std::vector<KvctRequest> requests;
  absl::flat_hash_map<std::string, uint32_t> models;
  for (uint32_t k = 0; k < files.size(); ++k) {
    std::ifstream in(files[k]);
    if (!in) return absl::NotFoundError(absl::StrCat(files[k], " cannot be read"));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("requests")) {
      return absl::InvalidArgumentError(absl::StrCat(files[k], ": not a session object with requests"));
    }
    uint32_t order = 0;
    const absl::Status s = FlattenSession(j["requests"], session_spacing_s * k, k, files[k], models, order, requests);
    if (!s.ok()) return s;
  }
  std::sort(requests.begin(), requests.end(), [](const KvctRequest& a, const KvctRequest& b) {
    if (a.time_s != b.time_s) return a.time_s < b.time_s;
    if (a.session != b.session) return a.session < b.session;
    return a.order < b.order;
  });

  SimTrace trace;
  trace.block_tokens = 64;
  trace.offsets.push_back(0);
  BlockNumbering numbering;
  for (const KvctRequest& r : requests) {
    for (uint64_t id : r.ids) trace.blocks.push_back(numbering.Dense(r.session, id, trace));
    trace.offsets.push_back(trace.blocks.size());
    trace.time_ns.push_back(static_cast<int64_t>(r.time_s * 1e9));
    trace.namespace_ids.push_back(r.namespace_id);
  }
  return trace;
}

absl::StatusOr<SimTrace> LoadSimTrace(const std::string& path, size_t limit, size_t sessions,
                                      double session_spacing_s) {
  absl::StatusOr<SimTrace> trace = std::filesystem::is_directory(path)
                                       ? LoadKvCacheTesterSimTrace(path, sessions, session_spacing_s)
                                       : LoadMooncakeSimTrace(path, limit);
  if (trace.ok() && limit != 0 && trace->num_requests() > limit) {
    trace->time_ns.resize(limit);
    trace->namespace_ids.resize(limit);
    trace->offsets.resize(limit + 1);
    trace->blocks.resize(trace->offsets.back());
    // Blocks first seen after the cut stay numbered; they are never accessed.
  }
  return trace;
}

}  // namespace kvtier::bench
