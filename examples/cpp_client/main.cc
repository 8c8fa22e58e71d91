// cpp_client: a C++ program that uses an installed kvtier (find_package(kvtier CONFIG), kvtier::client).
// It stores the KV blocks of one prompt in a kvtier cluster, finds them again by prefix, reads them
// back and checks every byte. Exit status 0 when all of that worked, 1 otherwise.
//
// Usage: cpp_client HOST:PORT [HOST:PORT ...]
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <vector>

#include "absl/time/time.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/namespace.h"

namespace {

// Block i's bytes: a pattern that differs per block and per byte.
std::byte PatternByte(size_t block, size_t offset) { return static_cast<std::byte>((block * 131 + offset * 7) & 0xff); }

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "cpp_client: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s HOST:PORT [HOST:PORT ...]\n", argv[0]);
    return 2;
  }
  kvtier::client::ClientOptions options;
  for (int i = 1; i < argc; ++i) options.members.push_back(argv[i]);
  options.rpc_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<kvtier::client::Client>> client = kvtier::client::Client::Connect(options);
  if (!client.ok()) return Fail("connect", client.status());

  // A small model: 2 layers, 2 KV heads of 16 dims, bf16, 16-token blocks (4 KiB per block).
  kvtier::Namespace ns;
  ns.tenant = "examples";
  ns.model = "cpp-client/tiny";
  ns.layout.num_layers = 2;
  ns.layout.num_kv_heads = 2;
  ns.layout.head_dim = 16;
  ns.layout.block_tokens = 16;
  std::vector<uint32_t> tokens;
  for (uint32_t t = 0; t < 4 * 16 + 5; ++t) tokens.push_back(1000 + t);  // 4 full blocks and 5 tokens
  absl::StatusOr<std::vector<kvtier::Fingerprint>> fps = kvtier::ChainFingerprints(ns, tokens);
  if (!fps.ok()) return Fail("fingerprints", fps.status());

  const uint64_t block_bytes = ns.layout.ShardBytes();
  std::vector<std::vector<std::byte>> blocks(fps->size(), std::vector<std::byte>(block_bytes));
  std::vector<std::span<const std::byte>> in;
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (size_t i = 0; i < block_bytes; ++i) blocks[b][i] = PatternByte(b, i);
    in.emplace_back(blocks[b]);
  }
  absl::StatusOr<std::vector<kvtier::client::PutResult>> put = (*client)->Put(ns, *fps, /*shard=*/0, in);
  if (!put.ok()) return Fail("put", put.status());
  for (kvtier::client::PutResult r : *put) {
    if (r != kvtier::client::PutResult::kStored && r != kvtier::client::PutResult::kAlreadyPresent) {
      std::fprintf(stderr, "cpp_client: put: a block came back %s\n", kvtier::client::PutResultName(r));
      return 1;
    }
  }

  absl::StatusOr<kvtier::client::LookupResult> hit = (*client)->LookupPrefix(ns, *fps);
  if (!hit.ok()) return Fail("lookup", hit.status());
  if (hit->prefix_blocks != fps->size()) {
    std::fprintf(stderr, "cpp_client: lookup found %u of %zu blocks\n", hit->prefix_blocks, fps->size());
    return 1;
  }

  std::vector<std::vector<std::byte>> out(fps->size(), std::vector<std::byte>(block_bytes));
  std::vector<std::span<std::byte>> out_spans(out.begin(), out.end());
  absl::StatusOr<std::vector<kvtier::client::GetResult>> got = (*client)->Get(ns, *fps, /*shard=*/0, out_spans);
  if (!got.ok()) return Fail("get", got.status());
  for (size_t b = 0; b < out.size(); ++b) {
    if ((*got)[b] != kvtier::client::GetResult::kHit || out[b] != blocks[b]) {
      std::fprintf(stderr, "cpp_client: block %zu came back %s\n", b, kvtier::client::GetResultName((*got)[b]));
      return 1;
    }
  }
  std::printf("cpp_client: stored, found and read back %zu blocks of %llu bytes\n", out.size(),
              static_cast<unsigned long long>(block_bytes));
  return 0;
}
