// reference_worker: serves a few prompts that share a long prefix with the tiny reference transformer,
// once through kvtier and once by full recompute, and prints TTFT-like timings of both.
//
//   reference_worker --members=host:port[,host:port...] [--codec=none|int8|fp8_e4m3] [--prompts=4]
//                    [--prefix_tokens=1024] [--suffix_tokens=64] [--layers=4] [--seed=1]
//   reference_worker --quick          # in-process server, small prompts (the ctest smoke test)
//
// With no --members it starts --local_servers in-process servers on 127.0.0.1:0. See README.md.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "kvtier/client/client.h"
#include "kvtier/reference_worker/reference_worker.h"
#include "kvtier/server/server.h"

ABSL_FLAG(std::string, members, "", "comma-separated host:port of kvtier servers; empty = in-process servers");
ABSL_FLAG(int, local_servers, 1, "in-process servers to start when --members is empty");
ABSL_FLAG(std::string, codec, "none", "how blocks are stored: none (bf16), int8 or fp8_e4m3");
ABSL_FLAG(int, prompts, 4, "prompts sharing the prefix (the first one finds nothing cached)");
ABSL_FLAG(int, prefix_tokens, 1024, "tokens of the shared prefix (a system prompt)");
ABSL_FLAG(int, suffix_tokens, 64, "tokens unique to each prompt");
ABSL_FLAG(int, layers, 4, "transformer layers");
ABSL_FLAG(uint64_t, seed, 1, "seed of the prompt tokens (the weights use ModelConfig's seed)");
ABSL_FLAG(std::string, tenant, "reference", "namespace tenant");
ABSL_FLAG(bool, quick, false, "one in-process server, short prompts, non-zero exit on any mismatch");

namespace {

using kvtier::reference_worker::ReferenceWorker;
using kvtier::reference_worker::ServeResult;
using kvtier::reference_worker::WorkerOptions;

std::vector<uint32_t> RandomTokens(uint64_t seed, int n, uint32_t vocab) {
  std::vector<uint32_t> t(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (auto& v : t) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<uint32_t>(x % vocab);
  }
  return t;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

int Run() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int prefix_tokens = quick ? 200 : absl::GetFlag(FLAGS_prefix_tokens);
  const int suffix_tokens = quick ? 20 : absl::GetFlag(FLAGS_suffix_tokens);
  const int num_prompts = quick ? 3 : absl::GetFlag(FLAGS_prompts);
  auto codec = kvtier::ParseCodec(absl::GetFlag(FLAGS_codec));
  if (!codec.ok()) {
    std::fprintf(stderr, "--codec: %s\n", codec.status().ToString().c_str());
    return 2;
  }

  std::vector<std::unique_ptr<kvtier::server::Server>> servers;
  std::vector<std::string> members = absl::StrSplit(absl::GetFlag(FLAGS_members), ',', absl::SkipWhitespace());
  if (members.empty()) {
    const int n = quick ? 1 : absl::GetFlag(FLAGS_local_servers);
    for (int i = 0; i < n; ++i) {
      auto s = kvtier::server::Server::Start({.node_id = "local-" + std::to_string(i),
                                              .metrics_address = "",
                                              .host_cache_bytes = 256ULL << 20,
                                              .slab_bytes = 4ULL << 20,
                                              .max_block_bytes = 4ULL << 20});
      if (!s.ok()) {
        std::fprintf(stderr, "in-process server: %s\n", s.status().ToString().c_str());
        return 1;
      }
      members.push_back("127.0.0.1:" + std::to_string((*s)->grpc_port()));
      servers.push_back(std::move(s).value());
    }
  }
  auto client = kvtier::client::Client::Connect({.members = members});
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }

