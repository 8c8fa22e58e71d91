// The UCX bulk data plane: in-process and real-process servers with a UCX listener on 127.0.0.1:0,
// talked to through the real client library (ctest sets UCX_NET_DEVICES=lo).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/server/server.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/wire/wire.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using client::Client;
using client::ClientOptions;
using client::GetResult;
using client::PutResult;

// A layout whose shard is exactly `bytes` long: MLA, fp8 (1 byte per value), one layer, one token.
Namespace NamespaceOfBlockBytes(uint64_t bytes, const std::string& model = "ucx-test") {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = model;
  ns.layout = {.kind = LayoutKind::kMla,
               .dtype = DType::kFp8E4m3,
               .num_layers = 1,
               .latent_dim = static_cast<uint32_t>(bytes),
               .block_tokens = 1,
               .tp_size = 1};
  return ns;
}

std::vector<Fingerprint> Fingerprints(const Namespace& ns, size_t n, uint32_t seed = 7) {
  std::vector<uint32_t> tokens(n * ns.layout.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 2654435761u ^ seed) % 32000;
  auto fps = ChainFingerprints(ns, tokens);
  EXPECT_TRUE(fps.ok());
  return fps.ok() ? *fps : std::vector<Fingerprint>{};
}

// Bytes derived from the fingerprint (xorshift), so every block differs and any mix-up shows.
std::vector<std::byte> BlockBytes(const Fingerprint& fp, uint64_t size) {
  std::vector<std::byte> b(size);
  uint64_t x = fp.RingPosition() | 1;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&b[i], &x, 8);
  }
  for (; i < size; ++i) b[i] = static_cast<std::byte>(x >> (8 * (i % 8)));
  return b;
}

v1::GetStatsResponse Stats(const std::string& address) {
  auto stub = v1::AdminService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetStatsResponse resp;
  EXPECT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok());
  return resp;
}

struct Blocks {
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> views;
};
Blocks MakeBlocks(std::span<const Fingerprint> fps, uint64_t size) {
  Blocks b;
  for (const auto& fp : fps) b.data.push_back(BlockBytes(fp, size));
  for (const auto& d : b.data) b.views.emplace_back(d);
  return b;
}

// Puts every block, then gets them into fresh buffers and checks every byte.
void PutThenGetEveryByte(Client& c, const Namespace& ns, std::span<const Fingerprint> fps) {
  const uint64_t size = ns.layout.ShardBytes();
  Blocks in = MakeBlocks(fps, size);
  auto put = c.Put(ns, fps, 0, in.views);
  ASSERT_OK(put);
  for (size_t i = 0; i < put->size(); ++i) {
    EXPECT_TRUE((*put)[i] == PutResult::kStored || (*put)[i] == PutResult::kAlreadyPresent)
        << "block " << i << ": " << client::PutResultName((*put)[i]);
  }
  std::vector<std::vector<std::byte>> out(fps.size(), std::vector<std::byte>(size));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto got = c.Get(ns, fps, 0, views);
  ASSERT_OK(got);
  for (size_t i = 0; i < fps.size(); ++i) {
    EXPECT_EQ((*got)[i], GetResult::kHit) << "block " << i << " of " << size << " bytes";
    EXPECT_TRUE(out[i] == in.data[i]) << "block " << i << " of " << size << " bytes differs";
  }
}

// In-process server with UCX on 127.0.0.1:0; the parameter is UCX_TLS of both sides.
class UcxInProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void StartServer(uint64_t host_bytes = 256ULL << 20, uint64_t slab_bytes = 64ULL << 20,
                   uint64_t max_block_bytes = 64ULL << 20, bool put_commit = true) {
    auto s = server::Server::Start({.node_id = "node-a",
                                    .metrics_address = "",
                                    .host_cache_bytes = host_bytes,
                                    .slab_bytes = slab_bytes,
                                    .max_block_bytes = max_block_bytes,
                                    .ucx_listen_address = "127.0.0.1:0",
                                    .ucx_transports = GetParam(),
                                    .ucx_put_commit = put_commit});
    ASSERT_OK(s);
    server_ = std::move(s).value();
    ASSERT_GT(server_->ucx_port(), 0);
  }
  std::unique_ptr<Client> Connect(const std::string& transport = "ucx", uint64_t max_block_bytes = 64ULL << 20,
                                  absl::Duration timeout = absl::Seconds(5)) {
    auto c = Client::Connect({.members = {Address()},
                              .rpc_timeout = timeout,
                              .max_block_bytes = max_block_bytes,
                              .transport = transport,
                              .ucx_transports = GetParam()});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  std::string Address() const { return "127.0.0.1:" + std::to_string(server_->grpc_port()); }

  std::unique_ptr<server::Server> server_;
};

