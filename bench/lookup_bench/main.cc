// lookup_bench: fingerprinting speed against raw SHA-256 on the same inputs, and the latency of a
// longest-prefix lookup against prompt length on a local cluster of in-process servers.
//
//   lookup_bench [--servers=3] [--runs=200] [--quick]
//
// Part 1 hashes a 128K-token prompt with ChainFingerprints at 16 and 256 tokens per block and compares
// with OpenSSL's SHA-256 over the same number of messages of the same size, measured in the same run,
// twice: through EVP (the work that `openssl speed -evp sha256` measures) and through the low-level
// SHA256_Init/Update/Final that ChainFingerprints calls (the same assembly without EVP's per-digest dispatch). Part 2
// stores every block of the prompt on the cluster, then times LookupPrefix for prompts of 1K to 128K tokens (p50, p99).
// The low-level baseline (SHA256_Init/Update/Final) is deprecated in OpenSSL 3 as an interface.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/evp.h>
#include <openssl/sha.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/server/server.h"

ABSL_FLAG(int, servers, 3, "in-process servers in the cluster");
ABSL_FLAG(int, runs, 200, "lookups per prompt length");
ABSL_FLAG(bool, quick, false, "a few runs only (the ctest smoke test)");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

kvtier::Namespace BenchNamespace(uint32_t block_tokens) {
  kvtier::Namespace ns;
  ns.tenant = "bench";
  ns.model = "lookup-bench";
  // The smallest valid payload (one bf16 value per token), so part 2 measures lookups, not storage.
  ns.layout = {.num_layers = 1, .num_kv_heads = 1, .head_dim = 1, .block_tokens = block_tokens};
  return ns;
}

// Median seconds of `runs` calls of fn().
template <typename Fn>
double MedianSeconds(int runs, Fn fn) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto start = Clock::now();
    fn();
    t.push_back(Seconds(Clock::now() - start));
  }
  return Percentile(t, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int runs = quick ? 5 : absl::GetFlag(FLAGS_runs);
  constexpr size_t kPromptTokens = 128 * 1024;
  std::vector<uint32_t> tokens(kPromptTokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 2654435761u) % 128256);

  std::printf("== fingerprinting a %zu-token prompt (median of %d runs)\n", kPromptTokens, runs);
  std::printf("%-12s %10s %12s %12s %12s %10s %10s\n", "block_tokens", "blocks", "kvtier ms", "evp ms", "SHA256_* ms",
              "vs evp", "vs SHA256_*");
  for (uint32_t bt : {16u, 256u}) {
    const kvtier::Namespace ns = BenchNamespace(bt);
    const size_t blocks = kPromptTokens / bt;
    const double ours = MedianSeconds(runs, [&] { (void)kvtier::ChainFingerprints(ns, tokens); });
    // Baseline: one SHA-256 per block over 32 + 4 x block_tokens bytes (previous digest + tokens), one
    // reused context, as `openssl speed -evp sha256 -bytes N` hashes N-byte messages.
    std::vector<unsigned char> msg(32 + 4 * bt, 0x5a);
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);  // fetched once, as openssl speed does
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    const double raw = MedianSeconds(runs, [&] {
      for (size_t b = 0; b < blocks; ++b) {
        EVP_DigestInit_ex(ctx, md, nullptr);
        EVP_DigestUpdate(ctx, msg.data(), msg.size());
        EVP_DigestFinal_ex(ctx, digest, &len);
        msg[b % 32] = digest[0];
      }
    });
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
    const double low = MedianSeconds(runs, [&] {
      for (size_t b = 0; b < blocks; ++b) {
        SHA256_CTX c;
        SHA256_Init(&c);
        SHA256_Update(&c, msg.data(), msg.size());
        SHA256_Final(digest, &c);
        msg[b % 32] = digest[0];
      }
    });
    std::printf("%-12u %10zu %12.3f %12.3f %12.3f %10.2f %10.2f\n", bt, blocks, ours * 1e3, raw * 1e3, low * 1e3,
                raw / ours, low / ours);
  }

  const int n_servers = absl::GetFlag(FLAGS_servers);
  std::vector<std::unique_ptr<kvtier::server::Server>> servers;
  std::vector<std::string> members;
  for (int i = 0; i < n_servers; ++i) {
    auto s = kvtier::server::Server::Start({.node_id = "bench-" + std::to_string(i),
                                            .metrics_address = "",
                                            .host_cache_bytes = 64ULL << 20,
                                            .slab_bytes = 1ULL << 20,
                                            .max_block_bytes = 1ULL << 20});
    if (!s.ok()) {
      std::fprintf(stderr, "lookup_bench: %s\n", std::string(s.status().message()).c_str());
      return 1;
    }
    members.push_back("127.0.0.1:" + std::to_string((*s)->grpc_port()));
    servers.push_back(std::move(s).value());
  }
  auto client = kvtier::client::Client::Connect({.members = members, .max_blocks_per_request = 65536});
  if (!client.ok()) {
    std::fprintf(stderr, "lookup_bench: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  const kvtier::Namespace ns = BenchNamespace(16);
  auto fps = kvtier::ChainFingerprints(ns, tokens);
  const uint64_t block_bytes = ns.layout.ShardBytes();
  std::vector<std::byte> payload(fps->size() * block_bytes, std::byte{1});
  std::vector<std::span<const std::byte>> views;
  for (size_t i = 0; i < fps->size(); ++i) views.emplace_back(payload.data() + i * block_bytes, block_bytes);
  auto put = (*client)->Put(ns, *fps, 0, views);
  if (!put.ok()) return 1;

  std::printf("\n== LookupPrefix on %d local servers, 16 tokens per block, all blocks cached (%d runs)\n", n_servers,
              runs);
  std::printf("%-14s %8s %10s %10s %12s\n", "prompt tokens", "blocks", "p50 ms", "p99 ms", "prefix");
  for (size_t len : {1024ul, 8192ul, 32768ul, 131072ul}) {
    std::span<const kvtier::Fingerprint> chain(fps->data(), len / 16);
    std::vector<double> ms;
    uint32_t prefix = 0;
    for (int i = 0; i < runs; ++i) {
      const auto start = Clock::now();
      auto r = (*client)->LookupPrefix(ns, chain);
      ms.push_back(Seconds(Clock::now() - start) * 1e3);
      prefix = r.ok() ? r->prefix_blocks : 0;
    }
    std::printf("%-14zu %8zu %10.3f %10.3f %12u\n", len, chain.size(), Percentile(ms, 0.5), Percentile(ms, 0.99),
                prefix);
    if (prefix != chain.size()) {
      std::fprintf(stderr, "lookup_bench: expected the whole prompt cached\n");
      return 1;
    }
  }
  return 0;
}
