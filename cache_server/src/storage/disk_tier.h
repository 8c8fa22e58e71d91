// DiskTier: the on-disk tier of one server, in RocksDB (payloads in blob files), surviving restarts.
#ifndef KVTIER_SERVER_SRC_STORAGE_DISK_TIER_H_
#define KVTIER_SERVER_SRC_STORAGE_DISK_TIER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/block_meta.h"

namespace kvtier::server {

// What the disk keeps beside a block's bytes, enough to rebuild the index after a restart.
struct DiskBlockMeta {
  uint64_t namespace_id = 0;
  uint64_t tenant_id = 0;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;  // XXH3-64 of the bytes, verified on every read
  uint32_t depth = 0;
  uint32_t access_count = 0;
  // The engine's metadata of the block (kvtier/common/block_meta.h); null (or empty) when it was put
  // without any. Shared, never changed once set: the in-memory entry and the record hold the same one.
  std::shared_ptr<const BlockMeta> block_meta;
};

// The record formats, exposed for tests and fuzzing. Key: 32 fingerprint bytes, then the shard as
// uint32 little-endian (36 bytes). Meta, version 1 (a block without engine metadata, and every record
// written before there was any): version byte 1, then namespace_id, tenant_id, size_bytes, checksum as
// uint64 LE, then depth, access_count as uint32 LE (41 bytes). Version 2 (a block with engine metadata):
// the same 41 bytes with version byte 2, then BlockMeta: hash and parent_hash (each a form byte, 0 none,
// 1 negative int, 2 uint, 3 bytes; then 8 bytes LE for an int, or a length byte and 1..64 bytes), a
// lora flag byte (0 or 1) and the lora id as 8 bytes LE when 1, the token count as uint32 LE (at most
// kMaxBlockTokenIds) and the tokens as uint32 LE. Version 3 (metadata with a parent fingerprint, which
// the client sends for every block but a chain's first): version 2's bytes with version byte 3, then the
// parent fingerprint's 32 bytes. All three are read; the decoder accepts only the canonical bytes the
// encoder writes (a version 2 record with empty metadata is malformed).
std::string EncodeDiskKey(const BlockKey& key);
bool DecodeDiskKey(std::string_view bytes, BlockKey* key);  // false: not a key
std::string EncodeDiskBlockMeta(const DiskBlockMeta& meta);
bool DecodeDiskBlockMeta(std::string_view bytes, DiskBlockMeta* meta);  // false: malformed (any input)

// What the disk tier can do now (docs/config.md, "Disk tier states"):
//   kOk        reads and writes (spill from host memory).
//   kFull      "degraded-full": the volume's free space is under the floor (min_free_bytes); no new
//              block is written (host evictions drop), reads and deletes go on.
//   kReadOnly  "read-only": the database refuses writes (an I/O error, or it could only be opened read
//              only); reads go on, nothing is written or deleted.
//   kOff       "off": no database (it could not be opened, or was closed after an error); every block
//              lives in memory only.
// Every state but kOk is left by Probe() once the volume has room again.
enum class DiskTierState : uint8_t { kOk = 0, kFull = 1, kReadOnly = 2, kOff = 3 };
// "ok", "degraded-full", "read-only", "off".
const char* DiskTierStateName(DiskTierState state);

struct DiskTierOptions {
  std::string path;  // the RocksDB directory; created when missing
  // Writes stop while the volume has less than this free (statvfs f_bavail), and resume once it has
  // 1.5x this. 0: the default, max(4 x the write buffer, min(volume / 8, 1 GiB)).
  uint64_t min_free_bytes = 0;
  // Where RocksDB's own info log goes: "" = its warnings and errors into the server's log (no file);
  // a directory = a LOG file there, at most 4 files of 8 MiB.
  std::string info_log_dir;
  // Writes skip RocksDB's WAL, so the blocks of the write buffers live only in memory until a flush.
  // Probe() flushes them once the oldest has waited this long: a killed process loses at most this
  // much of the newest spills (or the write buffers, if they fill first).
  std::chrono::milliseconds flush_interval{5000};
  // For tests of a stalled disk: called with "read", "write" or "delete" before each block read, write
  // and delete, on the calling thread, with no lock of the tier held; it may block. Null: none.
  std::function<void(const char* op)> before_io_for_test;
};

// Disk I/O errors by operation since creation (every one is also logged, rate limited).
struct DiskErrorCounters {
  std::atomic<uint64_t> open{0};
  std::atomic<uint64_t> write{0};
  std::atomic<uint64_t> read{0};
  std::atomic<uint64_t> remove{0};
  std::atomic<uint64_t> scan{0};
  std::atomic<uint64_t> background{0};  // RocksDB's flushes and compactions (an EventListener counts them)
  std::atomic<uint64_t> recreated{0};   // the database was started empty (see OpenOrDegrade)
};

// Two column families in one RocksDB: "default" holds a DiskBlockMeta record per key (41 bytes, more with engine
// metadata), "blocks" the payloads (blob files, no compression). Both records of a block are written in one WriteBatch
// without the WAL (a cache need not write every block twice) and the two families flush together, so a process killed
// mid-write leaves either both or neither, and loses at most its unflushed write buffers; a payload whose checksum
// fails is never returned. Keys are the 32 fingerprint bytes then the shard as uint32 little-endian. RocksDB's own
// files are bounded so that they cannot fill the volume unnoticed: small write buffers, blob garbage collected by
// compaction, an SstFileManager capping the database below the volume's size less the floor, and no info log on the
// volume unless info_log_dir says so. A full or failing volume never stops the process: the tier changes state
// (state(), reason(); logged) and Probe() brings it back. A database that cannot be opened read-write for want of room,
// once the files it no longer needs are deleted, and whose own files fill the volume, is started empty: it is a cache.
// Thread-safety: all methods may be called concurrently.
class DiskTier {
 public:
  // Opens or creates the database at `path` read-write with default options. Errors: Internal (RocksDB
  // could not open it).
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const std::string& path);
  // Opens the database as well as the volume allows and never fails: read-write (kOk, or kFull when
  // the volume is under its floor), else read-only (kReadOnly), else none (kOff). reason() says why.
  static std::unique_ptr<DiskTier> OpenOrDegrade(const DiskTierOptions& options);
  ~DiskTier();

