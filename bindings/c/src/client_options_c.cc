#include "client_options_c.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvtier/client/field_lists.h"
#include "kvtier/common/status_macros.h"

namespace kvtier::c_api {
namespace {

using client::ClientOptions;

// Whether `field` of the caller's struct lies wholly within its struct_size.
#define KVTIER_C_COVERS(c, field) \
  (offsetof(std::remove_cvref_t<decltype(c)>, field) + sizeof((c).field) <= (c).struct_size)

// The C spelling of each field kind (field_lists.h): its type, its default from `d` (a ClientOptions),
// and its reading into `o`. A field of the list that the C struct lacks, or has with another type, fails
// to compile here.
uint32_t ToMilliseconds(absl::Duration d) {
  return static_cast<uint32_t>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, UINT32_MAX));
}

#define KVTIER_C_CHECK_StringList(name) \
  static_assert(std::is_same_v<decltype(kvtier_client_options_t::name), const char* const*>)
#define KVTIER_C_CHECK_String(name) static_assert(std::is_same_v<decltype(kvtier_client_options_t::name), const char*>)
#define KVTIER_C_CHECK_Duration(name) \
  static_assert(std::is_same_v<decltype(kvtier_client_options_t::name##_ms), uint32_t>)
#define KVTIER_C_CHECK_Uint32(name) static_assert(std::is_same_v<decltype(kvtier_client_options_t::name), uint32_t>)
#define KVTIER_C_CHECK_Uint64(name) static_assert(std::is_same_v<decltype(kvtier_client_options_t::name), uint64_t>)
#define KVTIER_C_CHECK_Int32(name) static_assert(std::is_same_v<decltype(kvtier_client_options_t::name), int32_t>)
#define KVTIER_C_CHECK_ReplicationOverrides(name)                                                               \
  static_assert(std::is_same_v<decltype(kvtier_client_options_t::name), const kvtier_replication_override_t*>); \
  static_assert(std::is_same_v<decltype(kvtier_client_options_t::num_##name), size_t>)
#define KVTIER_C_CHECK(name, Kind) KVTIER_C_CHECK_##Kind(name);
KVTIER_CLIENT_OPTIONS_FIELDS(KVTIER_C_CHECK)
#undef KVTIER_C_CHECK

#define KVTIER_C_INIT_StringList(name) \
  c->name = nullptr;                   \
  c->num_##name = 0
#define KVTIER_C_INIT_String(name) c->name = nullptr
#define KVTIER_C_INIT_Duration(name) c->name##_ms = ToMilliseconds(d.name)
#define KVTIER_C_INIT_Uint32(name) c->name = d.name
#define KVTIER_C_INIT_Uint64(name) c->name = d.name
#define KVTIER_C_INIT_Int32(name) c->name = d.name
#define KVTIER_C_INIT_ReplicationOverrides(name) \
  c->name = nullptr;                             \
  c->num_##name = 0

absl::Status ReadStrings(const char* const* items, size_t n, const char* name, std::vector<std::string>& out) {
  if (n == 0) return absl::OkStatus();
  if (items == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("options.", name, ": NULL with num_", name, " > 0"));
  out.clear();
  for (size_t i = 0; i < n; ++i) {
    if (items[i] == nullptr) return absl::InvalidArgumentError(absl::StrCat("options.", name, "[", i, "]: NULL"));
    out.emplace_back(items[i]);
  }
  return absl::OkStatus();
}

absl::Status ReadOverrides(const kvtier_replication_override_t* items, size_t n, const char* name,
                           std::vector<ClientOptions::ReplicationOverride>& out) {
  if (n == 0) return absl::OkStatus();
  if (items == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("options.", name, ": NULL with num_", name, " > 0"));
  out.clear();
  for (size_t i = 0; i < n; ++i) {
    if (items[i].tenant == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("options.", name, "[", i, "].tenant: NULL"));
    }
    out.push_back({.tenant = items[i].tenant,
                   .model = items[i].model == nullptr ? "" : items[i].model,
                   .replication_factor = items[i].replication_factor});
  }
  return absl::OkStatus();
}

#define KVTIER_C_READ_StringList(name) \
  if (KVTIER_C_COVERS(c, num_##name)) KVTIER_RETURN_IF_ERROR(ReadStrings(c.name, c.num_##name, #name, o.name))
#define KVTIER_C_READ_String(name) \
  if (KVTIER_C_COVERS(c, name) && c.name != nullptr) o.name = c.name
#define KVTIER_C_READ_Duration(name) \
  if (KVTIER_C_COVERS(c, name##_ms)) o.name = absl::Milliseconds(c.name##_ms)
#define KVTIER_C_READ_Uint32(name) \
  if (KVTIER_C_COVERS(c, name)) o.name = c.name
#define KVTIER_C_READ_Uint64(name) \
  if (KVTIER_C_COVERS(c, name)) o.name = c.name
#define KVTIER_C_READ_Int32(name) \
  if (KVTIER_C_COVERS(c, name)) o.name = c.name
#define KVTIER_C_READ_ReplicationOverrides(name) \
  if (KVTIER_C_COVERS(c, num_##name)) KVTIER_RETURN_IF_ERROR(ReadOverrides(c.name, c.num_##name, #name, o.name))

// Every counter of the list is a uint64_t field of the C stats struct.
#define KVTIER_C_CHECK_COUNTER(name, help) \
  static_assert(std::is_same_v<decltype(kvtier_client_stats_t::name), uint64_t>);
KVTIER_CLIENT_STATS_COUNTERS(KVTIER_C_CHECK_COUNTER)
#undef KVTIER_C_CHECK_COUNTER

}  // namespace

void InitClientOptions(kvtier_client_options_t* c) {
  if (c == nullptr) return;
  const ClientOptions d;
  *c = {};
  c->struct_size = sizeof(kvtier_client_options_t);
#define KVTIER_C_INIT(name, Kind) KVTIER_C_INIT_##Kind(name);
  KVTIER_CLIENT_OPTIONS_FIELDS(KVTIER_C_INIT)
#undef KVTIER_C_INIT
}

absl::StatusOr<ClientOptions> ClientOptionsFromC(const kvtier_client_options_t& c) {
  if (c.struct_size < kClientOptionsFirstReleaseBytes) {
    return absl::InvalidArgumentError(absl::StrCat("options.struct_size: is ", c.struct_size, ", want at least ",
                                                   kClientOptionsFirstReleaseBytes,
                                                   " (call kvtier_client_options_init first)"));
  }
  if (c.struct_size > sizeof(kvtier_client_options_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.struct_size: is ", c.struct_size, ", larger than this libkvtier's ", sizeof(kvtier_client_options_t),
        "-byte kvtier_client_options_t: the program was built against a newer kvtier.h"));
  }
  ClientOptions o;
#define KVTIER_C_READ(name, Kind) KVTIER_C_READ_##Kind(name);
  KVTIER_CLIENT_OPTIONS_FIELDS(KVTIER_C_READ)
#undef KVTIER_C_READ
  return o;
}

absl::Status CopyClientStats(const client::ClientStats& s, kvtier_client_stats_t* out) {
  if (out->struct_size < kClientStatsFirstReleaseBytes) {
    return absl::InvalidArgumentError(absl::StrCat("out.struct_size: is ", out->struct_size, ", want at least ",
                                                   kClientStatsFirstReleaseBytes, " (sizeof(kvtier_client_stats_t))"));
  }
#define KVTIER_C_COPY_COUNTER(name, help) \
  if (KVTIER_C_COVERS(*out, name)) out->name = s.name.load(std::memory_order_relaxed);
  KVTIER_CLIENT_STATS_COUNTERS(KVTIER_C_COPY_COUNTER)
#undef KVTIER_C_COPY_COUNTER
  if (out->struct_size > sizeof(kvtier_client_stats_t)) {
    std::memset(reinterpret_cast<char*>(out) + sizeof(kvtier_client_stats_t), 0,
                out->struct_size - sizeof(kvtier_client_stats_t));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::c_api
