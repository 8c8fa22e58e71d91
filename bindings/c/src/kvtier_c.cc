// The C API (kvtier/kvtier.h) over kvtier::client::Client. This file is the only place where
// absl::Status becomes a kvtier_status_code, and no C++ exception crosses the extern "C" boundary.
#include "kvtier/kvtier.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client_options_c.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/namespace.h"

struct kvtier_namespace {
  kvtier::Namespace ns;
};

struct kvtier_client {
  std::unique_ptr<kvtier::client::Client> client;
};

namespace {

// The codes are absl::StatusCode's numbers (HOUSE_STYLE §3: they line up with gRPC's, too).
static_assert(KVTIER_INVALID_ARGUMENT == static_cast<int>(absl::StatusCode::kInvalidArgument));
static_assert(KVTIER_UNAVAILABLE == static_cast<int>(absl::StatusCode::kUnavailable));
static_assert(KVTIER_UNAUTHENTICATED == static_cast<int>(absl::StatusCode::kUnauthenticated));
static_assert(KVTIER_GET_HIT == static_cast<int>(kvtier::client::GetResult::kHit));
static_assert(KVTIER_GET_CHECKSUM_MISMATCH == static_cast<int>(kvtier::client::GetResult::kChecksumMismatch));
static_assert(KVTIER_PUT_STORED == static_cast<int>(kvtier::client::PutResult::kStored));
static_assert(KVTIER_PUT_ERROR == static_cast<int>(kvtier::client::PutResult::kError));
static_assert(static_cast<int>(KVTIER_LAYOUT_MLA) == static_cast<int>(kvtier::LayoutKind::kMla));
static_assert(static_cast<int>(KVTIER_DTYPE_FP8_E4M3) == static_cast<int>(kvtier::DType::kFp8E4m3));
static_assert(static_cast<int>(KVTIER_CODEC_INT8) == static_cast<int>(kvtier::Codec::kInt8));
static_assert(sizeof(kvtier::Fingerprint) == KVTIER_FINGERPRINT_BYTES);

// The last status of this thread, for kvtier_last_error_message().
thread_local kvtier_status_code t_last_code = KVTIER_OK;
thread_local std::string t_last_message;

// Records `s` as this thread's last status and in `error` (if given); returns its code.
kvtier_status_code Report(const absl::Status& s, kvtier_error_t* error) {
  const auto code = static_cast<kvtier_status_code>(s.code());
  t_last_code = code;
  t_last_message = std::string(s.message());
  if (error != nullptr) {
    error->code = code;
    const size_t n = std::min(t_last_message.size(), sizeof(error->message) - 1);
    std::memcpy(error->message, t_last_message.data(), n);
    error->message[n] = '\0';
  }
  return code;
}

kvtier_status_code Invalid(const std::string& message, kvtier_error_t* error) {
  return Report(absl::InvalidArgumentError(message), error);
}

// Runs `body` (returning absl::Status) and reports its outcome. A C++ exception (only std::bad_alloc
// and the like can escape the client) becomes INTERNAL instead of unwinding into C.
template <typename F>
kvtier_status_code Guard(kvtier_error_t* error, F&& body) noexcept {
  try {
    return Report(body(), error);
  } catch (const std::exception& e) {
    return Report(absl::InternalError(absl::StrCat("kvtier: C++ exception: ", e.what())), error);
  } catch (...) {
    return Report(absl::InternalError("kvtier: unknown C++ exception"), error);
  }
}

// Copies `n` packed 32-byte fingerprints into Fingerprint values (32 bytes per block: cheap next to I/O).
std::vector<kvtier::Fingerprint> Fingerprints(const uint8_t* packed, size_t n) {
  std::vector<kvtier::Fingerprint> out(n);
  for (size_t i = 0; i < n; ++i)
    std::memcpy(out[i].bytes.data(), packed + i * KVTIER_FINGERPRINT_BYTES, KVTIER_FINGERPRINT_BYTES);
  return out;
}

}  // namespace

