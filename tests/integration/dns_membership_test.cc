// Membership from DNS and health checks, against real processes: a dnsmasq on 127.0.0.1 with a high
// port serving the records of a directory (--hostsdir, re-read as files come and go), and kvtier-server
// processes on 127.0.0.1..4 sharing one port (A records carry no port). A client follows the records
// while a thread keeps doing Put/Get/LookupPrefix; members are ejected on failed health checks.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvtier/client/client.h"
#include "kvtier/client/dns_resolver.h"
#include "kvtier/common/fingerprint.h"
#include "kvtierctl_runner.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using client::Client;
using client::ClientOptions;
using client::GetResult;
using client::MemberHealth;
using client::MemberInfo;
using client::PutResult;
using testing::ServerProcess;

constexpr const char* kName = "kvtier.kvtier.test";

std::string FindDnsmasq() {
  for (const char* p : {"/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", "/sbin/dnsmasq", "/usr/local/sbin/dnsmasq"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// A dnsmasq child answering for *.kvtier.test from the files of a directory (one file per record, so a
// record is added by renaming a file in and removed by deleting it; dnsmasq watches the directory).
class Dnsmasq {
 public:
  static absl::StatusOr<std::unique_ptr<Dnsmasq>> Start(const std::string& binary) {
    auto d = std::unique_ptr<Dnsmasq>(new Dnsmasq());
    char dir_template[] = "/tmp/kvtier-dns-XXXXXX";
    if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
    d->dir_ = dir_template;
    std::filesystem::create_directory(d->dir_ + "/hosts");
    // dnsmasq started as root runs as an unprivileged user: let it read the records.
    std::filesystem::permissions(d->dir_, std::filesystem::perms(0755));
    std::filesystem::permissions(d->dir_ + "/hosts", std::filesystem::perms(0755));
    // dnsmasq cannot take a bound socket or report the port it bound, so the test asks the kernel for a
    // free UDP port, hands it over, and tries again (a new port) should another process take it first.
    for (int attempt = 0; attempt < 5; ++attempt) {
      const int port = EphemeralUdpPort();
      if (port <= 0) return absl::InternalError("no UDP port");
      std::vector<std::string> args = {binary,
                                       "--no-daemon",
                                       "--conf-file=/dev/null",
                                       "--no-resolv",
                                       "--no-hosts",
                                       "--bind-interfaces",
                                       "--listen-address=127.0.0.1",
                                       absl::StrCat("--port=", port),
                                       "--hostsdir=" + d->dir_ + "/hosts",
                                       "--local=/kvtier.test/",
                                       "--pid-file=" + d->dir_ + "/pid",
                                       "--log-facility=-"};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const std::string log = d->dir_ + "/dnsmasq.log";
      const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      d->pid_ = fork();
      if (d->pid_ < 0) return absl::InternalError("fork failed");
      if (d->pid_ == 0) {
        if (log_fd >= 0) {
          dup2(log_fd, STDOUT_FILENO);
          dup2(log_fd, STDERR_FILENO);
        }
        execv(argv[0], argv.data());
        _exit(127);
      }
      if (log_fd >= 0) close(log_fd);
      d->server_ = absl::StrCat("127.0.0.1:", port);
      // Up when it answers: an unknown name of its local domain is NXDOMAIN (NotFound).
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (absl::Now() < deadline) {
        auto r = client::ResolveMembers("probe.kvtier.test:1", d->server_, absl::Milliseconds(200));
        if (r.status().code() == absl::StatusCode::kNotFound) return d;
        int status = 0;
        if (waitpid(d->pid_, &status, WNOHANG) == d->pid_) {
          d->pid_ = -1;
          break;  // exited (e.g. the port was taken): next port
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (d->pid_ > 0) return absl::DeadlineExceededError(absl::StrCat("dnsmasq did not answer; see ", log));
    }
    return absl::InternalError("dnsmasq did not start; see " + d->dir_ + "/dnsmasq.log");
  }

  ~Dnsmasq() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // Adds the record `kName A ip` (written aside, then renamed in, so dnsmasq never reads half a file).
  void Add(const std::string& ip) {
    const std::string tmp = dir_ + "/" + ip + ".tmp";
    {
      std::ofstream out(tmp);
      out << ip << " " << kName << "\n";
    }
    std::filesystem::permissions(tmp, std::filesystem::perms(0644));
    std::filesystem::rename(tmp, dir_ + "/hosts/" + ip);
  }
  void Remove(const std::string& ip) { std::filesystem::remove(dir_ + "/hosts/" + ip); }
  const std::string& server() const { return server_; }

 private:
  Dnsmasq() = default;
  static int EphemeralUdpPort() {
    const int fd = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = -1;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
    close(fd);
    return port;
  }
  std::string dir_;
  std::string server_;
  pid_t pid_ = -1;
};

Namespace TestNamespace() {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "dns-test";
  ns.layout = {.kind = LayoutKind::kMla,
               .dtype = DType::kFp8E4m3,
               .num_layers = 1,
               .latent_dim = 512,
               .block_tokens = 1,
               .tp_size = 1};
  return ns;
}

std::vector<Fingerprint> Chain(const Namespace& ns, size_t n, uint32_t seed) {
  std::vector<uint32_t> tokens(n * ns.layout.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 2654435761u) ^ seed) % 32000;
  auto fps = ChainFingerprints(ns, tokens);
  EXPECT_TRUE(fps.ok());
  return fps.ok() ? *fps : std::vector<Fingerprint>{};
}

// Bytes derived from the fingerprint, so any mix-up of blocks shows.
std::vector<std::byte> Payload(const Fingerprint& fp, uint64_t size) {
  std::vector<std::byte> b(size);
  uint64_t x = fp.RingPosition() | 1;
  for (uint64_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b[i] = static_cast<std::byte>(x);
  }
  return b;
}

std::string OwnerOf(const HashRing& ring, const Fingerprint& fp) { return ring.node_ids()[ring.Primary(fp)]; }

std::set<std::string> Ids(const HashRing& ring) { return {ring.node_ids().begin(), ring.node_ids().end()}; }

const MemberInfo* Find(const std::vector<MemberInfo>& ms, const std::string& node_id) {
  for (const MemberInfo& m : ms) {
    if (m.node_id == node_id) return &m;
  }
  return nullptr;
}

// Polls `done` every 10 ms until it holds or `limit` passes; returns the time it took (limit if never).
template <typename Fn>
absl::Duration WaitFor(Fn done, absl::Duration limit) {
  const absl::Time start = absl::Now();
  while (!done()) {
    if (absl::Now() - start > limit) return limit;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::Now() - start;
}

class DnsMembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string binary = FindDnsmasq();
    if (binary.empty()) {
      GTEST_SKIP() << "dnsmasq is not installed (scripts/install-deps.sh installs dnsmasq-base)";
    }
    auto dns = Dnsmasq::Start(binary);
    ASSERT_OK(dns);
    dns_ = std::move(dns).value();
    // node-1 binds 127.0.0.1:0; the others bind the same port on 127.0.0.2..4.
    for (int i = 1; i <= 4; ++i) {
      const std::string ip = absl::StrCat("127.0.0.", i);
      auto p = ServerProcess::Start(absl::StrCat("node-", i),
                                    {absl::StrCat("--listen_address=", ip, ":", port_), "--ucx_listen_address=none"});
      ASSERT_OK(p);
      if (i == 1) port_ = (*p)->grpc_port();
      ASSERT_EQ((*p)->grpc_port(), port_);
      servers_.push_back(std::move(p).value());
    }
    for (int i = 1; i <= 3; ++i) dns_->Add(absl::StrCat("127.0.0.", i));
  }

  // Health checks every 200 ms with `health_timeout` deadlines; 3 failures eject, 2 passes return.
  ClientOptions Options(absl::Duration health_timeout = absl::Seconds(1)) const {
    return {.members_dns = absl::StrCat(kName, ":", port_),
            .dns_server = dns_->server(),
            .dns_refresh_interval = absl::Milliseconds(200),
            .dns_timeout = absl::Milliseconds(500),
            .health_check_interval = absl::Milliseconds(200),
            .health_check_timeout = health_timeout,
            .unhealthy_threshold = 3,
            .healthy_threshold = 2,
            .rpc_timeout = absl::Seconds(2),
            .transport = "grpc"};
  }

  std::string Address(int i) const { return absl::StrCat("127.0.0.", i, ":", port_); }

  std::unique_ptr<Dnsmasq> dns_;
  int port_ = 0;
  std::vector<std::unique_ptr<ServerProcess>> servers_;  // node-1..4 at 127.0.0.1..4
};

TEST_F(DnsMembershipTest, ResolverAsksTheGivenServerOnAnyPort) {
  auto r = client::ResolveMembers(absl::StrCat(kName, ":", port_), dns_->server(), absl::Seconds(2));
  ASSERT_OK(r);
  EXPECT_EQ(std::set<std::string>(r->begin(), r->end()), (std::set<std::string>{Address(1), Address(2), Address(3)}));
  EXPECT_EQ(r->size(), 3u);
  EXPECT_EQ(client::ResolveMembers("missing.kvtier.test:7400", dns_->server(), absl::Seconds(2)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client::ResolveMembers("no-port", dns_->server(), absl::Seconds(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client::ResolveMembers(absl::StrCat(kName, ":7400"), "not-an-ip", absl::Seconds(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing listens on port 1: no answer is Unavailable (keep what you have), within the timeout.
  const absl::Time start = absl::Now();
  EXPECT_EQ(
      client::ResolveMembers(absl::StrCat(kName, ":7400"), "127.0.0.1:1", absl::Milliseconds(300)).status().code(),
      absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// Needs no DNS server or member: runs with or without dnsmasq.
TEST(ClientOptionsTest, MembershipAndHealthErrorsNameTheField) {
  auto message = [](ClientOptions o) { return std::string(o.Validate().message()); };
  EXPECT_TRUE(absl::StartsWith(message({}), "members:"));
  EXPECT_OK((ClientOptions{.members_dns = "kvtier-members.kvtier.svc.cluster.local:7400"}.Validate()));
  EXPECT_OK(
      (ClientOptions{.members = {"10.0.0.1:7400"}, .members_dns = "kvtier-members:7400", .dns_server = "127.0.0.1:5353"}
           .Validate()));
  EXPECT_TRUE(absl::StartsWith(message({.members_dns = "no-port"}), "members_dns:"));
  EXPECT_TRUE(absl::StartsWith(message({.members_dns = "a:0"}), "members_dns:"));
  EXPECT_TRUE(absl::StartsWith(message({.members_dns = "a:1", .dns_server = "x"}), "dns_server:"));
  EXPECT_TRUE(absl::StartsWith(message({.members_dns = "a:1", .dns_server = "127.0.0.1:99999"}), "dns_server:"));
  EXPECT_OK((ClientOptions{.members_dns = "a:1", .dns_server = "127.0.0.1,[::1]:5353,::1"}.Validate()));
  EXPECT_TRUE(absl::StartsWith(message({.members_dns = "a:1", .dns_refresh_interval = absl::ZeroDuration()}),
                               "dns_refresh_interval:"));
  EXPECT_TRUE(absl::StartsWith(message({.members_dns = "a:1", .dns_timeout = absl::ZeroDuration()}), "dns_timeout:"));
  EXPECT_TRUE(absl::StartsWith(message({.members = {"a:1"}, .health_check_interval = absl::ZeroDuration()}),
                               "health_check_interval:"));
  EXPECT_TRUE(absl::StartsWith(message({.members = {"a:1"}, .health_check_timeout = absl::ZeroDuration()}),
                               "health_check_timeout:"));
  EXPECT_TRUE(absl::StartsWith(message({.members = {"a:1"}, .unhealthy_threshold = 0}), "unhealthy_threshold:"));
  EXPECT_TRUE(absl::StartsWith(message({.members = {"a:1"}, .healthy_threshold = 0}), "healthy_threshold:"));
}

TEST_F(DnsMembershipTest, StaticAndDnsMembersAreJoinedAndANameWithoutRecordsIsUnavailable) {
  ClientOptions o = Options();
  o.members = {Address(1), Address(4)};  // node-1 is in DNS too: one member
  auto c = Client::Connect(o);
  ASSERT_OK(c);
  const std::vector<MemberInfo> ms = (*c)->members();
  ASSERT_EQ(ms.size(), 4u);
  EXPECT_EQ(ms[0].address, Address(1));
  EXPECT_FALSE(ms[0].from_dns);
  EXPECT_FALSE(ms[1].from_dns);
  EXPECT_EQ(Ids((*c)->ring()), (std::set<std::string>{"node-1", "node-2", "node-3", "node-4"}));

  ClientOptions missing = Options();
  missing.members_dns = absl::StrCat("missing.kvtier.test:", port_);
  auto none = Client::Connect(missing);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "members_dns")) << none.status();
}

TEST_F(DnsMembershipTest, RingFollowsRecordsWhileTrafficSeesMissesButNoErrors) {
  auto connected = Client::Connect(Options());
  ASSERT_OK(connected);
  Client& c = **connected;
  EXPECT_EQ(Ids(c.ring()), (std::set<std::string>{"node-1", "node-2", "node-3"}));
  for (const MemberInfo& m : c.members()) {
    EXPECT_TRUE(m.from_dns && m.in_ring) << m.address;
  }
  EXPECT_EQ(c.ring_version(), 0u);

  const Namespace ns = TestNamespace();
  const uint64_t size = ns.layout.ShardBytes();
  const std::vector<Fingerprint> universe = Chain(ns, 4000, 11);  // for the share of keys that move
  const std::vector<Fingerprint> work = Chain(ns, 192, 23);       // what the traffic thread stores
  std::vector<std::vector<std::byte>> payloads;
  std::vector<std::span<const std::byte>> views;
  for (const auto& fp : work) payloads.push_back(Payload(fp, size));
  for (const auto& p : payloads) views.emplace_back(p);
  {
    auto put = c.Put(ns, work, 0, views);
    ASSERT_OK(put);
    for (PutResult r : *put) ASSERT_EQ(r, PutResult::kStored);
  }

  // Traffic: lookup, get (checking every byte), and put back what missed. Misses are expected after a
  // ring change; a non-OK status, a miss from error, a put error or a wrong byte is not.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rounds{0}, misses{0}, errors{0}, mismatches{0}, last_round_misses{0};
  std::string first_error;  // written by the traffic thread only, read after join
  std::thread traffic([&] {
    std::vector<std::vector<std::byte>> out(work.size(), std::vector<std::byte>(size));
    std::vector<std::span<std::byte>> out_views(out.begin(), out.end());
    auto fail = [&](const std::string& what) {
      if (errors.fetch_add(1) == 0) first_error = what;
    };
    while (!stop.load()) {
      auto look = c.LookupPrefix(ns, work);
      if (!look.ok()) fail(look.status().ToString());
      if (look.ok() && look->blocks_from_errors != 0) fail("lookup blocks from errors");
      auto got = c.Get(ns, work, 0, out_views);
      if (!got.ok()) {
        fail(got.status().ToString());
        continue;
      }
      std::vector<Fingerprint> again;
      std::vector<std::span<const std::byte>> again_views;
      uint64_t round_misses = 0;
      for (size_t i = 0; i < work.size(); ++i) {
        switch ((*got)[i]) {
          case GetResult::kHit:
            if (std::memcmp(out[i].data(), payloads[i].data(), size) != 0) mismatches.fetch_add(1);
            break;
          case GetResult::kMiss:
            ++round_misses;
            again.push_back(work[i]);
            again_views.push_back(views[i]);
            break;
          default:
            fail(absl::StrCat("get: ", client::GetResultName((*got)[i])));
        }
      }
      misses.fetch_add(round_misses);
      last_round_misses.store(round_misses);
      if (!again.empty()) {
        auto put = c.Put(ns, again, 0, again_views);
        if (!put.ok()) fail(put.status().ToString());
        for (PutResult r : put.ok() ? *put : std::vector<PutResult>{}) {
          if (r != PutResult::kStored && r != PutResult::kAlreadyPresent) {
            fail(absl::StrCat("put: ", client::PutResultName(r)));
          }
        }
      }
      rounds.fetch_add(1);
    }
  });
  auto wait_rounds = [&](uint64_t n) {
    const uint64_t target = rounds.load() + n;
    WaitFor([&] { return rounds.load() >= target; }, absl::Seconds(20));
  };
  wait_rounds(3);
  EXPECT_EQ(misses.load(), 0u) << "a stable ring: every block stays on its owner";

  // 3 -> 4: a record is added.
  const HashRing ring3 = c.ring();
  const uint64_t misses_before_add = misses.load();
  dns_->Add("127.0.0.4");
  const absl::Duration to_add = WaitFor([&] { return c.ring_version() >= 1; }, absl::Seconds(10));
  const HashRing ring4 = c.ring();
  ASSERT_EQ(Ids(ring4), (std::set<std::string>{"node-1", "node-2", "node-3", "node-4"}));
  EXPECT_LT(to_add, absl::Seconds(5));  // one refresh interval (200 ms) plus the node-id query
  size_t moved = 0;
  for (const auto& fp : universe) {
    const std::string before = OwnerOf(ring3, fp), after = OwnerOf(ring4, fp);
    if (before == after) continue;
    ++moved;
    EXPECT_EQ(after, "node-4") << "a key moves only to the new member";
  }
  const double moved_on_add = static_cast<double>(moved) / universe.size();
  EXPECT_GE(moved_on_add, 0.15);
  EXPECT_LE(moved_on_add, 0.40);
  size_t work_moved_on_add = 0;
  for (const auto& fp : work) work_moved_on_add += OwnerOf(ring3, fp) != OwnerOf(ring4, fp);
  wait_rounds(3);  // the moved blocks miss once, are put on node-4, then hit
  const uint64_t misses_on_add = misses.load() - misses_before_add;
  EXPECT_GT(work_moved_on_add, 0u);
  // Each moved block misses exactly once (a round that started on the old ring still hit).
  EXPECT_EQ(misses_on_add, work_moved_on_add);
  EXPECT_EQ(last_round_misses.load(), 0u) << "converged: every block on its new owner";

  // 4 -> 3: node-2's record is removed (the server keeps running; only the ring forgets it).
  const uint64_t misses_before_remove = misses.load();
  dns_->Remove("127.0.0.2");
  const absl::Duration to_remove = WaitFor([&] { return c.ring_version() >= 2; }, absl::Seconds(10));
  const HashRing ring_after = c.ring();
  ASSERT_EQ(Ids(ring_after), (std::set<std::string>{"node-1", "node-3", "node-4"}));
  EXPECT_LT(to_remove, absl::Seconds(5));
  moved = 0;
  for (const auto& fp : universe) {
    const std::string before = OwnerOf(ring4, fp), after = OwnerOf(ring_after, fp);
    if (before == after) continue;
    ++moved;
    EXPECT_EQ(before, "node-2") << "only the removed member's keys move";
  }
  const double moved_on_remove = static_cast<double>(moved) / universe.size();
  EXPECT_GE(moved_on_remove, 0.15);
  EXPECT_LE(moved_on_remove, 0.40);
  size_t work_moved_on_remove = 0;
  for (const auto& fp : work) work_moved_on_remove += OwnerOf(ring4, fp) != OwnerOf(ring_after, fp);
  wait_rounds(3);
  const uint64_t misses_on_remove = misses.load() - misses_before_remove;
  EXPECT_GT(work_moved_on_remove, 0u);
  EXPECT_EQ(misses_on_remove, work_moved_on_remove);
  EXPECT_EQ(last_round_misses.load(), 0u);
  EXPECT_EQ(Find(c.members(), "node-2"), nullptr) << "a member whose record went is no member";
  EXPECT_EQ(c.members().size(), 3u);

  stop = true;
  traffic.join();
  EXPECT_EQ(errors.load(), 0u) << first_error;
  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_EQ(c.stats().misses_from_errors.load(), 0u);
  EXPECT_EQ(c.stats().rpc_errors.load(), 0u);
  EXPECT_EQ(c.stats().checksum_failures.load(), 0u);
  EXPECT_EQ(c.stats().ring_changes.load(), 2u);
  EXPECT_GT(c.stats().dns_resolutions.load(), 2u);
  std::printf(
      "dns membership: 3->4 moved %.3f of keys, ring changed %.0f ms after the record was added, "
      "%llu misses (%zu of %zu working blocks moved); 4->3 moved %.3f, %.0f ms, %llu misses (%zu moved); "
      "%llu traffic rounds, 0 errors\n",
      moved_on_add, absl::ToDoubleMilliseconds(to_add), static_cast<unsigned long long>(misses_on_add),
      work_moved_on_add, work.size(), moved_on_remove, absl::ToDoubleMilliseconds(to_remove),
      static_cast<unsigned long long>(misses_on_remove), work_moved_on_remove,
      static_cast<unsigned long long>(rounds.load()));
  RecordProperty("moved_on_add", std::to_string(moved_on_add));
  RecordProperty("moved_on_remove", std::to_string(moved_on_remove));
  RecordProperty("ms_to_ring_change_on_add", std::to_string(absl::ToDoubleMilliseconds(to_add)));
  RecordProperty("ms_to_ring_change_on_remove", std::to_string(absl::ToDoubleMilliseconds(to_remove)));
}

TEST_F(DnsMembershipTest, UnhealthyMemberLeavesTheRingAndReturnsWhenHealthy) {
  auto connected = Client::Connect(Options(absl::Milliseconds(500)));
  ASSERT_OK(connected);
  Client& c = **connected;
  ASSERT_EQ(Ids(c.ring()), (std::set<std::string>{"node-1", "node-2", "node-3"}));
  WaitFor([&] { return Find(c.members(), "node-2")->health == MemberHealth::kHealthy; }, absl::Seconds(5));
  EXPECT_EQ(Find(c.members(), "node-2")->health, MemberHealth::kHealthy);

  // A stopped process keeps its connections open and answers nothing: health checks time out.
  ASSERT_EQ(kill(servers_[1]->pid(), SIGSTOP), 0);
  const absl::Duration to_eject = WaitFor([&] { return !Ids(c.ring()).contains("node-2"); }, absl::Seconds(10));
  ASSERT_FALSE(Ids(c.ring()).contains("node-2"));
  const MemberInfo* stopped = nullptr;
  const std::vector<MemberInfo> ms = c.members();
  stopped = Find(ms, "node-2");
  ASSERT_NE(stopped, nullptr);
  EXPECT_EQ(stopped->health, MemberHealth::kEjected);
  EXPECT_FALSE(stopped->in_ring);
  EXPECT_GE(stopped->consecutive_failures, 3u);
  EXPECT_FALSE(stopped->last_health_error.empty());
  // Three failed checks, 200 ms apart, each waiting out its 500 ms deadline (the first may have started
  // before the stop).
  EXPECT_GE(to_eject, absl::Milliseconds(1000));
  EXPECT_LT(to_eject, absl::Seconds(5));
  EXPECT_GE(c.stats().members_ejected.load(), 1u);

  // While it is out, traffic goes to the others: no RPC reaches the stopped member, so no errors.
  const Namespace ns = TestNamespace();
  const uint64_t size = ns.layout.ShardBytes();
  const std::vector<Fingerprint> fps = Chain(ns, 64, 5);
  std::vector<std::vector<std::byte>> payloads;
  std::vector<std::span<const std::byte>> views;
  for (const auto& fp : fps) payloads.push_back(Payload(fp, size));
  for (const auto& p : payloads) views.emplace_back(p);
  auto put = c.Put(ns, fps, 0, views);
  ASSERT_OK(put);
  for (PutResult r : *put) EXPECT_EQ(r, PutResult::kStored);
  std::vector<std::vector<std::byte>> out(fps.size(), std::vector<std::byte>(size));
  std::vector<std::span<std::byte>> out_views(out.begin(), out.end());
  auto got = c.Get(ns, fps, 0, out_views);
  ASSERT_OK(got);
  for (size_t i = 0; i < fps.size(); ++i) {
    EXPECT_EQ((*got)[i], GetResult::kHit);
    EXPECT_EQ(out[i], payloads[i]);
  }
  EXPECT_EQ(c.stats().misses_from_errors.load(), 0u);

  // Resumed: back after two passing checks (and its node id asked again).
  ASSERT_EQ(kill(servers_[1]->pid(), SIGCONT), 0);
  const absl::Duration to_return = WaitFor([&] { return Ids(c.ring()).contains("node-2"); }, absl::Seconds(10));
  ASSERT_TRUE(Ids(c.ring()).contains("node-2"));
  EXPECT_LT(to_return, absl::Seconds(3));
  EXPECT_EQ(Find(c.members(), "node-2")->health, MemberHealth::kHealthy);

  // A killed member (connection refused) is ejected the same way.
  servers_[2]->KillAndWait(SIGKILL);
  const absl::Duration to_eject_killed = WaitFor([&] { return !Ids(c.ring()).contains("node-3"); }, absl::Seconds(10));
  EXPECT_EQ(Ids(c.ring()), (std::set<std::string>{"node-1", "node-2"}));
  EXPECT_LT(to_eject_killed, absl::Seconds(3));
  std::printf("health: SIGSTOP ejected after %.0f ms, back %.0f ms after SIGCONT; SIGKILL ejected after %.0f ms\n",
              absl::ToDoubleMilliseconds(to_eject), absl::ToDoubleMilliseconds(to_return),
              absl::ToDoubleMilliseconds(to_eject_killed));
}

TEST_F(DnsMembershipTest, KvtierctlResolvesMembersWithTheSameDnsServerOption) {
  const auto st = testing::RunCtl(absl::StrCat("--members-dns ", kName, ":", port_, " --dns-server ", dns_->server(),
                                               " --timeout-ms 5000 status --json"));
  ASSERT_EQ(st.exit_code, 0) << st.output;
  const nlohmann::json j = testing::ParseJson(st.output);
  ASSERT_FALSE(j.is_discarded()) << st.output;
  std::set<std::string> ids;
  for (const auto& m : j["members"]) ids.insert(m["node_id"].get<std::string>());
  EXPECT_EQ(ids, (std::set<std::string>{"node-1", "node-2", "node-3"}));
  EXPECT_EQ(testing::RunCtl(absl::StrCat("--members-dns ", kName, ":", port_, " --dns-server bogus status")).exit_code,
            2);
  // A name without records: a warning, and with no member at all, exit 3.
  EXPECT_EQ(testing::RunCtl(
                absl::StrCat("--members-dns missing.kvtier.test:", port_, " --dns-server ", dns_->server(), " status"))
                .exit_code,
            3);
}

}  // namespace
}  // namespace kvtier