TEST_P(UcxInProcessTest, PutThenGetRoundTripsOverUcx) {
  StartServer();
  auto c = Connect("auto");
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->members().size(), 1u);
  EXPECT_EQ(c->members()[0].transport, "ucx");
  const Namespace ns = NamespaceOfBlockBytes(256 << 10);
  const auto fps = Fingerprints(ns, 16);
  PutThenGetEveryByte(*c, ns, fps);
  const uint64_t bytes = 16ULL * (256 << 10);
  const auto st = Stats(Address());
  EXPECT_EQ(st.ucx_write_bytes(), bytes);
  EXPECT_EQ(st.ucx_read_bytes(), bytes);
  EXPECT_EQ(st.grpc_write_bytes(), 0u);
  EXPECT_EQ(st.grpc_read_bytes(), 0u);
  // The server releases the lease once its sends complete, which may be just after the client has
  // every byte: wait for it (as the other tests here do), within a generous deadline.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (Stats(Address()).active_leases() != 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(Stats(Address()).active_leases(), 0u);  // the server released the lease after its sends
  EXPECT_EQ(c->stats().ucx_get_blocks.load(), 16u);
  EXPECT_EQ(c->stats().ucx_put_blocks.load(), 16u);
  EXPECT_EQ(c->stats().misses_from_errors.load(), 0u);
  EXPECT_EQ(c->stats().rpc_errors.load(), 0u);
  EXPECT_EQ(c->stats().ucx_connects.load(), 1u);  // one endpoint, reused by every call
  EXPECT_EQ(c->stats().ucx_leases.load(), 1u);    // the server requires no token: the lease came over UCX
  // The put reserved and committed over UCX too: one batch, no gRPC round trip on its path.
  EXPECT_EQ(c->stats().ucx_allocates.load(), 1u);
  EXPECT_EQ(c->stats().ucx_commits.load(), 1u);
}

// A put of several batches (pipelined, each batch's commit on its last message) stores every block
// once, with the server's commit on the UCX plane; against a server that does not take the commit on
// the last message (kCommitsPuts off), the same put commits each batch after its kPutDone.
TEST_P(UcxInProcessTest, AMultiBatchPutStoresEveryBlockWithOrWithoutTheCommitOnTheLastMessage) {
  for (const bool put_commit : {true, false}) {
    SCOPED_TRACE(put_commit ? "kPutCommit" : "kPutDone, then kCommit");
    StartServer(256ULL << 20, 64ULL << 20, 64ULL << 20, put_commit);
    auto c = Client::Connect({.members = {Address()},
                              .rpc_timeout = absl::Seconds(5),
                              .put_batch_blocks = 4,
                              .transport = "ucx",
                              .ucx_transports = GetParam()});
    ASSERT_OK(c);
    const Namespace ns = NamespaceOfBlockBytes(128 << 10);
    const auto fps = Fingerprints(ns, 22);  // 5 batches of 4 and one of 2
    PutThenGetEveryByte(**c, ns, fps);
    EXPECT_EQ((*c)->stats().ucx_allocates.load(), 6u);
    EXPECT_EQ((*c)->stats().ucx_commits.load(), 6u);
    EXPECT_EQ((*c)->stats().ucx_put_blocks.load(), 22u);
    EXPECT_EQ((*c)->stats().rpc_errors.load(), 0u);
    const auto st = Stats(Address());
    EXPECT_EQ(st.ucx_write_bytes(), 22ULL * (128 << 10));
    EXPECT_EQ(st.grpc_write_bytes(), 0u);
    EXPECT_EQ(st.active_reservations(), 0u);
    // A second put of the same keys finds them all present: nothing was half-committed.
    Blocks again = MakeBlocks(fps, 128 << 10);
    auto put = (*c)->Put(ns, fps, 0, again.views);
    ASSERT_OK(put);
    for (PutResult r : *put) EXPECT_EQ(r, PutResult::kAlreadyPresent);
    c->reset();
    server_.reset();
  }
}

// A server that requires tokens serves the UCX endpoint of a client with a token once its hello
// presented the session ticket the client opened over gRPC: leases, puts and gets all go over UCX.
TEST_P(UcxInProcessTest, AServerWithTokensServesAnEndpointWithASessionTicket) {
  server::ServerOptions o{.node_id = "node-t",
                          .metrics_address = "",
                          .host_cache_bytes = 64ULL << 20,
                          .ucx_listen_address = "127.0.0.1:0",
                          .ucx_transports = GetParam()};
  o.auth_tokens = {{.token_sha256 = server::Sha256Hex("worker-token"), .tenant = "acme", .role = "worker"}};
  auto s = server::Server::Start(o);
  ASSERT_OK(s);
  const std::string address = "127.0.0.1:" + std::to_string((*s)->grpc_port());
  auto c = Client::Connect(
      {.members = {address}, .transport = "ucx", .ucx_transports = GetParam(), .auth_token = "worker-token"});
  ASSERT_OK(c);
  const Namespace ns = NamespaceOfBlockBytes(128 << 10);
  PutThenGetEveryByte(**c, ns, Fingerprints(ns, 4));
  EXPECT_EQ((*c)->stats().ucx_leases.load(), 1u);  // the session may lease: no gRPC round trip
  EXPECT_EQ((*c)->stats().ucx_put_blocks.load(), 4u);
  EXPECT_EQ((*c)->stats().ucx_get_blocks.load(), 4u);
  EXPECT_EQ((*c)->stats().ucx_connects.load(), 1u);
  EXPECT_EQ((*c)->stats().misses_from_errors.load(), 0u);
}

