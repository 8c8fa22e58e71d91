#include "kvtier/server/server_options.h"

#include <string>

#include <gtest/gtest.h>

#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

TEST(ServerConfigTest, ParsesEverySectionWithUnits) {
  auto o = ParseServerConfig(R"(
server:
  node_id: node-a
  listen_address: 0.0.0.0:7400
  metrics_address: 127.0.0.1:0
host_tier:
  capacity_bytes: 2GiB
  slab_bytes: 32MiB
limits:
  max_block_bytes: 16MiB
  max_blocks_per_request: 1024
eviction:
  policy: lru
leases:
  default_ttl: 5s
  max_ttl: 1m
  reservation_ttl: 1500ms
)");
  ASSERT_OK(o);
  EXPECT_EQ(o->node_id, "node-a");
  EXPECT_EQ(o->listen_address, "0.0.0.0:7400");
  EXPECT_EQ(o->host_cache_bytes, 2ULL << 30);
  EXPECT_EQ(o->slab_bytes, 32ULL << 20);
  EXPECT_EQ(o->max_block_bytes, 16ULL << 20);
  EXPECT_EQ(o->max_blocks_per_request, 1024u);
  EXPECT_EQ(o->default_lease_ttl, absl::Seconds(5));
  EXPECT_EQ(o->max_lease_ttl, absl::Minutes(1));
  EXPECT_EQ(o->reservation_ttl, absl::Milliseconds(1500));
  EXPECT_OK(o->Validate());
}

TEST(ServerConfigTest, DiskAdmissionIsAWholeNumberOffByDefault) {
  auto off = ParseServerConfig("server:\n  node_id: a\ndisk_tier:\n  path: /tmp/x\n  capacity_bytes: 1GiB\n");
  ASSERT_OK(off);
  EXPECT_EQ(off->disk_admit_min_requests, 0u);
  auto two = ParseServerConfig("server:\n  node_id: a\ndisk_tier:\n  path: /tmp/x\n  admit_min_requests: 2\n");
  ASSERT_OK(two);
  EXPECT_EQ(two->disk_admit_min_requests, 2u);
  EXPECT_FALSE(ParseServerConfig("disk_tier:\n  admit_min_requests: 2KiB\n").ok());
  EXPECT_FALSE(ParseServerConfig("disk_tier:\n  admit_min_requests: -1\n").ok());
}

TEST(ServerConfigTest, EmptyConfigGivesDefaultsThatNeedANodeId) {
  auto o = ParseServerConfig("");
  ASSERT_OK(o);
  absl::Status s = o->Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("server.node_id"), std::string::npos) << s;
  o->node_id = "n";
  EXPECT_OK(o->Validate());
}

void ExpectErrorNames(const std::string& yaml, const std::string& key) {
  auto o = ParseServerConfig(yaml);
  absl::Status s = o.ok() ? o->Validate() : o.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << yaml;
  EXPECT_NE(s.message().find(key), std::string::npos) << "error \"" << s.message() << "\" should name " << key;
}

TEST(ServerConfigTest, ErrorsNameTheKey) {
  ExpectErrorNames("server: {node_id: a}\nhost_tier: {capacity_bytes: lots}\n", "host_tier.capacity_bytes");
  ExpectErrorNames("server: {node_id: a}\nhost_tier: {capacity_bytes: 0}\n", "host_tier.capacity_bytes");
  ExpectErrorNames("server: {node_id: a}\nleases: {default_ttl: soon}\n", "leases.default_ttl");
  ExpectErrorNames("server: {node_id: a, listen_adress: x}\n", "server.listen_adress");
  ExpectErrorNames("servr: {node_id: a}\n", "servr");
  ExpectErrorNames("server: {node_id: a, listen_address: nope}\n", "server.listen_address");
  ExpectErrorNames("server: {node_id: a}\nlimits: {max_block_bytes: 128MiB}\n", "limits.max_block_bytes");
  ExpectErrorNames("server: {node_id: a}\neviction: {policy: random}\n", "eviction.policy");
  ExpectErrorNames("server: {node_id: a}\nleases: {default_ttl: 10s, max_ttl: 1s}\n", "leases.max_ttl");
  ExpectErrorNames("server: [1, 2]\n", "server");
}

TEST(ServerConfigTest, SizesThatCannotWorkAreRefused) {
  // 2^64 - 1 bytes: more than a process can map (it used to wrap to a 2 MiB region of no slabs).
  ExpectErrorNames("server: {node_id: a}\nhost_tier: {capacity_bytes: 18446744073709551615}\n",
                   "host_tier.capacity_bytes");
  ExpectErrorNames("server: {node_id: a}\nhost_tier: {capacity_bytes: 129TiB}\n", "host_tier.capacity_bytes");
  // 1-byte slabs of 1 GiB: a billion slab records.
  ExpectErrorNames("server: {node_id: a}\nhost_tier: {slab_bytes: 1}\nlimits: {max_block_bytes: 1}\n",
                   "host_tier.slab_bytes");
  auto o = ParseServerConfig(
      "server: {node_id: a}\nhost_tier: {capacity_bytes: 1TiB, slab_bytes: 1MiB}\n"
      "limits: {max_block_bytes: 1MiB}\n");
  ASSERT_OK(o);
  EXPECT_OK(o->Validate());  // 2^20 slabs: the most allowed
}