  WorkerOptions options;
  options.model.num_layers = absl::GetFlag(FLAGS_layers);
  options.tenant = absl::GetFlag(FLAGS_tenant);
  options.codec = *codec;
  options.num_pages = (prefix_tokens + suffix_tokens) / options.page_size + 2;
  auto cached = ReferenceWorker::Create(options, client->get());
  auto plain = ReferenceWorker::Create(options, nullptr);
  if (!cached.ok() || !plain.ok()) {
    std::fprintf(stderr, "worker: %s\n", (cached.ok() ? plain.status() : cached.status()).ToString().c_str());
    return 1;
  }
  std::printf("namespace %s/%s rev %s layout %s (%llu bytes per block), %zu member(s)\n",
              (*cached)->ns().tenant.c_str(), (*cached)->ns().model.c_str(), (*cached)->ns().revision->c_str(),
              (*cached)->ns().layout.DebugString().c_str(),
              static_cast<unsigned long long>((*cached)->ns().layout.ShardBytes()), members.size());

  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const uint32_t vocab = static_cast<uint32_t>(options.model.vocab_size);
  const std::vector<uint32_t> prefix = RandomTokens(seed, prefix_tokens, vocab);
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < num_prompts; ++i) {
    std::vector<uint32_t> p = prefix;
    const auto suffix = RandomTokens(seed * 1000 + i + 1, suffix_tokens, vocab);
    p.insert(p.end(), suffix.begin(), suffix.end());
    prompts.push_back(std::move(p));
  }
  if (!prompts.empty()) prompts.push_back(prompts.front());  // a repeat: everything cached

  std::printf("%-7s %7s %7s %9s %9s %10s %9s %9s %11s %8s %11s\n", "prompt", "tokens", "reused", "lookup_ms",
              "fetch_ms", "compute_ms", "ttft_ms", "store_ms", "nocache_ms", "speedup", "max|dlogit|");
  double total_cached = 0, total_plain = 0, worst = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r0 = (*plain)->Serve(prompts[i]);
    auto r1 = (*cached)->Serve(prompts[i]);
    if (!r0.ok() || !r1.ok()) {
      std::fprintf(stderr, "serve: %s\n", (r0.ok() ? r1.status() : r0.status()).ToString().c_str());
      return 1;
    }
    double max_diff = 0;
    for (size_t v = 0; v < r0->logits.size(); ++v) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(r0->logits[v] - r1->logits[v])));
    }
    worst = std::max(worst, max_diff);
    total_cached += Ms(r1->ttft());
    total_plain += Ms(r0->ttft());
    std::printf("%-7s %7u %7u %9.2f %9.2f %10.2f %9.2f %9.2f %11.2f %7.1fx %11.3g\n",
                i + 1 == prompts.size() ? "repeat" : std::to_string(i).c_str(), r1->prompt_tokens, r1->computed_from,
                Ms(r1->lookup_time), Ms(r1->fetch_time), Ms(r1->compute_time), Ms(r1->ttft()), Ms(r1->store_time),
                Ms(r0->ttft()), Ms(r0->ttft()) / Ms(r1->ttft()), max_diff);
  }
  const auto& st = (*client)->stats();
  std::printf("total ttft %.2f ms with kvtier, %.2f ms recomputing (%.2f ms of CPU prefill saved)\n", total_cached,
              total_plain, total_plain - total_cached);
  std::printf(
      "client: lookups %llu, prefix hit blocks %llu, fetched blocks %llu (%llu bytes), stored %llu, "
      "misses from errors %llu\n",
      static_cast<unsigned long long>(st.lookups.load()), static_cast<unsigned long long>(st.prefix_hit_blocks.load()),
      static_cast<unsigned long long>(st.retrieve_hit_blocks.load()),
      static_cast<unsigned long long>(st.retrieve_hit_bytes.load()),
      static_cast<unsigned long long>(st.put_stored_blocks.load()),
      static_cast<unsigned long long>(st.misses_from_errors.load()));
  if (quick) {
    // The smoke test: codec none must reproduce the recompute exactly, and the repeat must hit.
    if (*codec == kvtier::Codec::kNone && worst != 0.0) {
      std::fprintf(stderr, "FAIL: logits with fetched KV differ from recompute by %g\n", worst);
      return 1;
    }
    if (st.retrieve_hit_blocks.load() == 0) {
      std::fprintf(stderr, "FAIL: no block was fetched\n");
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return Run();
}