  // Stores `bytes` (borrowed for the call) with `meta`. Errors: FailedPrecondition (not kOk, or no
  // room: the volume would go under its floor; the state becomes kFull), Internal (I/O; the state
  // becomes kReadOnly or kFull).
  absl::Status Put(const BlockKey& key, const DiskBlockMeta& meta, std::span<const std::byte> bytes);
  // Reads the payload into `out` (exactly meta.size_bytes long) and verifies its checksum.
  // Errors: NotFound (not on disk), DataLoss (size or checksum mismatch), Unavailable (kOff),
  // Internal (I/O).
  absl::Status Get(const BlockKey& key, const DiskBlockMeta& meta, std::span<std::byte> out);
  // Removes a block. Errors: FailedPrecondition (kReadOnly or kOff: nothing is written now; the key is
  // remembered, skipped by ForEach and deleted once the database is writable again), Internal (I/O).
  absl::Status Delete(const BlockKey& key);
  // Calls `visit` for every block's metadata (a scan of the small column family only).
  // Errors: Unavailable (kOff), Internal (I/O); records that do not parse are deleted (when
  // writable) and counted in *bad (if given).
  absl::Status ForEach(const std::function<void(const BlockKey&, const DiskBlockMeta&)>& visit,
                       uint64_t* bad = nullptr);
  // Overwrites one byte of a stored payload (for tests of corruption detection). Errors: NotFound.
  absl::Status CorruptForTest(const BlockKey& key, uint64_t offset);

  // True when a block of `bytes` may be written now: state kOk and the volume keeps its floor after
  // it. Checks statvfs; when under the floor the state becomes kFull (logged).
  bool HasRoomFor(uint64_t bytes);
  // Called every probe interval. Re-reads the volume (a volume grown or shrunk while running moves the
  // floor, when it is the default, and RocksDB's cap); flushes write buffers older than flush_interval;
  // leaves a degraded state when the volume has room again (free >= 1.5 x the floor): resumes the
  // database (DB::Resume) or reopens it, with a back-off (doubling up to 5 min) when the last recovery
  // did not hold. Cheap when kOk (one statvfs, which may also enter kFull).
  // Blob garbage: a deleted block's bytes stay in its blob file until every block of that file is
  // gone. A cache deletes in about the order it writes, so files empty by themselves and garbage
  // collection (which copies the live blobs of old files) is off; when the database's files grow past
  // 1.5x `logical_bytes` (the blocks' bytes, as the caller counts them; 0: unknown) it is turned on
  // for the oldest quarter of the blob files until they are back under 1.25x.
  // Returns true when it opened a database that was not open read-write before (the caller then
  // re-reads its records with ForEach).
  bool Probe(uint64_t logical_bytes = 0);
  // The blocks' bytes on disk as the caller counts them (see Probe); Put checks the garbage against it
  // every 16 writes, so that a fast spill rate cannot outrun the probe.
  void NoteLogicalBytes(uint64_t bytes) {
    logical_bytes_.store(bytes, std::memory_order_relaxed);
    logical_known_.store(true, std::memory_order_relaxed);
  }
  // True while blob garbage collection is on (see Probe).
  bool collecting_garbage() const { return collecting_.load(std::memory_order_relaxed); }
  // The most the disk budget may be on this volume: (volume - floor) / 2, so that blob garbage not yet
  // collected and compactions' output have room beside the blocks (docs/config.md, "The disk budget").
  // 0 when the volume's size is unknown.
  uint64_t budget_limit() const;

