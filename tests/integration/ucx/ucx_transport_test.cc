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
  void FinishReceive(const CapabilityId&, uint32_t, uint64_t bytes, bool ok, std::optional<uint64_t>) override {
    if (ok) received_bytes = bytes;
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
  absl::StatusOr<v1::CommitResponse> Commit(const Principal&, const v1::CommitRequest&) override {
    return absl::UnimplementedError("no commit here");
  }
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

std::unique_ptr<Rig> StartRig() {
  auto rig = std::make_unique<Rig>();
  auto server = UcxServer::Start({.listen_address = "127.0.0.1:0",
                                  .node_id = "node-u",
                                  .transports = "tcp",
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
