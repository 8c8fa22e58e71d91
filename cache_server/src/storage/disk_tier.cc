#include "storage/disk_tier.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <shared_mutex>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/listener.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_manager.h>
#include <rocksdb/write_batch.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/log.h"

namespace kvtier::server {
namespace {

// The one place a rocksdb::Status becomes an absl::Status. Corruption (RocksDB's own block or blob
// checksum failed) is DataLoss, as a failing block checksum is: the block is dropped, never served.
absl::Status FromRocks(const rocksdb::Status& s, const char* what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat(what, ": not found"));
  if (s.IsCorruption()) return absl::DataLossError(absl::StrCat(what, ": ", s.ToString()));
  return absl::InternalError(absl::StrCat(what, ": ", s.ToString()));
}

// Writes skip the WAL: the disk tier is a cache, so a killed process may lose the blocks not yet
// flushed (at most the write buffers, or flush_interval's worth), and every spill is written once, not
// twice (half the flash wear; no WAL files to count against the volume). Both column families flush
// together (atomic_flush), so what survives a kill is a block's payload and its record, or neither.
rocksdb::WriteOptions NoWal() {
  rocksdb::WriteOptions w;
  w.disableWAL = true;
  return w;
}

}  // namespace

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

// Counts and logs RocksDB's background errors (a flush or compaction that failed, e.g. ENOSPC on a
// blob file): the writes that follow fail too, and the tier's state says so.
class BackgroundErrorListener : public rocksdb::EventListener {
 public:
  BackgroundErrorListener(std::string path, std::atomic<uint64_t>* counter, std::atomic<bool>* damaged)
      : path_(std::move(path)), counter_(counter), damaged_(damaged) {}
  void OnBackgroundError(rocksdb::BackgroundErrorReason reason, rocksdb::Status* error) override {
    counter_->fetch_add(1, std::memory_order_relaxed);
    if (error != nullptr && error->IsCorruption()) damaged_->store(true, std::memory_order_relaxed);
    const char* what = reason == rocksdb::BackgroundErrorReason::kFlush        ? "a flush"
                       : reason == rocksdb::BackgroundErrorReason::kCompaction ? "a compaction"
                                                                               : "a background write";
    KVTIER_LOG_EVERY(std::chrono::seconds(10), err, "disk tier: {} at {} failed: {}", what, path_,
                     error != nullptr ? error->ToString() : std::string("unknown error"));
  }

 private:
  const std::string path_;
  std::atomic<uint64_t>* const counter_;
  std::atomic<bool>* const damaged_;
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
  std::lock_guard<std::shared_mutex> lock(tier->mu_);
  if (tier->impl_ == nullptr || tier->read_only_open_) {
    return absl::InternalError(absl::StrCat("opening the disk tier: ", tier->reason_, " (path ", path, ")"));
  }
  return tier;
}

std::unique_ptr<DiskTier> DiskTier::OpenOrDegrade(const DiskTierOptions& options) {
  auto tier = std::unique_ptr<DiskTier>(new DiskTier(options));
  uint64_t total = 0, avail = 0;
  if (VolumeOf(options.path, &total, &avail)) tier->free_bytes_.store(avail, std::memory_order_relaxed);
  std::lock_guard<std::shared_mutex> lock(tier->mu_);
  tier->SizeForVolumeLocked(total);
  tier->OpenLocked();
  return tier;
}

