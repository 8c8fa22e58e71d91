// The C API's versioned option and stats structs (kvtier/kvtier.h) <-> the C++ client's ClientOptions and
// ClientStats, field by field from kvtier/client/field_lists.h, so that no field can be left out: a
// field of the lists that kvtier_client_options_t or kvtier_client_stats_t lacks fails to compile.
// Private to libkvtier (and its tests); nothing here is exported.
#ifndef KVTIER_BINDINGS_C_CLIENT_OPTIONS_C_H_
#define KVTIER_BINDINGS_C_CLIENT_OPTIONS_C_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/client/client.h"
#include "kvtier/kvtier.h"

namespace kvtier::c_api {

// Bytes of the first release's structs: the smallest struct_size a caller may pass.
inline constexpr size_t kClientOptionsFirstReleaseBytes =
    offsetof(kvtier_client_options_t, virtual_nodes) + sizeof(uint32_t);
inline constexpr size_t kClientStatsFirstReleaseBytes =
    offsetof(kvtier_client_stats_t, checksum_failures) + sizeof(uint64_t);

// Sets options->struct_size and every field to the default of ClientOptions (strings and lists NULL,
// durations in milliseconds). `options` may be NULL (nothing happens).
void InitClientOptions(kvtier_client_options_t* options);

// The ClientOptions that `options` asks for: each field that lies wholly within options.struct_size is
// read (a NULL string keeps the default), every later field keeps its default. Borrowed for the call.
// Does not call ClientOptions::Validate (Client::Connect does).
// Errors: InvalidArgument naming the field ("options.struct_size: ...", "options.members[2]: NULL",
// "options.replication_overrides[0].tenant: NULL").
absl::StatusOr<client::ClientOptions> ClientOptionsFromC(const kvtier_client_options_t& options);

// Copies every counter of `stats` whose field lies wholly within out->struct_size into *out, and zeroes
// the caller's bytes beyond sizeof(kvtier_client_stats_t) up to struct_size.
// Errors: InvalidArgument (out->struct_size below kClientStatsFirstReleaseBytes).
absl::Status CopyClientStats(const client::ClientStats& stats, kvtier_client_stats_t* out);

}  // namespace kvtier::c_api

#endif  // KVTIER_BINDINGS_C_CLIENT_OPTIONS_C_H_
