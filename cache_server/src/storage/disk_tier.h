// DiskTier: the on-disk tier of one server, in RocksDB (payloads in blob files), surviving restarts.
#ifndef KVTIER_SERVER_SRC_STORAGE_DISK_TIER_H_
#define KVTIER_SERVER_SRC_STORAGE_DISK_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/common/block_key.h"

namespace kvtier::server {

// What the disk keeps beside a block's bytes, enough to rebuild the index after a restart.
struct DiskBlockMeta {
  uint64_t namespace_id = 0;
  uint64_t tenant_id = 0;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;  // XXH3-64 of the bytes, verified on every read
  uint32_t depth = 0;
  uint32_t access_count = 0;
};

// The record formats, exposed for tests and fuzzing. Key: 32 fingerprint bytes, then the shard as
// uint32 little-endian (36 bytes). Meta: version byte 1, then namespace_id, tenant_id, size_bytes,
// checksum as uint64 LE, then depth, access_count as uint32 LE (41 bytes).
std::string EncodeDiskKey(const BlockKey& key);
bool DecodeDiskKey(std::string_view bytes, BlockKey* key);  // false: not a key
std::string EncodeDiskBlockMeta(const DiskBlockMeta& meta);
bool DecodeDiskBlockMeta(std::string_view bytes, DiskBlockMeta* meta);  // false: malformed (any input)

// Two column families in one RocksDB: "default" holds a 41-byte DiskBlockMeta per key, "blocks" the
// payloads (blob files, no compression). Both records of a block are written in one WriteBatch, so a
// process killed mid-write leaves either both or neither; a payload whose checksum fails is never
// returned. Keys are the 32 fingerprint bytes then the shard as uint32 little-endian.
// The WAL is on without fsync: a killed process loses nothing, a lost machine may lose recent writes.
// Thread-safety: all methods may be called concurrently (RocksDB is thread-safe).
class DiskTier {
 public:
  // Opens or creates the database at `path`. Errors: Internal (RocksDB could not open it).
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const std::string& path);
  ~DiskTier();

  // Stores `bytes` (borrowed for the call) with `meta`. Errors: Internal (I/O).
  absl::Status Put(const BlockKey& key, const DiskBlockMeta& meta, std::span<const std::byte> bytes);
  // Reads the payload into `out` (exactly meta.size_bytes long) and verifies its checksum.
  // Errors: NotFound (not on disk), DataLoss (size or checksum mismatch), Internal (I/O).
  absl::Status Get(const BlockKey& key, const DiskBlockMeta& meta, std::span<std::byte> out);
  // Removes a block. Errors: Internal (I/O).
  absl::Status Delete(const BlockKey& key);
  // Calls `visit` for every block's metadata (a scan of the small column family only).
  // Errors: Internal (I/O); records that do not parse are deleted and counted in *bad (if given).
  absl::Status ForEach(const std::function<void(const BlockKey&, const DiskBlockMeta&)>& visit,
                       uint64_t* bad = nullptr);
  // Overwrites one byte of a stored payload (for tests of corruption detection). Errors: NotFound.
  absl::Status CorruptForTest(const BlockKey& key, uint64_t offset);

 private:
  struct Impl;
  explicit DiskTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_STORAGE_DISK_TIER_H_