TEST_P(UcxInProcessTest, MissesAndHitsMixInOneBatch) {
  StartServer();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const Namespace ns = NamespaceOfBlockBytes(64 << 10);
  const auto fps = Fingerprints(ns, 6);
  const std::vector<Fingerprint> stored = {fps[0], fps[2], fps[5]};
  Blocks in = MakeBlocks(stored, 64 << 10);
  ASSERT_OK(c->Put(ns, stored, 0, in.views));
  std::vector<std::vector<std::byte>> out(6, std::vector<std::byte>(64 << 10));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto got = c->Get(ns, fps, 0, views);
  ASSERT_OK(got);
  const std::vector<GetResult> want = {GetResult::kHit,  GetResult::kMiss, GetResult::kHit,
                                       GetResult::kMiss, GetResult::kMiss, GetResult::kHit};
  EXPECT_EQ(*got, want);
  EXPECT_TRUE(out[2] == in.data[1]);
  EXPECT_TRUE(out[5] == in.data[2]);
  EXPECT_EQ(c->stats().misses_from_errors.load(), 0u);
}

TEST_P(UcxInProcessTest, BlocksAroundTheGrpcMessageLimitRoundTrip) {
  StartServer(/*host_bytes=*/512ULL << 20);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  for (uint64_t size : {(4ULL << 20) - 1, 4ULL << 20, (4ULL << 20) + 1, 64ULL << 20}) {
    const Namespace ns = NamespaceOfBlockBytes(size, "m" + std::to_string(size));
    const auto fps = Fingerprints(ns, size > (8ULL << 20) ? 2 : 3);
    PutThenGetEveryByte(*c, ns, fps);
  }
  const auto st = Stats(Address());
  EXPECT_EQ(st.grpc_read_bytes() + st.grpc_write_bytes(), 0u);
  EXPECT_EQ(c->stats().misses_from_errors.load(), 0u);
}

TEST_P(UcxInProcessTest, BlocksAboveTheLimitAreRefusedUpFront) {
  StartServer();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const Namespace ns = NamespaceOfBlockBytes((64ULL << 20) + 1);
  const auto fps = Fingerprints(ns, 1);
  std::vector<std::byte> b(ns.layout.ShardBytes());
  std::vector<std::span<const std::byte>> in = {b};
  std::vector<std::span<std::byte>> out = {b};
  EXPECT_EQ(c->Put(ns, fps, 0, in).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Get(ns, fps, 0, out).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->LookupPrefix(ns, fps).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->stats().misses_from_errors.load(), 0u);  // the caller's error, not a server's
  EXPECT_EQ(Stats(Address()).read_blocks() + Stats(Address()).committed_blocks(), 0u);  // nothing was sent
}

TEST_P(UcxInProcessTest, OneGibBlockRoundTrips) {
  // 1 GiB in the server's host tier plus 2 GiB of client buffers: about 9 s here, so over one transport.
  if (GetParam() == "tcp") GTEST_SKIP() << "runs over shared memory only (time)";
  StartServer(/*host_bytes=*/1ULL << 30, /*slab_bytes=*/1ULL << 30, /*max_block_bytes=*/1ULL << 30);
  auto c = Connect("ucx", 1ULL << 30, absl::Seconds(60));
  ASSERT_NE(c, nullptr);
  const Namespace ns = NamespaceOfBlockBytes(1ULL << 30);
  const auto fps = Fingerprints(ns, 1);
  PutThenGetEveryByte(*c, ns, fps);
  EXPECT_EQ(Stats(Address()).ucx_read_bytes(), 1ULL << 30);
}

