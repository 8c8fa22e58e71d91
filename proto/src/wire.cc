#include "kvtier/wire/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::wire {

void ToProto(const Namespace& ns, v1::Namespace* out) {
  out->set_tenant(ns.tenant);
  out->set_model(ns.model);
  if (ns.revision.has_value()) out->set_revision(*ns.revision);
  v1::KvLayout* l = out->mutable_layout();
  const KvLayout& k = ns.layout;
  l->set_kind(static_cast<v1::LayoutKind>(k.kind));
  l->set_dtype(static_cast<v1::DType>(k.dtype));
  l->set_codec(static_cast<v1::Codec>(k.codec));
  l->set_num_layers(k.num_layers);
  l->set_num_kv_heads(k.num_kv_heads);
  l->set_head_dim(k.head_dim);
  l->set_latent_dim(k.latent_dim);
  l->set_block_tokens(k.block_tokens);
  l->set_tp_size(k.tp_size);
  l->set_quant_group_size(k.quant_group_size);
}

absl::StatusOr<Namespace> FromProto(const v1::Namespace& in) {
  Namespace ns;
  ns.tenant = in.tenant();
  ns.model = in.model();
  if (in.has_revision()) ns.revision = in.revision();
  const v1::KvLayout& l = in.layout();
  ns.layout.kind = static_cast<LayoutKind>(l.kind());
  ns.layout.dtype = static_cast<DType>(l.dtype());
  ns.layout.codec = static_cast<Codec>(l.codec());
  ns.layout.num_layers = l.num_layers();
  ns.layout.num_kv_heads = l.num_kv_heads();
  ns.layout.head_dim = l.head_dim();
  ns.layout.latent_dim = l.latent_dim();
  ns.layout.block_tokens = l.block_tokens();
  ns.layout.tp_size = l.tp_size();
  ns.layout.quant_group_size = l.quant_group_size();
  if (absl::Status s = ns.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("namespace.", s.message()));
  }
  return ns;
}

void EncodeKeys(std::span<const BlockKey> keys, v1::BlockKeys* out) {
  std::string* fps = out->mutable_fingerprints();
  fps->resize(keys.size() * 32);
  bool any_shard = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    std::memcpy(fps->data() + i * 32, keys[i].fingerprint.bytes.data(), 32);
    any_shard |= keys[i].shard != 0;
  }
  if (any_shard) {
    out->mutable_shards()->Reserve(static_cast<int>(keys.size()));
    for (const BlockKey& k : keys) out->add_shards(k.shard);
  }
}

absl::StatusOr<std::vector<BlockKey>> DecodeKeys(const v1::BlockKeys& in, uint32_t tp_size, uint32_t max_keys) {
  const std::string& fps = in.fingerprints();
  if (fps.size() % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys.fingerprints: ", fps.size(), " bytes is not a multiple of 32"));
  }
  const size_t n = fps.size() / 32;
  if (n == 0) return absl::InvalidArgumentError("keys: at least one key is required");
  if (n > max_keys) {
    return absl::InvalidArgumentError(absl::StrCat("keys: ", n, " keys, at most ", max_keys, " per request"));
  }
  if (in.shards_size() != 0 && static_cast<size_t>(in.shards_size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("keys.shards: ", in.shards_size(), " shards for ", n, " keys"));
  }
  std::vector<BlockKey> keys(n);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(keys[i].fingerprint.bytes.data(), fps.data() + i * 32, 32);
    if (in.shards_size() != 0) {
      keys[i].shard = in.shards(static_cast<int>(i));
      if (keys[i].shard >= tp_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("keys.shards[", i, "]: shard ", keys[i].shard, " >= tp_size ", tp_size));
      }
    }
  }
  return keys;
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

grpc::ChannelArguments ChannelArgs(uint64_t max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  args.SetInt("grpc.http2.lookahead_bytes", 16 << 20);
  args.SetInt("grpc.http2.bdp_probe", 0);
  // Each client keeps its own connection per member rather than sharing a global subchannel pool.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

void ConfigureServerBuilder(grpc::ServerBuilder& builder, uint64_t max_message_bytes) {
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  builder.AddChannelArgument("grpc.http2.lookahead_bytes", 16 << 20);
  builder.AddChannelArgument("grpc.http2.bdp_probe", 0);
  // gRPC sets SO_REUSEPORT by default: a second server on a port in use would start and take half of
  // the connections. A port in use must fail the start instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

namespace {

void HashToProto(const EngineBlockHash& h, v1::EngineBlockHash* out) {
  switch (h.form) {
    case EngineBlockHash::Form::kNone:
      break;
    case EngineBlockHash::Form::kInt:
      out->set_int_value(h.int_value);
      break;
    case EngineBlockHash::Form::kUint:
      out->set_uint_value(h.uint_value);
      break;
    case EngineBlockHash::Form::kBytes:
      out->set_bytes_value(h.bytes);
      break;
  }
}

EngineBlockHash HashFromProto(const v1::EngineBlockHash& h) {
  switch (h.value_case()) {
    case v1::EngineBlockHash::kIntValue:
      return EngineBlockHash::Int(h.int_value());  // a non-negative one becomes kUint
    case v1::EngineBlockHash::kUintValue:
      return EngineBlockHash::Uint(h.uint_value());
    case v1::EngineBlockHash::kBytesValue:
      return EngineBlockHash::Bytes(h.bytes_value());
    case v1::EngineBlockHash::VALUE_NOT_SET:
      break;
  }
  return EngineBlockHash();
}

}  // namespace

void ToProto(const BlockMeta& meta, v1::EngineBlockMeta* out) {
  if (!meta.hash.empty()) HashToProto(meta.hash, out->mutable_hash());
  if (!meta.parent_hash.empty()) HashToProto(meta.parent_hash, out->mutable_parent_hash());
  out->mutable_token_ids()->Add(meta.token_ids.begin(), meta.token_ids.end());
  if (meta.lora_id.has_value()) out->set_lora_id(*meta.lora_id);
  if (meta.parent_fingerprint.has_value()) {
    out->set_parent_fingerprint(meta.parent_fingerprint->bytes.data(), meta.parent_fingerprint->bytes.size());
  }
}

absl::StatusOr<BlockMeta> FromProto(const v1::EngineBlockMeta& meta, const std::string& field) {
  if (static_cast<size_t>(meta.token_ids_size()) > kMaxBlockTokenIds) {  // before copying them
    return absl::InvalidArgumentError(absl::StrCat(field, ".token_ids: ", meta.token_ids_size(), " token ids, at most ",
                                                   kMaxBlockTokenIds, " per block"));
  }
  BlockMeta out;
  if (meta.has_hash()) out.hash = HashFromProto(meta.hash());
  if (meta.has_parent_hash()) out.parent_hash = HashFromProto(meta.parent_hash());
  out.token_ids.assign(meta.token_ids().begin(), meta.token_ids().end());
  if (meta.has_lora_id()) out.lora_id = meta.lora_id();
  if (!meta.parent_fingerprint().empty()) {
    if (meta.parent_fingerprint().size() != 32) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".parent_fingerprint: ", meta.parent_fingerprint().size(), " bytes, want 32"));
    }
    Fingerprint fp;
    std::memcpy(fp.bytes.data(), meta.parent_fingerprint().data(), 32);
    out.parent_fingerprint = fp;
  }
  if (absl::Status s = ValidateBlockMeta(out, field); !s.ok()) return s;
  return out;
}

}  // namespace kvtier::wire
