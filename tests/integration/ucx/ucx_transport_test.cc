// The UCX transport on its own (transport/ucx): a UcxServer over a HostBlockSource of plain memory and a
// UcxClient, over loopback tcp. What the cache server adds (BlockStore, the RPCs) is tested in
// tests/integration/ucx_test.cc and tests/integration/security/.
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvtier/common/checksum.h"
#include "kvtier/ucx/host_block_source.h"
#include "kvtier/ucx/ucx_client.h"
#include "kvtier/ucx/ucx_server.h"

namespace kvtier::ucx {
namespace {

constexpr uint64_t kBlockBytes = 64 << 10;

// Two blocks of host memory: block 0 is a lease's (to send), block 1 a reservation's (to receive).
// Only tenant 7 (or an admin) holds them.
class MemoryBlockSource final : public HostBlockSource {
 public:
  MemoryBlockSource() : memory_(2 * kBlockBytes) {
    for (uint64_t i = 0; i < kBlockBytes; ++i) memory_[i] = static_cast<std::byte>(i * 7 + 1);
  }
  const CapabilityId lease = CapabilityId::Random();
  const CapabilityId reservation = CapabilityId::Random();
  std::optional<uint64_t> received_bytes;
  std::span<const std::byte> received() const { return {memory_.data() + kBlockBytes, kBlockBytes}; }
  std::span<const std::byte> sent() const { return {memory_.data(), kBlockBytes}; }
  int released = 0;

  std::span<std::byte> HostRegion() const override { return memory_; }
  absl::StatusOr<PinnedHostBlock> PinForSend(const Principal& who, const CapabilityId& id, uint32_t index) override {
    if (!Holds(who) || id != lease || index != 0) return absl::FailedPreconditionError("unknown or expired lease");
    return PinnedHostBlock{.data = memory_.data(), .size_bytes = kBlockBytes};
  }
  void UnpinSend(const CapabilityId&, uint32_t) override {}
  absl::StatusOr<PinnedHostBlock> PinForReceive(const Principal& who, const CapabilityId& id, uint32_t index) override {
    if (!Holds(who) || id != reservation || index != 0) return absl::FailedPreconditionError("unknown reservation");
    return PinnedHostBlock{.data = memory_.data() + kBlockBytes, .size_bytes = kBlockBytes};
  }
  void FinishReceive(const CapabilityId&, uint32_t, uint64_t bytes, bool ok, std::optional<uint64_t> sum) override {
    if (ok) received_bytes = bytes;
    received_sum = ok ? sum : std::nullopt;
  }
  bool PutTagFreeFor(const CapabilityId&) const override { return true; }
  void Release(const Principal& who, const CapabilityId& id) override {
    if (Holds(who) && id == lease) ++released;
  }
  absl::StatusOr<v1::ReadResponse> Lease(const Principal& who, const v1::ReadRequest&) override {
    if (!Holds(who)) return absl::PermissionDeniedError("another tenant's namespace");
    v1::ReadResponse resp;
    resp.set_lease_id(lease.ToWire());
    return resp;
  }
  absl::StatusOr<v1::AllocateResponse> Allocate(const Principal&, const v1::AllocateRequest&) override {
    return absl::UnimplementedError("no allocate here");
  }
  // With `commits`: block 0 of `reservation` is committed when its bytes all arrived and their hash is
  // the request's checksums[0]; what the commit saw is kept.
  absl::StatusOr<v1::CommitResponse> Commit(const Principal& who, const v1::CommitRequest& request) override {
    if (!commits) return absl::UnimplementedError("no commit here");
    if (!Holds(who) || CapabilityId::FromWire(request.reservation_id()) != reservation) {
      return absl::FailedPreconditionError("unknown reservation");
    }
    bytes_at_commit = received_bytes;
    v1::CommitResponse resp;
    const bool matches =
        received_sum.has_value() && request.checksums_size() == 1 && request.checksums(0) == *received_sum;
    resp.add_results(!received_sum.has_value() ? v1::COMMIT_RESULT_INCOMPLETE
                     : matches                 ? v1::COMMIT_RESULT_COMMITTED
                                               : v1::COMMIT_RESULT_CHECKSUM_MISMATCH);
    return resp;
  }
  bool commits = false;
  std::optional<uint64_t> received_sum;     // of the last receive, as the server hashed it
  std::optional<uint64_t> bytes_at_commit;  // received_bytes when Commit ran
  void CountTransfer(TransferDirection, uint64_t) override {}
  void CountTransferError(TransferDirection) override {}
  void CountAuthRejection() override { ++auth_rejections; }
  void SetPendingConnections(uint64_t) override {}
  void CountPendingConnectionResets(uint64_t, uint64_t) override {}
  int auth_rejections = 0;