void DiskTier::SizeForVolumeLocked(uint64_t total) {
  volume_bytes_.store(total, std::memory_order_relaxed);
  // Write buffers (and blob files) of 1/32 of the volume (1..64 MiB): a flush stays small beside the
  // floor. Both are changeable on an open database, so a resized volume resizes them too.
  write_buffer_bytes_ = std::clamp<uint64_t>(total / 32, kMiB, 64 * kMiB);
  if (impl_ != nullptr && !read_only_open_) {
    const std::string wb = std::to_string(write_buffer_bytes_);
    const rocksdb::Status b = impl_->db->SetOptions(impl_->blocks, {{"write_buffer_size", wb}, {"blob_file_size", wb}});
    const rocksdb::Status m = impl_->db->SetOptions(
        impl_->meta, {{"write_buffer_size", std::to_string(std::min<uint64_t>(write_buffer_bytes_, 4 * kMiB))}});
    if (!b.ok() || !m.ok()) {
      KVTIER_LOG(warn, "disk tier at {}: resizing the write buffers failed: {} {}", options_.path, b.ToString(),
                 m.ToString());
    }
  }
  const uint64_t floor = options_.min_free_bytes > 0
                             ? options_.min_free_bytes
                             : std::max<uint64_t>(4 * write_buffer_bytes_, std::min<uint64_t>(total / 8, 1024 * kMiB));
  min_free_bytes_.store(floor, std::memory_order_relaxed);
  if (impl_ != nullptr && impl_->files != nullptr && total > 0) {
    impl_->files->SetMaxAllowedSpaceUsage(total - std::min(total, floor / 2));
    impl_->files->SetCompactionBufferSize(floor / 4);
  }
}

uint64_t DiskTier::budget_limit() const {
  const uint64_t volume = volume_bytes();
  return (volume - std::min(volume, min_free_bytes())) / 2;
}

bool DiskTier::RefreshFree() {
  uint64_t total = 0, avail = 0;
  if (!VolumeOf(options_.path, &total, &avail)) return false;
  free_bytes_.store(avail, std::memory_order_relaxed);
  return true;
}

void DiskTier::DeleteDatabaseFilesLocked() {
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(options_.path, ec)) {
    std::error_code rm_ec;
    std::filesystem::remove_all(f.path(), rm_ec);
  }
  pending_deletes_.clear();  // nothing left to delete
}

uint64_t DiskTier::DirectoryBytes() const {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(options_.path, ec)) {
    std::error_code size_ec;
    if (f.is_regular_file(size_ec)) {
      const uintmax_t n = f.file_size(size_ec);
      if (!size_ec) bytes += n;
    }
  }
  return bytes;
}

