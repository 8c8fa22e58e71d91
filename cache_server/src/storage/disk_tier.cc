#include "storage/disk_tier.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_manager.h>
#include <rocksdb/write_batch.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/log.h"

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

namespace {

constexpr uint64_t kMiB = 1ULL << 20;

// RocksDB's info log into the server's log: warnings and errors only, rate limited, never a file on
// the (possibly full) volume.
class ForwardingLogger : public rocksdb::Logger {
 public:
  ForwardingLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override { Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap); }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    char buf[1024];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    std::vsnprintf(buf, sizeof(buf), format, ap);
#pragma GCC diagnostic pop
    if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL) {
      KVTIER_LOG_EVERY(std::chrono::seconds(10), err, "rocksdb: {}", buf);
    } else {
      KVTIER_LOG_EVERY(std::chrono::seconds(10), warn, "rocksdb: {}", buf);
    }
  }
};

// statvfs of `path`, or of its nearest existing parent. False when none can be read.
bool VolumeOf(const std::string& path, uint64_t* total, uint64_t* avail) {
  std::filesystem::path p(path);
  while (true) {
    struct statvfs st {};
    if (::statvfs(p.c_str(), &st) == 0) {
      *total = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
      *avail = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
      return true;
    }
    if (!p.has_parent_path() || p.parent_path() == p) return false;
    p = p.parent_path();
  }
}

std::string Mib(uint64_t bytes) { return absl::StrCat(bytes / kMiB, ".", (bytes % kMiB) * 10 / kMiB, " MiB"); }

}  // namespace

const char* DiskTierStateName(DiskTierState state) {
  switch (state) {
    case DiskTierState::kOk:
      return "ok";
    case DiskTierState::kFull:
      return "degraded-full";
    case DiskTierState::kReadOnly:
      return "read-only";
    case DiskTierState::kOff:
      return "off";
  }
  return "unknown";
}

struct DiskTier::Impl {
  std::unique_ptr<rocksdb::DB> db;
  rocksdb::ColumnFamilyHandle* meta = nullptr;    // "default"
  rocksdb::ColumnFamilyHandle* blocks = nullptr;  // "blocks"
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  std::shared_ptr<rocksdb::SstFileManager> files;

  ~Impl() {
    if (db != nullptr) {
      for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
      db->Close();
    }
  }
};

DiskTier::DiskTier(const DiskTierOptions& options) : options_(options) {}
DiskTier::~DiskTier() = default;

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const std::string& path) {
  auto tier = OpenOrDegrade({.path = path});
  std::lock_guard<std::mutex> lock(tier->mu_);
  if (tier->impl_ == nullptr || tier->read_only_open_) {
    return absl::InternalError(absl::StrCat("opening the disk tier: ", tier->reason_, " (path ", path, ")"));
  }
  return tier;
}

std::unique_ptr<DiskTier> DiskTier::OpenOrDegrade(const DiskTierOptions& options) {
  auto tier = std::unique_ptr<DiskTier>(new DiskTier(options));
  uint64_t total = 0, avail = 0;
  if (VolumeOf(options.path, &total, &avail)) {
    tier->volume_bytes_ = total;
    tier->free_bytes_.store(avail, std::memory_order_relaxed);
  }
  // Write buffers of 1/32 of the volume (1..64 MiB): a flush, and the WAL it retires, stay small beside
  // the floor.
  tier->write_buffer_bytes_ = std::clamp<uint64_t>(total / 32, kMiB, 64 * kMiB);
  tier->min_free_bytes_ = options.min_free_bytes > 0 ? options.min_free_bytes
                                                     : std::max<uint64_t>(4 * tier->write_buffer_bytes_,
                                                                          std::min<uint64_t>(total / 8, 1024 * kMiB));
  std::lock_guard<std::mutex> lock(tier->mu_);
  tier->OpenLocked();
  return tier;
}

