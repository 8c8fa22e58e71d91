// Runs the real kvtierctl binary for the integration tests, and puts blocks with the real client.
#ifndef KVTIER_TESTS_INTEGRATION_KVTIERCTL_RUNNER_H_
#define KVTIER_TESTS_INTEGRATION_KVTIERCTL_RUNNER_H_

#include <sys/wait.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "testing/server_process.h"

namespace kvtier::testing {

struct CtlResult {
  int exit_code = -1;
  std::string output;  // stdout, plus stderr when asked
};

// Runs `kvtierctl args` (through the shell, without $KVTIER_MEMBERS) and returns its exit code and
// stdout, plus stderr when `with_stderr`.
inline CtlResult RunCtl(const std::string& args, bool with_stderr = false) {
  const std::string cmd = absl::StrCat("env -u KVTIER_MEMBERS ", BinaryDir(), "/cli/kvtierctl ", args,
                                       with_stderr ? " 2>&1" : " 2>/dev/null");
  CtlResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline nlohmann::json ParseJson(const std::string& text) { return nlohmann::json::parse(text, nullptr, false); }

// A payload unique to block `index` (a little xorshift stream), so a block's bytes can be recognized.
inline std::vector<std::byte> BlockBytes(uint64_t size, uint64_t index) {
  std::vector<std::byte> out(size);
  uint64_t x = 0x9e3779b97f4a7c15ULL * (index + 1);
  for (uint64_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<std::byte>(x & 0xff);
  }
  return out;
}

// `n` consecutive blocks of a prompt whose tokens start at `seed`: fingerprints and their payloads.
struct Prompt {
  std::vector<uint32_t> tokens;
  std::vector<Fingerprint> fps;
  std::vector<std::vector<std::byte>> data;
};
inline absl::StatusOr<Prompt> MakePrompt(const Namespace& ns, size_t n, uint32_t seed) {
  Prompt p;
  p.tokens.resize(n * ns.layout.block_tokens);
  for (uint32_t i = 0; i < p.tokens.size(); ++i) p.tokens[i] = seed + i * 7;
  auto fps = ChainFingerprints(ns, p.tokens);
  if (!fps.ok()) return fps.status();
  p.fps = *std::move(fps);
  for (size_t i = 0; i < n; ++i) p.data.push_back(BlockBytes(ns.layout.ShardBytes(), seed * 1000003ULL + i));
  return p;
}

// Puts blocks [first, first + count) of `p` (shard 0). Errors: the client's, or Internal when a block
// was not stored.
inline absl::Status PutPrompt(client::Client& c, const Namespace& ns, const Prompt& p, size_t first = 0,
                              size_t count = SIZE_MAX) {
  count = std::min(count, p.fps.size() - first);
  std::vector<std::span<const std::byte>> in;
  for (size_t i = first; i < first + count; ++i) in.emplace_back(p.data[i]);
  auto put = c.Put(ns, std::span<const Fingerprint>(p.fps).subspan(first, count), 0, in, static_cast<uint32_t>(first));
  if (!put.ok()) return put.status();
  for (size_t i = 0; i < put->size(); ++i) {
    if ((*put)[i] != client::PutResult::kStored && (*put)[i] != client::PutResult::kAlreadyPresent) {
      return absl::InternalError(absl::StrCat("block ", first + i, ": ", client::PutResultName((*put)[i])));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_KVTIERCTL_RUNNER_H_