uint64_t DiskTier::DeleteObsoleteFilesLocked() {
  if (!std::filesystem::exists(std::filesystem::path(options_.path) / "CURRENT")) return 0;
  rocksdb::DBOptions db_options;
  db_options.info_log = std::make_shared<ForwardingLogger>();
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {{rocksdb::kDefaultColumnFamilyName, {}}, {"blocks", {}}};
  rocksdb::ColumnFamilyOptions blob_cf;
  blob_cf.enable_blob_files = true;
  cfs[1].options = blob_cf;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  if (!rocksdb::DB::OpenForReadOnly(db_options, options_.path, cfs, &handles, &raw).ok()) return 0;
  std::unique_ptr<rocksdb::DB> db(raw);
  std::vector<std::string> live;
  uint64_t manifest_bytes = 0;
  const rocksdb::Status listed = db->GetLiveFiles(live, &manifest_bytes, /*flush_memtable=*/false);
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
  db->Close();
  db.reset();
  if (!listed.ok()) return 0;
  absl::flat_hash_set<std::string> keep;
  for (const std::string& f : live) keep.insert(std::filesystem::path(f).filename().string());
  uint64_t freed = 0;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(options_.path, ec)) {
    const std::string name = f.path().filename().string();
    const bool data = name.ends_with(".sst") || name.ends_with(".blob");
    const bool manifest = name.starts_with("MANIFEST-");
    if ((!data && !manifest) || keep.contains(name)) continue;
    std::error_code rm_ec;
    const uintmax_t n = f.file_size(rm_ec);
    if (std::filesystem::remove(f.path(), rm_ec)) freed += rm_ec ? 0 : n;
  }
  return freed;
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
  db_options.atomic_flush = true;                 // writes skip the WAL (NoWal): a block and its record flush together
  db_options.avoid_flush_during_recovery = true;  // an open writes nothing it need not
  db_options.listeners.push_back(
      std::make_shared<BackgroundErrorListener>(options_.path, &errors_.background, &damaged_));
  if (options_.info_log_dir.empty()) {
    db_options.info_log = std::make_shared<ForwardingLogger>();
  } else {
    db_options.db_log_dir = options_.info_log_dir;
    db_options.max_log_file_size = 8 * kMiB;
    db_options.keep_log_file_num = 4;
  }
  rocksdb::ColumnFamilyOptions meta_options;
  meta_options.write_buffer_size = std::min<uint64_t>(write_buffer_bytes_, 4 * kMiB);
  rocksdb::ColumnFamilyOptions block_options;
  block_options.write_buffer_size = write_buffer_bytes_;
  block_options.enable_blob_files = true;  // payloads live in blob files, keys and pointers in SSTs
  block_options.min_blob_size = 0;
  block_options.blob_file_size = write_buffer_bytes_;
  block_options.blob_compression_type = rocksdb::kNoCompression;  // KV tensors barely compress
  block_options.enable_blob_garbage_collection = false;
  block_options.level0_file_num_compaction_trigger = 2;
  block_options.compression = rocksdb::kNoCompression;
  const std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {{rocksdb::kDefaultColumnFamilyName, meta_options},
                                                            {"blocks", block_options}};
  const uint64_t volume = volume_bytes(), floor = min_free_bytes();

  auto impl = std::make_unique<Impl>();
  auto open = [&](bool read_only) {
    impl = std::make_unique<Impl>();
    rocksdb::DBOptions o = db_options;
    if (!read_only) {
      rocksdb::Status fs;
      impl->files.reset(rocksdb::NewSstFileManager(rocksdb::Env::Default(), o.info_log, "", 0, true, &fs));
      if (impl->files != nullptr && volume > 0) {
        // RocksDB stops writing (a background error, not ENOSPC) before the database takes the volume
        // past half the floor; compactions need room for their output.
        impl->files->SetMaxAllowedSpaceUsage(volume - std::min(volume, floor / 2));
        // Compactions need this much free beside their input; a quarter of the floor is always there
        // while the floor holds, so the compactions that free garbage on a full volume still run.
        impl->files->SetCompactionBufferSize(floor / 4);
        o.sst_file_manager = impl->files;
      }
    }
    rocksdb::DB* db = nullptr;
    const rocksdb::Status st = read_only ? rocksdb::DB::OpenForReadOnly(o, options_.path, cfs, &impl->handles, &db)
                                         : rocksdb::DB::Open(o, options_.path, cfs, &impl->handles, &db);
    if (st.ok()) {
      impl->db.reset(db);
    } else {
      impl->handles.clear();
    }
    return st;
  };
  auto for_space = [&](const rocksdb::Status& st) {
    RefreshFree();
    return st.IsNoSpace() || absl::StrContains(st.ToString(), "space") || (volume > 0 && free_bytes() < floor);
  };

  read_only_open_ = false;
  rocksdb::Status s = open(/*read_only=*/false);
  std::string why;
  if (!s.ok()) {
    errors_.open.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG_EVERY(std::chrono::seconds(30), err, "disk tier: opening {} read-write failed: {}", options_.path,
                     s.ToString());
    why = s.ToString();
    if (for_space(s)) {
      // A killed process leaves files that only a read-write open would delete: delete them first.
      if (const uint64_t freed = DeleteObsoleteFilesLocked(); freed > 0) {
        KVTIER_LOG(warn, "disk tier at {}: deleted {} of files the database no longer references; opening again",
                   options_.path, Mib(freed));
        s = open(/*read_only=*/false);
      }
    }
  }
  const bool damaged = !s.ok() && s.IsCorruption();
  if (!s.ok() && (for_space(s) || damaged)) {
    // Still no room, and the database's own files take at least half of what the volume uses (or it is
    // damaged): nobody else will free that space, and a disk tier that can never write again is worth
    // less than an empty one. It is a cache: start it empty.
    const uint64_t own = DirectoryBytes();
    const uint64_t used = volume - std::min(volume, free_bytes());
    if (damaged || (volume > 0 && 2 * own >= used)) {
      errors_.recreated.fetch_add(1, std::memory_order_relaxed);
      const std::string what =
          damaged ? std::string("are damaged") : absl::StrCat("take ", Mib(used), " of the volume's used space");
      KVTIER_LOG(err,
                 "disk tier at {}: the database cannot be opened read-write ({}) and its {} of files {}; deleting "
                 "it and starting the disk tier empty (its blocks are lost, the server goes on)",
                 options_.path, s.ToString(), Mib(own), what);
      impl.reset();
      DeleteDatabaseFilesLocked();
      s = open(/*read_only=*/false);
      if (!s.ok()) why = s.ToString();
    }
  }
  if (!s.ok() && std::filesystem::exists(std::filesystem::path(options_.path) / "CURRENT")) {
    const rocksdb::Status ro = open(/*read_only=*/true);
    if (ro.ok()) {
      read_only_open_ = true;
    } else {
      KVTIER_LOG_EVERY(std::chrono::seconds(30), err, "disk tier: opening {} read-only failed: {}", options_.path,
                       ro.ToString());
    }
  }
  if (impl == nullptr || impl->db == nullptr) {
    impl_.reset();
    SetStateLocked(DiskTierState::kOff, absl::StrCat("cannot open the database: ", why));
    return;
  }
  impl->meta = impl->handles[0];
  impl->blocks = impl->handles[1];
  impl_ = std::move(impl);
  collecting_.store(false, std::memory_order_relaxed);  // opened with it off
  last_flush_ = std::chrono::steady_clock::now();
  if (read_only_open_) {
    SetStateLocked(DiskTierState::kReadOnly, absl::StrCat("opened read-only; the read-write open failed: ", why));
    return;
  }
  RefreshFree();
  const uint64_t free = free_bytes();
  if (volume > 0 && free < floor) {
    SetStateLocked(DiskTierState::kFull,
                   absl::StrCat(Mib(free), " free on the volume, under the floor of ", Mib(floor)));
  } else {
    SetStateLocked(DiskTierState::kOk, "");
    ApplyPendingDeletesLocked();
  }
}