bool DiskTier::RefreshFree() {
  uint64_t total = 0, avail = 0;
  if (!VolumeOf(options_.path, &total, &avail)) return false;
  free_bytes_.store(avail, std::memory_order_relaxed);
  return true;
}

void DiskTier::SetStateLocked(DiskTierState state, std::string reason) {
  const DiskTierState old = state_.load(std::memory_order_relaxed);
  reason_ = std::move(reason);
  state_.store(state, std::memory_order_relaxed);
  if (!reported_) {  // the first open
    reported_ = true;
    if (state == DiskTierState::kOk) {
      KVTIER_LOG(info, "disk tier at {}: ok", options_.path);
    } else {
      KVTIER_LOG(warn, "disk tier at {}: {}: {}; blocks stay in memory until it recovers", options_.path,
                 DiskTierStateName(state), reason_);
    }
    return;
  }
  if (old == state) return;
  if (state == DiskTierState::kOk) {
    KVTIER_LOG(info, "disk tier at {}: {} -> ok", options_.path, DiskTierStateName(old));
  } else {
    KVTIER_LOG(warn, "disk tier at {}: {} -> {}: {}; blocks stay in memory until it recovers", options_.path,
               DiskTierStateName(old), DiskTierStateName(state), reason_);
  }
}

void DiskTier::OpenLocked() {
  std::error_code ignored;
  std::filesystem::create_directories(options_.path, ignored);  // RocksDB creates only the last level
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = 2;
  db_options.max_total_wal_size = 4 * write_buffer_bytes_;  // older WALs force their memtables to flush
  db_options.avoid_flush_during_shutdown = true;            // the WAL keeps what a flush would write
  if (options_.info_log_dir.empty()) {
    db_options.info_log = std::make_shared<ForwardingLogger>();
  } else {
    db_options.db_log_dir = options_.info_log_dir;
    db_options.max_log_file_size = 8 * kMiB;
    db_options.keep_log_file_num = 4;
  }
  auto impl = std::make_unique<Impl>();
  rocksdb::Status fs;
  impl->files.reset(rocksdb::NewSstFileManager(rocksdb::Env::Default(), db_options.info_log, "", 0, true, &fs));
  if (impl->files != nullptr && volume_bytes_ > 0) {
    // RocksDB stops writing (a background error, not ENOSPC) before the database takes the volume
    // past half the floor; compactions need room for their output.
    impl->files->SetMaxAllowedSpaceUsage(volume_bytes_ - std::min(volume_bytes_, min_free_bytes_ / 2));
    impl->files->SetCompactionBufferSize(2 * write_buffer_bytes_);
    db_options.sst_file_manager = impl->files;
  }
  rocksdb::ColumnFamilyOptions meta_options;
  meta_options.write_buffer_size = std::min<uint64_t>(write_buffer_bytes_, 4 * kMiB);
  rocksdb::ColumnFamilyOptions block_options;
  block_options.write_buffer_size = write_buffer_bytes_;
  block_options.enable_blob_files = true;  // payloads live in blob files, keys and pointers in SSTs
  block_options.min_blob_size = 0;
  block_options.blob_file_size = write_buffer_bytes_;
  block_options.blob_compression_type = rocksdb::kNoCompression;  // KV tensors barely compress
  block_options.enable_blob_garbage_collection = true;
  block_options.blob_garbage_collection_age_cutoff = 0.5;
  block_options.compression = rocksdb::kNoCompression;
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {{rocksdb::kDefaultColumnFamilyName, meta_options},
                                                      {"blocks", block_options}};
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, options_.path, cfs, &impl->handles, &db);
  read_only_open_ = false;
  std::string why;
  if (!s.ok()) {
    errors_.open.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG_EVERY(std::chrono::seconds(30), err, "disk tier: opening {} read-write failed: {}", options_.path,
                     s.ToString());
    why = s.ToString();
    impl->handles.clear();
    db = nullptr;
    db_options.sst_file_manager.reset();
    if (std::filesystem::exists(std::filesystem::path(options_.path) / "CURRENT")) {
      s = rocksdb::DB::OpenForReadOnly(db_options, options_.path, cfs, &impl->handles, &db);
      if (s.ok()) {
        read_only_open_ = true;
      } else {
        KVTIER_LOG_EVERY(std::chrono::seconds(30), err, "disk tier: opening {} read-only failed: {}", options_.path,
                         s.ToString());
      }
    }
  }
  if (db == nullptr) {
    impl_.reset();
    SetStateLocked(DiskTierState::kOff, absl::StrCat("cannot open the database: ", why));
    return;
  }
  impl->db.reset(db);
  impl->meta = impl->handles[0];
  impl->blocks = impl->handles[1];
  impl_ = std::move(impl);
  if (read_only_open_) {
    SetStateLocked(DiskTierState::kReadOnly, absl::StrCat("opened read-only; the read-write open failed: ", why));
    return;
  }
  RefreshFree();
  const uint64_t free = free_bytes();
  if (volume_bytes_ > 0 && free < min_free_bytes_) {
    SetStateLocked(DiskTierState::kFull,
                   absl::StrCat(Mib(free), " free on the volume, under the floor of ", Mib(min_free_bytes_)));
  } else {
    SetStateLocked(DiskTierState::kOk, "");
  }
}

