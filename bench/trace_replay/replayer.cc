#include "replayer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <list>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "kvtier/common/fingerprint.h"

namespace kvtier::bench {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The reference LRU of data/README.md: after each request its blocks are touched in order.
class LruSim {
 public:
  explicit LruSim(uint64_t capacity) : capacity_(capacity) {}
  // Leading blocks of `ids` present, then touches all of them.
  uint64_t Request(std::span<const uint64_t> ids) {
    uint64_t hit = 0;
    while (hit < ids.size() && map_.contains(ids[hit])) ++hit;
    for (uint64_t id : ids) {
      auto it = map_.find(id);
      if (it != map_.end()) {
        order_.splice(order_.begin(), order_, it->second);
        continue;
      }
      if (capacity_ == 0) continue;
      if (map_.size() >= capacity_) {
        map_.erase(order_.back());
        order_.pop_back();
      }
      order_.push_front(id);
      map_[id] = order_.begin();
    }
    return hit;
  }

 private:
  uint64_t capacity_;
  std::list<uint64_t> order_;
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> map_;
};

LatencySummary Summarize(std::vector<double>& ms) {
  LatencySummary s;
  s.count = ms.size();
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[std::min(ms.size() - 1, static_cast<size_t>(q * (ms.size() - 1) + 0.5))]; };
  s.p50 = at(0.50);
  s.p90 = at(0.90);
  s.p99 = at(0.99);
  s.max = ms.back();
  double sum = 0;
  for (double v : ms) sum += v;
  s.mean = sum / ms.size();
  return s;
}

