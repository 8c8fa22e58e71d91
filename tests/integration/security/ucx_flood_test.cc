// The UCX port under a flood of raw TCP connections that never speak UCX: peers that send garbage and
// close, and peers that connect and stay silent. UCX's own connection manager holds such connections
// forever (transport/ucx/include/kvtier/ucx/ucx_pending_connections.h); the server must reset them and stay
// reachable for honest clients over UCX.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/ucx/ucx_pending_connections.h"
#include "testing/scrape_metrics.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::MetricValue;
using testing::ScrapeMetrics;
using testing::ServerProcess;
using ucx::PendingConnectionReaper;

constexpr char kToken[] = "ucx-flood-token";

int ConnectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True once the peer of `fd` has reset or closed the connection (within `wait`).
bool PeerDropped(int fd, absl::Duration wait) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) <= 0) return false;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

// Sockets of the local machine bound to `port` in TCP state `state` (hex, as /proc/net/tcp writes it:
// "08" CLOSE-WAIT, "01" ESTABLISHED).
int SocketsInState(int port, const std::string& state) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  int n = 0;
  char local_port[8];
  std::snprintf(local_port, sizeof(local_port), "%04X", port);
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, st;
    fields >> slot >> local >> remote >> st;
    if (local.size() > 5 && local.substr(local.size() - 4) == local_port && st == state) ++n;
  }
  return n;
}

// The reaper on this process's own sockets: a listener, connections accepted from it, one admitted.
TEST(PendingConnectionReaperTest, ResetsUnadmittedConnectionsByAgeAndPerHostLimit) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 64), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  constexpr int kConnections = 6;
  std::vector<int> clients, accepted;
  for (int i = 0; i < kConnections; ++i) {
    clients.push_back(ConnectTo(port));
    ASSERT_GE(clients.back(), 0);
    accepted.push_back(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_GE(accepted.back(), 0);
  }
  // Client 0's connection is admitted (UCX delivered its connection request).
  sockaddr_storage peer{};
  len = sizeof(peer);
  ASSERT_EQ(getpeername(accepted[0], reinterpret_cast<sockaddr*>(&peer), &len), 0);

  PendingConnectionReaper reaper({.timeout = absl::Seconds(10), .max_per_host = 3});
  reaper.set_listen_port(port);
  reaper.Admit(PendingConnectionReaper::PeerKey(reinterpret_cast<const sockaddr*>(&peer)));
  const absl::Time t0 = absl::Now();
  // 5 pending from 127.0.0.1, 3 allowed: the 2 oldest (clients 1 and 2) are reset at once.
  PendingConnectionReaper::SweepResult r = reaper.Sweep(t0);
  EXPECT_EQ(r.pending, 5u);
  EXPECT_EQ(r.over_limit, 2u);
  EXPECT_EQ(r.timed_out, 0u);
  EXPECT_TRUE(PeerDropped(clients[1], absl::Seconds(2)));
  EXPECT_TRUE(PeerDropped(clients[2], absl::Seconds(2)));
  EXPECT_FALSE(PeerDropped(clients[3], absl::Milliseconds(50)));
  // Before the timeout nothing else goes; after it, every pending one, never the admitted one.
  r = reaper.Sweep(t0 + absl::Seconds(9));
  EXPECT_EQ(r.pending, 3u);
  EXPECT_EQ(r.timed_out + r.over_limit, 0u);
  r = reaper.Sweep(t0 + absl::Seconds(10));
  EXPECT_EQ(r.timed_out, 3u);
  for (int i = 3; i < kConnections; ++i) EXPECT_TRUE(PeerDropped(clients[i], absl::Seconds(2))) << i;
  EXPECT_FALSE(PeerDropped(clients[0], absl::Milliseconds(50)));
  // Reset sockets have no peer any more: the next sweep sees none pending.
  EXPECT_EQ(reaper.Sweep(t0 + absl::Seconds(11)).pending, 0u);
  // Released (its endpoint closed): it is pending again from now on.
  reaper.Release(PendingConnectionReaper::PeerKey(reinterpret_cast<const sockaddr*>(&peer)));
  EXPECT_EQ(reaper.Sweep(t0 + absl::Seconds(12)).pending, 1u);
  for (int fd : clients) close(fd);
  for (int fd : accepted) close(fd);
  close(listener);
}

class UcxFloodTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/kvtier-ucx-flood-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    std::ofstream(dir_ + "/kvtier.yaml") << "auth:\n  tokens:\n"
                                         << "    - {token: " << kToken << ", tenant: tenant-a, role: worker}\n"
                                         << "ucx:\n  listen_address: 127.0.0.1:0\n"
                                         << "  pending_connection_timeout: 2s\n"
                                         << "  max_pending_connections_per_host: 64\n";
    auto p = ServerProcess::Start("ucx-flood-node", {"--config=" + dir_ + "/kvtier.yaml"});
    ASSERT_OK(p);
    server_ = *std::move(p);
    ASSERT_NE(server_->ucx_port(), 0);
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  double Metric(const std::string& series) { return MetricValue(ScrapeMetrics(server_->metrics_port()), series); }

  // An honest client with the token puts and gets `blocks` blocks over UCX; true when every block came
  // back byte for byte over UCX.
  void ExpectHonestClientOverUcx(uint32_t seed) {
    client::ClientOptions o{.members = {server_->address()}, .rpc_timeout = absl::Seconds(5), .transport = "ucx"};
    o.auth_token = kToken;
    auto c = client::Client::Connect(o);
    ASSERT_OK(c);
    const Namespace ns{.tenant = "tenant-a",
                       .model = "test/model",
                       .layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64, .block_tokens = 16},
                       .tenant_salt = "salt"};
    std::vector<uint32_t> tokens(4 * ns.layout.block_tokens);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 31 + seed * 7919);
    auto fps = ChainFingerprints(ns, tokens);
    ASSERT_OK(fps);
    const uint64_t size = ns.layout.ShardBytes();
    std::vector<std::string> data;
    std::vector<std::span<const std::byte>> views;
    for (size_t i = 0; i < fps->size(); ++i) data.push_back(std::string(size, static_cast<char>(seed + i)));
    for (const auto& d : data) views.push_back(std::as_bytes(std::span<const char>(d.data(), d.size())));
    ASSERT_OK((*c)->Put(ns, *fps, 0, views));
    std::vector<std::string> out(fps->size(), std::string(size, '\0'));
    std::vector<std::span<std::byte>> bufs;
    for (auto& d : out) bufs.push_back(std::as_writable_bytes(std::span<char>(d.data(), d.size())));
    auto got = (*c)->Get(ns, *fps, 0, bufs);
    ASSERT_OK(got);
    for (size_t i = 0; i < fps->size(); ++i) EXPECT_EQ((*got)[i], client::GetResult::kHit) << i;
    EXPECT_EQ(out, data);
    EXPECT_EQ((*c)->stats().ucx_get_blocks.load(), fps->size()) << "the blocks did not come over UCX";
    EXPECT_EQ((*c)->stats().ucx_put_blocks.load(), fps->size());
  }

  std::string dir_;
  std::unique_ptr<ServerProcess> server_;
};

// More connections than UCX's default async handler slots (1024), each sending 4 KiB of random bytes
// and closing; then 300 silent ones held open. Without the reaper every garbage connection stays in
// CLOSE-WAIT for the life of the process and honest UCX endpoints fail once the slots run out.
TEST_F(UcxFloodTest, GarbageAndSilentConnectionsAreResetAndHonestClientsStillGetOverUcx) {
  ExpectHonestClientOverUcx(1);
  const int port = server_->ucx_port();

  std::mt19937_64 rng(42);
  std::string garbage(4096, '\0');
  constexpr int kGarbage = 1200;
  int sent = 0;
  for (int i = 0; i < kGarbage; ++i) {
    for (char& ch : garbage) ch = static_cast<char>(rng());
    const int fd = ConnectTo(port);
    if (fd < 0) continue;  // the backlog is full for a moment
    if (send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL) > 0) ++sent;
    close(fd);
  }
  EXPECT_GT(sent, 1024) << "the flood did not exceed UCX's default async handler slots";

  constexpr int kSilent = 300;
  std::vector<int> silent;
  for (int i = 0; i < kSilent; ++i) {
    const int fd = ConnectTo(port);
    if (fd >= 0) silent.push_back(fd);
  }
  ASSERT_GT(silent.size(), 200u);
  // Within a sweep or two the per-host limit (64) resets the oldest; after the timeout (2 s) the rest.
  size_t dropped = 0;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  for (int fd : silent) {
    if (PeerDropped(fd, std::max(absl::Milliseconds(1), until - absl::Now()))) ++dropped;
  }
  EXPECT_EQ(dropped, silent.size()) << "silent connections are held open";
  for (int fd : silent) close(fd);

  // Nothing of the flood is left in the server: no connection in CLOSE-WAIT on its UCX port, none
  // pending, and the resets counted.
  const absl::Time settle = absl::Now() + absl::Seconds(10);
  while ((SocketsInState(port, "08") > 0 || Metric("kvtier_ucx_pending_connections") != 0) && absl::Now() < settle) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(SocketsInState(port, "08"), 0) << "garbage connections stuck in CLOSE-WAIT";
  EXPECT_EQ(Metric("kvtier_ucx_pending_connections"), 0);
  const double by_limit = Metric("kvtier_ucx_pending_connections_reset_total{reason=\"per_host_limit\"}");
  const double by_age = Metric("kvtier_ucx_pending_connections_reset_total{reason=\"timeout\"}");
  std::fprintf(stderr, "sent %d garbage connections, %zu silent; reset %.0f beyond the per-host limit, %.0f by age\n",
               sent, silent.size(), by_limit, by_age);
  EXPECT_GT(by_limit, 0);
  EXPECT_GT(by_age, 0);
  ASSERT_TRUE(server_->Running());
  ExpectHonestClientOverUcx(2);
}

}  // namespace
}  // namespace kvtier