void DiskTier::CloseLocked() {
  impl_.reset();
  read_only_open_ = false;
}

std::string DiskTier::reason() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return reason_;
}

uint64_t DiskTier::database_bytes() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (impl_ != nullptr && impl_->files != nullptr) return impl_->files->GetTotalSize();
  return impl_ != nullptr ? DirectoryBytes() : 0;  // read-only: no SstFileManager, count the files
}

void DiskTier::OnIoErrorLocked(const char* op, std::atomic<uint64_t>& counter, const absl::Status& s, bool write) {
  counter.fetch_add(1, std::memory_order_relaxed);
  KVTIER_LOG_EVERY(std::chrono::seconds(10), err, "disk tier: {} at {} failed: {}", op, options_.path,
                   std::string(s.message()));
  if (!write) return;
  if (absl::IsDataLoss(s)) damaged_.store(true, std::memory_order_relaxed);  // the probe starts it anew
  const bool no_space = absl::StrContains(s.message(), "space") || absl::StrContains(s.message(), "Space");
  if (RefreshFree() && volume_bytes() > 0 && (no_space || free_bytes() < min_free_bytes())) {
    SetStateLocked(DiskTierState::kFull,
                   absl::StrCat(op, " failed with ", Mib(free_bytes()), " free on the volume: ", s.message()));
  } else {
    SetStateLocked(DiskTierState::kReadOnly, absl::StrCat(op, " failed: ", s.message()));
  }
}

bool DiskTier::HasRoomFor(uint64_t bytes) {
  if (state() != DiskTierState::kOk) return false;
  std::lock_guard<std::shared_mutex> lock(mu_);
  if (state() != DiskTierState::kOk) return false;
  if (!RefreshFree() || volume_bytes() == 0) return true;  // no statvfs: RocksDB's own limit still holds
  // Written once (no WAL); the floor leaves room for the write buffers' flush and for compactions.
  const uint64_t free = free_bytes();
  if (free >= bytes && free - bytes >= min_free_bytes()) return true;
  SetStateLocked(DiskTierState::kFull,
                 absl::StrCat(Mib(free), " free on the volume, under the floor of ", Mib(min_free_bytes())));
  return false;
}