TEST_P(UcxInProcessTest, ServerStoppedMidTransferGivesMissesWithinTheDeadline) {
  StartServer(/*host_bytes=*/1ULL << 30);
  const absl::Duration timeout = absl::Seconds(2);
  auto c = Connect("ucx", 64ULL << 20, timeout);
  ASSERT_NE(c, nullptr);
  const Namespace ns = NamespaceOfBlockBytes(16ULL << 20);
  const auto fps = Fingerprints(ns, 24);  // 384 MiB per Get
  Blocks in = MakeBlocks(fps, 16ULL << 20);
  {
    // The blocks go in with a client of its own and a generous deadline: 384 MiB on a loaded 2-core
    // machine can take longer than the getter's 2 s, and this test is about the getter.
    auto writer = Connect("ucx", 64ULL << 20, absl::Seconds(60));
    ASSERT_NE(writer, nullptr);
    auto put = writer->Put(ns, fps, 0, in.views);
    ASSERT_OK(put);
    for (PutResult r : *put) ASSERT_EQ(r, PutResult::kStored);
  }
  std::vector<std::vector<std::byte>> out(fps.size(), std::vector<std::byte>(16ULL << 20));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  auto getter = std::async(std::launch::async, [&] {
    absl::Duration slowest;
    while (!stop.load()) {
      const absl::Time start = absl::Now();
      auto got = c->Get(ns, fps, 0, views);
      slowest = std::max(slowest, absl::Now() - start);
      EXPECT_OK(got);
      if (!got.ok()) break;
      for (size_t i = 0; i < got->size(); ++i) {
        // A plain miss only once the health checks ejected the stopped server (no owner is left to
        // fail: ejected members cost misses, not errors).
        const bool ejected = c->stats().members_ejected.load() > 0;
        EXPECT_TRUE((*got)[i] == GetResult::kHit || (*got)[i] == GetResult::kMissFromError ||
                    ((*got)[i] == GetResult::kMiss && ejected))
            << static_cast<int>((*got)[i]);
        if ((*got)[i] == GetResult::kHit) {
          EXPECT_TRUE(out[i] == in.data[i]);
        }
      }
      calls.fetch_add(1);
    }
    return slowest;
  });
  while (calls.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  server_->Shutdown();  // mid-transfer, most likely
  const int before = calls.load();
  while (calls.load() < before + 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  const absl::Duration slowest = getter.get();
  // rpc_timeout for the lease and the transfer together, plus the cancel and close grace, plus room for
  // a 2-core machine under load (the bound is what matters: a hang would run into the ctest timeout).
  EXPECT_LT(slowest, timeout + absl::Milliseconds(3000));
  EXPECT_GT(c->stats().misses_from_errors.load(), 0u);
}

// Gets from several threads at once share the client's endpoint and, over shared memory, its get lanes:
// every block lands in its own caller's buffer, byte for byte, and no lease is left behind.
TEST_P(UcxInProcessTest, ConcurrentBatchedGetsEachGetTheirOwnBytes) {
  StartServer();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const Namespace ns = NamespaceOfBlockBytes(512 << 10);
  const auto fps = Fingerprints(ns, 24);
  Blocks in = MakeBlocks(fps, 512 << 10);
  ASSERT_OK(c->Put(ns, fps, 0, in.views));
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 10; ++round) {
        // Each thread asks for its own rotation of the blocks, so a mix-up between callers shows.
        std::vector<Fingerprint> mine;
        std::vector<size_t> which;
        for (size_t k = 0; k < 8; ++k) {
          which.push_back((static_cast<size_t>(t) * 5 + round + k * 3) % fps.size());
          mine.push_back(fps[which.back()]);
        }
        std::vector<std::vector<std::byte>> out(mine.size(), std::vector<std::byte>(512 << 10));
        std::vector<std::span<std::byte>> views(out.begin(), out.end());
        auto got = c->Get(ns, mine, 0, views);
        ASSERT_OK(got);
        for (size_t k = 0; k < mine.size(); ++k) {
          EXPECT_EQ((*got)[k], GetResult::kHit);
          EXPECT_TRUE(out[k] == in.data[which[k]]) << "thread " << t << " block " << k;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(c->stats().ucx_get_blocks.load(), kThreads * 10u * 8u);
  EXPECT_EQ(c->stats().misses_from_errors.load(), 0u);
  // The server releases each lease once its last send completed, which may be just after the Get.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (Stats(Address()).active_leases() != 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(Stats(Address()).active_leases(), 0u);
}

// Over shared memory a batched get is split over the get lanes; one lane and more lanes than blocks
// give the same bytes, and a bad lane count is refused at Connect.
TEST_P(UcxInProcessTest, AnyNumberOfGetLanesGivesTheSameBytes) {
  StartServer();
  const Namespace ns = NamespaceOfBlockBytes(300 << 10);
  const auto fps = Fingerprints(ns, 5);
  for (int lanes : {1, 2, 7}) {
    auto c = Client::Connect(
        {.members = {Address()}, .transport = "ucx", .ucx_transports = GetParam(), .ucx_get_lanes = lanes});
    ASSERT_OK(c);
    PutThenGetEveryByte(**c, ns, fps);
    EXPECT_EQ((*c)->stats().ucx_get_blocks.load(), fps.size()) << lanes << " lanes";
    // The server is in this process: shared memory reaches it with cma, a single-copy lane.
    EXPECT_EQ((*c)->stats().ucx_lane_get_blocks.load(), GetParam() == "tcp" ? 0u : fps.size()) << lanes << " lanes";
    EXPECT_EQ((*c)->stats().misses_from_errors.load(), 0u) << lanes << " lanes";
  }
  for (int lanes : {0, 65}) {
    auto c = Client::Connect({.members = {Address()}, .transport = "ucx", .ucx_get_lanes = lanes});
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << lanes;
  }
}

TEST_P(UcxInProcessTest, ClientWithGrpcTransportMovesNothingOverUcx) {
  StartServer();
  auto c = Connect("grpc");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->members()[0].transport, "grpc");
  const Namespace ns = NamespaceOfBlockBytes(128 << 10);
  PutThenGetEveryByte(*c, ns, Fingerprints(ns, 4));
  const auto st = Stats(Address());
  EXPECT_EQ(st.ucx_read_bytes() + st.ucx_write_bytes(), 0u);
  EXPECT_EQ(st.grpc_read_bytes(), 4ULL * (128 << 10));
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxInProcessTest, ::testing::Values("tcp", "tcp,shm"),
                         [](const auto& info) { return info.param == "tcp" ? "Tcp" : "SharedMemory"; });

TEST(UcxFallbackTest, ServerWithoutUcxIsServedOverGrpc) {
  auto s = server::Server::Start({.node_id = "node-a", .metrics_address = "", .host_cache_bytes = 64ULL << 20});
  ASSERT_OK(s);
  const std::string address = "127.0.0.1:" + std::to_string((*s)->grpc_port());
  auto c = Client::Connect({.members = {address}, .transport = "auto"});
  ASSERT_OK(c);
  EXPECT_EQ((*c)->members()[0].transport, "grpc");
  const Namespace ns = NamespaceOfBlockBytes(96 << 10);
  const auto fps = Fingerprints(ns, 4);
  PutThenGetEveryByte(**c, ns, fps);
  EXPECT_EQ((*c)->stats().misses_from_errors.load(), 0u);
  const auto st = Stats(address);
  EXPECT_EQ(st.grpc_read_bytes(), 4ULL * (96 << 10));
  EXPECT_EQ(st.ucx_read_bytes(), 0u);

  // Insisting on UCX: the member's blocks are errors, counted, never a hang or a fallback.
  auto strict = Client::Connect({.members = {address}, .transport = "ucx"});
  ASSERT_OK(strict);
  EXPECT_EQ((*strict)->members()[0].transport, "none");
  std::vector<std::vector<std::byte>> out(fps.size(), std::vector<std::byte>(96 << 10));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto got = (*strict)->Get(ns, fps, 0, views);
  ASSERT_OK(got);
  for (GetResult r : *got) EXPECT_EQ(r, GetResult::kMissFromError);
  EXPECT_EQ((*strict)->stats().misses_from_errors.load(), fps.size());
}

// Real kvtier-server processes: kill -9 mid-transfer, restart, reconnect.
// Stops `pid` (SIGSTOP) and waits until every thread of it has stopped: the signal takes effect as each
// thread is next scheduled, and on a loaded machine a request may still be served in between.
bool StopAndWait(pid_t pid) {
  if (kill(pid, SIGSTOP) != 0) return false;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until) {
    bool all_stopped = true;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream in(task.path() / "stat");
      std::string line;
      std::getline(in, line);
      const size_t paren = line.rfind(')');  // "tid (comm) state ...": comm may hold spaces
      all_stopped &= paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T';
    }
    if (!ec && all_stopped) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

class UcxProcessTest : public ::testing::Test {
 protected:
  static absl::StatusOr<std::unique_ptr<testing::ServerProcess>> StartNode(const std::string& node_id,
                                                                           int grpc_port = 0) {
    return testing::ServerProcess::Start(node_id, {"--ucx_listen_address=127.0.0.1:0", "--host_cache_bytes=1073741824",
                                                   absl::StrCat("--listen_address=127.0.0.1:", grpc_port)});
  }
};

TEST_F(UcxProcessTest, EndpointIsReusedAndReconnectsAfterARestart) {
  auto node = StartNode("node-r");
  ASSERT_OK(node);
  ASSERT_GT((*node)->ucx_port(), 0);
  const int grpc_port = (*node)->grpc_port();
  const std::string address = (*node)->address();
  auto c = Client::Connect({.members = {"node-r=" + address},
                            .rpc_timeout = absl::Seconds(2),
                            .transport = "ucx",
                            .ucx_reconnect_backoff = absl::Milliseconds(200)});
  ASSERT_OK(c);
  Client& cl = **c;
  const Namespace ns = NamespaceOfBlockBytes(1 << 20);
  const auto fps = Fingerprints(ns, 8);
  for (int round = 0; round < 5; ++round) PutThenGetEveryByte(cl, ns, fps);
  EXPECT_EQ(cl.stats().ucx_connects.load(), 1u);  // five rounds of puts and gets, one endpoint
  EXPECT_EQ(cl.members()[0].transport, "ucx");

  // Kill it, then ask: misses from error, within the deadline.
  (*node)->KillAndWait(SIGKILL);
  node->reset();
  std::vector<std::vector<std::byte>> out(fps.size(), std::vector<std::byte>(1 << 20));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  const absl::Time start = absl::Now();
  auto got = cl.Get(ns, fps, 0, views);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2) + absl::Milliseconds(1500));
  ASSERT_OK(got);
  for (GetResult r : *got) EXPECT_EQ(r, GetResult::kMissFromError);
  EXPECT_EQ(cl.members()[0].transport, "none");  // dropped; reconnects after the backoff

  // Restart on the same gRPC port (the UCX port is new: the client asks GetInfo when it reconnects).
  auto again = StartNode("node-r", grpc_port);
  ASSERT_OK(again);
  // The client reconnects on a call after its UCX backoff (200 ms) once its gRPC channel has
  // reconnected too (gRPC's own backoff, at most 1 s here): calls until then are misses or errors.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (cl.members()[0].transport != "ucx" && absl::Now() < until) {
    std::vector<std::byte> probe(1 << 20);
    std::vector<std::span<std::byte>> one = {probe};
    (void)cl.Get(ns, std::span<const Fingerprint>(fps.data(), 1), 0, one);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  PutThenGetEveryByte(cl, ns, fps);
  EXPECT_EQ(cl.stats().ucx_connects.load(), 2u);
  EXPECT_EQ(cl.members()[0].transport, "ucx");
  EXPECT_GT(Stats(address).ucx_read_bytes(), 0u);
}

