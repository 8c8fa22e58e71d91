// BlockMeta: what an inference engine knows of a block beyond its bytes, kept so that KV-aware routers
// can count what kvtier holds in the engine's own terms (docs/events.md, "Engine block metadata").
#ifndef KVTIER_COMMON_BLOCK_META_H_
#define KVTIER_COMMON_BLOCK_META_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtier/common/fingerprint.h"

namespace kvtier {

// The most token ids one block's metadata may carry, and the longest engine hash in bytes. A block of a
// real engine holds 16 to a few hundred tokens; vLLM's bytes hashes are 32 bytes.
inline constexpr size_t kMaxBlockTokenIds = 1024;
inline constexpr size_t kMaxEngineHashBytes = 64;

// An engine's own hash of a block, as its KV events carry it (vLLM's ExternalBlockHash, `bytes | int`;
// SGLang's signed 64-bit hashes). Integers cover [-2^63, 2^64): kInt holds the negative ones and
// kUint the others, so that each is written to msgpack exactly as Python's msgpack writes that int.
struct EngineBlockHash {
  enum class Form : uint8_t { kNone = 0, kInt = 1, kUint = 2, kBytes = 3 };
  Form form = Form::kNone;
  int64_t int_value = 0;    // kInt
  uint64_t uint_value = 0;  // kUint
  std::string bytes;        // kBytes: 1..kMaxEngineHashBytes bytes

  static EngineBlockHash Int(int64_t v) {
    if (v >= 0) return Uint(static_cast<uint64_t>(v));
    EngineBlockHash h;
    h.form = Form::kInt;
    h.int_value = v;
    return h;
  }
  static EngineBlockHash Uint(uint64_t v) {
    EngineBlockHash h;
    h.form = Form::kUint;
    h.uint_value = v;
    return h;
  }
  static EngineBlockHash Bytes(std::string b) {
    EngineBlockHash h;
    h.form = Form::kBytes;
    h.bytes = std::move(b);
    return h;
  }
  bool empty() const { return form == Form::kNone; }
  friend bool operator==(const EngineBlockHash& a, const EngineBlockHash& b) {
    if (a.form != b.form) return false;
    switch (a.form) {
      case Form::kNone:
        return true;
      case Form::kInt:
        return a.int_value == b.int_value;
      case Form::kUint:
        return a.uint_value == b.uint_value;
      case Form::kBytes:
        return a.bytes == b.bytes;
    }
    return false;
  }
};

// Optional per-block metadata of a put. Every field may be left empty; a block with no metadata at all
// behaves exactly as a block put without it. Held by the server beside the block (in memory and in the
// disk tier's record) for as long as the block; about 4 KiB at most per block, outside the tiers'
// byte budgets. The client fills parent_fingerprint itself (Client::Put), so most blocks carry some.
struct BlockMeta {
  EngineBlockHash hash;             // the engine's hash of this block
  EngineBlockHash parent_hash;      // the engine's hash of the previous block of its chain; empty: the first
  std::vector<uint32_t> token_ids;  // the block's token ids, at most kMaxBlockTokenIds
  std::optional<int64_t> lora_id;   // the LoRA adapter the block was computed with; nullopt: none
  // kvtier's fingerprint of the previous block of the same prefix (the block at depth - 1, in the same
  // namespace); nullopt: the chain's first block, or not known to the writer.
  std::optional<Fingerprint> parent_fingerprint;

  // True when no engine field is set (parent_fingerprint aside): the events then name the block by its
  // fingerprint, as without metadata.
  bool engine_empty() const { return hash.empty() && parent_hash.empty() && token_ids.empty() && !lora_id.has_value(); }
  bool empty() const { return engine_empty() && !parent_fingerprint.has_value(); }
  friend bool operator==(const BlockMeta& a, const BlockMeta& b) {
    return a.hash == b.hash && a.parent_hash == b.parent_hash && a.token_ids == b.token_ids && a.lora_id == b.lora_id &&
           a.parent_fingerprint == b.parent_fingerprint;
  }
};

// OK, or InvalidArgument naming the field and the limit: more than kMaxBlockTokenIds token ids, or a
// bytes hash that is empty or longer than kMaxEngineHashBytes. `field` prefixes the message (e.g.
// "block_meta[3]").
inline absl::Status ValidateBlockMeta(const BlockMeta& m, const std::string& field) {
  if (m.token_ids.size() > kMaxBlockTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".token_ids: ", m.token_ids.size(), " token ids, at most ",
                                                   kMaxBlockTokenIds, " per block"));
  }
  for (const auto* h : {&m.hash, &m.parent_hash}) {
    if (h->form == EngineBlockHash::Form::kBytes && (h->bytes.empty() || h->bytes.size() > kMaxEngineHashBytes)) {
      return absl::InvalidArgumentError(absl::StrCat(field, h == &m.hash ? ".hash" : ".parent_hash", ": ",
                                                     h->bytes.size(), " bytes, want 1 to ", kMaxEngineHashBytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier

#endif  // KVTIER_COMMON_BLOCK_META_H_
