// kvtier-server as a real process: health, /metrics, SIGTERM, kill -9, bad config.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::ServerProcess;

Namespace TestNamespace() {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "llama-test";
  ns.layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64, .block_tokens = 16};
  return ns;
}

// GET http://127.0.0.1:port/metrics with a plain socket; returns the body.
std::string ScrapeMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

std::vector<std::byte> Bytes(uint64_t size, uint8_t seed) {
  std::vector<std::byte> b(size);
  for (size_t i = 0; i < size; ++i) b[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return b;
}

TEST(ServerProcessTest, ServesHealthMetricsAndBlocksThenStopsCleanlyOnSigterm) {
  auto proc = ServerProcess::Start("proc-a");
  ASSERT_OK(proc);
  // grpc.health.v1 answers SERVING.
  auto channel = grpc::CreateChannel((*proc)->address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hresp;
  grpc::ClientContext hctx;
  ASSERT_TRUE(health->Check(&hctx, hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  auto client = client::Client::Connect({.members = {(*proc)->address()}});
  ASSERT_OK(client);
  ASSERT_EQ((*client)->members().at(0).node_id, "proc-a");  // the id the member reports
  const Namespace ns = TestNamespace();
  std::vector<uint32_t> tokens(48);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i * 7;
  auto fps = ChainFingerprints(ns, tokens);
  ASSERT_OK(fps);
  const uint64_t size = ns.layout.ShardBytes();
  std::vector<std::vector<std::byte>> data = {Bytes(size, 1), Bytes(size, 2), Bytes(size, 3)};
  std::vector<std::span<const std::byte>> in(data.begin(), data.end());
  auto put = (*client)->Put(ns, *fps, 0, in);
  ASSERT_OK(put);
  auto look = (*client)->LookupPrefix(ns, *fps);
  ASSERT_OK(look);
  EXPECT_EQ(look->prefix_blocks, 3u);

  const std::string metrics = ScrapeMetrics((*proc)->metrics_port());
  EXPECT_NE(metrics.find("kvtier_lookup_blocks_total{result=\"hit\"} 3"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("kvtier_committed_blocks_total 3"), std::string::npos);
  EXPECT_NE(metrics.find("kvtier_capacity_bytes{tier=\"host\"} 67108864"), std::string::npos);
  EXPECT_NE(metrics.find("kvtier_rpc_duration_seconds_bucket"), std::string::npos);

  const int status = (*proc)->KillAndWait(SIGTERM);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ServerProcessTest, KilledServerBecomesCountedMissesWithinTheDeadline) {
  auto proc = ServerProcess::Start("proc-b");
  ASSERT_OK(proc);
  auto client = client::Client::Connect({.members = {(*proc)->address()}, .rpc_timeout = absl::Milliseconds(800)});
  ASSERT_OK(client);
  const Namespace ns = TestNamespace();
  std::vector<uint32_t> tokens(64, 5);
  auto fps = ChainFingerprints(ns, tokens);
  ASSERT_OK(fps);
  const uint64_t size = ns.layout.ShardBytes();
  std::vector<std::vector<std::byte>> data(4, Bytes(size, 9));
  std::vector<std::span<const std::byte>> in(data.begin(), data.end());
  ASSERT_OK((*client)->Put(ns, *fps, 0, in));

  (*proc)->KillAndWait(SIGKILL);
  const absl::Time start = absl::Now();
  auto look = (*client)->LookupPrefix(ns, *fps);
  ASSERT_OK(look);
  EXPECT_EQ(look->prefix_blocks, 0u);
  EXPECT_EQ(look->blocks_from_errors, 4u);
  std::vector<std::vector<std::byte>> out(4, std::vector<std::byte>(size));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto get = (*client)->Get(ns, *fps, 0, views);
  ASSERT_OK(get);
  for (auto r : *get) EXPECT_EQ(r, client::GetResult::kMissFromError);
  auto put = (*client)->Put(ns, *fps, 0, in);
  ASSERT_OK(put);
  for (auto r : *put) EXPECT_EQ(r, client::PutResult::kError);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(3 * 800 + 500));
  EXPECT_EQ((*client)->stats().misses_from_errors.load(), 8u);
}

TEST(ServerProcessTest, DiskTierComesBackAfterKillDashNineUnderTheSameNodeId) {
  char dir_template[] = "/tmp/kvtier-disk-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string disk = std::string(dir_template) + "/db";
  const Namespace ns = TestNamespace();
  const uint64_t size = ns.layout.ShardBytes();
  // Host memory holds 4 blocks, so most of the 40 end up demoted to disk.
  // Spills skip the WAL: the probe flushes what waited disk_tier.flush_interval (here 200 ms).
  const std::string config = std::string(dir_template) + "/kvtier.yaml";
  {
    std::ofstream out(config);
    out << "disk_tier:\n  flush_interval: 200ms\n  probe_interval: 100ms\n";
  }
  const std::vector<std::string> args = {"--config=" + config, "--disk_path=" + disk, "--disk_capacity_bytes=64MiB",
                                         "--host_cache_bytes=" + std::to_string(4 * size)};
  std::vector<uint32_t> tokens(40 * 16);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i * 3 + 1;
  auto fps = ChainFingerprints(ns, tokens);
  ASSERT_OK(fps);
  std::vector<std::vector<std::byte>> data;
  for (uint8_t i = 0; i < 40; ++i) data.push_back(Bytes(size, i));
  {
    auto proc = ServerProcess::Start("disk-node", args);
    ASSERT_OK(proc);
    // Batches of 4 blocks, each committed before the next: the put streams through the small host tier.
    auto client = client::Client::Connect({.members = {(*proc)->address()}, .put_batch_blocks = 4});
    ASSERT_OK(client);
    std::vector<std::span<const std::byte>> in(data.begin(), data.end());
    auto put = (*client)->Put(ns, *fps, 0, in);
    ASSERT_OK(put);
    for (auto r : *put) ASSERT_EQ(r, client::PutResult::kStored);
    absl::SleepFor(absl::Seconds(1));  // past flush_interval and a probe: the spills are on disk
    (*proc)->KillAndWait(SIGKILL);
  }
  auto proc = ServerProcess::Start("disk-node", args);
  ASSERT_OK(proc);
  auto client = client::Client::Connect({.members = {(*proc)->address()}});
  ASSERT_OK(client);
  auto look = (*client)->LookupPrefix(ns, *fps);
  ASSERT_OK(look);
  // The 36 demoted blocks, flushed before the kill, survive; the 4 that were only in host memory are gone.
  uint32_t present = 0;
  for (bool p : look->present) present += p;
  EXPECT_EQ(present, 36u);
  std::vector<std::vector<std::byte>> out(40, std::vector<std::byte>(size));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto got = (*client)->Get(ns, *fps, 0, views);
  ASSERT_OK(got);
  uint32_t hits = 0;
  for (size_t i = 0; i < 40; ++i) {
    if ((*got)[i] != client::GetResult::kHit) continue;
    ++hits;
    EXPECT_EQ(out[i], data[i]) << i;
  }
  EXPECT_EQ(hits, 36u);
  EXPECT_EQ((*client)->stats().checksum_failures.load(), 0u);
  (*proc)->KillAndWait(SIGTERM);
  std::filesystem::remove_all(dir_template);
}

int RunServer(const std::string& args, std::string& out) { return testing::RunServerToExit(args, out); }

// A temporary config file holding `yaml`; the caller unlinks it. Empty when it could not be written.
std::string WriteConfig(const std::string& yaml) {
  char path[] = "/tmp/kvtier-config-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return "";
  const bool written = write(fd, yaml.data(), yaml.size()) == static_cast<ssize_t>(yaml.size());
  close(fd);
  if (!written) unlink(path);
  return written ? path : "";
}

TEST(ServerProcessTest, BadConfigExitsWithAnErrorNamingTheKey) {
  const std::string path = WriteConfig("server:\n  node_id: x\nhost_tier:\n  capacity_bytes: many\n");
  ASSERT_FALSE(path.empty());
  std::string out;
  const int status = RunServer("--config=" + path, out);
  unlink(path.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(out.find("host_tier.capacity_bytes"), std::string::npos) << out;
}

TEST(ServerProcessTest, ASecondServerOnAPortInUseRefusesToStart) {
  auto first = ServerProcess::Start("first");
  ASSERT_OK(first);
  // gRPC's default SO_REUSEPORT would let the second one listen too and take half of the connections.
  std::string out;
  const int status = RunServer("--node_id=second --metrics_address=none --listen_address=" + (*first)->address(), out);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_NE(out.find("cannot listen on " + (*first)->address()), std::string::npos) << out;
  // Every connection still reaches the first.
  for (int i = 0; i < 4; ++i) {
    auto client = client::Client::Connect({.members = {(*first)->address()}});
    ASSERT_OK(client);
    EXPECT_EQ((*client)->members().at(0).node_id, "first");
  }
}

TEST(ServerProcessTest, AnUnreadableFileTheConfigNamesIsAUsageError) {
  std::string out;
  const int status = RunServer(
      "--node_id=x --metrics_address=none --listen_address=127.0.0.1:0 "
      "--config=/nonexistent/kvtier-server.yaml",
      out);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  const std::string path = WriteConfig("tls:\n  cert_file: /nonexistent/cert.pem\n  key_file: /nonexistent/key.pem\n");
  ASSERT_FALSE(path.empty());
  out.clear();
  const int tls_status =
      RunServer("--node_id=x --metrics_address=none --listen_address=127.0.0.1:0 --config=" + path, out);
  unlink(path.c_str());
  ASSERT_TRUE(WIFEXITED(tls_status)) << out;
  EXPECT_EQ(WEXITSTATUS(tls_status), 2) << out;
  EXPECT_NE(out.find("tls.cert_file"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvtier
