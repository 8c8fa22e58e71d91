// libFuzzer target: request validation. The bytes are parsed as each request message the cache service
// takes, then validated exactly as the server does before it allocates anything (namespace, layout, key
// counts, shards, block size). Nothing may crash, and a request that passes must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include <google/protobuf/stubs/logging.h>

#include "kvtier/v1/cache.pb.h"
#include "kvtier/wire/wire.h"

namespace {

void Validate(const kvtier::v1::Namespace& pns, const kvtier::v1::BlockKeys& pkeys) {
  auto ns = kvtier::wire::FromProto(pns);
  if (!ns.ok()) return;
  const uint64_t bytes = ns->layout.ShardBytes();
  if (bytes == 0 || bytes > (1ULL << 40)) std::abort();  // Validate() promised a sane size
  auto keys = kvtier::wire::DecodeKeys(pkeys, ns->layout.tp_size, 65536);
  if (!keys.ok()) return;
  if (keys->empty() || keys->size() > 65536) std::abort();
  for (const auto& k : *keys) {
    if (k.shard >= ns->layout.tp_size) std::abort();
  }
  kvtier::v1::BlockKeys round_trip;
  kvtier::wire::EncodeKeys(*keys, &round_trip);
  if (round_trip.fingerprints() != pkeys.fingerprints()) std::abort();
}

}  // namespace

// Invalid UTF-8 in string fields is an expected parse failure here; keep protobuf from logging each one.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvtier::v1::LookupRequest lookup;
  if (lookup.ParseFromArray(data, static_cast<int>(size))) Validate(lookup.namespace_(), lookup.keys());
  kvtier::v1::AllocateRequest allocate;
  if (allocate.ParseFromArray(data, static_cast<int>(size))) Validate(allocate.namespace_(), allocate.keys());
  kvtier::v1::ReadRequest read;
  if (read.ParseFromArray(data, static_cast<int>(size))) Validate(read.namespace_(), read.keys());
  return 0;
}
