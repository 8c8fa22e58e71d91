// The C API's option and stats structs against the field lists of kvtier/client/field_lists.h: every
// field of ClientOptions is taken from kvtier_client_options_t (each one set alone to a value unlike its
// default arrives, and moves nothing else), defaults come from ClientOptions itself, and a caller's
// struct_size decides which fields are read. No servers: the conversion only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client_options_c.h"
#include "kvtier/client/field_lists.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using client::ClientOptions;
using client::ClientStats;

// Equality of two values of a field, whatever its kind.
bool Same(const ClientOptions::ReplicationOverride& a, const ClientOptions::ReplicationOverride& b) {
  return a.tenant == b.tenant && a.model == b.model && a.replication_factor == b.replication_factor;
}
bool Same(const std::vector<ClientOptions::ReplicationOverride>& a,
          const std::vector<ClientOptions::ReplicationOverride>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!Same(a[i], b[i])) return false;
  }
  return true;
}
template <typename T>
bool Same(const T& a, const T& b) {
  return a == b;
}

// Names of the fields in which `a` and `b` differ.
std::vector<std::string> Differences(const ClientOptions& a, const ClientOptions& b) {
  std::vector<std::string> out;
#define KVTIER_TEST_DIFF(name, Kind) \
  if (!Same(a.name, b.name)) out.push_back(#name);
  KVTIER_CLIENT_OPTIONS_FIELDS(KVTIER_TEST_DIFF)
#undef KVTIER_TEST_DIFF
  return out;
}

// Storage for the strings and arrays a kvtier_client_options_t borrows.
struct CStrings {
  std::vector<std::string> members = {"node-a=10.0.0.1:7400", "10.0.0.2:7400"};
  std::vector<const char*> member_ptrs;
  std::vector<kvtier_replication_override_t> overrides = {{"acme", "llama", 3}, {"beta", nullptr, 2}};
  CStrings() {
    for (const auto& m : members) member_ptrs.push_back(m.c_str());
  }
};

// KVTIER_TEST_SET_<Kind>(name): sets field `name` of the C struct `c` to a value unlike its default, and
// the same field of `want` (a ClientOptions) to the value it must arrive as. Uses `strings` (CStrings).
#define KVTIER_TEST_SET_StringList(name)     \
  c.name = strings.member_ptrs.data();       \
  c.num_##name = strings.member_ptrs.size(); \
  want.name = strings.members;
#define KVTIER_TEST_SET_String(name) \
  c.name = "value-of-" #name;        \
  want.name = "value-of-" #name;
#define KVTIER_TEST_SET_Duration(name)                       \
  c.name##_ms = absl::ToInt64Milliseconds(want.name) + 1234; \
  want.name += absl::Milliseconds(1234);
#define KVTIER_TEST_SET_Uint32(name) \
  c.name = want.name + 7;            \
  want.name += 7;
#define KVTIER_TEST_SET_Uint64(name) \
  c.name = want.name + 4096;         \
  want.name += 4096;
#define KVTIER_TEST_SET_Int32(name) \
  c.name = want.name + 1;           \
  want.name += 1;
#define KVTIER_TEST_SET_ReplicationOverrides(name) \
  c.name = strings.overrides.data();               \
  c.num_##name = strings.overrides.size();         \
  want.name = {{"acme", "llama", 3}, {"beta", "", 2}};

kvtier_client_options_t InitC() {
  kvtier_client_options_t c;
  std::memset(&c, 0x5A, sizeof(c));  // init must set every byte that matters
  c_api::InitClientOptions(&c);
  return c;
}

TEST(BindingsCOptionsTest, InitGivesTheDefaultsOfClientOptions) {
  const kvtier_client_options_t c = InitC();
  EXPECT_EQ(c.struct_size, sizeof(kvtier_client_options_t));
  auto o = c_api::ClientOptionsFromC(c);
  ASSERT_OK(o);
  EXPECT_EQ(Differences(*o, ClientOptions{}), std::vector<std::string>{});
}

TEST(BindingsCOptionsTest, EveryFieldArrivesAloneAndMovesNothingElse) {
  size_t fields = 0;
#define KVTIER_TEST_ONE_FIELD(name, Kind)                                                      \
  {                                                                                            \
    SCOPED_TRACE(#name);                                                                       \
    CStrings strings;                                                                          \
    kvtier_client_options_t c = InitC();                                                       \
    ClientOptions want;                                                                        \
    KVTIER_TEST_SET_##Kind(name);                                                              \
    auto got = c_api::ClientOptionsFromC(c);                                                   \
    ASSERT_OK(got);                                                                            \
    EXPECT_EQ(Differences(*got, want), std::vector<std::string>{});                            \
    EXPECT_EQ(Differences(*got, ClientOptions{}), std::vector<std::string>{#name}) << "moved"; \
    ++fields;                                                                                  \
  }
  KVTIER_CLIENT_OPTIONS_FIELDS(KVTIER_TEST_ONE_FIELD)
#undef KVTIER_TEST_ONE_FIELD
  EXPECT_EQ(fields, client::kClientOptionsFieldCount);
}

// Every field set at once, then cut at struct_size = `size`: the fields wholly inside arrive, the others
// keep their defaults.
void ExpectOnlyCoveredFields(uint32_t size) {
  SCOPED_TRACE(absl::StrCat("struct_size ", size));
  CStrings strings;
  kvtier_client_options_t c = InitC();
  ClientOptions all;
  std::vector<std::string> covered;
#define KVTIER_TEST_OFFSET_StringList(name) offsetof(kvtier_client_options_t, num_##name) + sizeof(size_t)
#define KVTIER_TEST_OFFSET_ReplicationOverrides(name) offsetof(kvtier_client_options_t, num_##name) + sizeof(size_t)
#define KVTIER_TEST_OFFSET_String(name) offsetof(kvtier_client_options_t, name) + sizeof(const char*)
#define KVTIER_TEST_OFFSET_Duration(name) offsetof(kvtier_client_options_t, name##_ms) + sizeof(uint32_t)
#define KVTIER_TEST_OFFSET_Uint32(name) offsetof(kvtier_client_options_t, name) + sizeof(uint32_t)
#define KVTIER_TEST_OFFSET_Uint64(name) offsetof(kvtier_client_options_t, name) + sizeof(uint64_t)
#define KVTIER_TEST_OFFSET_Int32(name) offsetof(kvtier_client_options_t, name) + sizeof(int32_t)
#define KVTIER_TEST_SET_ALL(name, Kind)                                    \
  {                                                                        \
    ClientOptions& want = all;                                             \
    KVTIER_TEST_SET_##Kind(name);                                          \
    if (KVTIER_TEST_OFFSET_##Kind(name) <= size) covered.push_back(#name); \
  }
  KVTIER_CLIENT_OPTIONS_FIELDS(KVTIER_TEST_SET_ALL)
#undef KVTIER_TEST_SET_ALL
  c.struct_size = size;
  auto got = c_api::ClientOptionsFromC(c);
  ASSERT_OK(got);
  // Fields inside: as set (so they differ from the defaults); outside: the defaults (so equal to them).
  EXPECT_EQ(Differences(*got, ClientOptions{}), covered);
  std::vector<std::string> outside;
  for (const std::string& d : Differences(all, ClientOptions{})) {
    if (std::find(covered.begin(), covered.end(), d) == covered.end()) outside.push_back(d);
  }
  EXPECT_EQ(Differences(*got, all), outside);
}

TEST(BindingsCOptionsTest, OnlyFieldsWithinStructSizeAreRead) {
  // A program built against the first release: everything up to virtual_nodes.
  ExpectOnlyCoveredFields(c_api::kClientOptionsFirstReleaseBytes);
  // Every 4-byte boundary in between, so that each field is once just outside and then inside.
  for (uint32_t size = c_api::kClientOptionsFirstReleaseBytes; size <= sizeof(kvtier_client_options_t); size += 4) {
    ExpectOnlyCoveredFields(size);
  }
}

TEST(BindingsCOptionsTest, StructSizeOutsideTheKnownRangeIsRefusedByName) {
  kvtier_client_options_t c = InitC();
  c.struct_size = c_api::kClientOptionsFirstReleaseBytes - 1;
  EXPECT_EQ(c_api::ClientOptionsFromC(c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(c_api::ClientOptionsFromC(c).status().message(), "options.struct_size"));
  c.struct_size = sizeof(kvtier_client_options_t) + 8;
  EXPECT_TRUE(absl::StrContains(c_api::ClientOptionsFromC(c).status().message(), "newer kvtier.h"));
}

TEST(BindingsCOptionsTest, NullEntriesAreRefusedNamingTheEntry) {
  kvtier_client_options_t c = InitC();
  const char* members[] = {"10.0.0.1:7400", nullptr};
  c.members = members;
  c.num_members = 2;
  EXPECT_EQ(c_api::ClientOptionsFromC(c).status().message(), "options.members[1]: NULL");
  c.num_members = 1;
  kvtier_replication_override_t overrides[] = {{nullptr, "m", 2}};
  c.replication_overrides = overrides;
  c.num_replication_overrides = 1;
  EXPECT_EQ(c_api::ClientOptionsFromC(c).status().message(), "options.replication_overrides[0].tenant: NULL");
  c.replication_overrides = nullptr;
  EXPECT_EQ(c_api::ClientOptionsFromC(c).status().message(),
            "options.replication_overrides: NULL with num_replication_overrides > 0");
}

TEST(BindingsCOptionsTest, StatsCopyEveryCounterThatTheCallersStructHolds) {
  ClientStats s;
  uint64_t v = 1;
#define KVTIER_TEST_SET_COUNTER(name, help) s.name = v++;
  KVTIER_CLIENT_STATS_COUNTERS(KVTIER_TEST_SET_COUNTER)
#undef KVTIER_TEST_SET_COUNTER
  kvtier_client_stats_t out;
  std::memset(&out, 0, sizeof(out));
  out.struct_size = sizeof(out);
  ASSERT_OK(c_api::CopyClientStats(s, &out));
  size_t counters = 0;
#define KVTIER_TEST_CHECK_COUNTER(name, help)  \
  EXPECT_EQ(out.name, s.name.load()) << #name; \
  ++counters;
  KVTIER_CLIENT_STATS_COUNTERS(KVTIER_TEST_CHECK_COUNTER)
#undef KVTIER_TEST_CHECK_COUNTER
  EXPECT_EQ(counters, client::kClientStatsCounterCount);

  // A first-release caller's struct: the later counters are not written.
  std::memset(&out, 0xEE, sizeof(out));
  out.struct_size = c_api::kClientStatsFirstReleaseBytes;
  ASSERT_OK(c_api::CopyClientStats(s, &out));
  EXPECT_EQ(out.checksum_failures, s.checksum_failures.load());
  EXPECT_EQ(out.ucx_get_blocks, 0xEEEEEEEEEEEEEEEEULL);
  EXPECT_EQ(out.replica_read_blocks, 0xEEEEEEEEEEEEEEEEULL);
  out.struct_size = c_api::kClientStatsFirstReleaseBytes - 8;
  EXPECT_EQ(c_api::CopyClientStats(s, &out).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