  DiskTierState state() const { return state_.load(std::memory_order_relaxed); }
  std::string reason() const;  // why the state is not kOk ("" when kOk)
  const std::string& path() const { return options_.path; }
  // The volume's size at the last probe (0: unknown).
  uint64_t volume_bytes() const { return volume_bytes_.load(std::memory_order_relaxed); }
  uint64_t min_free_bytes() const { return min_free_bytes_.load(std::memory_order_relaxed); }
  uint64_t free_bytes() const { return free_bytes_.load(std::memory_order_relaxed); }  // at the last check
  const DiskErrorCounters& errors() const { return errors_; }
  // Bytes of the database's files (SST, blob) as RocksDB's SstFileManager tracks them.
  uint64_t database_bytes() const;

 private:
  struct Impl;
  explicit DiskTier(const DiskTierOptions& options);
  // Opens `impl_` read-write, else read-only; sets the state. Needs mu_.
  void OpenLocked();
  // Deletes the SST and blob files of the database at options_.path that its current version does not
  // reference (left by a killed process, deleted by RocksDB only after a read-write open). Returns the
  // bytes deleted. Needs mu_, with impl_ closed.
  uint64_t DeleteObsoleteFilesLocked();
  // Deletes every file of the database at options_.path (impl_ closed). Needs mu_.
  void DeleteDatabaseFilesLocked();
  // Bytes of the files in options_.path.
  uint64_t DirectoryBytes() const;
  // The write buffers, the floor and RocksDB's cap for a volume of `total` bytes. Needs mu_.
  void SizeForVolumeLocked(uint64_t total);
  // Turns garbage collection on past 1.5x the logical bytes, off under 1.25x (see Probe). Needs mu_.
  void CheckGarbageLocked();
  // Turns blob garbage collection on or off (SetOptions on the blocks family). Needs mu_ and impl_.
  void SetGarbageCollectionLocked(bool on);
  // Deletes the keys Delete() could not (pending_deletes_) once the database is writable. Needs mu_.
  void ApplyPendingDeletesLocked();
  void CloseLocked();
  void SetStateLocked(DiskTierState state, std::string reason);
  // Logs an I/O error of operation `op` (rate limited), counts it and moves to the state it implies.
  // Needs mu_ exclusively when `write`; a read error (only counted and logged) needs it shared.
  void OnIoErrorLocked(const char* op, std::atomic<uint64_t>& counter, const absl::Status& s, bool write);
  // statvfs of the volume; false when it cannot be read.
  bool RefreshFree();

  DiskTierOptions options_;
  std::atomic<uint64_t> volume_bytes_{0};
  std::atomic<uint64_t> min_free_bytes_{0};
  uint64_t write_buffer_bytes_ = 0;   // guarded by mu_; follows the volume (SizeForVolumeLocked)
  std::atomic<bool> damaged_{false};  // RocksDB reported a damaged file: the probe starts the tier anew
  std::atomic<uint64_t> free_bytes_{0};
  std::atomic<DiskTierState> state_{DiskTierState::kOff};
  std::atomic<bool> collecting_{false};     // blob garbage collection on (set under mu_)
  std::atomic<uint64_t> logical_bytes_{0};  // NoteLogicalBytes / Probe
  std::atomic<bool> logical_known_{false};  // logical_bytes_ was ever given
  uint32_t puts_since_check_ = 0;           // guarded by mu_
  DiskErrorCounters errors_;
  // Exclusive for the state and the database's lifetime (open, close, probe); shared for the RocksDB
  // reads, writes and deletes themselves, so that reads never wait on a write.
  mutable std::shared_mutex mu_;
  std::string reason_;           // guarded by mu_
  std::unique_ptr<Impl> impl_;   // guarded by mu_; null when kOff
  bool read_only_open_ = false;  // guarded by mu_; impl_ was opened read-only
  bool reported_ = false;        // guarded by mu_; the first state was logged
  // Keys Delete() refused while the database was not writable: skipped by ForEach, deleted later.
  absl::flat_hash_set<std::string> pending_deletes_;  // guarded by mu_
  std::chrono::steady_clock::time_point last_flush_;  // guarded by mu_
  // Recovery back-off: no resume or reopen before next_recovery_; the delay doubles when a recovery
  // did not last (the tier left ok within 5 min), up to 5 min.
  std::chrono::steady_clock::time_point next_recovery_;  // guarded by mu_
  std::chrono::steady_clock::time_point recovered_at_;   // guarded by mu_
  std::chrono::milliseconds recovery_backoff_{0};        // guarded by mu_
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_STORAGE_DISK_TIER_H_