TEST_F(UcxProcessTest, ServerKilledMidTransferGivesMissesWithinTheDeadline) {
  auto node = StartNode("node-k");
  ASSERT_OK(node);
  const absl::Duration timeout = absl::Seconds(2);
  auto c = Client::Connect({.members = {(*node)->address()}, .rpc_timeout = timeout, .transport = "ucx"});
  ASSERT_OK(c);
  const Namespace ns = NamespaceOfBlockBytes(8ULL << 20);
  const auto fps = Fingerprints(ns, 48);  // 384 MiB per Get
  Blocks in = MakeBlocks(fps, 8ULL << 20);
  ASSERT_OK((*c)->Put(ns, fps, 0, in.views));
  std::vector<std::vector<std::byte>> out(fps.size(), std::vector<std::byte>(8ULL << 20));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  auto getter = std::async(std::launch::async, [&] {
    absl::Duration slowest;
    while (!stop.load()) {
      const absl::Time start = absl::Now();
      auto got = (*c)->Get(ns, fps, 0, views);
      slowest = std::max(slowest, absl::Now() - start);
      EXPECT_OK(got);
      if (!got.ok()) break;
      for (size_t i = 0; i < got->size(); ++i) {
        EXPECT_TRUE((*got)[i] == GetResult::kHit || (*got)[i] == GetResult::kMissFromError);
        if ((*got)[i] == GetResult::kHit) {
          EXPECT_TRUE(out[i] == in.data[i]);
        }
      }
      calls.fetch_add(1);
    }
    return slowest;
  });
  while (calls.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  (*node)->KillAndWait(SIGKILL);
  const int before = calls.load();
  while (calls.load() < before + 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  EXPECT_LT(getter.get(), timeout + absl::Milliseconds(1500));
  EXPECT_GT((*c)->stats().misses_from_errors.load(), 0u);
}

// A stopped server (alive, answering nothing) whose UCX endpoint was dropped: the callers that find no
// endpoint must not queue behind the one reconnecting to it (each waiting for that one's GetInfo
// deadline in turn); every Get still returns within rpc_timeout.
TEST_F(UcxProcessTest, CallersDoNotQueueBehindAReconnectToAStoppedServer) {
  auto node = StartNode("node-s");
  ASSERT_OK(node);
  const absl::Duration timeout = absl::Seconds(1);
  auto c = Client::Connect({.members = {"node-s=" + (*node)->address()},
                            .rpc_timeout = timeout,
                            .transport = "auto",
                            .ucx_reconnect_backoff = absl::Milliseconds(50)});
  ASSERT_OK(c);
  Client& cl = **c;
  const Namespace ns = NamespaceOfBlockBytes(64 << 10);
  const auto fps = Fingerprints(ns, 4);
  PutThenGetEveryByte(cl, ns, fps);
  ASSERT_EQ(cl.members()[0].transport, "ucx");
  ASSERT_TRUE(StopAndWait((*node)->pid()));
  struct Resume {
    pid_t pid;
    ~Resume() { kill(pid, SIGCONT); }
  } resume{(*node)->pid()};
  constexpr int kThreads = 8;
  std::vector<std::future<absl::Duration>> callers;
  for (int t = 0; t < kThreads; ++t) {
    callers.push_back(std::async(std::launch::async, [&] {
      absl::Duration slowest;
      for (int round = 0; round < 3; ++round) {
        std::vector<std::vector<std::byte>> out(fps.size(), std::vector<std::byte>(64 << 10));
        std::vector<std::span<std::byte>> views(out.begin(), out.end());
        const absl::Time start = absl::Now();
        auto got = cl.Get(ns, fps, 0, views);
        slowest = std::max(slowest, absl::Now() - start);
        EXPECT_OK(got);
        if (got.ok()) {
          for (GetResult r : *got) EXPECT_EQ(r, GetResult::kMissFromError);
        }
      }
      return slowest;
    }));
  }
  absl::Duration slowest;
  for (auto& f : callers) slowest = std::max(slowest, f.get());
  EXPECT_LT(slowest, timeout + absl::Milliseconds(500));
}

// A server that stops answering for a while (a loaded or paused machine, here SIGSTOP for 800 ms): the
// kLease goes unanswered past its budget (a quarter of rpc_timeout), the lease is asked again over gRPC
// and answered once the server runs again, and the blocks then come over gRPC: hits, not misses.
TEST_F(UcxProcessTest, AServerThatAnswersTheLeaseLateServesTheGetOverGrpc) {
  auto node = StartNode("node-l");
  ASSERT_OK(node);
  const absl::Duration timeout = absl::Seconds(2);
  auto c = Client::Connect({.members = {"node-l=" + (*node)->address()}, .rpc_timeout = timeout, .transport = "auto"});
  ASSERT_OK(c);
  Client& cl = **c;
  const Namespace ns = NamespaceOfBlockBytes(64 << 10);
  const auto fps = Fingerprints(ns, 4);
  Blocks in = MakeBlocks(fps, 64 << 10);
  PutThenGetEveryByte(cl, ns, fps);
  ASSERT_EQ(cl.stats().ucx_leases.load(), 1u);
  const pid_t pid = (*node)->pid();
  ASSERT_TRUE(StopAndWait(pid));
  auto resume = std::async(std::launch::async, [pid] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    kill(pid, SIGCONT);
  });
  std::vector<std::vector<std::byte>> out(fps.size(), std::vector<std::byte>(64 << 10));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  const absl::Time start = absl::Now();
  auto got = cl.Get(ns, fps, 0, views);
  EXPECT_LT(absl::Now() - start, timeout);
  resume.get();
  ASSERT_OK(got);
  for (size_t i = 0; i < fps.size(); ++i) {
    EXPECT_EQ((*got)[i], GetResult::kHit) << i;
    EXPECT_TRUE(out[i] == in.data[i]) << i;
  }
  EXPECT_EQ(cl.stats().misses_from_errors.load(), 0u);
  EXPECT_EQ(cl.stats().ucx_endpoint_failures.load(), 1u);  // dropped, reconnected by a later call
}

// A Put of many batches to a stopped owner: the first batch that fails whole ends that owner's part of
// the call, instead of every batch waiting for its own deadlines.
TEST_F(UcxProcessTest, APutToAStoppedOwnerWaitsForOneBatchNotEvery) {
  auto node = StartNode("node-p");
  ASSERT_OK(node);
  const absl::Duration timeout = absl::Milliseconds(500);
  auto c = Client::Connect({.members = {"node-p=" + (*node)->address()},
                            .rpc_timeout = timeout,
                            .put_batch_blocks = 4,
                            .transport = "auto"});
  ASSERT_OK(c);
  const Namespace ns = NamespaceOfBlockBytes(64 << 10);
  const auto fps = Fingerprints(ns, 40);  // 10 batches of 4
  Blocks in = MakeBlocks(fps, 64 << 10);
  ASSERT_TRUE(StopAndWait((*node)->pid()));
  struct Resume {
    pid_t pid;
    ~Resume() { kill(pid, SIGCONT); }
  } resume{(*node)->pid()};
  const absl::Time start = absl::Now();
  auto put = (*c)->Put(ns, fps, 0, in.views);
  const absl::Duration took = absl::Now() - start;
  ASSERT_OK(put);
  for (PutResult r : *put) EXPECT_EQ(r, PutResult::kError);
  EXPECT_LT(took, 3 * timeout) << "one batch: Allocate times out (and at most a transfer and an Abort)";
}

// A server stopped (SIGSTOP) while a Put's blocks are on the wire: the sends it never takes are given up
// at the deadline, the Put returns, and the client then closes without waiting on them or leaving them
// behind (the sanitizer builds check that no request or transfer outlives it).
TEST_F(UcxProcessTest, AServerStoppedMidPutIsGivenUpOnAndTheClientClosesCleanly) {
  auto node = StartNode("node-m");
  ASSERT_OK(node);
  const pid_t pid = (*node)->pid();
  struct Resume {
    pid_t pid;
    ~Resume() { kill(pid, SIGCONT); }
  } resume{pid};
  const absl::Duration timeout = absl::Seconds(1);
  auto c = Client::Connect({.members = {"node-m=" + (*node)->address()}, .rpc_timeout = timeout, .transport = "ucx"});
  ASSERT_OK(c);
  const Namespace ns = NamespaceOfBlockBytes(8ULL << 20);
  std::atomic<bool> stop{false};
  std::atomic<int> puts{0};
  std::atomic<int> errors{0};  // blocks the stopped server never took
  auto putter = std::async(std::launch::async, [&] {
    absl::Duration slowest;
    for (uint32_t round = 0; !stop.load(); ++round) {
      const auto fps = Fingerprints(ns, 16, /*seed=*/100 + round);  // 128 MiB of new blocks each round
      Blocks in = MakeBlocks(fps, 8ULL << 20);
      const absl::Time start = absl::Now();
      auto put = (*c)->Put(ns, fps, 0, in.views);
      slowest = std::max(slowest, absl::Now() - start);
      EXPECT_OK(put);
      if (put.ok()) {
        for (PutResult r : *put) errors.fetch_add(r == PutResult::kError ? 1 : 0);
      }
      puts.fetch_add(1);
    }
    return slowest;
  });
  while (puts.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(15));  // the next round's sends are under way
  ASSERT_TRUE(StopAndWait(pid));
  const int before = puts.load();
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (puts.load() < before + 2 && absl::Now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  const absl::Duration slowest = putter.get();
  EXPECT_GE(puts.load(), before + 2) << "a Put to the stopped server never returned";
  // A Put's allocation, its transfer and its abort each have rpc_timeout, plus the cancel and close grace.
  EXPECT_LT(slowest, 3 * timeout + absl::Seconds(2));
  EXPECT_GT(errors.load(), 0);
  const absl::Time closing = absl::Now();
  c->reset();
  EXPECT_LT(absl::Now() - closing, absl::Seconds(3)) << "closing waited on sends the server never takes";
}

// A client process killed mid-transfer must not leave slots pinned: the server cancels or force-closes
// its transfers after ucx.transfer_timeout, and its leases and reservations then expire as usual.
TEST(UcxServerCleanupTest, ClientKilledMidTransferLeavesNothingPinned) {
  auto s = server::Server::Start({.node_id = "node-c",
                                  .metrics_address = "",
                                  .host_cache_bytes = 512ULL << 20,
                                  .default_lease_ttl = absl::Seconds(1),
                                  .reservation_ttl = absl::Seconds(1),
                                  .expiry_interval = absl::Milliseconds(100),
                                  .ucx_listen_address = "127.0.0.1:0",
                                  .ucx_transfer_timeout = absl::Milliseconds(500)});
  ASSERT_OK(s);
  const std::string address = "127.0.0.1:" + std::to_string((*s)->grpc_port());
  std::vector<std::string> args = {testing::BinaryDir() + "/bench/trace_replay/trace_replay", "--members=" + address,
                                   "--transport=ucx", "--block_bytes=4194304", "--limit=100000"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  const pid_t pid = fork();  // argv is built before fork: the child only execs
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(devnull, STDOUT_FILENO);
    dup2(devnull, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(devnull);
  // Let it move a few hundred MiB, then kill it wherever it is.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (Stats(address).ucx_write_bytes() < (64ULL << 20) && absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_GT(Stats(address).ucx_write_bytes(), 0u) << "the client never moved bytes over UCX";
  v1::GetStatsResponse st;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    st = Stats(address);
  } while ((st.active_leases() != 0 || st.active_reservations() != 0) && absl::Now() < deadline);
  EXPECT_EQ(st.active_leases(), 0u);
  EXPECT_EQ(st.active_reservations(), 0u);
  // And it still serves a new client over UCX.
  auto c = Client::Connect({.members = {address}, .transport = "ucx"});
  ASSERT_OK(c);
  const Namespace ns = NamespaceOfBlockBytes(1 << 20, "after-kill");
  PutThenGetEveryByte(**c, ns, Fingerprints(ns, 4));
}

}  // namespace
}  // namespace kvtier
