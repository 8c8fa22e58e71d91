// libFuzzer target: decoding the disk tier's records (what a restart reads back from RocksDB). Any bytes
// either decode to a record that re-encodes to the same bytes, or are rejected; nothing crashes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "storage/disk_tier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  kvtier::server::DiskBlockMeta meta;
  if (kvtier::server::DecodeDiskBlockMeta(bytes, &meta)) {
    if (kvtier::server::EncodeDiskBlockMeta(meta) != bytes) std::abort();
  }
  kvtier::BlockKey key;
  if (kvtier::server::DecodeDiskKey(bytes, &key)) {
    if (kvtier::server::EncodeDiskKey(key) != bytes) std::abort();
  }
  return 0;
}