void DiskTier::ApplyPendingDeletesLocked() {
  if (pending_deletes_.empty() || impl_ == nullptr || read_only_open_) return;
  rocksdb::WriteBatch batch;
  for (const std::string& k : pending_deletes_) {
    batch.Delete(impl_->meta, k);
    batch.Delete(impl_->blocks, k);
  }
  if (absl::Status s = FromRocks(impl_->db->Write(NoWal(), &batch), "deleting blocks dropped meanwhile"); !s.ok()) {
    OnIoErrorLocked("deleting blocks dropped meanwhile", errors_.remove, s, /*write=*/true);
    return;
  }
  KVTIER_LOG(info, "disk tier at {}: deleted {} blocks dropped while it was not writable", options_.path,
             pending_deletes_.size());
  pending_deletes_.clear();
}

void DiskTier::SetGarbageCollectionLocked(bool on) {
  const rocksdb::Status s =
      impl_->db->SetOptions(impl_->blocks, {{"enable_blob_garbage_collection", on ? "true" : "false"},
                                            {"blob_garbage_collection_age_cutoff", "0.25"},
                                            {"blob_garbage_collection_force_threshold", "0.5"}});
  if (!s.ok()) {
    KVTIER_LOG_EVERY(std::chrono::seconds(60), warn, "disk tier at {}: turning blob garbage collection {} failed: {}",
                     options_.path, on ? "on" : "off", s.ToString());
    return;
  }
  collecting_.store(on, std::memory_order_relaxed);
}

void DiskTier::CheckGarbageLocked() {
  const uint64_t logical_bytes = logical_bytes_.load(std::memory_order_relaxed);
  if (impl_ == nullptr || impl_->files == nullptr || !logical_known_.load(std::memory_order_relaxed)) return;
  const uint64_t files = impl_->files->GetTotalSize();
  const bool on = collecting_.load(std::memory_order_relaxed);
  if (!on && 2 * files > 3 * logical_bytes && files > 2 * write_buffer_bytes_) {
    KVTIER_LOG(info, "disk tier at {}: its files take {} for {} of blocks; collecting blob garbage", options_.path,
               Mib(files), Mib(logical_bytes));
    SetGarbageCollectionLocked(true);
  } else if (on && 4 * files < 5 * logical_bytes) {
    KVTIER_LOG(info, "disk tier at {}: its files take {} for {} of blocks; blob garbage collection off", options_.path,
               Mib(files), Mib(logical_bytes));
    SetGarbageCollectionLocked(false);
  }
}

