// Conversions between kvtier's C++ types and proto/kvtier/v1 messages, status mapping, and the gRPC
// settings shared by servers and clients. Internal to kvtier (generated types stay out of public APIs).
#ifndef KVTIER_WIRE_WIRE_H_
#define KVTIER_WIRE_WIRE_H_

#include <cstdint>
#include <span>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/block_meta.h"
#include "kvtier/common/namespace.h"
#include "kvtier/v1/types.pb.h"

namespace kvtier::wire {

// Copies everything but tenant_salt (which never leaves the client) into `out`.
void ToProto(const Namespace& ns, v1::Namespace* out);
// Parses and validates. Errors: InvalidArgument naming the field ("namespace.layout.head_dim: ...").
absl::StatusOr<Namespace> FromProto(const v1::Namespace& ns);

// Packs keys as n x 32 fingerprint bytes plus shards (omitted when all are 0).
void EncodeKeys(std::span<const BlockKey> keys, v1::BlockKeys* out);
// Unpacks and validates: fingerprints a multiple of 32 bytes, 1..max_keys keys, shards empty or one per
// key and each < tp_size. Errors: InvalidArgument with the offending count or value.
absl::StatusOr<std::vector<BlockKey>> DecodeKeys(const v1::BlockKeys& keys, uint32_t tp_size, uint32_t max_keys);

// An engine's block metadata (with the parent fingerprint) to and from its message. FromProto
// validates (ValidateBlockMeta, and a parent_fingerprint of 0 or 32 bytes): errors are InvalidArgument
// naming `field` and the limit.
void ToProto(const BlockMeta& meta, v1::EngineBlockMeta* out);
absl::StatusOr<BlockMeta> FromProto(const v1::EngineBlockMeta& meta, const std::string& field);

// absl and gRPC status codes line up one to one.
grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);

// Channel arguments for multi-MiB blocks: message limits of `max_message_bytes` both ways and HTTP/2 flow
// control opened up (16 MiB lookahead, no BDP probing), as measured in TOOLCHAIN.md.
grpc::ChannelArguments ChannelArgs(uint64_t max_message_bytes);
// The same settings for a server builder, and no SO_REUSEPORT: a port already in use fails the start.
void ConfigureServerBuilder(grpc::ServerBuilder& builder, uint64_t max_message_bytes);

}  // namespace kvtier::wire

#endif  // KVTIER_WIRE_WIRE_H_