nlohmann::json LatencyJson(const LatencySummary& s) {
  return {{"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}, {"max", s.max}, {"mean", s.mean}, {"count", s.count}};
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// Builds the windows of ReplayOptions::report_interval_requests from the report's running counters.
class WindowTracker {
 public:
  WindowTracker(const ReplayOptions& o, ReplayReport& rep) : o_(o), rep_(rep) {}

  void RequestStarted(size_t r) {
    if (o_.report_interval_requests == 0 || open_) return;
    open_ = true;
    start_ = rep_;  // the running counters; windows and latencies are not read from it
    w_ = WindowReport{};
    w_.index = rep_.windows.size();
    w_.first_request = r;
    w_.start_unix_ms = absl::ToUnixMillis(absl::Now());
    first_lookup_ = lookups_;
  }

  // After request r, which recorded `lookup_latency_ms` and had `errors` misses from error or put errors.
  void RequestEnded(size_t r, double lookup_latency_ms, uint64_t errors, bool last) {
    if (o_.report_interval_requests == 0) return;
    lookup_ms_.push_back(lookup_latency_ms);
    ++lookups_;
    const int64_t now = absl::ToUnixMillis(absl::Now());
    if (errors > 0) w_.last_error_unix_ms = now;
    if (!last && (r + 1 - w_.first_request) < o_.report_interval_requests) return;
    w_.end_unix_ms = now;
    w_.requests = rep_.requests - start_.requests;
    w_.blocks = rep_.blocks - start_.blocks;
    w_.hit_blocks = rep_.hit_blocks - start_.hit_blocks;
    w_.lookup_prefix_blocks = rep_.lookup_prefix_blocks - start_.lookup_prefix_blocks;
    w_.payload_mismatches = rep_.payload_mismatches - start_.payload_mismatches;
    w_.checksum_failures = rep_.checksum_failures - start_.checksum_failures;
    w_.client_errors = rep_.client_errors - start_.client_errors;
    w_.misses_from_errors = rep_.misses_from_errors - start_.misses_from_errors;
    w_.put_errors = rep_.put_errors - start_.put_errors;
    std::vector<double> slice(lookup_ms_.begin() + first_lookup_, lookup_ms_.end());
    w_.lookup_ms = Summarize(slice);
    rep_.windows.push_back(w_);
    if (o_.on_window) o_.on_window(w_);
    open_ = false;
  }

 private:
  const ReplayOptions& o_;
  ReplayReport& rep_;
  bool open_ = false;
  ReplayReport start_;
  WindowReport w_;
  std::vector<double> lookup_ms_;
  size_t lookups_ = 0, first_lookup_ = 0;
};

}  // namespace

double PrefillModel::PrefillSeconds(double start, double end) const {
  if (end <= start) return 0;
  const double flops =
      flops_per_token * (end - start) + attention_flops_per_token_position * (end * end - start * start) / 2;
  return flops / (peak_flops * mfu);
}

void BlockTokens(uint64_t hash_id, std::span<uint32_t> out) {
  uint64_t state = hash_id * 0x2545f4914f6cdd1dULL + 0x1234;
  for (auto& t : out) t = static_cast<uint32_t>(SplitMix64(state) % 128256);
}

void BlockPayload(uint64_t hash_id, std::span<std::byte> out) {
  uint64_t state = hash_id ^ 0x5bd1e9955bd1e995ULL;
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t v = SplitMix64(state);
    std::memcpy(out.data() + i, &v, 8);
  }
  if (i < out.size()) {
    const uint64_t v = SplitMix64(state);
    std::memcpy(out.data() + i, &v, out.size() - i);
  }
}

absl::StatusOr<Namespace> ReplayNamespace(const ReplayOptions& o) {
  const uint64_t unit = 2ULL * o.block_tokens * 2;  // K and V, bf16
  if (o.block_tokens == 0 || o.block_bytes == 0 || o.block_bytes % unit != 0) {
    return absl::InvalidArgumentError(absl::StrCat("block_bytes must be a positive multiple of ", unit, " (K and V of ",
                                                   o.block_tokens, " bf16 tokens)"));
  }
  Namespace ns;
  ns.tenant = o.tenant;
  ns.model = o.model;
  ns.layout = {.kind = LayoutKind::kStandard,
               .dtype = DType::kBf16,
               .codec = Codec::kNone,
               .num_layers = 1,
               .num_kv_heads = 1,
               .head_dim = static_cast<uint32_t>(o.block_bytes / unit),
               .block_tokens = o.block_tokens,
               .tp_size = 1};
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  return ns;
}

absl::StatusOr<ReplayReport> Replay(client::Client& client, std::span<const TraceRequest> requests,
                                    const ReplayOptions& o) {
  auto ns_or = ReplayNamespace(o);
  if (!ns_or.ok()) return ns_or.status();
  const Namespace ns = *ns_or;
  const uint64_t bb = o.block_bytes;
  ReplayReport rep;
  rep.capacity_blocks = o.capacity_blocks;
  LruSim lru(o.capacity_blocks);
  std::vector<double> lookup_ms, get_ms, put_ms;
  std::vector<uint32_t> tokens;
  std::vector<std::byte> fetched, expected(bb), outgoing;
  const uint64_t misses_before = client.stats().misses_from_errors.load();
  const uint64_t checksum_before = client.stats().checksum_failures.load();
  double ttft_plain = 0, ttft_cached = 0;
  const absl::Time start = absl::Now();
  const int64_t first_ts = requests.empty() ? 0 : requests.front().timestamp_ms;
  WindowTracker windows(o, rep);

  for (size_t r = 0; r < requests.size(); ++r) {
    const TraceRequest& req = requests[r];
    if (o.time_scale > 0) {
      const absl::Time due = start + absl::Milliseconds((req.timestamp_ms - first_ts) / o.time_scale);
      if (due > absl::Now()) absl::SleepFor(due - absl::Now());
    }
    windows.RequestStarted(r);
    const uint64_t request_misses_before = client.stats().misses_from_errors.load();
    const uint64_t request_put_errors_before = rep.put_errors;
    const size_t n = req.hash_ids.size();
    rep.requests++;
    rep.blocks += n;
    rep.input_tokens += req.input_length;
    rep.lru_sim_hit_blocks += lru.Request(req.hash_ids);

    tokens.resize(n * o.block_tokens);
    for (size_t i = 0; i < n; ++i) {
      BlockTokens(req.hash_ids[i], std::span(tokens).subspan(i * o.block_tokens, o.block_tokens));
    }
    auto fps = ChainFingerprints(ns, tokens);
    if (!fps.ok()) return fps.status();

    absl::Time t0 = absl::Now();
    auto lookup = client.LookupPrefix(ns, *fps);
    const double lookup_latency = Ms(absl::Now() - t0);
    lookup_ms.push_back(lookup_latency);
    uint32_t prefix = 0;
    if (!lookup.ok()) {
      rep.client_errors++;
    } else {
      prefix = lookup->prefix_blocks;
    }
    rep.lookup_prefix_blocks += prefix;

    // Fetch the prefix and check every byte; the hit is the leading run that arrived intact.
    uint32_t hit = 0;
    if (prefix > 0) {
      fetched.resize(prefix * bb);
      std::vector<std::span<std::byte>> bufs;
      for (uint32_t i = 0; i < prefix; ++i) bufs.emplace_back(fetched.data() + i * bb, bb);
      t0 = absl::Now();
      auto got = client.Get(ns, std::span(*fps).first(prefix), 0, bufs);
      get_ms.push_back(Ms(absl::Now() - t0));
      if (!got.ok()) {
        rep.client_errors++;
      } else {
        bool run = true;
        for (uint32_t i = 0; i < prefix; ++i) {
          if ((*got)[i] != client::GetResult::kHit) {
            run = false;
            continue;
          }
          BlockPayload(req.hash_ids[i], expected);
          if (std::memcmp(bufs[i].data(), expected.data(), bb) != 0) {
            rep.payload_mismatches++;
            run = false;
            continue;
          }
          rep.bytes_fetched += bb;
          if (run) ++hit;
        }
      }
    }
    rep.hit_blocks += hit;
    const uint64_t hit_tokens = std::min<uint64_t>(uint64_t{hit} * o.block_tokens, req.input_length);
    rep.hit_tokens += hit_tokens;

    // Store the blocks after the hit (a block already present only refreshes its recency).
    if (hit < n) {
      const size_t m = n - hit;
      outgoing.resize(m * bb);
      std::vector<std::span<const std::byte>> views;
      for (size_t i = 0; i < m; ++i) {
        std::span<std::byte> b(outgoing.data() + i * bb, bb);
        BlockPayload(req.hash_ids[hit + i], b);
        views.emplace_back(b);
      }
      t0 = absl::Now();
      auto put = client.Put(ns, std::span(*fps).subspan(hit), 0, views, hit);
      put_ms.push_back(Ms(absl::Now() - t0));
      if (!put.ok()) {
        rep.client_errors++;
      } else {
        for (client::PutResult p : *put) {
          if (p == client::PutResult::kStored) rep.bytes_stored += bb;
          if (p == client::PutResult::kError) rep.put_errors++;
          if (p == client::PutResult::kNoSpace) rep.put_rejected++;
        }
      }
    }

    const double L = req.input_length;
    ttft_plain += o.prefill.PrefillSeconds(0, L);
    const double reused = std::min<double>(hit_tokens, std::max(0.0, L - 1));  // the last token is always computed
    ttft_cached += o.prefill.PrefillSeconds(reused, L) +
                   (hit > 0 ? hit * o.prefill.model_block_bytes / o.prefill.fetch_bytes_per_s : 0) +
                   lookup_latency / 1000.0;
    // Running totals, so that windows see them; the final values are set below.
    const uint64_t request_misses = client.stats().misses_from_errors.load() - request_misses_before;
    rep.misses_from_errors += request_misses;
    rep.checksum_failures = client.stats().checksum_failures.load() - checksum_before;
    windows.RequestEnded(r, lookup_latency, request_misses + (rep.put_errors - request_put_errors_before),
                         r + 1 == requests.size());
    if (o.after_request) o.after_request(r);
  }
  rep.duration_s = absl::ToDoubleSeconds(absl::Now() - start);
  rep.misses_from_errors = client.stats().misses_from_errors.load() - misses_before;
  rep.checksum_failures = client.stats().checksum_failures.load() - checksum_before;
  rep.lookup_ms = Summarize(lookup_ms);
  rep.get_ms = Summarize(get_ms);
  rep.put_ms = Summarize(put_ms);
  if (rep.requests > 0) {
    rep.ttft_no_cache_mean_s = ttft_plain / rep.requests;
    rep.ttft_cached_mean_s = ttft_cached / rep.requests;
  }
  return rep;
}

std::string ReplayReport::ToJson() const {
  nlohmann::json j = {
      {"requests", requests},
      {"blocks", blocks},
      {"capacity_blocks", capacity_blocks},
      {"block_hit_ratio", block_hit_ratio()},
      {"token_hit_ratio", token_hit_ratio()},
      {"lru_sim_hit_ratio", capacity_blocks ? nlohmann::json(lru_sim_hit_ratio()) : nlohmann::json(nullptr)},
      {"lookup_prefix_hit_ratio", blocks ? double(lookup_prefix_blocks) / double(blocks) : 0.0},
      {"hit_blocks", hit_blocks},
      {"input_tokens", input_tokens},
      {"prefill_tokens_saved", hit_tokens},
      {"payload_mismatches", payload_mismatches},
      {"checksum_failures", checksum_failures},
      {"client_errors", client_errors},
      {"misses_from_errors", misses_from_errors},
      {"put_errors", put_errors},
      {"put_rejected", put_rejected},
      {"bytes_fetched", bytes_fetched},
      {"bytes_stored", bytes_stored},
      {"duration_s", duration_s},
      {"requests_per_s", duration_s > 0 ? requests / duration_s : 0.0},
      {"throughput_bytes_per_s", duration_s > 0 ? (bytes_fetched + bytes_stored) / duration_s : 0.0},
      {"lookup_latency_ms", LatencyJson(lookup_ms)},
      {"get_latency_ms", LatencyJson(get_ms)},
      {"put_latency_ms", LatencyJson(put_ms)},
      {"ttft_estimate_s",
       {{"no_cache_mean", ttft_no_cache_mean_s},
        {"cached_mean", ttft_cached_mean_s},
        {"speedup", ttft_cached_mean_s > 0 ? ttft_no_cache_mean_s / ttft_cached_mean_s : 0.0}}},
  };
  if (!windows.empty()) {
    nlohmann::json w = nlohmann::json::array();
    for (const WindowReport& win : windows) w.push_back(nlohmann::json::parse(win.ToJson()));
    j["windows"] = std::move(w);
  }
  return j.dump();
}

std::string WindowReport::ToJson() const {
  const nlohmann::json j = {
      {"index", index},
      {"first_request", first_request},
      {"requests", requests},
      {"blocks", blocks},
      {"hit_blocks", hit_blocks},
      {"block_hit_ratio", block_hit_ratio()},
      {"lookup_prefix_blocks", lookup_prefix_blocks},
      {"payload_mismatches", payload_mismatches},
      {"checksum_failures", checksum_failures},
      {"client_errors", client_errors},
      {"misses_from_errors", misses_from_errors},
      {"put_errors", put_errors},
      {"start_unix_ms", start_unix_ms},
      {"end_unix_ms", end_unix_ms},
      {"last_error_unix_ms", last_error_unix_ms},
      {"lookup_latency_ms", LatencyJson(lookup_ms)},
  };
  return j.dump();
}

std::string ReplayReport::ToText() const {
  std::string s;
  absl::StrAppendFormat(&s, "requests            %d (%d blocks, %d input tokens) in %.1f s (%.0f req/s)\n", requests,
                        blocks, input_tokens, duration_s, duration_s > 0 ? requests / duration_s : 0.0);
  if (capacity_blocks > 0) {
    absl::StrAppendFormat(&s, "capacity            %d blocks\n", capacity_blocks);
    absl::StrAppendFormat(&s, "block hit ratio     %.4f   (reference LRU of the same capacity: %.4f)\n",
                          block_hit_ratio(), lru_sim_hit_ratio());
  } else {
    absl::StrAppendFormat(&s, "capacity            not given (--capacity_blocks), so no reference LRU\n");
    absl::StrAppendFormat(&s, "block hit ratio     %.4f\n", block_hit_ratio());
  }
  absl::StrAppendFormat(&s, "token hit ratio     %.4f   (%d prefill tokens saved)\n", token_hit_ratio(), hit_tokens);
  absl::StrAppendFormat(&s, "correctness         %d payload mismatches, %d checksum failures, %d client errors\n",
                        payload_mismatches, checksum_failures, client_errors);
  absl::StrAppendFormat(&s, "faults              %d misses from errors, %d failed puts, %d puts rejected (no space)\n",
                        misses_from_errors, put_errors, put_rejected);
  absl::StrAppendFormat(&s, "bytes               %.1f MiB fetched, %.1f MiB stored (%.2f GB/s)\n",
                        bytes_fetched / 1048576.0, bytes_stored / 1048576.0,
                        duration_s > 0 ? (bytes_fetched + bytes_stored) / duration_s / 1e9 : 0.0);
  auto lat = [&](const char* name, const LatencySummary& l) {
    absl::StrAppendFormat(&s, "%-19s p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms  (%d calls)\n", name, l.p50,
                          l.p90, l.p99, l.max, l.count);
  };
  lat("lookup latency", lookup_ms);
  lat("get latency", get_ms);
  lat("put latency", put_ms);
  absl::StrAppendFormat(
      &s, "TTFT estimate       %.1f ms without the cache, %.1f ms with it (x%.2f; model in bench/README.md)\n",
      ttft_no_cache_mean_s * 1000, ttft_cached_mean_s * 1000,
      ttft_cached_mean_s > 0 ? ttft_no_cache_mean_s / ttft_cached_mean_s : 0.0);
  return s;
}

}  // namespace kvtier::bench