 private:
  static bool Holds(const Principal& who) { return who.admin() || who.tenant_id == 7; }
  mutable std::vector<std::byte> memory_;
};

// Tickets "a" (tenant 7) and "b" (tenant 8).
std::optional<Principal> FindTicket(std::string_view ticket) {
  if (ticket == "a") return Principal{.role = Principal::Role::kWorker, .tenant = "a", .tenant_id = 7};
  if (ticket == "b") return Principal{.role = Principal::Role::kWorker, .tenant = "b", .tenant_id = 8};
  return std::nullopt;
}

struct Rig {
  MemoryBlockSource source;
  std::unique_ptr<UcxServer> server;
  std::unique_ptr<UcxClient> client;
  std::string address() const { return absl::StrCat("127.0.0.1:", server->port()); }
};

std::unique_ptr<Rig> StartRig(bool offer_put_commit = true) {
  auto rig = std::make_unique<Rig>();
  auto server = UcxServer::Start({.listen_address = "127.0.0.1:0",
                                  .node_id = "node-u",
                                  .transports = "tcp",
                                  .offer_put_commit = offer_put_commit,
                                  .call_threads = 1,
                                  .tickets_required = true,
                                  .find_ticket = &FindTicket},
                                 rig->source);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  rig->server = *std::move(server);
  auto client = UcxClient::Create("tcp", /*get_lanes=*/1);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  rig->client = *std::move(client);
  return rig;
}

TEST(UcxTransportTest, PutLandsInTheSourcesSlotAndGetSendsFromIt) {
  auto rig = StartRig();
  ASSERT_NE(rig, nullptr);
  auto conn = rig->client->Connect(rig->address(), absl::Now() + absl::Seconds(10), "a");
  ASSERT_TRUE(conn.ok()) << conn.status();
  EXPECT_EQ(conn->node_id, "node-u");
  EXPECT_TRUE(conn->takes_leases);
  EXPECT_TRUE(conn->takes_puts);

  std::vector<std::byte> block(kBlockBytes);
  for (uint64_t i = 0; i < kBlockBytes; ++i) block[i] = static_cast<std::byte>(i * 13 + 5);
  const uint32_t index = 0;
  const std::span<const std::byte> blocks[] = {block};
  UcxClient::TransferResult put =
      rig->client->Put(conn->endpoint, rig->source.reservation, {&index, 1}, blocks, absl::Now() + absl::Seconds(10));
  ASSERT_EQ(put.items.size(), 1u);
  EXPECT_EQ(put.items[0], UcxClient::ItemStatus::kOk);
  EXPECT_EQ(rig->source.received_bytes, kBlockBytes);
  EXPECT_EQ(std::memcmp(rig->source.received().data(), block.data(), kBlockBytes), 0);

  std::vector<std::byte> got(kBlockBytes);
  const std::span<std::byte> buffers[] = {got};
  UcxClient::TransferResult get = rig->client->Get(conn->endpoint, rig->source.lease, /*release=*/true, {&index, 1},
                                                   buffers, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(get.items[0], UcxClient::ItemStatus::kOk);
  EXPECT_EQ(std::memcmp(got.data(), rig->source.sent().data(), kBlockBytes), 0);
  EXPECT_EQ(rig->source.released, 1);

  auto lease =
      rig->client->Lease(conn->endpoint, v1::ReadRequest().SerializeAsString(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(lease.ok()) << lease.status();
  v1::ReadResponse resp;
  ASSERT_TRUE(resp.ParseFromString(*lease));
  EXPECT_EQ(CapabilityId::FromWire(resp.lease_id()), rig->source.lease);
  auto commit = rig->client->Commit(conn->endpoint, "", absl::Now() + absl::Seconds(10));
  EXPECT_EQ(commit.status().code(), absl::StatusCode::kUnimplemented) << commit.status();  // the source's own code
}

// A put's commit rides on its last message (kPutCommit): the server runs it once the block landed and
// was hashed, and its one reply is the commit's answer; a checksum that is not the bytes' is refused.
TEST(UcxTransportTest, PutAndCommitCommitsOnceTheBytesLandedAndChecksTheirHash) {
  auto rig = StartRig();
  ASSERT_NE(rig, nullptr);
  rig->source.commits = true;
  auto conn = rig->client->Connect(rig->address(), absl::Now() + absl::Seconds(10), "a");
  ASSERT_TRUE(conn.ok()) << conn.status();
  EXPECT_TRUE(conn->commits_puts);
  std::vector<std::byte> block(kBlockBytes);
  for (uint64_t i = 0; i < kBlockBytes; ++i) block[i] = static_cast<std::byte>(i * 11 + 3);
  const uint32_t index = 0;
  const std::span<const std::byte> blocks[] = {block};
  for (const bool right_checksum : {false, true}) {
    rig->source.bytes_at_commit.reset();
    UcxClient::PutCommitResult r = rig->client->PutAndCommit(
        conn->endpoint, rig->source.reservation, {&index, 1}, blocks, absl::Now() + absl::Seconds(10), [&] {
          v1::CommitRequest req;
          req.set_reservation_id(rig->source.reservation.ToWire());
          req.add_checksums(BlockChecksum(block.data(), kBlockBytes) + (right_checksum ? 0 : 1));
          return req.SerializeAsString();
        });
    ASSERT_EQ(r.transfer.items.size(), 1u);
    EXPECT_EQ(r.transfer.items[0], UcxClient::ItemStatus::kOk);
    EXPECT_FALSE(r.transfer.endpoint_failed);
    ASSERT_TRUE(r.commit.ok()) << r.commit.status();
    v1::CommitResponse resp;
    ASSERT_TRUE(resp.ParseFromString(*r.commit));
    ASSERT_EQ(resp.results_size(), 1);
    EXPECT_EQ(resp.results(0), right_checksum ? v1::COMMIT_RESULT_COMMITTED : v1::COMMIT_RESULT_CHECKSUM_MISMATCH);
    EXPECT_EQ(rig->source.bytes_at_commit, kBlockBytes) << "the commit ran before the block landed";
    EXPECT_EQ(std::memcmp(rig->source.received().data(), block.data(), kBlockBytes), 0);
  }
}

// A server that does not offer kPutCommit says so in its hello, and answers one anyway with
// FAILED_PRECONDITION, not by dropping the endpoint; Put then Commit still works there.
TEST(UcxTransportTest, AServerWithoutPutCommitRefusesItAndKeepsTheEndpoint) {
  auto rig = StartRig(/*offer_put_commit=*/false);
  ASSERT_NE(rig, nullptr);
  rig->source.commits = true;
  auto conn = rig->client->Connect(rig->address(), absl::Now() + absl::Seconds(10), "a");
  ASSERT_TRUE(conn.ok()) << conn.status();
  EXPECT_TRUE(conn->takes_puts);
  EXPECT_FALSE(conn->commits_puts);
  std::vector<std::byte> block(kBlockBytes, std::byte{9});
  const uint32_t index = 0;
  const std::span<const std::byte> blocks[] = {block};
  v1::CommitRequest req;
  req.set_reservation_id(rig->source.reservation.ToWire());
  req.add_checksums(BlockChecksum(block.data(), kBlockBytes));
  UcxClient::PutCommitResult r =
      rig->client->PutAndCommit(conn->endpoint, rig->source.reservation, {&index, 1}, blocks,
                                absl::Now() + absl::Seconds(10), [&] { return req.SerializeAsString(); });
  EXPECT_EQ(r.commit.status().code(), absl::StatusCode::kFailedPrecondition) << r.commit.status();
  EXPECT_FALSE(r.transfer.endpoint_failed);
  UcxClient::TransferResult put =
      rig->client->Put(conn->endpoint, rig->source.reservation, {&index, 1}, blocks, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(put.items[0], UcxClient::ItemStatus::kOk);
  auto commit = rig->client->Commit(conn->endpoint, req.SerializeAsString(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(commit.ok()) << commit.status();
  v1::CommitResponse resp;
  ASSERT_TRUE(resp.ParseFromString(*commit));
  EXPECT_EQ(resp.results(0), v1::COMMIT_RESULT_COMMITTED);
}

TEST(UcxTransportTest, AnotherTenantsTicketGetsNothingAndNoTicketIsRefused) {
  auto rig = StartRig();
  ASSERT_NE(rig, nullptr);
  auto refused = rig->client->Connect(rig->address(), absl::Now() + absl::Seconds(10), "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_GE(rig->source.auth_rejections, 1);

  auto conn = rig->client->Connect(rig->address(), absl::Now() + absl::Seconds(10), "b");
  ASSERT_TRUE(conn.ok()) << conn.status();
  std::vector<std::byte> got(kBlockBytes);
  const uint32_t index = 0;
  const std::span<std::byte> buffers[] = {got};
  UcxClient::TransferResult get = rig->client->Get(conn->endpoint, rig->source.lease, /*release=*/true, {&index, 1},
                                                   buffers, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(get.items[0], UcxClient::ItemStatus::kUnavailable);  // an empty message: tenant 8 holds no lease
  EXPECT_EQ(rig->source.released, 0);
  auto lease =
      rig->client->Lease(conn->endpoint, v1::ReadRequest().SerializeAsString(), absl::Now() + absl::Seconds(10));
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kPermissionDenied) << lease.status();
}

}  // namespace
}  // namespace kvtier::ucx