extern "C" {

const char* kvtier_status_code_name(kvtier_status_code code) {
  switch (code) {
    case KVTIER_OK:
      return "OK";
    case KVTIER_CANCELLED:
      return "CANCELLED";
    case KVTIER_UNKNOWN:
      return "UNKNOWN";
    case KVTIER_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case KVTIER_DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case KVTIER_NOT_FOUND:
      return "NOT_FOUND";
    case KVTIER_ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case KVTIER_PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case KVTIER_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case KVTIER_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case KVTIER_ABORTED:
      return "ABORTED";
    case KVTIER_OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case KVTIER_UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case KVTIER_INTERNAL:
      return "INTERNAL";
    case KVTIER_UNAVAILABLE:
      return "UNAVAILABLE";
    case KVTIER_DATA_LOSS:
      return "DATA_LOSS";
    case KVTIER_UNAUTHENTICATED:
      return "UNAUTHENTICATED";
  }
  return "UNKNOWN_CODE";
}

const char* kvtier_last_error_message(void) { return t_last_message.c_str(); }
kvtier_status_code kvtier_last_error_code(void) { return t_last_code; }
const char* kvtier_version(void) { return KVTIER_VERSION; }

void kvtier_kv_layout_init(kvtier_kv_layout_t* layout) {
  if (layout == nullptr) return;
  const kvtier::KvLayout d;
  *layout = {};
  layout->struct_size = sizeof(kvtier_kv_layout_t);
  layout->kind = static_cast<kvtier_layout_kind>(d.kind);
  layout->dtype = static_cast<kvtier_dtype>(d.dtype);
  layout->codec = static_cast<kvtier_codec>(d.codec);
  layout->block_tokens = d.block_tokens;
  layout->tp_size = d.tp_size;
  layout->quant_group_size = d.quant_group_size;
}

kvtier_status_code kvtier_namespace_create(const char* tenant, const char* model, const char* revision,
                                           const kvtier_kv_layout_t* layout, kvtier_namespace_t** out,
                                           kvtier_error_t* error) {
  if (out == nullptr) return Invalid("out: must not be NULL", error);
  *out = nullptr;
  if (tenant == nullptr) return Invalid("tenant: must not be NULL", error);
  if (model == nullptr) return Invalid("model: must not be NULL", error);
  if (layout == nullptr) return Invalid("layout: must not be NULL", error);
  if (layout->struct_size < sizeof(kvtier_kv_layout_t)) {
    return Invalid(absl::StrCat("layout.struct_size: is ", layout->struct_size, ", want ", sizeof(kvtier_kv_layout_t),
                                " (call kvtier_kv_layout_init first)"),
                   error);
  }
  return Guard(error, [&]() -> absl::Status {
    auto h = std::make_unique<kvtier_namespace>();
    h->ns.tenant = tenant;
    h->ns.model = model;
    if (revision != nullptr) h->ns.revision = std::string(revision);
    kvtier::KvLayout& l = h->ns.layout;
    l.kind = static_cast<kvtier::LayoutKind>(layout->kind);
    l.dtype = static_cast<kvtier::DType>(layout->dtype);
    l.codec = static_cast<kvtier::Codec>(layout->codec);
    l.num_layers = layout->num_layers;
    l.num_kv_heads = layout->num_kv_heads;
    l.head_dim = layout->head_dim;
    l.latent_dim = layout->latent_dim;
    l.block_tokens = layout->block_tokens;
    l.tp_size = layout->tp_size;
    l.quant_group_size = layout->quant_group_size;
    if (absl::Status s = h->ns.Validate(); !s.ok()) return s;
    *out = h.release();
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_namespace_set_tenant_salt(kvtier_namespace_t* ns, const void* salt, size_t salt_bytes,
                                                    kvtier_error_t* error) {
  if (ns == nullptr) return Invalid("ns: must not be NULL", error);
  if (salt == nullptr && salt_bytes > 0) return Invalid("salt: NULL with salt_bytes > 0", error);
  return Guard(error, [&]() -> absl::Status {
    kvtier::Namespace copy = ns->ns;
    copy.tenant_salt = std::string(static_cast<const char*>(salt), salt_bytes);
    if (absl::Status s = copy.Validate(); !s.ok()) return s;
    ns->ns = std::move(copy);
    return absl::OkStatus();
  });
}

void kvtier_namespace_free(kvtier_namespace_t* ns) { delete ns; }

uint64_t kvtier_namespace_block_bytes(const kvtier_namespace_t* ns) {
  return ns == nullptr ? 0 : ns->ns.layout.ShardBytes();
}

uint32_t kvtier_namespace_block_tokens(const kvtier_namespace_t* ns) {
  return ns == nullptr ? 0 : ns->ns.layout.block_tokens;
}

uint64_t kvtier_namespace_id(const kvtier_namespace_t* ns) { return ns == nullptr ? 0 : ns->ns.Id(); }

kvtier_status_code kvtier_fingerprint_tokens(const kvtier_namespace_t* ns, const uint32_t* tokens, size_t num_tokens,
                                             const kvtier_extra_keys_t* extra, uint8_t* out_fingerprints,
                                             size_t out_capacity, size_t* out_count, kvtier_error_t* error) {
  if (ns == nullptr) return Invalid("ns: must not be NULL", error);
  if (tokens == nullptr && num_tokens > 0) return Invalid("tokens: NULL with num_tokens > 0", error);
  if (out_count == nullptr) return Invalid("out_count: must not be NULL", error);
  *out_count = 0;
  const size_t needed = num_tokens / ns->ns.layout.block_tokens;
  if (needed > out_capacity) {
    *out_count = needed;
    return Report(absl::OutOfRangeError(
                      absl::StrCat("out_capacity: room for ", out_capacity, " fingerprints, ", needed, " needed")),
                  error);
  }
  if (out_fingerprints == nullptr && needed > 0) return Invalid("out_fingerprints: must not be NULL", error);
  return Guard(error, [&]() -> absl::Status {
    kvtier::ExtraKeys keys;
    if (extra != nullptr) {
      if (extra->lora_adapter_id != nullptr) {
        keys.lora = kvtier::LoraKey{.adapter_id = extra->lora_adapter_id, .version = extra->lora_version};
      }
      if (extra->cache_salt != nullptr) {
        keys.cache_salt = std::string(static_cast<const char*>(extra->cache_salt), extra->cache_salt_bytes);
      }
      if (extra->num_multimodal > 0 && extra->multimodal == nullptr) {
        return absl::InvalidArgumentError("extra.multimodal: NULL with num_multimodal > 0");
      }
      for (size_t i = 0; i < extra->num_multimodal; ++i) {
        const kvtier_multimodal_input_t& m = extra->multimodal[i];
        if (m.content_hash == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("extra.multimodal[", i, "].content_hash: NULL"));
        }
        keys.multimodal.push_back(
            {.content_hash = std::string(static_cast<const char*>(m.content_hash), m.content_hash_bytes),
             .offset_tokens = m.offset_tokens,
             .length_tokens = m.length_tokens});
      }
    }
    auto fps = kvtier::ChainFingerprints(ns->ns, std::span<const uint32_t>(tokens, num_tokens), keys);
    if (!fps.ok()) return fps.status();
    for (size_t i = 0; i < fps->size(); ++i) {
      std::memcpy(out_fingerprints + i * KVTIER_FINGERPRINT_BYTES, (*fps)[i].bytes.data(), KVTIER_FINGERPRINT_BYTES);
    }
    *out_count = fps->size();
    return absl::OkStatus();
  });
}

void kvtier_client_options_init(kvtier_client_options_t* options) { kvtier::c_api::InitClientOptions(options); }

kvtier_status_code kvtier_client_connect(const kvtier_client_options_t* options, kvtier_client_t** out,
                                         kvtier_error_t* error) {
  if (out == nullptr) return Invalid("out: must not be NULL", error);
  *out = nullptr;
  if (options == nullptr) return Invalid("options: must not be NULL", error);
  return Guard(error, [&]() -> absl::Status {
    auto o = kvtier::c_api::ClientOptionsFromC(*options);
    if (!o.ok()) return o.status();
    auto c = kvtier::client::Client::Connect(*o);
    if (!c.ok()) return c.status();
    *out = new kvtier_client{std::move(c).value()};
    return absl::OkStatus();
  });
}

void kvtier_client_close(kvtier_client_t* client) { delete client; }

kvtier_status_code kvtier_lookup_prefix(kvtier_client_t* client, const kvtier_namespace_t* ns,
                                        const uint8_t* fingerprints, size_t num_blocks, uint32_t* out_prefix_blocks,
                                        uint8_t* out_present, uint32_t* out_blocks_from_errors, kvtier_error_t* error) {
  if (client == nullptr) return Invalid("client: must not be NULL", error);
  if (ns == nullptr) return Invalid("ns: must not be NULL", error);
  if (fingerprints == nullptr && num_blocks > 0) return Invalid("fingerprints: NULL with num_blocks > 0", error);
  if (out_prefix_blocks == nullptr) return Invalid("out_prefix_blocks: must not be NULL", error);
  *out_prefix_blocks = 0;
  return Guard(error, [&]() -> absl::Status {
    auto r = client->client->LookupPrefix(ns->ns, Fingerprints(fingerprints, num_blocks));
    if (!r.ok()) return r.status();
    *out_prefix_blocks = r->prefix_blocks;
    if (out_present != nullptr) {
      for (size_t i = 0; i < num_blocks; ++i) out_present[i] = r->present[i] ? 1 : 0;
    }
    if (out_blocks_from_errors != nullptr) *out_blocks_from_errors = r->blocks_from_errors;
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_get(kvtier_client_t* client, const kvtier_namespace_t* ns, const uint8_t* fingerprints,
                              size_t num_blocks, uint32_t shard, void* const* buffers, uint64_t buffer_bytes,
                              kvtier_get_result* out_results, uint32_t* out_hits, kvtier_error_t* error) {
  if (client == nullptr) return Invalid("client: must not be NULL", error);
  if (ns == nullptr) return Invalid("ns: must not be NULL", error);
  if (num_blocks > 0 && (fingerprints == nullptr || buffers == nullptr || out_results == nullptr)) {
    return Invalid("fingerprints, buffers and out_results: must not be NULL", error);
  }
  if (out_hits != nullptr) *out_hits = 0;
  return Guard(error, [&]() -> absl::Status {
    std::vector<std::span<std::byte>> views;
    views.reserve(num_blocks);
    for (size_t i = 0; i < num_blocks; ++i) {
      if (buffers[i] == nullptr) return absl::InvalidArgumentError(absl::StrCat("buffers[", i, "]: NULL"));
      views.emplace_back(static_cast<std::byte*>(buffers[i]), buffer_bytes);
    }
    auto r = client->client->Get(ns->ns, Fingerprints(fingerprints, num_blocks), shard, views);
    if (!r.ok()) return r.status();
    uint32_t hits = 0;
    for (size_t i = 0; i < num_blocks; ++i) {
      out_results[i] = static_cast<kvtier_get_result>((*r)[i]);
      hits += (*r)[i] == kvtier::client::GetResult::kHit ? 1 : 0;
    }
    if (out_hits != nullptr) *out_hits = hits;
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_put(kvtier_client_t* client, const kvtier_namespace_t* ns, const uint8_t* fingerprints,
                              size_t num_blocks, uint32_t shard, const void* const* blocks, uint64_t block_bytes,
                              uint32_t first_block_index, kvtier_put_result* out_results, kvtier_error_t* error) {
  if (client == nullptr) return Invalid("client: must not be NULL", error);
  if (ns == nullptr) return Invalid("ns: must not be NULL", error);
  if (num_blocks > 0 && (fingerprints == nullptr || blocks == nullptr)) {
    return Invalid("fingerprints and blocks: must not be NULL", error);
  }
  return Guard(error, [&]() -> absl::Status {
    std::vector<std::span<const std::byte>> views;
    views.reserve(num_blocks);
    for (size_t i = 0; i < num_blocks; ++i) {
      if (blocks[i] == nullptr) return absl::InvalidArgumentError(absl::StrCat("blocks[", i, "]: NULL"));
      views.emplace_back(static_cast<const std::byte*>(blocks[i]), block_bytes);
    }
    auto r = client->client->Put(ns->ns, Fingerprints(fingerprints, num_blocks), shard, views, first_block_index);
    if (!r.ok()) return r.status();
    if (out_results != nullptr) {
      for (size_t i = 0; i < num_blocks; ++i) out_results[i] = static_cast<kvtier_put_result>((*r)[i]);
    }
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_client_stats(const kvtier_client_t* client, kvtier_client_stats_t* out,
                                       kvtier_error_t* error) {
  if (client == nullptr) return Invalid("client: must not be NULL", error);
  if (out == nullptr) return Invalid("out: must not be NULL", error);
  return Report(kvtier::c_api::CopyClientStats(client->client->stats(), out), error);
}

kvtier_status_code kvtier_client_stats_foreach(const kvtier_client_t* client, kvtier_counter_fn fn, void* ctx,
                                               kvtier_error_t* error) {
  if (client == nullptr) return Invalid("client: must not be NULL", error);
  if (fn == nullptr) return Invalid("fn: must not be NULL", error);
  client->client->stats().ForEach([&](const kvtier::CounterInfo& info, uint64_t value) {
    const std::string name(info.name), help(info.help);  // NUL-terminated for C
    fn(ctx, name.c_str(), value, help.c_str());
  });
  return Report(absl::OkStatus(), error);
}

kvtier_status_code kvtier_client_server_stats_foreach(const kvtier_client_t* client, int64_t timeout_ms,
                                                      kvtier_server_counter_fn fn, void* ctx, kvtier_error_t* error) {
  if (client == nullptr) return Invalid("client: must not be NULL", error);
  if (fn == nullptr) return Invalid("fn: must not be NULL", error);
  if (timeout_ms <= 0) return Invalid(absl::StrCat("timeout_ms: must be > 0, not ", timeout_ms), error);
  return Guard(error, [&] {
    for (const kvtier::client::MemberStats& m : client->client->ServerStats(absl::Milliseconds(timeout_ms))) {
      if (!m.status.ok()) {
        const std::string message(m.status.message());
        fn(ctx, m.address.c_str(), m.node_id.c_str(), static_cast<kvtier_status_code>(m.status.code()), message.c_str(),
           0, 0);
        continue;
      }
      for (const kvtier::client::ServerCounter& c : m.counters) {
        fn(ctx, m.address.c_str(), m.node_id.c_str(), KVTIER_OK, c.name.c_str(), c.value,
           c.kind == kvtier::CounterKind::kGauge ? 1 : 0);
      }
    }
    return absl::OkStatus();
  });
}

}  // extern "C"
