#include "storage/disk_tier.h"

#include <cstring>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include "absl/strings/str_cat.h"
#include "kvtier/common/checksum.h"

namespace kvtier::server {
namespace {

constexpr uint8_t kMetaVersion = 1;
constexpr size_t kMetaBytes = 1 + 8 * 4 + 4 * 2;

// The one place a rocksdb::Status becomes an absl::Status.
absl::Status FromRocks(const rocksdb::Status& s, const char* what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat(what, ": not found"));
  return absl::InternalError(absl::StrCat(what, ": ", s.ToString()));
}

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

std::string EncodeDiskBlockMeta(const DiskBlockMeta& m) {
  std::string s;
  s.reserve(kMetaBytes);
  s.push_back(static_cast<char>(kMetaVersion));
  PutU64(s, m.namespace_id);
  PutU64(s, m.tenant_id);
  PutU64(s, m.size_bytes);
  PutU64(s, m.checksum);
  PutU32(s, m.depth);
  PutU32(s, m.access_count);
  return s;
}

bool DecodeDiskBlockMeta(std::string_view s, DiskBlockMeta* m) {
  if (s.size() != kMetaBytes || static_cast<uint8_t>(s[0]) != kMetaVersion) return false;
  const char* p = s.data() + 1;
  m->namespace_id = GetU(p, 8);
  m->tenant_id = GetU(p + 8, 8);
  m->size_bytes = GetU(p + 16, 8);
  m->checksum = GetU(p + 24, 8);
  m->depth = static_cast<uint32_t>(GetU(p + 32, 4));
  m->access_count = static_cast<uint32_t>(GetU(p + 36, 4));
  return m->size_bytes > 0;
}

namespace {
std::string KeyBytes(const BlockKey& k) { return EncodeDiskKey(k); }
std::string MetaBytes(const DiskBlockMeta& m) { return EncodeDiskBlockMeta(m); }
}  // namespace

struct DiskTier::Impl {
  std::unique_ptr<rocksdb::DB> db;
  rocksdb::ColumnFamilyHandle* meta = nullptr;    // "default"
  rocksdb::ColumnFamilyHandle* blocks = nullptr;  // "blocks"
  std::vector<rocksdb::ColumnFamilyHandle*> handles;

  ~Impl() {
    if (db != nullptr) {
      for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
      db->Close();
    }
  }
};

DiskTier::DiskTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskTier::~DiskTier() = default;

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const std::string& path) {
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = 2;
  rocksdb::ColumnFamilyOptions meta_options;
  rocksdb::ColumnFamilyOptions block_options;
  block_options.enable_blob_files = true;  // payloads live in blob files, keys and pointers in SSTs
  block_options.min_blob_size = 0;
  block_options.blob_compression_type = rocksdb::kNoCompression;  // KV tensors barely compress
  block_options.enable_blob_garbage_collection = true;
  block_options.compression = rocksdb::kNoCompression;
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {{rocksdb::kDefaultColumnFamilyName, meta_options},
                                                      {"blocks", block_options}};
  auto impl = std::make_unique<Impl>();
  rocksdb::DB* db = nullptr;
  absl::Status s = FromRocks(rocksdb::DB::Open(db_options, path, cfs, &impl->handles, &db), "opening the disk tier");
  if (!s.ok()) return absl::InternalError(absl::StrCat(s.message(), " (path ", path, ")"));
  impl->db.reset(db);
  impl->meta = impl->handles[0];
  impl->blocks = impl->handles[1];
  return std::unique_ptr<DiskTier>(new DiskTier(std::move(impl)));
}

absl::Status DiskTier::Put(const BlockKey& key, const DiskBlockMeta& meta, std::span<const std::byte> bytes) {
  const std::string k = KeyBytes(key);
  rocksdb::WriteBatch batch;
  batch.Put(impl_->blocks, k, rocksdb::Slice(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  batch.Put(impl_->meta, k, MetaBytes(meta));
  return FromRocks(impl_->db->Write(rocksdb::WriteOptions(), &batch), "writing a block to disk");
}

absl::Status DiskTier::Get(const BlockKey& key, const DiskBlockMeta& meta, std::span<std::byte> out) {
  rocksdb::PinnableSlice value;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  if (absl::Status s = FromRocks(impl_->db->Get(ro, impl_->blocks, KeyBytes(key), &value), "reading a block");
      !s.ok()) {
    return s;
  }
  if (value.size() != meta.size_bytes || out.size() != meta.size_bytes) {
    return absl::DataLossError(absl::StrCat("block on disk is ", value.size(), " bytes, index says ", meta.size_bytes));
  }
  std::memcpy(out.data(), value.data(), value.size());
  if (BlockChecksum(out.data(), out.size()) != meta.checksum) {
    return absl::DataLossError("block on disk failed its checksum");
  }
  return absl::OkStatus();
}

absl::Status DiskTier::Delete(const BlockKey& key) {
  const std::string k = KeyBytes(key);
  rocksdb::WriteBatch batch;
  batch.Delete(impl_->meta, k);
  batch.Delete(impl_->blocks, k);
  return FromRocks(impl_->db->Write(rocksdb::WriteOptions(), &batch), "deleting a block from disk");
}

absl::Status DiskTier::ForEach(const std::function<void(const BlockKey&, const DiskBlockMeta&)>& visit, uint64_t* bad) {
  std::unique_ptr<rocksdb::Iterator> it(impl_->db->NewIterator(rocksdb::ReadOptions(), impl_->meta));
  std::vector<std::string> broken;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    BlockKey key;
    DiskBlockMeta meta;
    if (!DecodeDiskKey(it->key().ToStringView(), &key) || !DecodeDiskBlockMeta(it->value().ToStringView(), &meta)) {
      broken.push_back(it->key().ToString());
      continue;
    }
    visit(key, meta);
  }
  if (absl::Status s = FromRocks(it->status(), "scanning the disk tier"); !s.ok()) return s;
  for (const std::string& k : broken) {
    rocksdb::WriteBatch batch;
    batch.Delete(impl_->meta, k);
    batch.Delete(impl_->blocks, k);
    (void)impl_->db->Write(rocksdb::WriteOptions(), &batch);
  }
  if (bad != nullptr) *bad = broken.size();
  return absl::OkStatus();
}

absl::Status DiskTier::CorruptForTest(const BlockKey& key, uint64_t offset) {
  const std::string k = KeyBytes(key);
  std::string value;
  if (absl::Status s = FromRocks(impl_->db->Get(rocksdb::ReadOptions(), impl_->blocks, k, &value), "corrupting");
      !s.ok()) {
    return s;
  }
  if (offset >= value.size()) return absl::InvalidArgumentError("offset past the block");
  value[offset] = static_cast<char>(value[offset] ^ 0x5a);
  return FromRocks(impl_->db->Put(rocksdb::WriteOptions(), impl_->blocks, k, value), "corrupting");
}

}  // namespace kvtier::server