void DiskTier::CloseLocked() {
  impl_.reset();
  read_only_open_ = false;
}

std::string DiskTier::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

uint64_t DiskTier::database_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_ != nullptr && impl_->files != nullptr ? impl_->files->GetTotalSize() : 0;
}

void DiskTier::OnIoErrorLocked(const char* op, std::atomic<uint64_t>& counter, const absl::Status& s, bool write) {
  counter.fetch_add(1, std::memory_order_relaxed);
  KVTIER_LOG_EVERY(std::chrono::seconds(10), err, "disk tier: {} at {} failed: {}", op, options_.path,
                   std::string(s.message()));
  if (!write) return;
  const bool no_space = absl::StrContains(s.message(), "space") || absl::StrContains(s.message(), "Space");
  if (RefreshFree() && volume_bytes_ > 0 && (no_space || free_bytes() < min_free_bytes_)) {
    SetStateLocked(DiskTierState::kFull,
                   absl::StrCat(op, " failed with ", Mib(free_bytes()), " free on the volume: ", s.message()));
  } else {
    SetStateLocked(DiskTierState::kReadOnly, absl::StrCat(op, " failed: ", s.message()));
  }
}

bool DiskTier::HasRoomFor(uint64_t bytes) {
  if (state() != DiskTierState::kOk) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (state() != DiskTierState::kOk) return false;
  if (!RefreshFree() || volume_bytes_ == 0) return true;  // no statvfs: RocksDB's own limit still holds
  // The bytes land twice until a flush retires the WAL that holds them.
  const uint64_t free = free_bytes();
  if (free >= 2 * bytes && free - 2 * bytes >= min_free_bytes_) return true;
  SetStateLocked(DiskTierState::kFull,
                 absl::StrCat(Mib(free), " free on the volume, under the floor of ", Mib(min_free_bytes_)));
  return false;
}

bool DiskTier::Probe() {
  std::lock_guard<std::mutex> lock(mu_);
  const bool have_free = RefreshFree() && volume_bytes_ > 0;
  const DiskTierState st = state();
  if (st == DiskTierState::kOk) {
    if (have_free && free_bytes() < min_free_bytes_) {
      SetStateLocked(DiskTierState::kFull,
                     absl::StrCat(Mib(free_bytes()), " free on the volume, under the floor of ", Mib(min_free_bytes_)));
    }
    return false;
  }
  if (have_free && free_bytes() < min_free_bytes_ + min_free_bytes_ / 2) return false;  // not yet
  if (impl_ != nullptr && !read_only_open_) {
    const rocksdb::Status s = impl_->db->Resume();
    if (s.ok()) {
      SetStateLocked(DiskTierState::kOk, "");
      return false;
    }
    if (s.IsBusy()) return false;  // RocksDB's own recovery is under way
    KVTIER_LOG_EVERY(std::chrono::seconds(30), warn, "disk tier: resuming {} failed ({}); reopening it", options_.path,
                     s.ToString());
  }
  CloseLocked();
  OpenLocked();
  return impl_ != nullptr && !read_only_open_;
}