bool DiskTier::Probe(uint64_t logical_bytes) {
  std::lock_guard<std::shared_mutex> lock(mu_);
  if (logical_bytes > 0) NoteLogicalBytes(logical_bytes);
  const auto now = std::chrono::steady_clock::now();
  uint64_t total = 0, avail = 0;
  const bool have_free = VolumeOf(options_.path, &total, &avail) && total > 0;
  if (have_free) {
    free_bytes_.store(avail, std::memory_order_relaxed);
    const uint64_t was = volume_bytes();
    // A volume grown (or shrunk) while running: the floor (when it is the default) and RocksDB's cap
    // follow; the store re-reads budget_limit(). Sizes within 1% are the same volume.
    if (was == 0 || (total > was ? total - was : was - total) > was / 100) {
      SizeForVolumeLocked(total);
      if (was > 0) {
        KVTIER_LOG(warn, "disk tier at {}: the volume is now {} (was {}): floor {}, budget limit {}", options_.path,
                   Mib(total), Mib(was), Mib(min_free_bytes()), Mib(budget_limit()));
      }
    }
  }
  const uint64_t floor = min_free_bytes();
  if (damaged_.load(std::memory_order_relaxed) && impl_ != nullptr) {
    // RocksDB found one of its files damaged (a blob or SST failing its CRC in a compaction, a write):
    // every compaction that reads it fails again, so the tier would stay read-only. It is a cache:
    // start it empty.
    errors_.recreated.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG(err,
               "disk tier at {}: the database has a damaged file ({}); deleting it and starting the disk tier "
               "empty (its blocks are lost, the server goes on)",
               options_.path, reason_);
    CloseLocked();
    DeleteDatabaseFilesLocked();
    damaged_.store(false, std::memory_order_relaxed);
    OpenLocked();
    return impl_ != nullptr && !read_only_open_;
  }
  const DiskTierState st = state();
  // Write buffers that waited flush_interval go to disk, so that a kill loses no more than that; on a
  // full volume the flush carries the deletes (tombstones) whose compaction frees the blob files.
  if ((st == DiskTierState::kOk || st == DiskTierState::kFull) && impl_ != nullptr && !read_only_open_ &&
      (st == DiskTierState::kFull || now - last_flush_ >= options_.flush_interval)) {
    uint64_t unflushed = 0, unflushed_meta = 0;
    impl_->db->GetIntProperty(impl_->blocks, rocksdb::DB::Properties::kNumEntriesActiveMemTable, &unflushed);
    impl_->db->GetIntProperty(impl_->meta, rocksdb::DB::Properties::kNumEntriesActiveMemTable, &unflushed_meta);
    if (unflushed + unflushed_meta > 0) {
      rocksdb::FlushOptions fo;
      fo.wait = false;
      fo.allow_write_stall = true;
      (void)impl_->db->Flush(fo, impl_->handles);
    }
    last_flush_ = now;
  }
  if (st == DiskTierState::kOk || st == DiskTierState::kFull) CheckGarbageLocked();
  if (st == DiskTierState::kOk) {
    if (have_free && avail < floor) {
      SetStateLocked(DiskTierState::kFull,
                     absl::StrCat(Mib(avail), " free on the volume, under the floor of ", Mib(floor)));
      return false;
    }
    if (recovery_backoff_.count() > 0 && now - recovered_at_ > std::chrono::minutes(5)) {
      recovery_backoff_ = std::chrono::milliseconds(0);  // the last recovery held
    }
    return false;
  }
  if (st == DiskTierState::kFull && have_free) {  // keep the reason's figure current
    reason_ = avail < floor ? absl::StrCat(Mib(avail), " free on the volume, under the floor of ", Mib(floor))
                            : absl::StrCat(Mib(avail), " free on the volume; writes resume at 1.5x the floor (",
                                           Mib(floor + floor / 2), ")");
  }
  if (have_free && avail < floor + floor / 2) return false;  // not yet
  if (now < next_recovery_) return false;                    // backing off: the last recovery did not hold
  if (now - recovered_at_ < std::chrono::minutes(5)) {
    recovery_backoff_ =
        std::clamp<std::chrono::milliseconds>(2 * recovery_backoff_, std::chrono::seconds(2), std::chrono::minutes(5));
  }
  recovered_at_ = now;
  next_recovery_ = now + recovery_backoff_;
  if (impl_ != nullptr && !read_only_open_) {
    const rocksdb::Status s = impl_->db->Resume();
    if (s.ok()) {
      SetStateLocked(DiskTierState::kOk, "");
      ApplyPendingDeletesLocked();
      return false;
    }
    if (s.IsBusy()) {  // RocksDB's own recovery is under way
      next_recovery_ = now;
      return false;
    }
    KVTIER_LOG_EVERY(std::chrono::seconds(30), warn, "disk tier: resuming {} failed ({}); reopening it", options_.path,
                     s.ToString());
  }
  CloseLocked();
  OpenLocked();
  return impl_ != nullptr && !read_only_open_;
}