TEST(ServerConfigTest, ABlockSizeWhoseSlotCannotFitASlabIsRefusedWithTheFix) {
  // Slots round up to 64 bytes: a 1000001-byte block needs 1000064, more than a 1000001-byte slab holds.
  auto o =
      ParseServerConfig("server: {node_id: a}\nhost_tier: {slab_bytes: 1000001}\nlimits: {max_block_bytes: 1000001}\n");
  ASSERT_OK(o);
  const absl::Status s = o->Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  for (const char* part : {"limits.max_block_bytes", "1000064", "at most 1000000", "at least 1000064"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message() << " should say " << part;
  }
  // The largest block that does fit, and a slab rounded to the alignment, are accepted.
  for (const char* yaml :
       {"server: {node_id: a}\nhost_tier: {slab_bytes: 1000001}\nlimits: {max_block_bytes: 1000000}\n",
        "server: {node_id: a}\nhost_tier: {slab_bytes: 1000064}\nlimits: {max_block_bytes: 1000001}\n"}) {
    auto ok = ParseServerConfig(yaml);
    ASSERT_OK(ok);
    EXPECT_OK(ok->Validate()) << yaml;
  }
  ExpectErrorNames("server: {node_id: a}\nhost_tier: {capacity_bytes: 32}\n", "host_tier.capacity_bytes");
}

TEST(ServerConfigTest, PinnedShareOutsideZeroToOneIsRefused) {
  for (const char* v : {"0", "-0.5", "1.5", "nan"}) {
    ExpectErrorNames(std::string("server: {node_id: a}\nleases: {tenant_pinned_share: ") + v + "}\n",
                     "leases.tenant_pinned_share");
  }
  auto o = ParseServerConfig("server: {node_id: a}\nleases: {tenant_pinned_share: 0.25}\n");
  ASSERT_OK(o);
  EXPECT_OK(o->Validate());
  EXPECT_DOUBLE_EQ(o->tenant_pinned_share, 0.25);
}

TEST(ServerConfigTest, InfiniteLeasesAreRefused) {
  ExpectErrorNames("server: {node_id: a}\nleases: {default_ttl: inf, max_ttl: inf}\n", "leases.default_ttl");
  ExpectErrorNames("server: {node_id: a}\nleases: {max_ttl: inf}\n", "leases.max_ttl");
  ExpectErrorNames("server: {node_id: a}\nleases: {reservation_ttl: inf}\n", "leases.reservation_ttl");
}

TEST(ServerConfigTest, CountsAreWholeNumbersNotSizes) {
  ExpectErrorNames("server: {node_id: a}\nhbm_tier: {device: 1KiB}\n", "hbm_tier.device");
  ExpectErrorNames("server: {node_id: a}\nlimits: {max_blocks_per_request: 64Ki}\n", "limits.max_blocks_per_request");
  ExpectErrorNames("server: {node_id: a}\nlimits: {max_blocks_per_request: -1}\n", "limits.max_blocks_per_request");
  auto o = ParseServerConfig("server: {node_id: a}\nhbm_tier: {device: 3}\n");
  ASSERT_OK(o);
  EXPECT_EQ(o->hbm_device, 3u);
}

TEST(ServerConfigTest, ASectionOrKeyGivenTwiceIsRefused) {
  ExpectErrorNames("server: {node_id: a}\nserver: {node_id: b}\n", "server");
  ExpectErrorNames("server:\n  node_id: a\n  node_id: b\n", "server.node_id");
}

TEST(ServerConfigTest, UcxTransportsMustIncludeTheTcpListener) {
  ExpectErrorNames("server: {node_id: a}\nucx: {listen_address: \"127.0.0.1:0\", transports: shm}\n", "ucx.transports");
  auto o = ParseServerConfig("server: {node_id: a}\nucx: {listen_address: \"127.0.0.1:0\", transports: \"tcp,shm\"}\n");
  ASSERT_OK(o);
  EXPECT_OK(o->Validate());
}

TEST(ServerConfigTest, UcxPendingConnectionLimitsAreBounded) {
  ExpectErrorNames("server: {node_id: a}\nucx: {pending_connection_timeout: 10ms}\n", "ucx.pending_connection_timeout");
  ExpectErrorNames("server: {node_id: a}\nucx: {max_pending_connections_per_host: 0}\n",
                   "ucx.max_pending_connections_per_host");
  auto o = ParseServerConfig(
      "server: {node_id: a}\nucx: {pending_connection_timeout: 3s, max_pending_connections_per_host: 8}\n");
  ASSERT_OK(o);
  EXPECT_OK(o->Validate());
  EXPECT_EQ(o->ucx_pending_connection_timeout, absl::Seconds(3));
  EXPECT_EQ(o->ucx_max_pending_connections_per_host, 8u);
}

TEST(ServerConfigTest, MetricsAddressIsIpv4OrAHostName) {
  ExpectErrorNames("server: {node_id: a, metrics_address: \"[::1]:0\"}\n", "server.metrics_address");
}

TEST(ServerConfigTest, NonScalarKeysAreInvalidArgumentNotACrash) {
  // Found by config_fuzzer: YAML allows complex keys, which yaml-cpp refuses to convert to strings.
  EXPECT_EQ(ParseServerConfig("?\n-").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseServerConfig("? [a, b]\n: 1\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseServerConfig("server:\n  ? {x: 1}\n  : 2\n").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ServerConfigTest, MalformedYamlIsInvalidArgument) {
  auto o = ParseServerConfig("server: {node_id: [unclosed\n");
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ServerConfigTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadServerConfig("/nonexistent/kvtier.yaml").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvtier::server
