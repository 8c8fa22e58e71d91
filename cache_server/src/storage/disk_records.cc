// The disk tier's record formats: keys and block metadata (DiskBlockMeta), versions 1 to 3.
#include "storage/disk_tier.h"

#include <cstring>
#include <memory>
#include <string>
#include <string_view>

namespace kvtier::server {
namespace {

constexpr uint8_t kMetaVersion = 1;        // the fixed fields only
constexpr uint8_t kMetaVersionEngine = 2;  // then the engine's BlockMeta
constexpr uint8_t kMetaVersionParent = 3;  // then the engine's BlockMeta and the parent fingerprint
constexpr size_t kMetaBytes = 1 + 8 * 4 + 4 * 2;

}  // namespace

std::string EncodeDiskKey(const BlockKey& k) {
  std::string s(36, '\0');
  std::memcpy(s.data(), k.fingerprint.bytes.data(), 32);
  for (int i = 0; i < 4; ++i) s[32 + i] = static_cast<char>((k.shard >> (8 * i)) & 0xff);
  return s;
}

bool DecodeDiskKey(std::string_view s, BlockKey* k) {
  if (s.size() != 36) return false;
  std::memcpy(k->fingerprint.bytes.data(), s.data(), 32);
  k->shard = 0;
  for (int i = 0; i < 4; ++i) k->shard |= static_cast<uint32_t>(static_cast<uint8_t>(s[32 + i])) << (8 * i);
  return true;
}

namespace {

void PutU64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetU(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

namespace {

void PutEngineHash(std::string& s, const EngineBlockHash& h) {
  s.push_back(static_cast<char>(h.form));
  switch (h.form) {
    case EngineBlockHash::Form::kNone:
      break;
    case EngineBlockHash::Form::kInt:
      PutU64(s, static_cast<uint64_t>(h.int_value));
      break;
    case EngineBlockHash::Form::kUint:
      PutU64(s, h.uint_value);
      break;
    case EngineBlockHash::Form::kBytes:
      s.push_back(static_cast<char>(h.bytes.size()));
      s.append(h.bytes);
      break;
  }
}

// Reads one hash at *p (advancing it) from [*p, end); false when malformed or not in its canonical form
// (a non-negative kInt, a bytes hash of 0 or more than kMaxEngineHashBytes bytes, an unknown form).
bool GetEngineHash(const char** p, const char* end, EngineBlockHash* h) {
  if (*p == end) return false;
  const auto form = static_cast<uint8_t>(*(*p)++);
  switch (form) {
    case static_cast<uint8_t>(EngineBlockHash::Form::kNone):
      *h = EngineBlockHash();
      return true;
    case static_cast<uint8_t>(EngineBlockHash::Form::kInt):
    case static_cast<uint8_t>(EngineBlockHash::Form::kUint): {
      if (end - *p < 8) return false;
      const uint64_t v = GetU(*p, 8);
      *p += 8;
      if (form == static_cast<uint8_t>(EngineBlockHash::Form::kUint)) {
        *h = EngineBlockHash::Uint(v);
        return true;
      }
      if (static_cast<int64_t>(v) >= 0) return false;
      *h = EngineBlockHash::Int(static_cast<int64_t>(v));
      return true;
    }
    case static_cast<uint8_t>(EngineBlockHash::Form::kBytes): {
      if (*p == end) return false;
      const auto n = static_cast<uint8_t>(*(*p)++);
      if (n == 0 || n > kMaxEngineHashBytes || end - *p < n) return false;
      *h = EngineBlockHash::Bytes(std::string(*p, n));
      *p += n;
      return true;
    }
    default:
      return false;
  }
}

}  // namespace

std::string EncodeDiskBlockMeta(const DiskBlockMeta& m) {
  const bool engine = m.block_meta != nullptr && !m.block_meta->empty();
  const bool parent = engine && m.block_meta->parent_fingerprint.has_value();
  std::string s;
  s.reserve(kMetaBytes + (engine ? 64 + 4 * m.block_meta->token_ids.size() : 0));
  s.push_back(static_cast<char>(parent ? kMetaVersionParent : engine ? kMetaVersionEngine : kMetaVersion));
  PutU64(s, m.namespace_id);
  PutU64(s, m.tenant_id);
  PutU64(s, m.size_bytes);
  PutU64(s, m.checksum);
  PutU32(s, m.depth);
  PutU32(s, m.access_count);
  if (!engine) return s;
  const BlockMeta& b = *m.block_meta;
  PutEngineHash(s, b.hash);
  PutEngineHash(s, b.parent_hash);
  s.push_back(b.lora_id.has_value() ? 1 : 0);
  if (b.lora_id.has_value()) PutU64(s, static_cast<uint64_t>(*b.lora_id));
  PutU32(s, static_cast<uint32_t>(b.token_ids.size()));
  for (uint32_t t : b.token_ids) PutU32(s, t);
  if (parent) s.append(reinterpret_cast<const char*>(b.parent_fingerprint->bytes.data()), 32);
  return s;
}

bool DecodeDiskBlockMeta(std::string_view s, DiskBlockMeta* m) {
  if (s.size() < kMetaBytes) return false;
  const auto version = static_cast<uint8_t>(s[0]);
  if (version == kMetaVersion ? s.size() != kMetaBytes
                              : version != kMetaVersionEngine && version != kMetaVersionParent) {
    return false;
  }
  const char* p = s.data() + 1;
  m->namespace_id = GetU(p, 8);
  m->tenant_id = GetU(p + 8, 8);
  m->size_bytes = GetU(p + 16, 8);
  m->checksum = GetU(p + 24, 8);
  m->depth = static_cast<uint32_t>(GetU(p + 32, 4));
  m->access_count = static_cast<uint32_t>(GetU(p + 36, 4));
  m->block_meta = nullptr;
  if (m->size_bytes == 0) return false;
  if (version == kMetaVersion) return true;
  const char* end = s.data() + s.size();
  if (version == kMetaVersionParent) {  // the parent fingerprint ends the record
    if (s.size() < kMetaBytes + 32) return false;
    end -= 32;
  }
  p = s.data() + kMetaBytes;
  auto b = std::make_shared<BlockMeta>();
  if (!GetEngineHash(&p, end, &b->hash) || !GetEngineHash(&p, end, &b->parent_hash) || p == end) return false;
  const auto has_lora = static_cast<uint8_t>(*p++);
  if (has_lora > 1) return false;
  if (has_lora == 1) {
    if (end - p < 8) return false;
    b->lora_id = static_cast<int64_t>(GetU(p, 8));
    p += 8;
  }
  if (end - p < 4) return false;
  const uint64_t tokens = GetU(p, 4);
  p += 4;
  if (tokens > kMaxBlockTokenIds || static_cast<uint64_t>(end - p) != 4 * tokens) return false;
  b->token_ids.resize(tokens);
  for (uint64_t i = 0; i < tokens; ++i, p += 4) b->token_ids[i] = static_cast<uint32_t>(GetU(p, 4));
  if (version == kMetaVersionParent) {
    Fingerprint fp;
    std::memcpy(fp.bytes.data(), end, 32);
    b->parent_fingerprint = fp;
  } else if (b->empty()) {
    return false;  // written as version 1
  }
  m->block_meta = std::move(b);
  return true;
}

}  // namespace kvtier::server