absl::Status DiskTier::Put(const BlockKey& key, const DiskBlockMeta& meta, std::span<const std::byte> bytes) {
  if (options_.before_io_for_test) options_.before_io_for_test("write");
  if (!HasRoomFor(bytes.size())) {
    return absl::FailedPreconditionError(absl::StrCat("disk tier is ", DiskTierStateName(state())));
  }
  const std::string k = KeyBytes(key);
  absl::Status s;
  {
    // Shared: reads (and other writes) go on beside this one; RocksDB is thread-safe.
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (impl_ == nullptr || state() != DiskTierState::kOk) {
      return absl::FailedPreconditionError(absl::StrCat("disk tier is ", DiskTierStateName(state())));
    }
    rocksdb::WriteBatch batch;
    batch.Put(impl_->blocks, k, rocksdb::Slice(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    batch.Put(impl_->meta, k, MetaBytes(meta));
    s = FromRocks(impl_->db->Write(NoWal(), &batch), "writing a block");
  }
  std::lock_guard<std::shared_mutex> lock(mu_);
  if (s.ok()) {
    pending_deletes_.erase(k);  // a delete refused earlier no longer applies to the new record
  } else {
    OnIoErrorLocked("writing a block", errors_.write, s, /*write=*/true);
  }
  if (++puts_since_check_ >= 16) {  // garbage grows with spills: check it between probes too
    puts_since_check_ = 0;
    CheckGarbageLocked();
  }
  return s;
}

absl::Status DiskTier::Get(const BlockKey& key, const DiskBlockMeta& meta, std::span<std::byte> out) {
  if (options_.before_io_for_test) options_.before_io_for_test("read");
  std::shared_lock<std::shared_mutex> lock(mu_);  // reads run beside each other and beside writes
  if (impl_ == nullptr) return absl::UnavailableError("disk tier is off");
  rocksdb::PinnableSlice value;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  if (absl::Status s = FromRocks(impl_->db->Get(ro, impl_->blocks, KeyBytes(key), &value), "reading a block");
      !s.ok()) {
    // NotFound: not on disk; DataLoss: RocksDB's own checksum failed (the caller counts a checksum failure).
    if (!absl::IsNotFound(s) && !absl::IsDataLoss(s)) OnIoErrorLocked("reading a block", errors_.read, s, false);
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
  if (options_.before_io_for_test) options_.before_io_for_test("delete");
  const std::string k = KeyBytes(key);
  {
    std::lock_guard<std::shared_mutex> lock(mu_);
    const DiskTierState st = state();
    if (impl_ == nullptr || read_only_open_ || st == DiskTierState::kReadOnly || st == DiskTierState::kOff) {
      // Remembered (bounded: past 1M keys the rest are found stale by the store's reconcile instead).
      if (pending_deletes_.size() < (1u << 20)) pending_deletes_.insert(k);
      return absl::FailedPreconditionError(absl::StrCat("disk tier is ", DiskTierStateName(st)));
    }
  }
  absl::Status s;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    // Closed meanwhile (a probe reopening it): the store's reconcile finds the record stale.
    if (impl_ == nullptr || read_only_open_) return absl::FailedPreconditionError("disk tier is reopening");
    rocksdb::WriteBatch batch;
    batch.Delete(impl_->meta, k);
    batch.Delete(impl_->blocks, k);
    s = FromRocks(impl_->db->Write(NoWal(), &batch), "deleting a block");
  }
  if (!s.ok()) {
    std::lock_guard<std::shared_mutex> lock(mu_);
    OnIoErrorLocked("deleting a block", errors_.remove, s, /*write=*/true);
  }
  return s;
}

absl::Status DiskTier::ForEach(const std::function<void(const BlockKey&, const DiskBlockMeta&)>& visit, uint64_t* bad) {
  std::lock_guard<std::shared_mutex> lock(mu_);
  if (impl_ == nullptr) return absl::UnavailableError("disk tier is off");
  std::unique_ptr<rocksdb::Iterator> it(impl_->db->NewIterator(rocksdb::ReadOptions(), impl_->meta));
  std::vector<std::string> broken;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (pending_deletes_.contains(absl::string_view(it->key().data(), it->key().size())))
      continue;  // dropped while not writable
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
    if (absl::Status s = FromRocks(impl_->db->Write(NoWal(), &batch), "deleting a bad record"); !s.ok()) {
      OnIoErrorLocked("deleting a bad record", errors_.remove, s, /*write=*/true);
      break;
    }
  }
  if (bad != nullptr) *bad = broken.size();
  return absl::OkStatus();
}

absl::Status DiskTier::CorruptForTest(const BlockKey& key, uint64_t offset) {
  std::lock_guard<std::shared_mutex> lock(mu_);
  if (impl_ == nullptr) return absl::NotFoundError("disk tier is off");
  const std::string k = KeyBytes(key);
  std::string value;
  if (absl::Status s = FromRocks(impl_->db->Get(rocksdb::ReadOptions(), impl_->blocks, k, &value), "corrupting");
      !s.ok()) {
    return s;
  }
  if (offset >= value.size()) return absl::InvalidArgumentError("offset past the block");
  value[offset] = static_cast<char>(value[offset] ^ 0x5a);
  return FromRocks(impl_->db->Put(NoWal(), impl_->blocks, k, value), "corrupting");
}

}  // namespace kvtier::server