absl::Status DiskTier::Put(const BlockKey& key, const DiskBlockMeta& meta, std::span<const std::byte> bytes) {
  if (!HasRoomFor(bytes.size())) {
    return absl::FailedPreconditionError(absl::StrCat("disk tier is ", DiskTierStateName(state())));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (impl_ == nullptr || state() != DiskTierState::kOk) {
    return absl::FailedPreconditionError(absl::StrCat("disk tier is ", DiskTierStateName(state())));
  }
  const std::string k = KeyBytes(key);
  rocksdb::WriteBatch batch;
  batch.Put(impl_->blocks, k, rocksdb::Slice(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  batch.Put(impl_->meta, k, MetaBytes(meta));
  absl::Status s = FromRocks(impl_->db->Write(rocksdb::WriteOptions(), &batch), "writing a block");
  if (!s.ok()) OnIoErrorLocked("writing a block", errors_.write, s, /*write=*/true);
  return s;
}

absl::Status DiskTier::Get(const BlockKey& key, const DiskBlockMeta& meta, std::span<std::byte> out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (impl_ == nullptr) return absl::UnavailableError("disk tier is off");
  rocksdb::PinnableSlice value;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  if (absl::Status s = FromRocks(impl_->db->Get(ro, impl_->blocks, KeyBytes(key), &value), "reading a block");
      !s.ok()) {
    if (!absl::IsNotFound(s)) OnIoErrorLocked("reading a block", errors_.read, s, /*write=*/false);
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
  std::lock_guard<std::mutex> lock(mu_);
  const DiskTierState st = state();
  if (impl_ == nullptr || read_only_open_ || st == DiskTierState::kReadOnly || st == DiskTierState::kOff) {
    return absl::FailedPreconditionError(absl::StrCat("disk tier is ", DiskTierStateName(st)));
  }
  const std::string k = KeyBytes(key);
  rocksdb::WriteBatch batch;
  batch.Delete(impl_->meta, k);
  batch.Delete(impl_->blocks, k);
  absl::Status s = FromRocks(impl_->db->Write(rocksdb::WriteOptions(), &batch), "deleting a block");
  if (!s.ok()) OnIoErrorLocked("deleting a block", errors_.remove, s, /*write=*/true);
  return s;
}

absl::Status DiskTier::ForEach(const std::function<void(const BlockKey&, const DiskBlockMeta&)>& visit, uint64_t* bad) {
  std::lock_guard<std::mutex> lock(mu_);
  if (impl_ == nullptr) return absl::UnavailableError("disk tier is off");
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
  if (absl::Status s = FromRocks(it->status(), "scanning the disk tier"); !s.ok()) {
    OnIoErrorLocked("scanning the disk tier", errors_.scan, s, /*write=*/false);
    return s;
  }
  it.reset();
  const bool writable = !read_only_open_ && state() != DiskTierState::kReadOnly;
  for (const std::string& k : broken) {
    if (!writable) break;
    rocksdb::WriteBatch batch;
    batch.Delete(impl_->meta, k);
    batch.Delete(impl_->blocks, k);
    if (absl::Status s = FromRocks(impl_->db->Write(rocksdb::WriteOptions(), &batch), "deleting a bad record");
        !s.ok()) {
      OnIoErrorLocked("deleting a bad record", errors_.remove, s, /*write=*/true);
      break;
    }
  }
  if (bad != nullptr) *bad = broken.size();
  return absl::OkStatus();
}

absl::Status DiskTier::CorruptForTest(const BlockKey& key, uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  if (impl_ == nullptr) return absl::NotFoundError("disk tier is off");
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
