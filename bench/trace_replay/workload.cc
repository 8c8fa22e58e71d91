#include "workload.h"

#include <algorithm>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace kvtier::bench {

absl::StatusOr<std::vector<TraceRequest>> LoadMooncakeTrace(const std::string& path, size_t limit) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("trace ", path, " cannot be read"));
  std::vector<TraceRequest> out;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": not a JSON object"));
    }
    TraceRequest r;
    auto field = [&](const char* name) -> const nlohmann::json* {
      auto it = j.find(name);
      return it == j.end() ? nullptr : &*it;
    };
    const nlohmann::json* ts = field("timestamp");
    const nlohmann::json* in_len = field("input_length");
    const nlohmann::json* ids = field("hash_ids");
    if (ts == nullptr || !ts->is_number() || in_len == nullptr || !in_len->is_number_unsigned() || ids == nullptr ||
        !ids->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": needs timestamp, input_length (>= 0) and hash_ids (array)"));
    }
    r.timestamp_ms = ts->get<int64_t>();
    r.input_length = in_len->get<uint32_t>();
    if (const nlohmann::json* o = field("output_length"); o != nullptr && o->is_number_unsigned()) {
      r.output_length = o->get<uint32_t>();
    }
    r.hash_ids.reserve(ids->size());
    for (const auto& id : *ids) {
      if (!id.is_number_unsigned()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": hash_ids must be non-negative integers"));
      }
      r.hash_ids.push_back(id.get<uint64_t>());
    }
    out.push_back(std::move(r));
    if (limit != 0 && out.size() >= limit) break;
  }
  return out;
}

std::vector<TraceRequest> SyntheticWorkload(const SyntheticOptions& o) {
  std::mt19937_64 rng(o.seed);
  auto uniform = [&](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  uint64_t next_id = 0;
  std::vector<std::vector<uint64_t>> prompts(o.system_prompts);
  for (auto& p : prompts) {
    p.resize(uniform(2, 6));
    for (auto& id : p) id = next_id++;
  }
  struct Turn {
    int64_t time_ms;
    uint32_t session;
    TraceRequest request;
  };
  std::vector<Turn> turns;
  // Popular system prompts get more sessions (a Zipf-like skew): prompt k with weight 1/(k+1).
  std::vector<double> weights(o.system_prompts);
  for (uint32_t k = 0; k < o.system_prompts; ++k) weights[k] = 1.0 / (k + 1);
  std::discrete_distribution<uint32_t> pick_prompt(weights.begin(), weights.end());
  for (uint32_t s = 0; s < o.sessions; ++s) {
    const auto& sys = prompts[pick_prompt(rng)];
    std::vector<uint64_t> context = sys;
    int64_t t = static_cast<int64_t>(uniform(0, 600'000));  // sessions start over 10 minutes
    const uint64_t n_turns = uniform(1, o.max_turns);
    for (uint64_t k = 0; k < n_turns; ++k) {
      // The user's message (and, after the first turn, the previous answer) adds 1-4 blocks.
      const uint64_t added = uniform(1, 4);
      for (uint64_t b = 0; b < added; ++b) context.push_back(next_id++);
      TraceRequest r;
      r.timestamp_ms = t;
      r.hash_ids = context;
      r.input_length = static_cast<uint32_t>(context.size() * o.block_tokens - uniform(0, o.block_tokens - 1));
      r.output_length = static_cast<uint32_t>(uniform(50, 500));
      turns.push_back({t, s, std::move(r)});
      t += static_cast<int64_t>(uniform(5'000, 60'000));  // the user reads, thinks, types
    }
  }
  std::stable_sort(turns.begin(), turns.end(), [](const Turn& a, const Turn& b) { return a.time_ms < b.time_ms; });
  std::vector<TraceRequest> out;
  out.reserve(turns.size());
  for (auto& t : turns) out.push_back(std::move(t.request));
  return out;
}

}  // namespace kvtier::bench
